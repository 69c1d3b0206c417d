"""The first stage of every evaluator: the static policy, then the build.

The policy runs before anything compiles the source (the evaluator is the trust boundary). A
candidate that stops here gets its final outcome; one that builds goes on to be run.
"""

from __future__ import annotations

import time

from ptxgym.build.result import CompileResult
from ptxgym.languages import ActionLanguage, get_language
from ptxgym.outcome import Outcome, Status
from ptxgym.tasks import Task


def build_candidate(
    task: Task, source: str, compile_timeout_s: float, language: ActionLanguage | None = None
) -> tuple[Outcome | None, CompileResult | None]:
    """Policy check and build of ``source`` in ``language`` (the default language when
    ``None``), shared by every evaluator.

    Returns a final outcome when the candidate stops here, else the successful build.
    """
    started = time.perf_counter()
    language = language or get_language()
    policy = language.check_policy(source, task)
    if not policy.ok:
        outcome = Outcome(
            task_id=task.id,
            status=Status.POLICY_VIOLATION,
            message="the source breaks the rules:\n"
            + "\n".join(f"- {violation}" for violation in policy.violations),
            evaluator="policy",
            seconds=time.perf_counter() - started,
        )
        return outcome, None
    build = language.build(source, task, timeout_s=compile_timeout_s)
    if build.policy_violation is not None:
        outcome = Outcome(
            task_id=task.id,
            status=Status.POLICY_VIOLATION,
            message=f"the build breaks the rules: {build.policy_violation}",
            evaluator="policy",
            compile=build,
            seconds=time.perf_counter() - started,
        )
        return outcome, build
    if not build.ok:
        message = "compile timed out" if build.timed_out else "compilation failed"
        outcome = Outcome(
            task_id=task.id,
            status=Status.COMPILE_ERROR,
            message=message,
            evaluator="compiler",
            compile=build,
            seconds=time.perf_counter() - started,
        )
        return outcome, build
    return None, build
