"""What runs inside a Ray cluster for :class:`~ptxgym.evaluate.ray_pool.RayEvaluator`.

Three kinds of actor, each a plain class here that ``ray.remote`` makes an actor of when a pool
starts (so this module imports without Ray, and its classes can be read and tested without it):

- a **builder** (CPU) runs the policy check and the build of a candidate
  (``ptxgym.evaluate.build_step``) and answers with a small :class:`Built` record and, as a
  separate object, the library's bytes, which Ray then hands straight to the judge that needs
  them, wherever it runs;
- a **judge** serves one GPU generation (``sm_90``, ``sm_100``): a GPU judge holds one GPU and
  today's judge for it (``LocalGPUEvaluator.evaluate_build``, which keeps the workload state
  between requests); a compile-only judge holds none and answers ``COMPILED``, so a whole pool
  runs on machines without a GPU (CI);
- the **pool** actor is the pool's directory: it starts the builders and judges (which live and
  die with it), tells clients what each serves, and replaces one that died.

Records between them are the typed dataclasses below; every one pickles as Ray sends it.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from ptxgym import paths
from ptxgym.build.result import DEFAULT_COMPILE_TIMEOUT_S, CompileResult
from ptxgym.build.sass import LISTING_FILE, kept_listing
from ptxgym.evaluate.build_step import build_candidate
from ptxgym.evaluate.judge_settings import JudgeSettings
from ptxgym.evaluate.local_gpu import LocalGPUEvaluator, gpu_of
from ptxgym.outcome import Outcome, Status
from ptxgym.tasks import Task

JudgeKind = Literal["gpu", "compile-only"]
JUDGE_KINDS: tuple[JudgeKind, ...] = ("gpu", "compile-only")
Role = Literal["builder", "judge"]

_ARCH_RE = re.compile(r"^sm_(\d+)a?$")


def generation(arch: str) -> str:
    """The GPU generation an architecture name stands for: ``sm_90a`` and ``sm_90`` are both
    ``sm_90`` (a task's build target carries the ``a`` of its architecture-specific features;
    a judge serves every task of its generation)."""
    match = _ARCH_RE.match(arch.strip())
    if match is None:
        raise ValueError(f"{arch!r} is not a GPU architecture such as sm_90 or sm_100")
    return f"sm_{match.group(1)}"


def task_generation(task: Task) -> str:
    """The generation of GPU that runs ``task`` (an H100 task: ``sm_90``; B200: ``sm_100``)."""
    major, minor = task.target.compute_capability
    return f"sm_{major}{minor}"


class PoolError(RuntimeError):
    """A pool could not start or replace one of its actors (resources, a failed start)."""


@dataclass(frozen=True)
class PoolSpec:
    """What a pool is made of.

    ``judge``: ``gpu`` (``gpus`` judges, one per GPU, each serving its GPU's generation) or
    ``compile-only`` (one judge per entry of ``arches``, serving that generation; an entry may
    repeat). ``builders`` CPU actors each run up to ``builds_per_builder`` builds at once (and
    ask Ray for that many CPUs). ``max_in_flight``: requests one judge holds at once; more wait
    on the caller's side. ``settings``: the GPU judges' (``None``: the defaults).
    """

    judge: JudgeKind
    gpus: int = 0
    arches: tuple[str, ...] = ()
    builders: int = 1
    builds_per_builder: int = 2
    max_in_flight: int = 4
    compile_timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S
    settings: JudgeSettings | None = None

    def __post_init__(self) -> None:
        if self.judge not in JUDGE_KINDS:
            raise ValueError(f"judge must be one of {JUDGE_KINDS}, not {self.judge!r}")
        if self.judge == "gpu" and self.arches:
            raise ValueError("a GPU judge serves its own GPU's architecture: give gpus, not arches")
        if self.judge == "compile-only" and self.gpus:
            raise ValueError("compile-only judges hold no GPU: give arches, not gpus")
        object.__setattr__(self, "arches", tuple(generation(arch) for arch in self.arches))
        if self.judges < 1:
            raise ValueError("a pool needs at least one judge (gpus or arches)")
        for name in ("builders", "builds_per_builder", "max_in_flight"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")

    @property
    def judges(self) -> int:
        return self.gpus if self.judge == "gpu" else len(self.arches)

    def needs(self) -> dict[str, float]:
        """The Ray resources the whole pool asks for."""
        cpus = self.builders * self.builds_per_builder + (self.gpus if self.judge == "gpu" else 0)
        return {"CPU": float(cpus), "GPU": float(self.gpus)}


@dataclass(frozen=True)
class Placement:
    """Where an actor runs and what it serves, as it reports itself once started."""

    host: str
    device: str  # the GPU's name, or "cpu"
    arch: str | None = None  # judges: the generation served


@dataclass(frozen=True)
class Member:
    """One actor of a pool. ``token`` names this incarnation of the slot: a replacement gets a
    new one, so a client that saw the old one die asks for a replacement only once."""

    slot: int
    role: Role
    token: str
    handle: Any = field(repr=False)  # the Ray actor handle
    capacity: int
    placement: Placement

    @property
    def arch(self) -> str | None:
        return self.placement.arch

    def describe(self) -> str:
        served = f" serving {self.arch}" if self.arch else ""
        return f"{self.role} {self.slot} on {self.placement.host} ({self.placement.device}){served}"


@dataclass(frozen=True)
class Built:
    """A builder's answer: the final outcome when the candidate stopped at the policy or the
    build, else the successful build (its library's bytes travel beside it, as their own
    object). ``seconds``: the wall time of the policy check and build."""

    stopped: Outcome | None
    build: CompileResult | None
    seconds: float
    # The build's SASS listing (``ptxgym.build.sass.LISTING_FILE``), which the judge's count
    # joins its per-address counts with: sent, not made again on the judge's node (about a
    # CPU-second of cuobjdump per evaluation). Empty when the build kept none.
    listing: str = ""


def _host() -> str:
    return socket.gethostname()


class Builder:
    """The policy check and build of candidates, several at once (a threaded actor)."""

    def __init__(self, compile_timeout_s: float) -> None:
        self.compile_timeout_s = compile_timeout_s

    def placement(self) -> Placement:
        return Placement(_host(), "cpu")

    def build(self, task: Task, source: str) -> tuple[Built, bytes]:
        """The build (or the outcome that stopped it) and the library's bytes (empty when
        there is no library); called with two returns, so each is its own object."""
        started = time.perf_counter()
        stopped, build = build_candidate(task, source, self.compile_timeout_s)
        seconds = time.perf_counter() - started
        if stopped is not None or build is None or build.library is None:
            return Built(stopped, build, seconds), b""
        library = Path(build.library)
        return Built(None, build, seconds, kept_listing(library) or ""), library.read_bytes()


class Judge:
    """Judges builds made elsewhere for one GPU generation, several at once (a threaded actor).

    A GPU judge is started by Ray with one GPU (CUDA device 0 of its process) and keeps
    ``LocalGPUEvaluator``'s judge for it, so the workload state (inputs, references, baseline
    latencies) is made once and reused by every request. A compile-only judge serves ``arch``
    without a GPU. Each request's library is written into this actor's own cache folder (the
    builder may be on another host), judged there, and removed.
    """

    def __init__(self, kind: JudgeKind, arch: str | None, settings: JudgeSettings | None) -> None:
        self.kind = kind
        self._scratch = paths.cache_dir() / "ray-judge" / f"{_host()}-{os.getpid()}"
        self._scratch.mkdir(parents=True, exist_ok=True)
        self._evaluator: LocalGPUEvaluator | None = None
        if kind == "compile-only":
            if arch is None:
                raise ValueError("a compile-only judge needs the architecture it serves")
            self._placement = Placement(_host(), "cpu", generation(arch))
            return
        gpu = gpu_of(0)
        if gpu is None:
            raise PoolError(f"a GPU judge on {_host()} was given no NVIDIA GPU")
        self._evaluator = LocalGPUEvaluator(0, settings=settings)
        # Start the judge now (minutes, the first time on a host), not in the first request.
        self._evaluator.device_info()
        major, minor = gpu.capability
        self._placement = Placement(_host(), gpu.name, f"sm_{major}{minor}")

    def placement(self) -> Placement:
        return self._placement

    def judge(
        self,
        task: Task,
        build: CompileResult,
        library: bytes,
        compile_seconds: float,
        listing: str = "",
    ) -> Outcome:
        """The outcome of ``build`` (a successful one, whose library's bytes are ``library``
        and SASS listing ``listing``). Candidate failures are outcomes; an exception is the
        evaluator's own failure."""
        started = time.perf_counter()
        served = self._placement.arch
        if task_generation(task) != served:
            raise PoolError(f"{task.id} was sent to a judge of {served}")
        if not library:
            raise PoolError(f"{task.id}: the build's library did not arrive")
        # A folder per request: the listing is found beside its library by name.
        folder = Path(tempfile.mkdtemp(dir=self._scratch))
        candidate = folder / "candidate.so"
        try:
            candidate.write_bytes(library)
            if listing:
                (folder / LISTING_FILE).write_text(listing, encoding="utf-8")
            here = replace(build, library=str(candidate))
            if self._evaluator is None:
                return Outcome(
                    task_id=task.id,
                    status=Status.COMPILED,
                    message=f"compiled for {task.target.arch}; not run (compile-only evaluator)",
                    evaluator="compile-only",
                    compile=build,
                    seconds=compile_seconds + time.perf_counter() - started,
                )
            outcome = self._evaluator.evaluate_build(task, here, compile_seconds)
            # The record names the build where it was made and is kept, not this scratch copy.
            return replace(outcome, compile=build)
        finally:
            shutil.rmtree(folder, ignore_errors=True)


class Pool:
    """A pool's directory (a threaded actor): starts its builders and judges, which are owned
    by it and so end with it, and replaces one that died.

    Clients ask it for the members, then call them directly; the directory is on no request's
    path. A member that dies is replaced at most once per incarnation (``Member.token``),
    however many clients saw it die.
    """

    def __init__(self, spec: PoolSpec) -> None:
        self.spec = spec
        self._members: list[Member] = []
        self._lock = threading.Lock()  # the member list
        # One per slot: a replacement (minutes, for a GPU judge) holds up only its own slot.
        self._replacing: list[threading.Lock] = []

    def start(self, timeout_s: float) -> list[Member]:
        """Start every member and wait until each has reported where it runs."""
        with self._lock:
            if not self._members:
                judge: Role = "judge"
                builder: Role = "builder"
                roles = [judge] * self.spec.judges + [builder] * self.spec.builders
                handles = [self._spawn(role, slot) for slot, role in enumerate(roles)]
                placements = self._placements(handles, timeout_s)
                self._members = [
                    Member(slot, role, uuid.uuid4().hex, handle, self._capacity(role), placement)
                    for slot, (role, handle, placement) in enumerate(
                        zip(roles, handles, placements, strict=True)
                    )
                ]
                self._replacing = [threading.Lock() for _ in roles]
            return list(self._members)

    def members(self) -> list[Member]:
        with self._lock:
            return list(self._members)

    def replace(self, slot: int, token: str, timeout_s: float) -> Member:
        """A live member for ``slot`` in place of incarnation ``token``: a new one if that is
        still the slot's, else the one that already replaced it."""
        with self._replacing[slot]:
            with self._lock:
                current = self._members[slot]
            if current.token != token:
                return current
            self._kill(current.handle)
            handle = self._spawn(current.role, slot)
            (placement,) = self._placements([handle], timeout_s)
            member = Member(
                slot, current.role, uuid.uuid4().hex, handle, current.capacity, placement
            )
            with self._lock:
                self._members[slot] = member
            return member

    def shutdown(self) -> None:
        """End every member (the directory itself is ended by whoever asked)."""
        with self._lock:
            for member in self._members:
                self._kill(member.handle)
            self._members = []

    def _capacity(self, role: Role) -> int:
        return self.spec.builds_per_builder if role == "builder" else self.spec.max_in_flight

    def _spawn(self, role: Role, slot: int) -> Any:
        import ray

        spec = self.spec
        # One more concurrent call than the capacity: ``placement`` is answered even when the
        # actor is full of work.
        common: dict[str, Any] = {"max_concurrency": self._capacity(role) + 1, "max_restarts": 0}
        if role == "builder":
            builder = ray.remote(Builder).options(
                num_cpus=spec.builds_per_builder, scheduling_strategy="SPREAD", **common
            )
            return builder.remote(spec.compile_timeout_s)
        judge = ray.remote(Judge)
        if spec.judge == "gpu":
            return judge.options(num_gpus=1, num_cpus=1, **common).remote(
                "gpu", None, spec.settings
            )
        return judge.options(num_cpus=0, **common).remote("compile-only", spec.arches[slot], None)

    def _placements(self, handles: list[Any], timeout_s: float) -> list[Placement]:
        import ray

        refs = [handle.placement.remote() for handle in handles]
        ready, waiting = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        if waiting:
            for handle in handles:
                self._kill(handle)
            needs = ", ".join(f"{value:g} {name}" for name, value in self.spec.needs().items())
            raise PoolError(
                f"{len(waiting)} of {len(refs)} actors did not start within {timeout_s:.0f} s: "
                f"the pool asks for {needs} in all; does the cluster have them free?"
            )
        try:
            placements: list[Placement] = ray.get(ready)
        except ray.exceptions.RayError as exc:
            for handle in handles:
                self._kill(handle)
            raise PoolError(f"an actor of the pool failed to start: {exc}") from None
        # ``ray.wait`` answers in the order things finished; the caller needs its own order.
        by_ref = dict(zip(ready, placements, strict=True))
        return [by_ref[ref] for ref in refs]

    @staticmethod
    def _kill(handle: Any) -> None:
        import ray

        ray.kill(handle, no_restart=True)
