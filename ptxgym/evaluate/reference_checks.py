"""The judge's checks of a worker's outputs: copied to the GPU and compared with the references.

A conversation (``ptxgym.evaluate.conversation``) hands each set of outputs the worker sends to
``ReferenceChecks``: a correctness stage's are compared with the references of the workload's
state (``ptxgym.evaluate.workload_state``), a timed call's with references the judge makes then
from its own seed for that call, which the worker never sees. The comparison is the judge's,
never the worker's: workers are hostile by assumption, and one that dies, hangs or breaks its
CUDA context costs only itself. When the GPU has no memory left to check the outputs with (the
worker holds it), the checks raise ``CheckUnavailable``: the candidate's doing, a runtime error.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, Protocol

from ptxgym.evaluate.conversation import CheckUnavailable
from ptxgym.evaluate.correctness import check_outputs
from ptxgym.evaluate.worker import make_inputs, resolve_callable
from ptxgym.evaluate.workload_state import TimingPlan, WorkloadState
from ptxgym.outcome import CheckReport
from ptxgym.tasks import Task


class JudgeGPU(Protocol):
    """What of the judge (``ptxgym.evaluate.judge.Judge``) the checks use: its torch, and where
    the calling thread's comparisons run. A protocol, so that this module needs no import of the
    judge's."""

    torch: Any

    def check_stream(self) -> contextlib.AbstractContextManager[object]: ...


class ReferenceChecks:
    """The judge's checks: a worker's outputs copied to the GPU and compared with the
    references, a stage's from its workload state, a timed call's made from the judge's seed
    for that call."""

    def __init__(
        self,
        judge: JudgeGPU,
        task: Task,
        states: list[WorkloadState],
        plans: dict[str, TimingPlan],
    ) -> None:
        self.judge = judge
        self.task = task
        self.states = {state.spec.name: state for state in states}
        self.plans = plans
        # The judge's own seconds in the correctness stage's comparisons (outputs copied to the
        # GPU and compared): beside the worker's calls, what the stage's length is made of.
        self.compare_seconds = 0.0

    def stage(self, workload: str, stage: str, outputs: dict[str, Any]) -> CheckReport:
        state = self.states[workload]
        checked = next(s for s in state.stages if s.name == stage)
        started = time.perf_counter()
        try:
            return self._compare(
                state, stage, outputs, lambda: checked.references, outliers=checked.outliers
            )
        finally:
            self.compare_seconds += time.perf_counter() - started

    def timed_call(self, workload: str, call: int, outputs: dict[str, Any]) -> CheckReport:
        state = self.states[workload]
        seed = self.plans[workload].seed + call
        return self._compare(
            state,
            f"timed call {call}",
            outputs,
            lambda: _timed_references(self.task, state, seed),
        )

    def _compare(
        self,
        state: WorkloadState,
        label: str,
        outputs: dict[str, Any],
        references: Callable[[], dict[str, Any]],
        *,
        outliers: bool = False,
    ) -> CheckReport:
        try:
            # Read back once per output (check_outputs), which syncs the stream: all of this
            # is done before the arena is wiped or the references freed.
            with self.judge.check_stream():
                on_gpu = {name: tensor.to("cuda") for name, tensor in outputs.items()}
                axes = self.task.axis_values(state.spec)
                return check_outputs(
                    self.task,
                    label,
                    state.spec.name,
                    axes,
                    on_gpu,
                    references(),
                    outliers=outliers,
                )
        except self.judge.torch.cuda.OutOfMemoryError:
            raise CheckUnavailable(
                f"the GPU ran out of memory while its outputs were checked "
                f"({state.spec.name}/{label}): the process running the kernel holds too much "
                "device memory"
            ) from None


def _timed_references(task: Task, state: WorkloadState, seed: int) -> dict[str, Any]:
    """The references for one timed call's inputs (made from the judge's own seed)."""
    reference = resolve_callable(task.callables.reference)
    inputs = make_inputs(task, state.spec.payload(), seed, False)
    references: dict[str, Any] = reference(inputs, **task.callables.params)
    return references
