"""Wrappers over a ptxgym env.

- :class:`FastP` keeps each turn's correctness, qualification and speedup and computes the
  metrics of :mod:`ptxgym.records.metrics`; the step that ends an episode carries them in
  ``info["fastp"]``.
- :class:`TrajectoryRecorder` appends one :class:`~ptxgym.records.turns.TurnRecord` per step to a
  JSONL file and syncs it to disk before the step returns, so a crash loses nothing.
- :class:`ChatMessages` keeps the conversation as chat messages (``info["messages"]``) for
  trainers that apply chat templates; see docs/chat.md.

The datasets made of the records (failure→repair pairs, FlashInfer-Trace) are
:mod:`ptxgym.records.exports`'s; their names are still given here, where they were first.

See docs/metrics.md.
"""

from __future__ import annotations

import os
import platform
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, SupportsFloat, TypedDict

import gymnasium as gym

from ptxgym import __version__
from ptxgym.build.result import CompilerUnavailable
from ptxgym.device.gpus import visible_gpus
from ptxgym.env import PTXKernelEnv
from ptxgym.languages.cuda.compiler import nvcc_version
from ptxgym.outcome import Status
from ptxgym.records.exports import (
    export_flashinfer,
    repair_pairs,
    solution_name,
    write_repair_dataset,
)
from ptxgym.records.metrics import (
    TURN_LIMITS,
    Summary,
    Turn,
    best_speedup,
    fast_p,
    summarize,
    turn_correctness,
)
from ptxgym.records.quality import measure as measure_quality
from ptxgym.records.transitions import transition
from ptxgym.records.turns import TurnRecord, append_line

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
        """:func:`ptxgym.records.metrics.summarize` over this wrapper's trajectories."""
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
    """Appends a :class:`~ptxgym.records.turns.TurnRecord` per step to a JSONL file at ``path``.

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
