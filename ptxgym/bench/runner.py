"""Run an agent over tasks × prompt variants × trajectories, recording every turn; resumable.

``run(plan, agent, out)`` plays each episode of the plan through :class:`PTXKernelEnv` wrapped in
:class:`~ptxgym.wrappers.ChatMessages` (the conversation, for agents that speak chat) and
:class:`~ptxgym.wrappers.TrajectoryRecorder`, which appends one JSON line per turn to ``out``.
``concurrency`` episodes are played at once, each in a thread of its own with its own env and
agent session: while one waits for its model, others are evaluated, so the GPU does not wait on
the model when there is work (the evaluators take turns on it). Running the same plan again
continues where it stopped: finished episodes are skipped, a partly recorded one is restored
(its env and conversation, from the records) and goes on from its next turn, and no recorded
turn is evaluated again. When the agent fails (``AgentError``: its endpoint is down), no new turn
starts, the turns under way finish and are recorded, and the error is raised.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from tqdm import tqdm

from ptxgym.agents.base import Agent, AgentSession, Reply
from ptxgym.agents.scripted import ScriptedAgent
from ptxgym.env import PTXKernelEnv
from ptxgym.evaluate.evaluator import EVALUATORS, Evaluator, make_evaluator
from ptxgym.languages import DEFAULT_LANGUAGE, LANGUAGES
from ptxgym.prompt import PROMPT_VARIANTS
from ptxgym.records.turns import TurnRecord, read_records
from ptxgym.tasks import get_task
from ptxgym.tasks.packs import KNOWLEDGE_LEVELS
from ptxgym.wrappers import ChatMessages, TrajectoryRecorder

__all__ = ["Episode", "RunPlan", "ScriptedAgent", "run"]

Episode = tuple[str, int, int]
"""(task id, prompt variant, trajectory index)."""


@dataclass(frozen=True)
class RunPlan:
    """What to run: every task × prompt variant × trajectory, each an episode of ``turns`` steps.

    ``name`` identifies the run inside its output file: running a plan of the same name into the
    same file resumes it. ``evaluator`` is a name (``auto``, ``gpu``, ``compile-only``) resolved
    once per task, or an :class:`~ptxgym.evaluate.evaluator.Evaluator` object shared by every
    episode.
    """

    name: str
    tasks: tuple[str, ...]
    variants: tuple[int, ...] = PROMPT_VARIANTS
    trajectories: int = 1
    turns: int = 8
    knowledge: str = "full"
    evaluator: str | Evaluator = "auto"
    language: str = DEFAULT_LANGUAGE
    """The action language of the episodes (``ptxgym.languages``)."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a run needs a name")
        if not self.tasks:
            raise ValueError("a run needs at least one task")
        if len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"a task is listed twice: {', '.join(self.tasks)}")
        for task_id in self.tasks:
            get_task(task_id)  # an unknown id fails here, not midway through the run
        if not self.variants or not set(self.variants) <= set(PROMPT_VARIANTS):
            raise ValueError(
                f"prompt variants must be among {PROMPT_VARIANTS}, not {self.variants}"
            )
        if len(set(self.variants)) != len(self.variants):
            raise ValueError(f"a prompt variant is listed twice: {self.variants}")
        if self.trajectories < 1 or self.turns < 1:
            raise ValueError("trajectories and turns must be at least 1")
        if self.knowledge not in KNOWLEDGE_LEVELS:
            raise ValueError(f"knowledge must be one of {KNOWLEDGE_LEVELS}, not {self.knowledge!r}")
        if self.language not in LANGUAGES:
            raise ValueError(f"language must be one of {sorted(LANGUAGES)}, not {self.language!r}")
        if isinstance(self.evaluator, str) and self.evaluator not in EVALUATORS:
            raise ValueError(f"evaluator must be one of {EVALUATORS}, not {self.evaluator!r}")

    @property
    def episodes(self) -> list[Episode]:
        """Every episode, in the order they run."""
        return [
            (task_id, variant, trajectory)
            for task_id in self.tasks
            for variant in self.variants
            for trajectory in range(self.trajectories)
        ]


def run(
    plan: RunPlan, agent: Agent, out: Path, *, progress: bool = True, concurrency: int = 1
) -> Path:
    """Play every episode of ``plan`` with ``agent``, appending turn records to ``out``, with
    up to ``concurrency`` episodes under way at once.

    Resumes what ``out`` already holds for ``plan.name``. Returns ``out``.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, not {concurrency}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    recorded = _recorded(out, plan, agent) if out.exists() else {}
    pending = [episode for episode in plan.episodes if len(recorded.get(episode, [])) < plan.turns]
    owned: list[Evaluator] = []  # built here from a name, so closed here
    evaluators: dict[str, Evaluator] = {}
    for task_id in dict.fromkeys(task_id for task_id, _, _ in pending):
        evaluators[task_id] = make_evaluator(plan.evaluator, get_task(task_id), plan.language)
        if evaluators[task_id] is not plan.evaluator:
            owned.append(evaluators[task_id])
    done = sum(min(len(recorded.get(episode, [])), plan.turns) for episode in plan.episodes)
    bar = tqdm(
        total=len(plan.episodes) * plan.turns,
        initial=done,
        desc=plan.name,
        unit="turn",
        disable=not progress,
    )
    shown = threading.Lock()  # tqdm's bar, from every episode's thread
    stop = threading.Event()  # the agent failed: no new turn starts

    def play(episode: Episode) -> None:
        task_id, variant, trajectory = episode
        env = PTXKernelEnv(
            task_id,
            turns=plan.turns,
            prompt_variant=variant,
            knowledge=plan.knowledge,
            evaluator=evaluators[task_id],
            language=plan.language,
        )
        chat = ChatMessages(env)
        recorder = TrajectoryRecorder(chat, out, run=plan.name, agent=agent.name)
        session = _session(agent)
        try:
            history = recorded.get(episode, [])
            observation, info = recorder.reset(options={"trajectory": trajectory})
            if history:
                observation = chat.resume(
                    [(record.source, record.feedback) for record in history],
                    [record.generation.get("reply", "") for record in history]
                    if all("reply" in record.generation for record in history)
                    else None,
                )
                info = {**_restored_info(history[-1]), "messages": chat.messages}
                recorder.continue_after(history[-1])
            for _ in range(len(history), plan.turns):
                if stop.is_set():
                    return
                reply = Reply.of(session.act(observation, info))
                recorder.generation = reply.generation
                observation, _, _, _, info = recorder.step(reply.text)
                with shown:
                    bar.set_postfix_str(f"{task_id} v{variant} #{trajectory}: {info['status']}")
                    bar.update()
        except BaseException:
            stop.set()
            raise
        finally:
            recorder.close()

    try:
        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="episode") as pool:
            # In plan order: with concurrency 1, episodes run one after another as before.
            futures = [pool.submit(play, episode) for episode in pending]
            errors = [error for future in futures if (error := future.exception()) is not None]
        if errors:
            raise errors[0]
    finally:
        bar.close()
        for evaluator in owned:
            evaluator.close()
    return out


def _session(agent: Agent) -> AgentSession:
    """The agent's session for one episode; an object with only ``act`` (the agents of
    ptxgym 0.1) is its own session."""
    make = getattr(agent, "session", None)
    return cast(AgentSession, agent) if make is None else cast(AgentSession, make())


def _recorded(out: Path, plan: RunPlan, agent: Agent) -> dict[Episode, list[TurnRecord]]:
    """The turns ``out`` already holds for the plan's episodes, in order, checked for gaps."""
    planned = set(plan.episodes)
    episodes: dict[Episode, list[TurnRecord]] = defaultdict(list)
    for record in read_records(out):
        episode = (record.task_id, record.prompt_variant, record.trajectory)
        ours = (record.run, record.knowledge, record.language) == (
            plan.name,
            plan.knowledge,
            plan.language,
        )
        if ours and episode in planned:
            episodes[episode].append(record)
    for (task_id, variant, trajectory), records in episodes.items():
        where = f"{out}: run {plan.name!r}, {task_id} variant {variant} trajectory {trajectory}"
        records.sort(key=lambda record: record.turn)
        turns = [record.turn for record in records]
        if turns != list(range(1, len(turns) + 1)):
            raise ValueError(f"{where}: recorded turns {turns} are not 1, 2, … in order")
        others = {record.agent for record in records} - {agent.name}
        if others:
            raise ValueError(
                f"{where}: recorded by agent {sorted(others)[0]!r}, not {agent.name!r}; "
                "give this run another name"
            )
    return dict(episodes)


def _restored_info(record: TurnRecord) -> dict[str, Any]:
    """The ``info`` that the recorded step returned (the env's step keys), for the agent."""
    return {
        "task_id": record.task_id,
        "turn": record.turn,
        "status": record.status,
        "message": record.message,
        "source": record.source,
        "feedback": record.feedback,
        "reward_components": record.reward_components,
        "outcome": record.outcome,
    }
