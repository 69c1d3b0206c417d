"""Evaluate candidates on a pool of Ray actors: builds on CPU actors, judging on one actor per GPU,
on this machine or across a cluster (``ptxgym.evaluate.ray_actors`` holds the actors).

:class:`RayEvaluator` is an :class:`~ptxgym.evaluate.evaluator.Evaluator`: ``evaluate`` blocks,
``submit`` returns a future and ``evaluate_async`` is awaitable, so envs, vector envs, the run
loop and RL trainers on Ray (verl, OpenRLHF) use it as they use the local GPU evaluator. Each
request is built by the least-loaded builder, then judged by the least-loaded judge of the
task's GPU generation (an ``H100`` task by an ``sm_90`` judge, a ``B200`` task by ``sm_100``);
a judge holds at most ``max_in_flight`` requests, and the rest wait on the caller's side. A task
that no judge serves fails at once (:class:`NoJudgeError`).

Faults: a builder or judge that dies under a request (Ray's ``RayActorError``, which covers
``ActorDiedError`` and ``ActorUnavailableError``) is replaced through the pool's directory and
the request is sent once more, to another actor or the replacement; a second death fails the
request with an ``EvaluatorError``. Each request has an id and its future is settled exactly
once (``stats()`` counts answers, failures, retries and replacements). An exception raised
inside an actor is the evaluator's failure, not the actor's death: it reaches the caller as an
``EvaluatorError`` and nothing is retried; a candidate's own failures are outcomes, as anywhere.

Ray is optional (``pip install 'ptxgym[ray]'``) and imported only when an evaluator is made or a
pool served. The pool is started by the evaluator (and ended by ``close``), or served by
``ptxgym serve`` as a named, detached pool that any number of clients reach by name
(``RayEvaluator(address=..., pool=NAME)``, or the evaluator spec ``ray://HOST:PORT/NAME``).

Connecting to the cluster lives in ``ptxgym.evaluate.ray_connection`` (``import_ray``,
``connected``), and shaping, starting, finding and ending pools in ``ptxgym.evaluate.ray_served``
(``parse_spec``, ``plan_pool``, ``serve_pool``, ``pool_members``, ``stop_pool``); their public
names are imported here too, so this module stays the one to import.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from ptxgym.build.result import DEFAULT_COMPILE_TIMEOUT_S
from ptxgym.evaluate.errors import EvaluatorError
from ptxgym.evaluate.judge_settings import JudgeSettings
from ptxgym.evaluate.ray_actors import Built, JudgeKind, Member, task_generation
from ptxgym.evaluate.ray_connection import (
    actor_exception,
    connect,
    connected,
    disconnect,
    import_ray,
)
from ptxgym.evaluate.ray_served import (
    DEFAULT_ARCHES,
    DEFAULT_POOL,
    NAMESPACE,
    START_TIMEOUT_S,
    parse_spec,
    plan_pool,
    pool_members,
    serve_pool,
    served_pool,
    start_pool,
    stop_pool,
)
from ptxgym.outcome import Outcome
from ptxgym.tasks import Task

# This module's own names, and those of connecting and serving that its users have always
# imported from here (``ptxgym serve``, docs/ray.md, benchmarks/ray_scaling.py).
__all__ = [
    "DEFAULT_ARCHES",
    "DEFAULT_POOL",
    "NAMESPACE",
    "MemberLoad",
    "NoJudgeError",
    "PoolStats",
    "RayEvaluator",
    "connected",
    "import_ray",
    "parse_spec",
    "plan_pool",
    "pool_members",
    "serve_pool",
    "stop_pool",
]

log = logging.getLogger(__name__)

_T = TypeVar("_T")


class NoJudgeError(EvaluatorError):
    """No judge of the pool serves the GPU generation of the task."""


@dataclass(frozen=True)
class MemberLoad:
    """One actor's share of the work so far (``RayEvaluator.stats``)."""

    member: str
    arch: str | None
    capacity: int
    in_flight: int
    peak_in_flight: int
    requests: int
    alive: bool


@dataclass(frozen=True)
class PoolStats:
    """What one evaluator's requests came to. Every submitted request is eventually answered
    (an Outcome), failed (an exception) or cancelled by its caller, exactly once:
    ``duplicate_answers`` counts any second answer, and is 0 unless the pool is broken."""

    submitted: int
    answered: int
    failed: int
    cancelled: int
    retried: int
    actor_deaths: int
    replaced: int
    duplicate_answers: int
    judges: tuple[MemberLoad, ...]
    builders: tuple[MemberLoad, ...]

    @property
    def settled(self) -> int:
        return self.answered + self.failed + self.cancelled


@dataclass
class _Slot:
    """The caller's view of one member: requests it holds now, and whether it still serves.
    Touched only on the evaluator's event loop."""

    member: Member
    in_flight: int = 0
    peak: int = 0
    requests: int = 0
    down: bool = False  # its actor died; a replacement is under way
    gone: bool = False  # no replacement could be made: it serves no more

    @property
    def free(self) -> bool:
        return not self.down and not self.gone and self.in_flight < self.member.capacity

    def load(self) -> MemberLoad:
        return MemberLoad(
            self.member.describe(),
            self.member.arch,
            self.member.capacity,
            self.in_flight,
            self.peak,
            self.requests,
            not (self.down or self.gone),
        )


@dataclass
class _Request:
    id: int
    task: Task
    source: str
    future: Future[Outcome]
    settled: bool = False
    runner: Future[None] | None = None  # the coroutine serving it, kept referenced


class RayEvaluator:
    """Policy and build on the pool's CPU builders, then correctness and timing (or, with
    compile-only judges, static inspection) on a judge of the task's GPU generation.

    ``address``: ``None`` starts a local Ray cluster (this machine's cores and GPUs; ended by
    ``close``), ``"auto"`` joins the cluster this machine is a node of, ``"ray://HOST:PORT"``
    reaches one through Ray Client. A connection the program already made (``ray.init``, as in
    an RL trainer) is used as it is, whatever ``address`` says.

    ``pool``: the name of a pool served on the cluster (``ptxgym serve``), shared with other
    clients and left running by ``close``. Without it the evaluator starts a pool of its own,
    shaped by the rest (defaults from the cluster, see ``plan_pool``):

    - ``judge``: ``"gpu"`` (one judge per GPU, ``gpus`` of them, each holding one GPU) or
      ``"compile-only"`` (no GPU: one judge per entry of ``arches``, e.g. ``("sm_90",)``,
      serving that GPU generation; a generation listed twice gets two judges);
    - ``builders`` CPU actors, each running ``builds_per_builder`` builds at once;
    - ``max_in_flight``: requests one judge holds at once (default: the judge's concurrency,
      4); more wait here, in the caller's process;
    - ``compile_timeout_s``, ``settings``: as for ``LocalGPUEvaluator``.

    ``queue_timeout_s``: how long a request may wait for a free builder or judge before it
    fails with an EvaluatorError (None: as long as it takes). ``start_timeout_s``: how long the
    pool's actors (and a replacement) may take to start.
    """

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        *,
        pool: str | None = None,
        judge: JudgeKind | None = None,
        arches: Sequence[str] | None = None,
        gpus: int | None = None,
        builders: int | None = None,
        builds_per_builder: int | None = None,
        max_in_flight: int | None = None,
        compile_timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S,
        settings: JudgeSettings | None = None,
        queue_timeout_s: float | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        shaped = (judge, arches, gpus, builders, builds_per_builder, max_in_flight, settings)
        if pool is not None and any(value is not None for value in shaped):
            raise ValueError(
                f"pool {pool!r} is served with its own shape: give pool, or the shape of a "
                "pool to start (judge, arches, gpus, builders, ...), not both"
            )
        self.queue_timeout_s = queue_timeout_s
        self.start_timeout_s = start_timeout_s
        self.pool_name = pool
        self._ray = ray = connect(address)
        self._directory: Any = None
        try:
            if pool is not None:
                self._directory, members = served_pool(pool)
            else:
                spec = plan_pool(
                    judge=judge,
                    arches=arches,
                    gpus=gpus,
                    builders=builders,
                    builds_per_builder=builds_per_builder,
                    max_in_flight=max_in_flight,
                    compile_timeout_s=compile_timeout_s,
                    settings=settings,
                )
                self._directory, members = start_pool(spec, start_timeout_s)
            self._judges = [_Slot(m) for m in members if m.role == "judge"]
            self._builders = [_Slot(m) for m in members if m.role == "builder"]
            if not self._judges or not self._builders:
                raise EvaluatorError(f"pool {pool!r} has no judge or no builder (stopped?)")
        except BaseException:
            if pool is None and self._directory is not None:
                ray.kill(self._directory)
            disconnect()
            raise
        self._lock = threading.Lock()  # requests and counters, from any thread
        self._pending: dict[int, _Request] = {}
        self._ids = itertools.count()
        self._counts = dict.fromkeys(
            ("submitted", "answered", "failed", "cancelled", "retried", "deaths", "replaced"), 0
        )
        self._duplicates = 0
        self._closed = False
        self._replacing: set[asyncio.Task[None]] = set()
        self._loop = asyncio.new_event_loop()
        self._changed = asyncio.Condition()  # a slot was freed, replaced or lost
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="ptxgym-ray-dispatch", daemon=True
        )
        self._thread.start()

    @classmethod
    def from_spec(cls, spec: str) -> RayEvaluator:
        """The client of a served pool named by ``ray://HOST:PORT[/POOL]`` or
        ``ray://auto[/POOL]`` (the pool's name defaults to ``ptxgym``)."""
        address, pool = parse_spec(spec)
        return cls(address, pool=pool)

    # The Evaluator protocol, and its asynchronous forms.

    def evaluate(self, task: Task, source: str) -> Outcome:
        return self.submit(task, source).result()

    def submit(self, task: Task, source: str) -> Future[Outcome]:
        """Evaluate in the background; the future holds the Outcome (or an EvaluatorError:
        at once, a NoJudgeError, when no judge serves the task's GPU generation)."""
        future: Future[Outcome] = Future()
        with self._lock:
            if self._closed:
                raise EvaluatorError("the Ray evaluator is closed")
            request = _Request(next(self._ids), task, source, future)
            self._counts["submitted"] += 1
            self._pending[request.id] = request
        arch = task_generation(task)
        served = sorted({slot.member.arch or "" for slot in self._judges if not slot.gone})
        if arch not in served:
            self._settle(
                request,
                error=NoJudgeError(
                    f"{task.id} needs an {arch} judge; this pool's judges serve "
                    f"{', '.join(served) or 'nothing any more'}"
                ),
            )
            return future
        request.runner = asyncio.run_coroutine_threadsafe(self._serve(request), self._loop)
        return future

    async def evaluate_async(self, task: Task, source: str) -> Outcome:
        """``await evaluator.evaluate_async(task, source)``: ``submit`` for asyncio code."""
        return await asyncio.wrap_future(self.submit(task, source))

    def members(self) -> list[Member]:
        """The pool's actors as this evaluator knows them now (judges first)."""
        return [slot.member for slot in self._judges + self._builders]

    def stats(self) -> PoolStats:
        """A snapshot of this evaluator's requests and of each actor's load."""
        if self._thread.is_alive():
            return self._on_loop(self._snapshot()).result()
        return self._snapshot_now()

    def close(self) -> None:
        """Stop dispatching (requests still under way fail with an EvaluatorError), end the
        pool when this evaluator started it, and the Ray connection when it made it."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._on_loop(self._cancel_all()).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        for request in list(self._pending.values()):
            self._settle(request, error=EvaluatorError("the Ray evaluator was closed"))
        if self.pool_name is None:
            try:
                self._ray.get(self._directory.shutdown.remote(), timeout=60)
            except self._ray.exceptions.RayError as exc:  # its members end with it anyway
                log.warning("the pool did not shut down cleanly: %s", exc)
            self._ray.kill(self._directory)
        disconnect()

    # Dispatch, on the evaluator's event loop.

    def _on_loop(self, coroutine: Coroutine[Any, Any, _T]) -> Future[_T]:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    async def _serve(self, request: _Request) -> None:
        if not request.future.set_running_or_notify_cancel():
            self._settle(request, cancelled=True)
            return
        try:
            outcome = await self._evaluate(request)
        except Exception as exc:  # every failure is the caller's to see, in its future
            self._settle(request, error=exc)
        else:
            self._settle(request, outcome=outcome)

    async def _evaluate(self, request: _Request) -> Outcome:
        task = request.task
        built, refs, build_wait = await self._on_member(
            self._builders,
            None,
            lambda member: member.handle.build.options(num_returns=2).remote(task, request.source),
        )
        assert isinstance(built, Built)
        if built.stopped is not None:
            return _with_wait(built.stopped, build_wait)
        # The library's bytes go from the builder's node to the judge's as their own object:
        # this process never holds them.
        library = refs[1]
        outcome, _, judge_wait = await self._on_member(
            self._judges,
            task_generation(task),
            lambda member: [
                member.handle.judge.remote(task, built.build, library, built.seconds, built.listing)
            ],
        )
        assert isinstance(outcome, Outcome)
        return _with_wait(outcome, build_wait + judge_wait)

    async def _on_member(
        self, slots: list[_Slot], arch: str | None, call: Callable[[Member], Sequence[Any]]
    ) -> tuple[Any, Sequence[Any], float]:
        """``call`` on the least-loaded free member of ``slots`` (serving ``arch``, for judges):
        the value of the first object it returns, all its object refs, and the seconds spent
        waiting for a free member. Sent once more if that member dies under it."""
        ray = self._ray
        waited = 0.0
        for attempt in range(2):
            started = time.perf_counter()
            slot = await self._acquire(slots, arch)
            waited += time.perf_counter() - started
            member = slot.member
            try:
                refs = call(member)
                value = await asyncio.wrap_future(refs[0].future())
                return value, refs, waited
            except ray.exceptions.RayActorError as exc:
                await self._lost(slot, member)
                if attempt:
                    raise EvaluatorError(
                        f"two actors died under this request, the last {member.describe()}: {exc}"
                    ) from None
                with self._lock:
                    self._counts["retried"] += 1
                log.warning("%s died under a request; sending it again", member.describe())
            except ray.exceptions.RayError as exc:
                cause = actor_exception(exc)
                raise EvaluatorError(
                    f"{member.describe()} failed: {type(cause).__name__}: {cause}"
                ) from None
            finally:
                await self._release(slot)
        raise AssertionError("unreachable: the second attempt returns or raises")

    async def _acquire(self, slots: list[_Slot], arch: str | None) -> _Slot:
        """A free slot (the least loaded), waiting for one as long as ``queue_timeout_s``."""
        deadline = None if self.queue_timeout_s is None else time.monotonic() + self.queue_timeout_s
        async with self._changed:
            while True:
                serving = [s for s in slots if not s.gone and arch in (None, s.member.arch)]
                if not serving:
                    what = f"judge of {arch}" if arch else "builder"
                    raise EvaluatorError(f"no {what} is left: each died and none could replace it")
                free = [slot for slot in serving if slot.free]
                if free:
                    slot = min(free, key=lambda s: (s.in_flight, s.requests))
                    slot.in_flight += 1
                    slot.requests += 1
                    slot.peak = max(slot.peak, slot.in_flight)
                    return slot
                timeout = None if deadline is None else deadline - time.monotonic()
                try:
                    await asyncio.wait_for(self._changed.wait(), timeout)
                except TimeoutError:
                    raise EvaluatorError(
                        f"no {'judge' if arch else 'builder'} was free within "
                        f"queue_timeout_s={self.queue_timeout_s:g} s"
                    ) from None

    async def _release(self, slot: _Slot) -> None:
        async with self._changed:
            slot.in_flight -= 1
            self._changed.notify_all()

    async def _lost(self, slot: _Slot, member: Member) -> None:
        """``member`` died: take its slot out of service until the directory replaces it
        (once, however many requests saw it die)."""
        if slot.member.token != member.token or slot.down:
            return  # already replaced, or being replaced
        slot.down = True
        with self._lock:
            self._counts["deaths"] += 1
        task = asyncio.get_running_loop().create_task(self._replace(slot, member))
        self._replacing.add(task)
        task.add_done_callback(self._replacing.discard)

    async def _replace(self, slot: _Slot, dead: Member) -> None:
        ref = self._directory.replace.remote(dead.slot, dead.token, self.start_timeout_s)
        try:
            member = await asyncio.wrap_future(ref.future())
        except self._ray.exceptions.RayError as exc:
            slot.gone = True
            log.error("%s could not be replaced: %s", dead.describe(), actor_exception(exc))
        else:
            slot.member, slot.down = member, False
            with self._lock:
                self._counts["replaced"] += 1
            log.warning("%s replaced by a new actor", dead.describe())
        async with self._changed:
            self._changed.notify_all()

    async def _cancel_all(self) -> None:
        current = asyncio.current_task()
        tasks = [task for task in asyncio.all_tasks() if task is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _snapshot(self) -> PoolStats:
        return self._snapshot_now()

    def _snapshot_now(self) -> PoolStats:
        with self._lock:
            counts, duplicates = dict(self._counts), self._duplicates
        return PoolStats(
            submitted=counts["submitted"],
            answered=counts["answered"],
            failed=counts["failed"],
            cancelled=counts["cancelled"],
            retried=counts["retried"],
            actor_deaths=counts["deaths"],
            replaced=counts["replaced"],
            duplicate_answers=duplicates,
            judges=tuple(slot.load() for slot in self._judges),
            builders=tuple(slot.load() for slot in self._builders),
        )

    def _settle(
        self,
        request: _Request,
        *,
        outcome: Outcome | None = None,
        error: BaseException | None = None,
        cancelled: bool = False,
    ) -> None:
        """Answer ``request``: the only place a request's future is set, and only once."""
        with self._lock:
            if request.settled:
                self._duplicates += 1
                return
            request.settled = True
            self._pending.pop(request.id, None)
            kind = "cancelled" if cancelled else "failed" if error is not None else "answered"
            self._counts[kind] += 1
        if error is not None:
            request.future.set_exception(error)
        elif outcome is not None:
            request.future.set_result(outcome)


def _with_wait(outcome: Outcome, waited: float) -> Outcome:
    """``outcome`` with the seconds its request waited for free actors (``pool_wait``)."""
    return replace(outcome, stage_seconds={**outcome.stage_seconds, "pool_wait": waited})
