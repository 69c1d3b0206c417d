"""Outcome → the feedback text a model reads, and the turn records of later observations."""

from __future__ import annotations

from ptxgym.compiler import CompileResult
from ptxgym.outcome import Outcome, Status
from ptxgym.tasks import Task

_NEXT_STEP = {
    Status.FORMAT_ERROR: "Reply with the complete kernel source in one ```cuda block.",
    Status.POLICY_VIOLATION: "Remove what the rules forbid; write that part yourself.",
    Status.COMPILE_ERROR: "Fix the errors above; line numbers refer to your source.",
    Status.COMPILED: (
        "The kernel was built but not run (compile-only evaluation): correctness, speed and "
        "instruction execution were not measured."
    ),
    Status.RUNTIME_ERROR: "Check launch configuration, indexing and the CUDA error above.",
    Status.TIMEOUT: "The kernel did not finish in time: look for a hang or a deadlock.",
    Status.MEMORY_ERROR: "Fix the out-of-bounds or misaligned access reported above.",
    Status.INCORRECT_SHAPE: "Write outputs with exactly the stated shapes.",
    Status.INCORRECT_DTYPE: "Write outputs with exactly the stated dtypes.",
    Status.INCORRECT_NUMERICAL: "Fix the numerical error: compare your indexing and math.",
    Status.PASSED: "Correct. Make it faster while keeping it correct.",
}


def render_feedback(outcome: Outcome, task: Task) -> str:
    """The feedback for one step: status, the useful part of any log, measurements, next step."""
    lines = [f"Status: {outcome.status.value}: {outcome.message}"]
    build = outcome.compile
    if build is not None and build.log and not build.ok:
        lines += ["", "Compiler output:", "```text", build.log, "```"]
    if build is not None and build.ok:
        lines += _resources(build)
    if outcome.latency_ms is not None:
        lines.append(f"Latency: {outcome.latency_ms:.4f} ms")
    if outcome.baseline_latency_ms is not None:
        lines.append(f"Baseline ({task.callables.baseline}): {outcome.baseline_latency_ms:.4f} ms")
    if outcome.speedup is not None:
        lines.append(f"Speedup: {outcome.speedup:.3f}x")
    if outcome.status.correct:
        qualified = {True: "yes", False: "no", None: "unknown (not profiled)"}[outcome.qualified]
        lines.append(f"Target instructions executed: {qualified}")
    lines += ["", _NEXT_STEP[outcome.status]]
    return "\n".join(lines)


def _resources(build: CompileResult) -> list[str]:
    cached = " (cached build)" if build.cached else ""
    lines = ["", f"Build: {build.arch}, {build.seconds:.1f} s{cached}."]
    if build.kernels:
        lines.append("Kernels (ptxas): registers, shared memory, stack, spills")
        for kernel in build.kernels:
            spills = kernel.spill_store_bytes + kernel.spill_load_bytes
            lines.append(
                f"- {kernel.name}: {kernel.registers} regs, {kernel.shared_bytes} B static smem, "
                f"{kernel.stack_bytes} B stack, {spills} B spilled"
                + (" (spills cost local-memory traffic)" if spills else "")
            )
    else:
        lines.append("No __global__ kernel was compiled: the entry point must launch one.")
    if build.warnings:
        lines += ["Warnings:", *(f"- {w}" for w in build.warnings[:6])]
    return lines


def render_turn(turn: int, source: str | None, feedback: str) -> str:
    """One turn as shown in later observations: the submitted kernel (if shown) and feedback."""
    parts = [f"## Turn {turn}"]
    if source is not None:
        parts += ["", "Your kernel:", "", f"```cuda\n{source.rstrip()}\n```"]
    parts += ["", "Feedback:", "", feedback]
    return "\n".join(parts)
