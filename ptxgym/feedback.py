"""Outcome → the feedback text a model reads, and the turn records of later observations."""

from __future__ import annotations

import re
from collections import Counter

from ptxgym.build.result import CompileResult
from ptxgym.build.sass import SassInventory, matches_any, matching_count
from ptxgym.outcome import CheckReport, KernelFacts, Outcome, SanitizerReport, SpeedOfLight, Status
from ptxgym.tasks import Task

_NEXT_STEP = {
    Status.FORMAT_ERROR: "Reply with the complete kernel source in one ```cuda block.",
    Status.POLICY_VIOLATION: (
        "Change what the messages above name; the prompt's rules say what is allowed."
    ),
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
        lines += _resources(build, task)
    if outcome.checks and not outcome.checks[-1].ok:
        lines += _mismatches(outcome.checks[-1])
    if outcome.worker_log:
        lines += [
            "",
            "Output of the process that ran the kernel (last lines):",
            "```text",
            outcome.worker_log,
            "```",
        ]
    if outcome.sanitizers:
        lines += _memory_safety(outcome.sanitizers, _covered(outcome))
    if outcome.timings:
        lines += ["", f"Timing ({outcome.timings[0].method}), per workload:"]
        for timing in outcome.timings:
            lines.append(
                f"- {timing.workload}: {timing.latency_ms:.4f} ms, baseline "
                f"{timing.baseline_latency_ms:.4f} ms, speedup {timing.speedup:.3f}x"
            )
    if outcome.latency_ms is not None and outcome.baseline_latency_ms is not None:
        lines.append(
            f"Total: {outcome.latency_ms:.4f} ms vs baseline ({task.callables.baseline}) "
            f"{outcome.baseline_latency_ms:.4f} ms"
        )
    if outcome.speedup is not None:
        lines.append(f"Speedup: {outcome.speedup:.3f}x")
    if outcome.speed_of_light is not None and not outcome.speed_of_light.fault:
        lines.append(speed_of_light_line(outcome.speed_of_light))
    if outcome.status.correct:
        lines += _qualification(outcome, task)
    advice = _policy_advice(outcome.message) if outcome.status is Status.POLICY_VIOLATION else []
    lines += ["", *(advice or [_NEXT_STEP[outcome.status]])]
    return "\n".join(lines)


def speed_of_light_line(bound: SpeedOfLight) -> str:
    """One line: what the kernel achieved against the GPU's peaks, and the roofline bound."""
    peaks = bound.peaks
    return (
        f"Speed of light on {peaks.device}: {bound.achieved_tflops:.1f} TFLOP/s "
        f"({bound.mfu:.0%} of the {peaks.tflops:.0f} TFLOP/s bf16 peak), "
        f"{bound.achieved_gbps:.0f} GB/s ({bound.bandwidth_use:.0%} of {peaks.dram_gbps:.0f} "
        f"GB/s); the {bound.limit}-bound floor is {bound.bound_ms:.4f} ms and this kernel takes "
        f"{bound.of_bound:.2f}x it."
    )


# Each kind of policy violation (ptxgym.languages.cuda.policy, and the build's own checks in
# ptxgym.languages.cuda.compiler), recognised by its wording, and what fixes it: "remove it" does
# not fix a missing entry point.
_POLICY_ADVICE: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"the entry point is missing"),
        'Add the entry point: a function with C linkage (extern "C"), exactly the signature '
        "above, that launches your kernel.",
    ),
    (
        re.compile(r"the source is [\d,]+ characters; the limit is"),
        "Shorten the source below the limit: drop unused code, generated tables and comments.",
    ),
    (
        re.compile(r"as to the compiler|trigraph|escape sequences"),
        "Write the flagged lines plainly, so that they read the same to the check as to the "
        "compiler.",
    ),
    (
        re.compile(r"may be included|never by path|not an allowed header|only quoted include"),
        "Include only the allowed headers, by name: the CUDA and C++ standard headers the rules "
        "list, and the knowledge pack's quoted header.",
    ),
    (
        re.compile(r"write the kernel yourself|the kernel must not use it"),
        "Remove the library and write that part yourself: the kernel must compute the result.",
    ),
    (
        re.compile(r"the host code calls"),
        "Keep host code to preparing and launching the kernel, with the CUDA runtime and the C "
        "library functions the rules allow.",
    ),
    (
        re.compile(r"loading libraries at run time"),
        "Remove the run-time loading: everything the kernel uses must be in your one source.",
    ),
    (
        re.compile(r"directive|#pragma|_Pragma|__has_embed|#embed|assembler|preprocessed source"),
        "Remove the directive, pragma or assembler construct named above; the rules list what "
        "is allowed.",
    ),
)


def _policy_advice(message: str) -> list[str]:
    """One piece of advice per kind of violation in ``message``, in order, each once."""
    advice: list[str] = []
    for line in message.splitlines():
        for pattern, text in _POLICY_ADVICE:
            if pattern.search(line) and text not in advice:
                advice.append(text)
                break
    return advice


def _qualification(outcome: Outcome, task: Task) -> list[str]:
    """Which target families executed, how often, and why a correct kernel did not qualify."""
    profile = outcome.profile
    if not task.instructions_required:
        return [
            "",
            "Performance task: no target instruction family is required; only speed counts.",
            *(_profiler_facts(profile.kernels) if profile is not None and profile.ok else []),
        ]
    if profile is None:
        return ["Target instructions executed: unknown (not profiled); unknown never qualifies."]
    if not profile.ok:
        return [
            f"Target instructions executed: unknown ({profile.reason}); unknown never qualifies."
        ]
    sass = outcome.compile.sass if outcome.compile is not None else None
    in_sass = sass.families_present if sass is not None and sass.error is None else {}
    lines = [
        "",
        f"Target instructions ({_COUNTED_BY.get(profile.method, profile.method)}: executed, "
        f"predicated-on threads / warps{_covered(outcome)}):",
    ]
    if profile.note:
        lines.append(f"({profile.note})")
    if profile.audit:
        lines.append(f"(Nsight Compute's audit of these counts: {profile.audit})")
    for key, family in task.target.instruction_families.items():
        patterns = [pattern for group in family.all_of for pattern in group]
        if profile.families.get(key):
            counts = ", ".join(
                f"{opcode} {count:,} / {profile.warp_counts.get(opcode, 0):,}"
                for opcode, count in sorted(profile.thread_counts.items())
                if count > 0 and matches_any(opcode, patterns)
            )
            lines.append(f"- {family.name}: executed ({counts})")
        elif in_sass.get(key):
            lines.append(f"- {family.name}: present in SASS but never executed")
        else:
            lines.append(f"- {family.name}: not executed (no {'/'.join(patterns)} in the code)")
    if profile.coverage is not None:
        short = profile.families.get("compute") and profile.coverage < profile.min_coverage
        lines.append(
            f"- work on {task.target.instruction_families['compute'].name}: "
            f"{profile.coverage:.1%} of the operator's FLOPs"
            + (
                f", below the {profile.min_coverage:.0%} it must do to qualify"
                if short
                else f" (it must do at least {profile.min_coverage:.0%} to qualify)"
            )
        )
    names = " or ".join(f.name for f in task.target.instruction_families.values())
    if outcome.qualified:
        lines.append("Qualified: yes.")
    else:
        lines.append(f"Qualified: no; a correct kernel qualifies by executing {names}.")
    return lines + _profiler_facts(profile.kernels)


_COUNTED_BY = {
    "ncu": "Nsight Compute",
    "cupti": "CUPTI SASS metrics",
    "sass": "the build's SASS",
}


def _profiler_facts(kernels: tuple[KernelFacts, ...]) -> list[str]:
    """Nsight Compute's summary of the longest kernels: where the time went and what limits it."""
    timed = sorted(kernels, key=lambda k: k.duration_us or 0.0, reverse=True)[:2]
    if not timed:
        return []
    lines = ["", "Profiler (Nsight Compute, one call; percentages are of the GPU's peak):"]
    for kernel in timed:
        facts = [
            f"{kernel.duration_us:.1f} us" if kernel.duration_us is not None else None,
            _percent("SM throughput", kernel.sm_throughput_pct),
            _percent("memory throughput", kernel.memory_throughput_pct),
            _percent("DRAM throughput", kernel.dram_throughput_pct),
            _percent("achieved occupancy", kernel.achieved_occupancy_pct),
            _percent("theoretical occupancy", kernel.theoretical_occupancy_pct),
            f"{kernel.registers_per_thread:.0f} registers/thread"
            if kernel.registers_per_thread is not None
            else None,
            f"grid {kernel.grid_size:.0f} x {kernel.block_size:.0f} threads"
            if kernel.grid_size is not None and kernel.block_size is not None
            else None,
        ]
        lines.append(f"- {kernel.name}: " + ", ".join(f for f in facts if f is not None))
    if len(kernels) > len(timed):
        lines.append(f"- ({len(kernels) - len(timed)} more launches)")
    return lines


def _percent(label: str, value: float | None) -> str | None:
    return f"{label} {value:.0f}%" if value is not None else None


def _covered(outcome: Outcome) -> str:
    """Which workload the tools' one call ran on, where the task has several."""
    if not outcome.tools_workload or len(outcome.timings) <= 1:
        return ""
    return f", on workload {outcome.tools_workload} only"


def _memory_safety(reports: tuple[SanitizerReport, ...], covered: str) -> list[str]:
    """What compute-sanitizer's tools said about one call of the kernel."""
    lines = ["", f"Memory safety (compute-sanitizer, one call of the kernel{covered}):"]
    for report in reports:
        if not report.ok:
            lines.append(f"- {report.tool}: unknown ({report.reason})")
        elif not report.errors:
            lines.append(f"- {report.tool}: no errors")
        else:
            plural = "s" if report.errors != 1 else ""
            lines.append(f"- {report.tool}: {report.errors} error{plural}; the first:")
            lines += ["```text", "\n\n".join(report.findings), "```"]
    return lines


def _mismatches(report: CheckReport) -> list[str]:
    lines = ["", f"Check {report.workload}/{report.stage}:"]
    for output in report.outputs:
        if output.ok:
            lines.append(f"- {output.name}: ok (max abs error {output.max_abs_error:.3g})")
            continue
        lines.append(
            f"- {output.name}: {output.detail}; max abs error {output.max_abs_error:.4g}, "
            f"max rel error {output.max_rel_error:.4g}, worst finite element "
            f"{output.worst_ratio:.3g}x its tolerance, {output.non_finite} NaN/Inf "
            "(outputs are NaN-poisoned before the call, so NaN often means never written)"
        )
        for worst in output.worst:
            lines.append(
                f"    {output.name}{list(worst.index)}: got {worst.got:.6g}, "
                f"expected {worst.expected:.6g}"
            )
    return lines


def _resources(build: CompileResult, task: Task) -> list[str]:
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
        if build.sass is not None and task.instructions_required:
            lines += _sass(build.sass, task)
    else:
        lines.append("No __global__ kernel was compiled: the entry point must launch one.")
    if build.warnings:
        lines += ["Warnings:", *(f"- {w}" for w in build.warnings[:6])]
    return lines


def _sass(inventory: SassInventory, task: Task) -> list[str]:
    """One line per target family: compiled into the SASS or not, and where."""
    if inventory.error is not None:
        return [f"In SASS: not inspected ({inventory.error})."]
    totals: Counter[str] = Counter()
    for kernel in inventory.kernels:
        totals.update(kernel.opcodes)
    lines = ["In SASS (static; presence alone does not qualify: the profile counts what executes):"]
    for key, family in task.target.instruction_families.items():
        label = f"{family.name} ({' and '.join('/'.join(g) for g in family.all_of)})"
        if inventory.families_present.get(key):
            patterns = [pattern for group in family.all_of for pattern in group]
            counts = [(k.name, matching_count(k.opcodes, patterns)) for k in inventory.kernels]
            where = ", ".join(
                f"{name} ({n} static instruction{'s' if n != 1 else ''})" for name, n in counts if n
            )
            lines.append(f"- {label}: present in {where}")
            continue
        missing = ["/".join(g) for g in family.all_of if not matching_count(totals, g)]
        # A partly compiled family (e.g. tcgen05.mma without tcgen05.ld) names what is missing.
        partial = len(missing) < len(family.all_of)
        lines.append(f"- {label}: absent" + (f" (no {' or '.join(missing)})" if partial else ""))
    return lines


def render_turn(turn: int, source: str | None, feedback: str) -> str:
    """One turn as shown in later observations: the submitted kernel (if shown) and feedback."""
    parts = [f"## Turn {turn}"]
    if source is not None:
        parts += ["", "Your kernel:", "", f"```cuda\n{source.rstrip()}\n```"]
    parts += ["", "Feedback:", "", feedback]
    return "\n".join(parts)
