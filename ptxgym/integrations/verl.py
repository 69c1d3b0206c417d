"""verl's hooks, filled by ptxgym: the custom reward function, a multi-turn tool, and (for verl
0.7 and before) an interaction. Each scores a model's reply as ``PTXKernelEnv.step`` would: the
last ```cuda block (or the whole text) is the candidate, any ptxgym evaluator judges it (by
default the Ray pool served on the cluster, ``ray://auto``: ``ptxgym serve``), the env's reward
function gives the reward and ``render_feedback`` the text the model reads next.

Matched against verl's own source: release 0.9.1 and main of 2026-08 (verl-project/verl,
formerly volcengine/verl), and v0.7.1 for interactions.

- :func:`compute_score` is the custom reward function that ``get_custom_reward_fn``
  (``verl/trainer/ppo/reward.py``) loads from ``reward.custom_reward_function`` (``path``:
  ``pkg://ptxgym.integrations.verl``, ``name``, ``reward_kwargs``: passed to it as keywords).
  The reward loop's ``NaiveRewardManager``
  (``verl/experimental/reward_loop/reward_manager/naive.py``) awaits it, as a coroutine
  function, with ``data_source``, ``solution_str``, ``ground_truth`` and ``extra_info``; of the
  dict it returns, ``score`` is the reward and every key goes to ``reward_extra_info``.
  :func:`compute_score_sync` is the same for reward managers that call it without awaiting.
- ``KernelTool`` is a ``verl.tools.base_tool.BaseTool``: ``ToolAgentLoop._call_tool``
  (``verl/experimental/agent_loop/tool_agent_loop.py``) calls ``create`` (with the sample's
  ``extra_info.tools_kwargs[<tool>].create_kwargs``), ``execute(instance_id, parameters,
  agent_data=...)`` -> (``ToolResponse``, step reward, metrics) and ``release`` once per tool
  call, so what a trajectory has done so far lives in ``agent_data.extra_fields``, which verl
  hands to the reward function as part of ``extra_info``. It is declared in the tool config
  that ``verl/tools/tool_registry.py`` (``verl/tools/utils/`` before 0.8) reads
  (``examples/verl/`` has one).
- ``KernelInteraction`` is a ``verl.interactions.base.BaseInteraction``
  (``start_interaction``, ``generate_response`` -> (terminate, response, turn score, extra),
  ``calculate_score``, ``finalize_interaction``), as verl 0.7's ``ToolAgentLoop`` drives it
  from the interaction config read by ``verl/interactions/utils/interaction_registry.py``.
  verl removed interactions in 0.8.0 (verl-project/verl#6074); from then on, use ``KernelTool``.

verl itself is imported only when ``KernelTool`` or ``KernelInteraction`` is looked up (verl's
registries import the class by name, which builds it on verl's base class then); the reward
function needs no verl at all.
"""

from __future__ import annotations

import asyncio
import importlib
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ptxgym.evaluate.evaluator import Evaluator, make_evaluator
from ptxgym.feedback import render_feedback
from ptxgym.languages import get_language
from ptxgym.outcome import Outcome, Status
from ptxgym.prompt import build_prompt
from ptxgym.reward import Reward, resolve_reward
from ptxgym.tasks import Task, get_task

DATA_SOURCE = "ptxgym"
"""The ``data_source`` of the rows :func:`dataset_row` makes."""
DEFAULT_EVALUATOR = "ray://auto"
"""The pool served on the cluster under the default name (``ptxgym serve``)."""
TOOL_NAME = "submit_kernel"
"""The tool's name unless its config gives a schema with another."""
INTERACTION_NAME = "ptxgym"
"""The interaction's name in :func:`dataset_row`'s ``interaction_kwargs``."""
_BEST_KEY = "ptxgym_best"  # the tool's record of a trajectory's best turn, in extra_fields
_TURNS_KEY = "ptxgym_turns"  # the tool's count of a trajectory's turns, in extra_fields
# Interactions verl never finalizes (its loops end a trajectory without telling them) are
# dropped oldest first beyond this many.
_MAX_OPEN_EPISODES = 4096


@dataclass(frozen=True)
class ScoredReply:
    """One model reply, evaluated and rewarded as ``PTXKernelEnv.step`` would."""

    task: Task
    outcome: Outcome
    reward: Reward
    feedback: str

    def extra_info(self) -> dict[str, float | str]:
        """Scalars for verl's ``reward_extra_info`` (the same keys for every sample)."""
        outcome = self.outcome
        return {
            "score": self.reward.total,
            "status": outcome.status.value,
            "compiled": float(outcome.status.compiled),
            "correct": float(outcome.status.correct),
            "qualified": float(outcome.qualified is True),
            "speedup": float(outcome.speedup or 0.0),
            **{f"reward_{name}": value for name, value in self.reward.components.items()},
        }


_evaluators: dict[tuple[str, str], Evaluator] = {}
_evaluators_lock = threading.Lock()


def shared_evaluator(spec: str | Evaluator, task: Task) -> Evaluator:
    """The evaluator ``spec`` names, made once per process (verl's workers live for the whole
    run, and a Ray pool's client is worth keeping), or ``spec`` itself when it is one."""
    if not isinstance(spec, str):
        return spec
    # "auto" depends on the task's GPU; the other names do not.
    key = (spec, task.gpu if spec == "auto" else "")
    with _evaluators_lock:
        if key not in _evaluators:
            _evaluators[key] = make_evaluator(spec, task)
        return _evaluators[key]


def _format_error(task: Task, message: str, started: float) -> Outcome:
    return Outcome(
        task_id=task.id,
        status=Status.FORMAT_ERROR,
        message=message,
        evaluator="none",
        seconds=time.perf_counter() - started,
    )


def _scored(task: Task, outcome: Outcome, reward: str) -> ScoredReply:
    return ScoredReply(
        task, outcome, resolve_reward(reward)(outcome), render_feedback(outcome, task)
    )


async def score_reply_async(
    task: Task, reply: str, evaluator: str | Evaluator = DEFAULT_EVALUATOR, reward: str = "ladder"
) -> ScoredReply:
    """Evaluate and reward ``reply`` (a model's text, or a bare source) for ``task``, without
    blocking the event loop (an evaluator without ``evaluate_async`` runs in a thread)."""
    started = time.perf_counter()
    extraction = get_language().extract(reply)
    if extraction.source is None:
        outcome = _format_error(task, extraction.error or "no source", started)
    else:
        chosen = shared_evaluator(evaluator, task)
        evaluate_async = getattr(chosen, "evaluate_async", None)
        if evaluate_async is not None:
            outcome = await evaluate_async(task, extraction.source)
        else:
            outcome = await asyncio.to_thread(chosen.evaluate, task, extraction.source)
    return _scored(task, outcome, reward)


def score_reply(
    task: Task, reply: str, evaluator: str | Evaluator = DEFAULT_EVALUATOR, reward: str = "ladder"
) -> ScoredReply:
    """:func:`score_reply_async`, blocking."""
    started = time.perf_counter()
    extraction = get_language().extract(reply)
    if extraction.source is None:
        outcome = _format_error(task, extraction.error or "no source", started)
    else:
        outcome = shared_evaluator(evaluator, task).evaluate(task, extraction.source)
    return _scored(task, outcome, reward)


def _task_of(ground_truth: Any, extra_info: Mapping[str, Any] | None) -> Task:
    """The sample's task: ``extra_info["task_id"]``, else the ground truth (the task id, in
    :func:`dataset_row`'s rows)."""
    task_id = (extra_info or {}).get("task_id") or ground_truth
    if not isinstance(task_id, str):
        raise ValueError(f"a ptxgym sample names its task id as ground truth, not {task_id!r}")
    return get_task(task_id)


async def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    *,
    evaluator: str = DEFAULT_EVALUATOR,
    reward: str = "ladder",
    **_: Any,
) -> dict[str, float | str]:
    """verl's custom reward function: the env's reward for the kernel in ``solution_str``, with
    the outcome's scalars as extra info. ``evaluator`` and ``reward`` come from the config's
    ``reward_kwargs``; other keywords verl passes (a reward router's address) are not used.

    A multi-turn trajectory that submitted kernels through ``KernelTool`` was scored turn by
    turn already: its best turn is its score, and nothing is evaluated again.
    """
    if extra_info is not None and isinstance(best := extra_info.get(_BEST_KEY), Mapping):
        return dict(best)
    task = _task_of(ground_truth, extra_info)
    return (await score_reply_async(task, solution_str, evaluator, reward)).extra_info()


def compute_score_sync(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    *,
    evaluator: str = DEFAULT_EVALUATOR,
    reward: str = "ladder",
    **_: Any,
) -> dict[str, float | str]:
    """:func:`compute_score` for reward managers that call the function without awaiting it
    (``verl/workers/reward_manager/naive.py``)."""
    if extra_info is not None and isinstance(best := extra_info.get(_BEST_KEY), Mapping):
        return dict(best)
    task = _task_of(ground_truth, extra_info)
    return score_reply(task, solution_str, evaluator, reward).extra_info()


def dataset_row(
    task_id: str, *, index: int = 0, variant: int = 0, knowledge: str = "full"
) -> dict[str, Any]:
    """One row of a verl RL dataset (write a list of them to parquet) for ``task_id``: the
    prompt as a chat, the task id as ground truth, and the kwargs that ``KernelTool`` and
    ``KernelInteraction`` read, so the same rows serve one-turn and multi-turn training."""
    task = get_task(task_id)
    prompt = build_prompt(task, variant=variant, knowledge=knowledge)
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": prompt.text}],
        "ability": "cuda",
        "reward_model": {"style": "rule", "ground_truth": task.id},
        "extra_info": {
            "index": index,
            "task_id": task.id,
            "tools_kwargs": {TOOL_NAME: {"create_kwargs": {"task_id": task.id}}},
            "interaction_kwargs": {"name": INTERACTION_NAME, "task_id": task.id},
        },
    }


def _closing_line() -> str:
    """What ends the feedback while turns remain, as in the env's observations."""
    fence = get_language().fence
    return f"Write the next version of the kernel: reply with one ```{fence} block."


class InteractionLogic:
    """``KernelInteraction`` without verl's base class: one episode per ``instance_id``, each
    reply scored as an env step, the feedback as the next user message, the episode ended after
    the task's turns (or ``config["turns"]``). ``config``: ``evaluator`` (default
    ``ray://auto``), ``reward`` (``ladder``), ``turns``, and ``name`` (set by verl's registry)."""

    def __init__(self, config: dict[str, Any]) -> None:
        # What verl's BaseInteraction.__init__ sets.
        self.config = config
        self.name: str = config.get("name", INTERACTION_NAME)
        self.evaluator: str = config.get("evaluator", DEFAULT_EVALUATOR)
        self.reward: str = config.get("reward", "ladder")
        self.turns: int | None = config.get("turns")
        self._episodes: OrderedDict[str, _Episode] = OrderedDict()

    async def start_interaction(
        self, instance_id: str | None = None, task_id: str | None = None, **kwargs: Any
    ) -> str:
        if task_id is None:
            raise ValueError("a ptxgym interaction needs interaction_kwargs.task_id")
        instance_id = instance_id or _new_id()
        task = get_task(task_id)
        self._episodes[instance_id] = _Episode(task, self.turns or task.turns)
        while len(self._episodes) > _MAX_OPEN_EPISODES:
            self._episodes.popitem(last=False)
        return instance_id

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        episode = self._episodes[instance_id]
        reply = next(
            (
                str(m.get("content") or "")
                for m in reversed(messages)
                if m.get("role") == "assistant"
            ),
            "",
        )
        scored = await score_reply_async(episode.task, reply, self.evaluator, self.reward)
        episode.turn += 1
        episode.best = max(episode.best, scored.reward.total)
        done = episode.turn >= episode.turns
        response = scored.feedback if done else f"{scored.feedback}\n\n{_closing_line()}"
        if done:  # verl does not always finalize: the episode is over, so it goes now
            self._episodes.pop(instance_id, None)
        return done, response, scored.reward.total, scored.extra_info()

    async def calculate_score(self, instance_id: str | None = None, **kwargs: Any) -> float:
        """The episode's best turn reward so far (0 for an episode unknown or over)."""
        episode = self._episodes.get(instance_id or "")
        return episode.best if episode is not None else 0.0

    async def finalize_interaction(self, instance_id: str | None = None, **kwargs: Any) -> None:
        self._episodes.pop(instance_id or "", None)


@dataclass
class _Episode:
    task: Task
    turns: int
    turn: int = 0
    best: float = 0.0


def _new_id() -> str:
    return uuid.uuid4().hex


def _verl_schemas() -> Any:
    """verl's tool records (``ToolResponse``, ``OpenAIFunctionToolSchema``)."""
    return importlib.import_module("verl.tools.schemas")


class ToolLogic:
    """``KernelTool`` without verl's base class: the model calls the tool with its kernel
    (``{"source": "..."}``); the answer is the env's feedback and the step reward is the env's.
    The trajectory's turn count and best turn live in ``agent_data.extra_fields``, since verl
    makes a tool instance per call. ``config``: ``evaluator``, ``reward``, ``turns`` (after
    that many submissions the answer says no more are scored and the reward is 0)."""

    def __init__(self, config: dict[str, Any], tool_schema: Any = None) -> None:
        # What verl's BaseTool.__init__ sets (without printing the schema).
        self.config = config
        self.tool_schema = tool_schema or self.get_openai_tool_schema()
        self.name: str = self.tool_schema.function.name
        self.evaluator: str = config.get("evaluator", DEFAULT_EVALUATOR)
        self.reward: str = config.get("reward", "ladder")
        self.turns: int | None = config.get("turns")
        self._tasks: dict[str, Task] = {}

    def get_openai_tool_schema(self) -> Any:
        return _verl_schemas().OpenAIFunctionToolSchema.model_validate(tool_schema())

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, Any]:
        task_id = (kwargs.get("create_kwargs") or {}).get("task_id") or kwargs.get("task_id")
        if task_id is None:
            raise ValueError(
                f"the {self.name} tool needs extra_info.tools_kwargs.{self.name}.create_kwargs."
                "task_id"
            )
        instance_id = instance_id or _new_id()
        self._tasks[instance_id] = get_task(task_id)
        return instance_id, _verl_schemas().ToolResponse()

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[Any, float, dict[str, Any]]:
        response = _verl_schemas().ToolResponse
        task = self._tasks[instance_id]
        agent_data = kwargs.get("agent_data")
        fields: dict[str, Any] = agent_data.extra_fields if agent_data is not None else {}
        turn = int(fields.get(_TURNS_KEY, 0)) + 1
        fields[_TURNS_KEY] = turn
        limit = self.turns or task.turns
        if turn > limit:
            return response(text=f"No more submissions are scored ({limit} were)."), 0.0, {}
        scored = await score_reply_async(
            task, str(parameters.get("source", "")), self.evaluator, self.reward
        )
        info = scored.extra_info()
        best = fields.get(_BEST_KEY)
        if not isinstance(best, Mapping) or float(best["score"]) < scored.reward.total:
            fields[_BEST_KEY] = info
        text = scored.feedback if turn >= limit else f"{scored.feedback}\n\n{_closing_line()}"
        return response(text=text), scored.reward.total, info

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """Rewards are per call (``execute``); the trajectory's is the reward function's."""
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self._tasks.pop(instance_id, None)


def tool_schema(name: str = TOOL_NAME) -> dict[str, Any]:
    """The tool's OpenAI function schema (what the tool config's ``tool_schema`` holds)."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": (
                "Submit the complete CUDA translation unit of your kernel. It is checked, "
                "compiled, run, verified and timed; the answer is the evaluation's feedback."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "source": {
                        "type": "string",
                        "description": "the whole .cu file, with the exact entry point",
                    }
                },
                "required": ["source"],
            },
        },
    }


_built: dict[str, type] = {}


def _verl_class(name: str) -> type:
    """``KernelTool`` or ``KernelInteraction``: the logic above on verl's base class, made on
    first use (so that importing this module needs no verl) and the same class after."""
    if name in _built:
        return _built[name]
    logic: type
    if name == "KernelTool":
        module, base_name, logic = "verl.tools.base_tool", "BaseTool", ToolLogic
        needs = "verl"
    else:
        module, base_name, logic = "verl.interactions.base", "BaseInteraction", InteractionLogic
        needs = "verl<=0.7.1 (0.8 removed interactions; use KernelTool)"
    try:
        base = getattr(importlib.import_module(module), base_name)
    except ImportError as exc:
        raise ImportError(f"ptxgym.integrations.verl.{name} needs {needs}: {exc}") from exc
    built = type(name, (logic, base), {"__module__": __name__, "__doc__": logic.__doc__})
    _built[name] = built
    return built


def __getattr__(name: str) -> Any:
    if name in ("KernelTool", "KernelInteraction"):
        return _verl_class(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
