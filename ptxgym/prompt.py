"""The first observation: task, contract, target, protocol, output format and knowledge pack.

Three prompt variants say the same facts in different framings (the paper reports results as
mean and range over variants, so a model is not tuned to one wording). The evaluation section
states the timing protocol from the constants the judge's settings default to
(``ptxgym.evaluate.timing``, which imports nothing heavy), so the prompt says what the judge does.
"""

from __future__ import annotations

from dataclasses import dataclass

from ptxgym.evaluate.timing import (
    HOST_ALLOWANCE_MS,
    HOST_ALLOWANCE_RATIO,
    TIMED_CALLS,
    TRIALS,
    WARMUP_CALLS,
)
from ptxgym.languages import DEFAULT_LANGUAGE, LanguageSections, get_language
from ptxgym.outcome import FAULT_RATIO
from ptxgym.tasks import Task
from ptxgym.tasks.packs import PackPart, estimate_tokens, load_pack, pack_header_name

PROMPT_VARIANTS = (0, 1, 2)


@dataclass(frozen=True)
class Prompt:
    """The prompt text and its named sections (for token accounting)."""

    text: str
    sections: dict[str, str]

    def tokens(self) -> dict[str, int]:
        return {name: estimate_tokens(text) for name, text in self.sections.items()}


def build_prompt(
    task: Task, *, variant: int = 0, knowledge: str = "full", language: str = DEFAULT_LANGUAGE
) -> Prompt:
    """The full prompt for ``task`` in prompt ``variant`` with the pack at ``knowledge`` level,
    for a candidate written in action ``language``."""
    if variant not in PROMPT_VARIANTS:
        raise ValueError(f"prompt_variant must be one of {PROMPT_VARIANTS}, not {variant!r}")
    writer = get_language(language)
    # The pack's C++ wrappers only for a language that can include them.
    pack = [
        part
        for part in load_pack(task.target.pack, knowledge)
        if writer.pack_wrappers or not part.name.endswith(".cuh")
    ]
    wrappers_shown = any(part.name.endswith(".cuh") for part in pack)
    own = writer.prompt_sections(task, variant=variant, wrappers_shown=wrappers_shown)
    sections = {
        "introduction": _introduction(task, variant, own),
        "task": _task_section(task),
        "interface": own.interface,
        "target": _target_section(task, own.build),
        "evaluation": _evaluation_section(task),
        "rules": own.rules,
        "output": own.output,
    }
    for part in pack:
        sections[f"pack:{part.name}"] = _pack_section(task, part)
    order = list(sections)
    if variant == 2:
        # Reference material first, the assignment last: the task is freshest when writing.
        order = [n for n in order if n.startswith("pack:")] + [
            n for n in order if not n.startswith("pack:")
        ]
    text = "\n\n".join(sections[name].strip() for name in order) + "\n"
    return Prompt(text, {name: sections[name] for name in order})


def _introduction(task: Task, variant: int, own: LanguageSections) -> str:
    goal = f"a correct and fast {own.kernel} for {task.op} on an NVIDIA {task.gpu} "
    goal += f"({task.target.arch})"
    if task.instructions_required:
        families = _family_names(task)
        goal += f" that really executes the architecture-specific instructions {families}"
    if variant == 0:
        return f"# Task {task.id}\n\nWrite {goal}, {own.approach}."
    if variant == 1:
        return (
            f"# Task {task.id}\n\nYou are an expert GPU kernel engineer. Your job: {goal}. "
            "You will get several turns: each submission is compiled, checked, profiled and "
            "timed against the vendor library, and the results come back to you."
        )
    return (
        f"# Reference material, then task {task.id}\n\nThe architecture reference comes first; "
        f"the assignment follows it. The assignment: {goal}."
    )


def _family_names(task: Task) -> str:
    families = task.target.instruction_families
    return f"({families['compute'].name} or {families['data_movement'].name})"


def _task_section(task: Task) -> str:
    definition = task.definition
    lines = ["## Operator", "", task.description.strip(), "", "### Axes", ""]
    for name, axis in definition.axes.items():
        value = f" = {axis.value}" if axis.value is not None else " (set by the workload)"
        lines.append(f"- `{name}`{value}: {axis.description}")
    for title, tensors in (("Inputs", definition.inputs), ("Outputs", definition.outputs)):
        lines += ["", f"### {title}", ""]
        for name, spec in tensors.items():
            line = f"- `{name}`: {spec.dtype} [{', '.join(spec.shape)}], {spec.layout}"
            lines.append(line + (f". {spec.description}" if spec.description else ""))
    if definition.constraints:
        lines += ["", "Constraints: " + "; ".join(f"`{c}`" for c in definition.constraints)]
    lines += ["", "### Workloads", ""]
    if task.pooled:
        lines.append(
            f"The kernel is evaluated on a pool of {len(task.workloads)} workloads; it must be "
            "correct on all of them, and its speed is measured on each."
        )
    for workload in task.workloads:
        axes = ", ".join(f"{k}={v}" for k, v in workload.axes.items())
        lines.append(
            f"- `{workload.name}`: {axes}"
            + _sequence_summary(workload.sequences)
            + (f" ({workload.description})" if workload.description else "")
        )
    return "\n".join(lines)


def _sequence_summary(sequences: dict[str, list[int]]) -> str:
    parts = []
    for name, lengths in sequences.items():
        distinct = sorted(set(lengths))
        shown = ", ".join(map(str, distinct[:8])) + (", ..." if len(distinct) > 8 else "")
        parts.append(f"{name} in {{{shown}}}")
    return "; " + "; ".join(parts) if parts else ""


def _target_section(task: Task, build: str) -> str:
    families = task.target.instruction_families
    lines = [
        "## Target",
        "",
        f"- GPU: {task.gpu} class, {task.target.devices}; code is built for `{task.target.arch}`.",
        f"- Build: {build}.",
        "",
        "### Required instructions",
        "",
    ]
    if not task.instructions_required:
        # A performance task (docs/tasks.md): no family to qualify with, only speed counts.
        lines.append(
            "None: this is a performance task. Every correct kernel counts, whatever "
            "instructions it executes; what matters is its speed against the baseline."
        )
        return "\n".join(lines)
    lines += [
        "A correct kernel qualifies only if, while it runs, it executes at least one family:",
        "",
    ]
    for key, family in families.items():
        groups = " and ".join("/".join(group) for group in family.all_of)
        lines.append(f"- {key.replace('_', ' ')} `{family.name}`: {family.description} ({groups}).")
    lines += [
        "",
        "Qualification is measured, not read from the source: Nsight Compute counts the SASS "
        "instructions your kernels execute (`sass__thread_inst_executed_true_per_opcode`, "
        "predicated-on threads, over your launches only). Instructions that are compiled in "
        "but never executed do not count; a failed profile counts as not qualified.",
        "",
        f"The compute family must also do at least {task.min_coverage:.0%} of the operator's "
        f"work: the FLOPs its matrix instructions execute, against `{task.flops}` FLOPs "
        "(multiply-adds count 2; only the pairs a causal mask keeps). A token instruction "
        "beside work done otherwise does not qualify.",
    ]
    return "\n".join(lines)


def _tolerances(task: Task) -> str:
    """The allclose tolerances: one pair for every output, or each output's where they differ."""
    pairs = {name: task.tolerance_for(name) for name in task.definition.outputs}
    text = {name: f"atol={t.atol:g}, rtol={t.rtol:g}" for name, t in pairs.items()}
    if len(set(text.values())) == 1:
        return next(iter(text.values()))
    return "; ".join(f"{name}: {value}" for name, value in text.items())


def _outlier_tolerance(task: Task) -> str:
    """The outlier stage's own tolerance, where the task sets one."""
    tolerance = task.outlier_tolerance
    if tolerance is None:
        return ""
    return f" (checked with atol={tolerance.atol:g}, rtol={tolerance.rtol:g})"


def _evaluation_section(task: Task) -> str:
    return "\n".join(
        [
            "## Evaluation",
            "",
            "1. Static checks, then compilation (errors come back trimmed).",
            "2. Correctness on fresh random inputs for each trial: outputs are filled with a "
            "poison value before each call, so every element must be written; shapes and dtypes "
            "must match; `allclose(out, ref, "
            f"{_tolerances(task)})` against a float32 reference; no "
            "NaN/Inf; inputs must be unchanged after the call. A second stage repeats the check "
            "on inputs with a few large outliers" + _outlier_tolerance(task) + ".",
            f"3. Timing: {WARMUP_CALLS} warm-up and then {TIMED_CALLS} timed calls per trial, "
            f"{TRIALS} trials, median per trial, "
            "device time of all work your call launches on any stream, L2 flushed before each "
            "call, fresh inputs for every call; the outputs of a few timed calls, chosen at "
            "random, are checked like the trials. The library baseline is timed the same way; "
            "speedup = baseline time / your time. Host work inside your call is not device "
            "time: a call whose wall time exceeds its device time by more than "
            f"max({HOST_ALLOWANCE_MS:g} ms, {_times(HOST_ALLOWANCE_RATIO)}the device time) is a "
            "RUNTIME_ERROR, and so is a time under "
            f"{FAULT_RATIO:g} x the least the GPU needs at its datasheet peaks for this work "
            "(a measurement fault, not a speedup).",
            "4. Memory safety, after timing: compute-sanitizer memcheck reruns one call of a "
            "kernel that ran (or crashed); an invalid access turns the result into MEMORY_ERROR.",
            "5. The instruction profile above, for correct kernels.",
            "",
            "Statuses: FORMAT_ERROR, POLICY_VIOLATION, COMPILE_ERROR, RUNTIME_ERROR, TIMEOUT, "
            "MEMORY_ERROR, INCORRECT_SHAPE, INCORRECT_DTYPE, INCORRECT_NUMERICAL, PASSED.",
        ]
    )


def _times(ratio: float) -> str:
    """``ratio`` as a factor written before a quantity ("" for 1)."""
    return "" if ratio == 1 else f"{ratio:g} x "


def _pack_section(task: Task, part: PackPart) -> str:
    heading = f"## Knowledge pack ({task.target.pack}): {part.title}"
    if part.name.endswith(".cuh"):
        return (
            f'{heading}\n\nAvailable as `#include "{pack_header_name(task)}"`, or copy what you '
            f"need.\n\n```cuda\n{part.text.strip()}\n```"
        )
    return f"{heading}\n\n{part.text.strip()}"
