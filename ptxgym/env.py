"""The Gymnasium environment: thin glue over the stages of a step."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, SupportsFloat

import gymnasium as gym

from ptxgym.evaluate.evaluator import Evaluator, make_evaluator
from ptxgym.feedback import render_feedback, render_turn
from ptxgym.languages import DEFAULT_LANGUAGE, MAX_ACTION_CHARS, get_language
from ptxgym.outcome import Outcome, Status
from ptxgym.prompt import PROMPT_VARIANTS, build_prompt
from ptxgym.reward import RewardFunction, resolve_reward
from ptxgym.spaces import SourceText
from ptxgym.tasks import get_task
from ptxgym.tasks.packs import KNOWLEDGE_LEVELS

HISTORY_MODES = ("full", "feedback-only")
MAX_OBSERVATION_CHARS = 4_000_000


class PTXKernelEnv(gym.Env[str, str]):
    """Write a fast GPU kernel with architecture-specific PTX, over several turns.

    ## Description

    Each registered id (``PTX-{GPU}-{Op}[-d{D}]``, see ``ptxgym list``) pairs a library operator
    (cuBLAS GEMM, cuDNN attention, FlashInfer GQA) and a fixed workload with a GPU target and
    the architecture-specific instructions the kernel must execute (Hopper: wgmma or TMA;
    Blackwell: tcgen05 MMA with tensor-memory readback, or TMA). The agent writes a CUDA C++
    translation unit with a C entry point (or, with ``language="triton"``, a Python module of
    Triton kernels with an entry function over torch tensors); each step compiles it, evaluates
    it, and returns feedback for the next attempt.

    ## Action Space

    ``SourceText``: any ``str`` — a CUDA source, or a model reply holding one; the last
    ```cuda (or c/c++) block is taken (for Triton: a module, or the last ```python block). A
    non-``str`` action raises ``TypeError``. Bad text
    (empty, no code, over 2,000,000 characters, invalid UTF-8, binary) ends the step with
    ``FORMAT_ERROR`` and feedback; the episode goes on.

    ## Observation Space

    ``SourceText``: a ``str`` of at most 4,000,000 characters. After ``reset`` it is the prompt
    (task, exact C signature and layouts, target and required instructions, evaluation
    protocol, output format, knowledge pack). After each step it is the prompt followed by
    every turn so far: the submitted kernel (with ``history="full"``) and its feedback.

    ## Rewards

    ``reward="ladder"`` (default): compiled 0.1, ran 0.1, correct 0.3, correct and executing
    the target instructions 0.3, plus up to 0.2 for speed (0 at half the baseline's speed, 0.1
    at parity, 0.2 at 2x or more); total in [0, 1]. ``"binary"``: 1 for correct and qualified.
    Or any callable ``Outcome -> float | Reward``. Components are in ``info["reward_components"]``;
    see docs/reward.md.

    ## Starting State

    The prompt for the chosen ``prompt_variant`` and ``knowledge`` level; ``reset`` takes no
    randomness from its seed (evaluation inputs are drawn fresh by the evaluator).

    ## Episode End

    The episode is truncated after ``turns`` steps (``max_episode_steps`` of the registered
    spec, 8 by default); it never terminates early, since a correct kernel can still be made
    faster.

    ## Info

    ``status``, ``message``, ``turn``, ``source`` (the extracted kernel or None),
    ``feedback``, ``reward_components`` and ``outcome`` (the full structured record: compile
    log and kernel resources, latencies, speedup, qualification).

    ## Arguments

    - ``task_id``: a registered id (set by ``gym.make``).
    - ``turns``: steps per episode (default: the task's, 8). With ``gym.make`` pass
      ``max_episode_steps`` too if you raise it.
    - ``prompt_variant``: 0, 1 or 2.
    - ``knowledge``: ``none``, ``params``, ``params+wrappers``, ``params+wrappers+contracts`` or
      ``full``.
    - ``history``: ``full`` (kernels and feedback) or ``feedback-only``.
    - ``reward``: a name (``ladder``, ``binary``) or a callable.
    - ``evaluator``: ``auto`` (the local GPU when it matches the task, else compile-only),
      ``gpu``, ``compile-only``, or an :class:`~ptxgym.evaluate.evaluator.Evaluator` (made for
      the same ``language``).
    - ``render_mode``: ``ansi`` or ``human``.
    - ``language``: the action language, ``cuda`` (default) or ``triton`` (docs/triton.md):
      the prompt's contract and rules, the extraction, the static policy and the build all
      follow it.

    ## Registered Configurations

    30 ids: ``PTX-{H100,B200}-GEMM``;
    ``PTX-{H100,B200}-MHA{Fwd,FwdCausal,Bwd,BwdCausal}-d{64,96,128}``;
    ``PTX-{H100,B200}-GQADecode`` and ``PTX-{H100,B200}-GQAPrefill``.
    """

    # Frames are turns, which come as fast as the evaluator finishes them; Gymnasium asks for a
    # positive rate whenever render modes are declared, and nothing here plays frames back.
    metadata = {"render_modes": ["ansi", "human"], "render_fps": 1}  # noqa: RUF012

    def __init__(
        self,
        task_id: str,
        turns: int | None = None,
        prompt_variant: int = 0,
        knowledge: str = "full",
        history: str = "full",
        reward: str | RewardFunction = "ladder",
        evaluator: str | Evaluator = "auto",
        render_mode: str | None = None,
        language: str = DEFAULT_LANGUAGE,
    ) -> None:
        self.task = get_task(task_id)
        self.turns = self.task.turns if turns is None else turns
        if not isinstance(self.turns, int) or self.turns < 1:
            raise ValueError(f"turns must be a positive int, not {turns!r}")
        if prompt_variant not in PROMPT_VARIANTS:
            raise ValueError(f"prompt_variant must be one of {PROMPT_VARIANTS}")
        if knowledge not in KNOWLEDGE_LEVELS:
            raise ValueError(f"knowledge must be one of {KNOWLEDGE_LEVELS}, not {knowledge!r}")
        if history not in HISTORY_MODES:
            raise ValueError(f"history must be one of {HISTORY_MODES}, not {history!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}")
        self.prompt_variant = prompt_variant
        self.knowledge = knowledge
        self.history = history
        self.render_mode = render_mode
        self.reward_function = resolve_reward(reward)
        # Built on the first step, not here: vector envs construct a throwaway env in the parent
        # process, which must not start GPU workers.
        self._evaluator_spec = evaluator
        self._evaluator: Evaluator | None = None
        self.language = get_language(language)
        if not isinstance(evaluator, str):
            make_evaluator(evaluator, self.task, language)  # made for another language: refused
        self.prompt = build_prompt(
            self.task, variant=prompt_variant, knowledge=knowledge, language=self.language.name
        )
        # The line that ends the observation while turns remain (and each user message of
        # ptxgym.wrappers.ChatMessages).
        self.closing = (
            f"Write the next version of the kernel: reply with one ```{self.language.fence} block."
        )
        self.observation_space = SourceText(MAX_OBSERVATION_CHARS)
        self.action_space = SourceText(MAX_ACTION_CHARS)
        self._turn = 0
        self._records: list[str] = []
        self._observation = self.prompt.text

    @property
    def evaluator(self) -> Evaluator:
        if self._evaluator is None:
            self._evaluator = make_evaluator(self._evaluator_spec, self.task, self.language.name)
        return self._evaluator

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self._turn = 0
        self._records = []
        self._observation = self.prompt.text
        spec_limit = self.spec.max_episode_steps if self.spec is not None else None
        if spec_limit is not None and spec_limit < self.turns:
            gym.logger.warn(
                f"turns={self.turns} but the TimeLimit wrapper stops at {spec_limit}; pass "
                f"max_episode_steps={self.turns} to gym.make"
            )
        info = {
            "task_id": self.task.id,
            "turn": 0,
            "turns": self.turns,
            "prompt_tokens": self.prompt.tokens(),
        }
        return self._observation, info

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        if not isinstance(action, str):
            raise TypeError(
                f"the action must be a str ({self.language.name} source or a model reply), "
                f"not {type(action).__name__}"
            )
        if self._turn >= self.turns:
            raise RuntimeError("the episode is over: call reset() before step()")
        started = time.perf_counter()
        self._turn += 1
        extraction = self.language.extract(action)
        if extraction.source is None:
            outcome = Outcome(
                task_id=self.task.id,
                status=Status.FORMAT_ERROR,
                message=extraction.error or "no source",
                evaluator="none",
                seconds=time.perf_counter() - started,
            )
        else:
            outcome = self.evaluator.evaluate(self.task, extraction.source)
        reward = self.reward_function(outcome)
        feedback = render_feedback(outcome, self.task)
        shown = extraction.source if self.history == "full" else None
        self._records.append(render_turn(self._turn, shown, feedback))
        self._observation = self._compose_observation()
        truncated = self._turn >= self.turns
        info = {
            "task_id": self.task.id,
            "turn": self._turn,
            "status": outcome.status.value,
            "message": outcome.message,
            "source": extraction.source,
            "feedback": feedback,
            "reward_components": reward.components,
            "outcome": outcome.to_dict(),
        }
        if self.render_mode == "human":
            self.render()
        return self._observation, reward.total, False, truncated, info

    def resume(self, history: Sequence[tuple[str | None, str]]) -> str:
        """Restore an episode from recorded turns, without evaluating them again.

        ``history`` holds each finished turn's extracted source (``None`` when there was none)
        and its feedback text, in order. Call right after ``reset``. Returns the observation the
        agent saw after the last of those turns, so an interrupted run can go on where it was.
        """
        if self._turn != 0:
            raise RuntimeError("resume() must follow reset()")
        if len(history) > self.turns:
            raise ValueError(f"{len(history)} recorded turns, but the episode has {self.turns}")
        for source, feedback in history:
            self._turn += 1
            shown = source if self.history == "full" else None
            self._records.append(render_turn(self._turn, shown, feedback))
        self._observation = self._compose_observation()
        return self._observation

    def _compose_observation(self) -> str:
        closing = [] if self._turn >= self.turns else [self.closing]
        parts = [self.prompt.text, *self._records, *closing]
        text = "\n\n".join(parts)
        if len(text) > MAX_OBSERVATION_CHARS:
            # Keep the prompt and the latest turns; older turns are elided, newest kept whole.
            kept: list[str] = []
            budget = MAX_OBSERVATION_CHARS - len(self.prompt.text) - 200
            for record in reversed(self._records):
                if len(record) + 2 > budget:
                    break
                kept.insert(0, record)
                budget -= len(record) + 2
            elided = len(self._records) - len(kept)
            note = f"({elided} earlier turns omitted: the observation limit was reached)"
            text = "\n\n".join([self.prompt.text, note, *kept, *closing])
        return text[:MAX_OBSERVATION_CHARS]

    def render(self) -> str | None:
        """The latest turn (``ansi`` returns it, ``human`` prints it); before the first step,
        one line about the episode, since the prompt itself runs to 100,000+ characters and is
        the observation already."""
        latest = self._records[-1] if self._records else self._episode_header()
        if self.render_mode == "ansi":
            return latest
        if self.render_mode == "human":
            print(latest)
        return None

    def _episode_header(self) -> str:
        return (
            f"{self.task.id}: turn {self._turn} of {self.turns}; the prompt "
            f"({len(self.prompt.text):,} characters) is the observation"
        )

    def close(self) -> None:
        if self._evaluator is not None and self._evaluator is not self._evaluator_spec:
            self._evaluator.close()
        self._evaluator = None
        super().close()
