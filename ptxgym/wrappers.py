"""Wrappers over a ptxgym env, and exports built from the records they write.

- :class:`FastP` keeps each turn's correctness, qualification and speedup and computes the
  metrics of :mod:`ptxgym.bench.metrics`; the step that ends an episode carries them in
  ``info["fastp"]``.
- :class:`TrajectoryRecorder` appends one :class:`~ptxgym.bench.records.TurnRecord` per step to a
  JSONL
  file and syncs it to disk before the step returns, so a crash loses nothing.
- :func:`export_flashinfer` turns records into a FlashInfer-Trace dataset; :func:`repair_pairs`
  and :func:`write_repair_dataset` turn them into failure→repair training pairs.
- :class:`ChatMessages` keeps the conversation as chat messages (``info["messages"]``) for
  trainers that apply chat templates; see docs/chat.md.

See docs/metrics.md.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, SupportsFloat, TypedDict

import gymnasium as gym

from ptxgym import __version__
from ptxgym.bench.metrics import (
    TURN_LIMITS,
    Summary,
    Turn,
    best_speedup,
    fast_p,
    summarize,
    turn_correctness,
)
from ptxgym.bench.quality import measure as measure_quality
from ptxgym.bench.records import TurnRecord, append_line
from ptxgym.bench.transitions import transition
from ptxgym.build.result import CompileResult, CompilerUnavailable
from ptxgym.device.gpus import visible_gpus
from ptxgym.env import PTXKernelEnv
from ptxgym.interop import flashinfer_trace as trace
from ptxgym.languages.cuda.compiler import nvcc_version
from ptxgym.outcome import Outcome, Status
from ptxgym.tasks import Task, get_task

__all__ = [
    "ChatMessage",
    "ChatMessages",
    "FastP",
    "TrajectoryRecorder",
    "episode_metrics",
    "export_flashinfer",
    "repair_pairs",
    "solution_name",
    "summarize_wrappers",
    "write_repair_dataset",
]

_PASSED = Status.PASSED.value

# --------------------------------------------------------------------------------------------
# Fast_p


def _turn(info: Mapping[str, Any]) -> Turn:
    outcome = info["outcome"]
    return Turn(
        info["status"] == _PASSED,
        outcome["qualified"],
        outcome["speedup"],
        outcome["instructions_required"],
    )


def episode_metrics(turns: Sequence[Turn]) -> dict[str, Any]:
    """One episode's metrics over all its turns, as JSON-ready data.

    ``turn_correctness``, ``best_speedup`` and ``fast_1`` each map ``inst`` (correct and
    qualified turns only) and ``all`` (every correct turn) to a value, ``None`` where there is
    none.
    """
    episode = [list(turns)]

    def both(metric: Callable[..., float | None]) -> dict[str, float | None]:
        return {"inst": metric(episode, inst=True), "all": metric(episode, inst=False)}

    return {
        "turns": len(turns),
        "turn_correctness": both(turn_correctness),
        "best_speedup": both(best_speedup),
        "fast_1": both(lambda trajectories, inst: fast_p(trajectories, 1.0, inst=inst)),
    }


class FastP(gym.Wrapper[str, str, str, str]):
    """Keeps every turn's facts for the Fast_p metrics; one trajectory per episode.

    Each ``reset`` starts a trajectory; an episode with no steps is not counted. On the step
    that ends an episode (terminated or truncated), ``info["fastp"]`` holds
    :func:`episode_metrics` for that episode, which also reaches callers through vector envs.
    """

    def __init__(self, env: gym.Env[str, str]) -> None:
        super().__init__(env)
        self._episodes: list[list[Turn]] = []

    def _start(self) -> None:
        # Reuse an episode that has no turns yet, so repeated resets do not pile up empty lists.
        if not self._episodes or self._episodes[-1]:
            self._episodes.append([])

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        observation, info = self.env.reset(seed=seed, options=options)
        self._start()
        return observation, info

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = self.env.step(action)
        if not self._episodes:  # a step with no reset before it starts the first episode
            self._start()
        episode = self._episodes[-1]
        episode.append(_turn(info))
        if terminated or truncated:
            info = {**info, "fastp": episode_metrics(episode)}
        return observation, reward, terminated, truncated, info

    @property
    def trajectories(self) -> list[list[Turn]]:
        """Every episode with at least one step, oldest first (the current one included)."""
        return [list(episode) for episode in self._episodes if episode]

    def summary(self, limits: Sequence[int] = TURN_LIMITS, ps: Sequence[float] = (1.0,)) -> Summary:
        """:func:`ptxgym.bench.metrics.summarize` over this wrapper's trajectories."""
        return summarize(self.trajectories, limits=limits, ps=ps)


def summarize_wrappers(
    wrappers: Iterable[FastP], limits: Sequence[int] = TURN_LIMITS, ps: Sequence[float] = (1.0,)
) -> Summary:
    """The metrics over the trajectories of many wrappers pooled (many envs, many tasks)."""
    pooled = [trajectory for wrapper in wrappers for trajectory in wrapper.trajectories]
    return summarize(pooled, limits=limits, ps=ps)


# --------------------------------------------------------------------------------------------
# Trajectory records


def _versions() -> dict[str, str]:
    """ptxgym, Python and nvcc versions; GPU names and driver when a GPU is visible."""
    versions = {"ptxgym": __version__, "python": platform.python_version()}
    try:
        versions["nvcc"] = nvcc_version()
    except (CompilerUnavailable, OSError, subprocess.SubprocessError):
        versions["nvcc"] = "unavailable"
    gpus = visible_gpus()
    if gpus:
        versions["gpu"] = ", ".join(dict.fromkeys(gpu.name for gpu in gpus))
        versions["driver"] = gpus[0].driver
    return versions


class TrajectoryRecorder(gym.Wrapper[str, str, str, str]):
    """Appends a :class:`~ptxgym.bench.records.TurnRecord` per step to a JSONL file at ``path``.

    Each ``reset`` starts a trajectory: its index is ``options["trajectory"]`` when given (to
    resume one), else one more than the last this recorder used (the first is 0). Every line
    is written with one ``write`` under an exclusive ``flock`` and synced before ``step``
    returns, so several recorders may share a file and a crash loses no finished step.
    """

    def __init__(
        self,
        env: gym.Env[str, str],
        path: str | os.PathLike[str],
        *,
        run: str = "run",
        agent: str = "unknown",
    ) -> None:
        super().__init__(env)
        unwrapped = env.unwrapped
        if not isinstance(unwrapped, PTXKernelEnv):
            raise TypeError(f"TrajectoryRecorder needs a ptxgym env, not {type(unwrapped)}")
        self._ptx = unwrapped
        self.path = Path(path)
        self.run = run
        self.agent = agent
        self.trajectory: int | None = None
        # What the agent's model said of the next action (ptxgym.agents.Reply.generation):
        # written into the next step's record, then cleared.
        self.generation: dict[str, Any] = {}
        self._last_trajectory = -1
        self._versions: dict[str, str] | None = None
        # The current trajectory's last recorded turn, for the next turn's transition.
        self._previous: TurnRecord | None = None
        self.path.parent.mkdir(parents=True, exist_ok=True)

    @property
    def versions(self) -> dict[str, str]:
        """Versions written into every record; computed once (nvcc and nvidia-smi run once)."""
        if self._versions is None:
            self._versions = _versions()
        return self._versions

    def _next_index(self, requested: Any = None) -> int:
        if requested is None:
            return self._last_trajectory + 1
        if isinstance(requested, bool) or not isinstance(requested, int) or requested < 0:
            raise ValueError(f"options['trajectory'] must be an int >= 0, not {requested!r}")
        return requested

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        index = self._next_index((options or {}).get("trajectory"))
        observation, info = self.env.reset(seed=seed, options=options)
        self.trajectory = self._last_trajectory = index
        self._previous = None
        return observation, info

    def continue_after(self, record: TurnRecord) -> None:
        """Take ``record`` as the current trajectory's last turn (a trajectory resumed from
        its records): the next turn's transition is from it."""
        self._previous = record

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        started = time.perf_counter()
        observation, reward, terminated, truncated, info = self.env.step(action)
        seconds = time.perf_counter() - started
        if self.trajectory is None:  # a step with no reset before it starts trajectory 0
            self.trajectory = self._last_trajectory = self._next_index()
        record = self._record(info, float(reward), seconds)
        self._previous = record
        self.generation = {}
        append_line(self.path, record.to_json() + "\n", TurnRecord.from_json)
        return observation, reward, terminated, truncated, info

    def _record(self, info: Mapping[str, Any], reward: float, step_seconds: float) -> TurnRecord:
        """The record of a step of the current trajectory, from its ``info``."""
        assert self.trajectory is not None
        outcome = dict(info["outcome"])
        task = self._ptx.task
        language = self._ptx.language.name
        quality = measure_quality(info["source"], language)
        record = TurnRecord(
            run=self.run,
            task_id=info["task_id"],
            prompt_variant=self._ptx.prompt_variant,
            knowledge=self._ptx.knowledge,
            trajectory=self.trajectory,
            turn=info["turn"],
            agent=self.agent,
            status=info["status"],
            correct=info["status"] == _PASSED,
            qualified=outcome["qualified"],
            speedup=outcome["speedup"],
            latency_ms=outcome["latency_ms"],
            baseline_latency_ms=outcome["baseline_latency_ms"],
            reward=reward,
            reward_components=dict(info["reward_components"]),
            source=info["source"],
            feedback=info["feedback"],
            message=info["message"],
            step_seconds=step_seconds,
            evaluator=outcome["evaluator"],
            versions=dict(self.versions),
            timestamp=datetime.now(UTC).isoformat(timespec="milliseconds"),
            outcome=outcome,
            generation=dict(self.generation),
            category=task.category,
            instructions_required=task.instructions_required,
            quality={} if quality is None else quality.to_dict(),
            language=language,
        )
        if self._previous is None or self._previous.trajectory != record.trajectory:
            return record
        step = transition(self._previous.as_transition_turn(), record.as_transition_turn())
        return replace(record, transition=step.to_dict())


# --------------------------------------------------------------------------------------------
# Exports

# run, task, variant, knowledge, language, trajectory
TrajectoryKey = tuple[str, str, int, str, str, int]


def _trajectories(records: Iterable[TurnRecord]) -> dict[TrajectoryKey, list[TurnRecord]]:
    """Records grouped by trajectory, ordered by turn; for a turn recorded twice, the last."""
    groups: dict[TrajectoryKey, dict[int, TurnRecord]] = {}
    for record in records:
        key = (
            record.run,
            record.task_id,
            record.prompt_variant,
            record.knowledge,
            record.language,
            record.trajectory,
        )
        groups.setdefault(key, {})[record.turn] = record
    return {key: [turns[t] for t in sorted(turns)] for key, turns in groups.items()}


def repair_pairs(records: Iterable[TurnRecord]) -> list[dict[str, Any]]:
    """Failure→repair pairs: each failing turn with a source, and the first later PASSED turn.

    Pairs are formed within one trajectory (same run, task, variant, knowledge, language,
    index). A failure with no later correct turn gives no pair; several failures may share one
    repair.
    """
    pairs: list[dict[str, Any]] = []
    for (run, task_id, variant, knowledge, language, index), turns in _trajectories(
        records
    ).items():
        for position, failed in enumerate(turns):
            if failed.status == _PASSED or failed.source is None:
                continue
            repaired = next((t for t in turns[position + 1 :] if t.status == _PASSED), None)
            if repaired is None:
                continue
            pairs.append(
                {
                    "run": run,
                    "task_id": task_id,
                    "prompt_variant": variant,
                    "knowledge": knowledge,
                    "language": language,
                    "trajectory": index,
                    "failed_turn": failed.turn,
                    "failed_status": failed.status,
                    "failed_source": failed.source,
                    "feedback": failed.feedback,
                    "repaired_turn": repaired.turn,
                    "repaired_source": repaired.source,
                    "repaired_speedup": repaired.speedup,
                    "repaired_qualified": repaired.qualified,
                }
            )
    return pairs


def write_repair_dataset(records: Iterable[TurnRecord], path: str | os.PathLike[str]) -> int:
    """Write :func:`repair_pairs` as JSONL (the file is replaced); returns how many."""
    pairs = repair_pairs(records)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(pair) + "\n" for pair in pairs)
    return len(pairs)


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def solution_name(record: TurnRecord, definition: str) -> str:
    """``<run>_<definition>_v<variant>_<knowledge>_t<trajectory>_<turn>``, file-name safe.

    FlashInfer-Bench requires solution names to be unique across a whole dataset, hence the
    definition; knowledge levels of one run would clash without it.
    """
    name = (
        f"{record.run}_{definition}_v{record.prompt_variant}_{record.knowledge}"
        f"_t{record.trajectory}_{record.turn}"
    )
    return _UNSAFE.sub("-", name)


def _environment(record: TurnRecord) -> trace.Environment:
    libs = {k: v for k, v in record.versions.items() if k != "gpu"}
    gpu = record.versions.get("gpu", "").strip()
    # FlashInfer names hardware NVIDIA_H100; nvidia-smi says "NVIDIA H100 80GB HBM3".
    hardware = _UNSAFE.sub("_", gpu) if gpu else "unknown"
    return trace.Environment(hardware=hardware, libs=libs)


def _outcome(record: TurnRecord) -> Outcome:
    """The fields of the record's Outcome that ``trace_from_outcome`` reads."""
    build = record.outcome.get("compile")
    compile_result = None
    if isinstance(build, Mapping):
        compile_result = CompileResult(
            ok=bool(build.get("ok", False)),
            log=str(build.get("log", "")),
            source_hash=str(build.get("source_hash", "")),
            arch=str(build.get("arch", "")),
            seconds=float(build.get("seconds", 0.0)),
        )
    return Outcome(
        task_id=record.task_id,
        status=Status(record.status),
        message=record.message,
        evaluator=record.evaluator,
        compile=compile_result,
        latency_ms=record.latency_ms,
        baseline_latency_ms=record.baseline_latency_ms,
        speedup=record.speedup,
        qualified=record.qualified,
        instructions_required=record.instructions_required,
    )


def _correctness(record: TurnRecord, workload: str) -> trace.Correctness | None:
    """Error maxima over every check of ``workload``; NaN when they do not bound the error.

    ptxgym's maxima skip non-finite elements, and a shape or dtype failure measures nothing.
    """
    outputs = [
        output
        for check in record.outcome.get("checks", [])
        if check.get("workload") == workload
        for output in check.get("outputs", [])
    ]
    if not outputs:
        return None
    if any(o.get("non_finite") or o.get("problem") in ("shape", "dtype") for o in outputs):
        return trace.Correctness(max_relative_error=math.nan, max_absolute_error=math.nan)
    return trace.Correctness(
        max_relative_error=max(float(o["max_rel_error"]) for o in outputs),
        max_absolute_error=max(float(o["max_abs_error"]) for o in outputs),
    )


def _traces(
    task: Task, workloads: Sequence[trace.Workload], record: TurnRecord, name: str
) -> list[trace.Trace]:
    """One trace per task workload for a recorded turn.

    ptxgym evaluates the whole workload pool and gives one status, so every workload gets that
    status. A PASSED turn's latencies come from the outcome's per-workload ``timings``; with no
    timing for a workload, the totals stand for it only when the pool has one workload.
    """
    outcome = _outcome(record)
    timings = {t["workload"]: t for t in record.outcome.get("timings", [])}
    environment = _environment(record)
    traces: list[trace.Trace] = []
    for spec, workload in zip(task.workloads, workloads, strict=True):
        figures = outcome
        timing = timings.get(spec.name)
        if outcome.status is Status.PASSED and timing is not None:
            figures = replace(
                outcome,
                latency_ms=timing["latency_ms"],
                baseline_latency_ms=timing["baseline_latency_ms"],
                speedup=timing["speedup"],
            )
        elif outcome.status is Status.PASSED and len(task.workloads) > 1:
            figures = replace(outcome, latency_ms=None, baseline_latency_ms=None, speedup=None)
        traces.append(
            trace.trace_from_outcome(
                task,
                workload,
                name,
                figures,
                environment=environment,
                correctness=_correctness(record, spec.name),
                timestamp=record.timestamp or None,
            )
        )
    return traces


def export_flashinfer(records: Iterable[TurnRecord], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write the turns that produced a source as a FlashInfer-Trace dataset under ``out_dir``.

    Definitions, workloads and blobs come from
    :func:`ptxgym.interop.flashinfer_trace.write_trace_set` for every task with such a turn; each
    turn adds ``solutions/<definition>/<name>.json`` (see :func:`solution_name`; the author is the
    record's agent) and one trace per workload to ``traces/<op_type>/<definition>.jsonl``. Files are
    rewritten whole, so exporting the same records again gives the same dataset. Tasks that
    FlashInfer-Trace cannot describe (``flashinfer_trace.export_problem``) are left out. Returns
    the files written.
    """
    root = Path(out_dir)
    by_task: dict[str, list[TurnRecord]] = {}
    for turns in _trajectories(records).values():
        for record in turns:
            if record.source is not None:
                by_task.setdefault(record.task_id, []).append(record)
    tasks = [get_task(task_id) for task_id in by_task]
    tasks = [task for task in tasks if trace.export_problem(task) is None]
    written = trace.write_trace_set(root, tasks)
    owners: dict[str, tuple[str, tuple[str, int, str, int, int]]] = {}
    for task in tasks:
        definition = trace.definition_name(task)
        kind = trace.op_type(task)
        workloads = [
            record.workload
            for record in trace.read_jsonl(root / "workloads" / kind / f"{definition}.jsonl")
        ]
        lines: list[str] = []
        for record in by_task[task.id]:
            assert record.source is not None
            name = solution_name(record, definition)
            identity = (record.run, record.key)
            if owners.setdefault(name, identity) != identity:
                raise trace.TraceExportError(f"two turns map to the solution name {name!r}")
            solution = trace.solution_from_source(
                task, record.source, name=name, author=record.agent or "unknown"
            )
            path = root / "solutions" / definition / f"{name}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(
                solution.model_dump_json(indent=2, exclude_unset=True) + "\n", encoding="utf-8"
            )
            written.append(path)
            lines += [
                t.model_dump_json(exclude_unset=True) + "\n"
                for t in _traces(task, workloads, record, name)
            ]
        traces_path = root / "traces" / kind / f"{definition}.jsonl"
        traces_path.parent.mkdir(parents=True, exist_ok=True)
        traces_path.write_text("".join(lines), encoding="utf-8")
        written.append(traces_path)
    return written


# --------------------------------------------------------------------------------------------
# Chat messages


class ChatMessage(TypedDict):
    """One message of a chat conversation, as chat templates (and OpenAI-style APIs) take it."""

    role: Literal["system", "user", "assistant"]
    content: str


class ChatMessages(gym.Wrapper[str, str, str, str]):
    """Keeps the episode as chat messages beside the flat observation, which is unchanged.

    After ``reset``, ``info["messages"]`` is ``[{"role": "user", "content": prompt}]``, preceded
    by ``{"role": "system", "content": system}`` when ``system`` is given. Each ``step(action)``
    appends ``{"role": "assistant", "content": action}`` (the reply exactly as sent) and
    ``{"role": "user", "content": feedback}``: the step's ``info["feedback"]``, followed by the
    env's closing instruction (after a blank line) while turns remain — the text the flat
    observation appends for the turn, without its ``## Turn`` header, the echoed kernel and the
    ``Feedback:`` label. Every ``info["messages"]`` and :attr:`messages` is a fresh copy, and the
    messages do not depend on ``history`` (it shapes only the flat observation). To restore an
    episode, call this wrapper's :meth:`resume`, not the env's. See docs/chat.md.
    """

    def __init__(self, env: gym.Env[str, str], *, system: str | None = None) -> None:
        super().__init__(env)
        unwrapped = env.unwrapped
        if not isinstance(unwrapped, PTXKernelEnv):
            raise TypeError(f"ChatMessages needs a ptxgym env, not {type(unwrapped)}")
        if system is not None and not isinstance(system, str):
            raise TypeError(f"system must be a str or None, not {type(system).__name__}")
        self._ptx = unwrapped
        self.system = system
        self._messages: list[ChatMessage] = []
        self._turn = 0
        self._start()  # a step with no reset before it continues the env's fresh episode

    @property
    def messages(self) -> list[ChatMessage]:
        """The conversation so far: a copy, so a caller may change it freely."""
        return [message.copy() for message in self._messages]

    def _start(self) -> None:
        self._messages = []
        if self.system is not None:
            self._messages.append({"role": "system", "content": self.system})
        self._messages.append({"role": "user", "content": self._ptx.prompt.text})
        self._turn = 0

    def _user_message(self, turn: int, feedback: str) -> ChatMessage:
        """The feedback of ``turn`` as the env shows it next: with the closing line (the env's
        own text) while turns remain, as in :meth:`PTXKernelEnv._compose_observation`."""
        closing = [self._ptx.closing] if turn < self._ptx.turns else []
        return {"role": "user", "content": "\n\n".join([feedback, *closing])}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        observation, info = self.env.reset(seed=seed, options=options)
        self._start()
        return observation, {**info, "messages": self.messages}

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = self.env.step(action)
        turn = int(info["turn"])
        if turn != self._turn + 1:
            raise RuntimeError(
                f"the env is at turn {turn} but ChatMessages holds {self._turn} turns: it was "
                "stepped or resumed behind this wrapper (resume through ChatMessages.resume)"
            )
        self._turn = turn
        self._messages.append({"role": "assistant", "content": action})
        self._messages.append(self._user_message(turn, info["feedback"]))
        return observation, reward, terminated, truncated, {**info, "messages": self.messages}

    def resume(
        self,
        history: Sequence[tuple[str | None, str]],
        replies: Sequence[str] | None = None,
    ) -> str:
        """:meth:`PTXKernelEnv.resume` through this wrapper, rebuilding the messages too.

        ``history`` is what the env's ``resume`` takes: each turn's extracted source and its
        feedback. The user messages are rebuilt exactly. The assistant messages are the replies
        the agent sent, which ``history`` does not hold: pass them as ``replies`` (one per turn)
        to mirror the episode exactly; without them each is rebuilt as the extracted source in
        one code block (what the prompt asks for), or ``""`` for a turn whose reply held no
        code. Call right after ``reset``; returns the restored flat observation.
        """
        if replies is not None and len(replies) != len(history):
            raise ValueError(f"{len(replies)} replies for {len(history)} recorded turns")
        if self._turn != 0:
            raise RuntimeError("resume() must follow reset()")
        observation = self._ptx.resume(history)
        fence = self._ptx.language.fence
        for turn, (source, feedback) in enumerate(history, 1):
            if replies is not None:
                reply = replies[turn - 1]
            elif source is None:
                reply = ""
            else:
                reply = f"```{fence}\n{source.rstrip()}\n```"
            self._messages.append({"role": "assistant", "content": reply})
            self._messages.append(self._user_message(turn, feedback))
        self._turn = len(history)
        return observation
