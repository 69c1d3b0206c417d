"""The prompt's CUDA parts: the build command, the entry point's contract, the rules the static
policy enforces (stated from the policy's own constants) and the output format."""

from __future__ import annotations

from ptxgym.languages.base import LanguageSections
from ptxgym.languages.cuda.compiler import link_command, nvcc_command
from ptxgym.languages.cuda.policy import ALLOWED_SYSTEM_HEADERS, MAX_SOURCE_CHARS
from ptxgym.tasks import DTYPE_BYTES, Task
from ptxgym.tasks.packs import pack_header_name


def sections(task: Task, *, variant: int, wrappers_shown: bool) -> LanguageSections:
    """The CUDA sections of ``task``'s prompt in prompt ``variant``. The pack's header is offered
    only where its wrappers are shown (knowledge levels with them): an ablation without them must
    not point at a header the model never saw."""
    command = " ".join(["nvcc", *nvcc_command(task)[1:]])
    link = " ".join(["nvcc", *link_command(task)[1:]])
    return LanguageSections(
        kernel="CUDA kernel",
        approach="using inline PTX where CUDA C++ has no equivalent",
        build=f"`{command}` (candidate.cu is your source, included by build.cu), then `{link}`",
        interface=_interface(task),
        rules=_rules(task, wrappers_shown),
        output=_output(variant),
    )


def _interface(task: Task) -> str:
    definition = task.definition
    sizes = ", ".join(
        f"{name} {DTYPE_BYTES[spec.dtype]} B/elem"
        for name, spec in {**definition.inputs, **definition.outputs}.items()
    )
    return "\n".join(
        [
            "## Entry point",
            "",
            "Define exactly this function with C linkage:",
            "",
            "```c",
            task.entry_point.signature,
            "```",
            "",
            "- Every pointer is a device pointer to a contiguous tensor laid out as above "
            f"({sizes}); inputs are const and must not be modified.",
            "- The integer arguments are the axis values of the workload being run.",
            "- Launch all work on `stream` (asynchronously; do not synchronize the device) and "
            "return `cudaSuccess` (0) or the first CUDA error, e.g. `(int)cudaGetLastError()`.",
            "- Scratch memory: allocate it with `cudaMallocAsync`/`cudaFreeAsync` on `stream`, or "
            "once and keep it; it is yours.",
            "- Host code may create TMA tensor maps with `cuTensorMapEncodeTiled` obtained through "
            "`cudaGetDriverEntryPointByVersion` (include `<cudaTypedefs.h>`; libcuda is not "
            "linked).",
        ]
    )


def _rules(task: Task, wrappers_shown: bool) -> str:
    headers = ", ".join(f"<{h}>" for h in sorted(ALLOWED_SYSTEM_HEADERS, key=str.lower))
    pack_header = (
        f', and `#include "{pack_header_name(task)}"` (the PTX wrappers of the knowledge pack, '
        "exactly as shown below)"
        if wrappers_shown
        else ""
    )
    return "\n".join(
        [
            "## Rules",
            "",
            f"- One translation unit, at most {MAX_SOURCE_CHARS:,} characters.",
            f"- Allowed includes: {headers}{pack_header}. Nothing else, and never a path.",
            "- No cuBLAS, cuDNN, CUTLASS/CuTe, FlashInfer, Thrust/CUB or torch, whether by "
            "header, by declaration or through dlopen/dlsym: such a kernel is rejected.",
            "- Host code may call the CUDA runtime and a few C library functions (memory, "
            "strings, printf, math, malloc/free, exit); any other external function (files, "
            "processes, threads, sockets, the dynamic loader) is rejected at build time.",
        ]
    )


def _output(variant: int) -> str:
    advice = {
        0: "",
        1: " Think about the data layout and the schedule first, then write the code.",
        2: " First make it correct with the required instructions; then make it fast.",
    }[variant]
    return (
        "## Output format\n\nReply with the complete source in exactly one ```cuda code block "
        "(if there are several, the last one is used)." + advice
    )
