"""The prompt's Triton parts: the entry function's contract, what the target instructions are in
Triton's terms, the rules the static policy enforces (stated from its own constants) and the
output format."""

from __future__ import annotations

from ptxgym.languages.base import LanguageSections
from ptxgym.languages.triton.policy import (
    ALLOWED_IMPORTS,
    MAX_SOURCE_CHARS,
    TENSOR_ATTRIBUTES,
    TORCH_FUNCTIONS,
    entry_parameters,
)
from ptxgym.tasks import Task

TRITON_VERSION = "3.6"
"""The Triton the judge is built and tested against (the ``triton`` extra pins it)."""
# What tl.dot and tensor descriptors become on each target, in the SASS the judge counts.
_LOWERING = {
    "sm_90a": (
        "`tl.dot` on bfloat16/float16 blocks of at least 64 rows per warpgroup (`num_warps` a "
        "multiple of 4) lowers to wgmma (SASS HGMMA); smaller blocks fall back to mma.sync "
        "(HMMA), which does not count. Loads and stores through a tensor descriptor lower to TMA "
        "(UTMALDG, UTMASTG): `TensorDescriptor.from_tensor(tensor, block_shape)` on the host, "
        "passed to the kernel and used as `desc.load([i, j])`, or `tl.make_tensor_descriptor` "
        "inside the kernel after `triton.set_allocator(...)` in the entry. A `tl.load` of "
        "pointers is not TMA."
    ),
    "sm_100a": (
        "`tl.dot` on bfloat16/float16 blocks of 128 rows lowers to tcgen05 MMA with the "
        "accumulator in tensor memory (SASS UTC*MMA, read back with LDTM). Loads and stores "
        "through a tensor descriptor lower to TMA: `TensorDescriptor.from_tensor(tensor, "
        "block_shape)` on the host, passed to the kernel and used as `desc.load([i, j])`, or "
        "`tl.make_tensor_descriptor` inside the kernel after `triton.set_allocator(...)` in the "
        "entry. A `tl.load` of pointers is not TMA."
    ),
}


def sections(task: Task, *, variant: int, wrappers_shown: bool) -> LanguageSections:
    """The Triton sections of ``task``'s prompt in prompt ``variant`` (the pack's C++ wrappers
    are never shown to a Triton candidate, so ``wrappers_shown`` changes nothing)."""
    return LanguageSections(
        kernel="Triton kernel",
        approach=(
            "in Python with @triton.jit kernels whose tl.dot and tensor descriptors lower to "
            "those instructions"
            if task.instructions_required
            else "in Python with @triton.jit kernels"
        ),
        build=(
            f"Triton {TRITON_VERSION} compiles your kernels for `{task.target.arch}` on the GPU "
            "host, in a run that imports the module and calls the entry once on each workload "
            "before the evaluation; compiling and autotuning happen there, never in the timed "
            "calls"
        ),
        interface=_interface(task),
        rules=_rules(task),
        output=_output(variant),
    )


def _interface(task: Task) -> str:
    definition = task.definition
    parameters = ", ".join(entry_parameters(task))
    tensors = [
        f"- `{name}`: {spec.dtype} [{', '.join(spec.shape)}]"
        + (" (input: must not be modified)" if name in definition.inputs else " (output)")
        for name, spec in {**definition.inputs, **definition.outputs}.items()
    ]
    lines = [
        "## Entry point",
        "",
        "Define exactly this Python function at module level:",
        "",
        "```python",
        f"def {task.entry_point.symbol}({parameters}) -> None: ...",
        "```",
        "",
        "The tensors are torch tensors on the GPU, contiguous and laid out as above:",
        "",
        *tensors,
        "",
        "- The integer arguments are the axis values of the workload being run (Python ints).",
        "- Write every element of the outputs by launching your `@triton.jit` kernels "
        "(`kernel[grid](...)`). They run on the current torch stream: do not synchronize, "
        "and do not make streams. The return value is ignored; an exception is a "
        "RUNTIME_ERROR.",
        '- Scratch memory: `torch.empty(..., device="cuda")` (or `torch.zeros`) in the entry.',
    ]
    if task.instructions_required and task.target.arch in _LOWERING:
        lines += ["", "### The required instructions in Triton", "", _LOWERING[task.target.arch]]
    return "\n".join(lines)


def _rules(task: Task) -> str:
    imports = "; ".join(f"`{line}`" for line in ALLOWED_IMPORTS)
    torch_calls = ", ".join(f"`torch.{name}`" for name in sorted(TORCH_FUNCTIONS))
    attributes = ", ".join(f"`{name}`" for name in sorted(TENSOR_ATTRIBUTES))
    return "\n".join(
        [
            "## Rules",
            "",
            f"- One Python module, at most {MAX_SOURCE_CHARS:,} characters. It may import "
            f"only: {imports}.",
            "- Host code does no work on tensors: the entry may call "
            f"{torch_calls} (and name torch dtypes), use {attributes} of a tensor, and pass "
            "tensors to kernel launches, torch's allocation and "
            "`TensorDescriptor.from_tensor`. No other torch function (no `torch.matmul`, no "
            "`@`, no `torch.nn.functional`, no cuBLAS or cuDNN by any route), no arithmetic, "
            "indexing or iteration on tensors: such a module is rejected.",
            "- Kernels are `@triton.jit` functions (optionally under `@triton.autotune` and "
            "`@triton.heuristics`) using `tl`, `libdevice` and `math`; autotuning hooks "
            "(`pre_hook`, `post_hook`, custom `do_bench`) and compiler options that name files "
            "or toolchain flags (`ir_override`, `extern_libs`, `ptx_options`, ...) are refused.",
            "- No other builtins than plain ones (`range`, `len`, `min`, `max`, `int`, `float`, "
            "`print`, ...): no `open`, `exec`, `eval`, `getattr`, `globals` or `__import__`; no "
            "name or attribute starting with `_`; no classes, `try`, `with`, `global`, `del` or "
            "assignments to attributes or items. Module level holds only imports, functions "
            "and constants.",
            f"- Every kernel must be compiled by the entry's first call on each workload "
            f"({', '.join(w.name for w in task.workloads)}): the evaluation itself cannot "
            "compile, so a kernel launched only later (another specialisation, another branch) "
            "fails it with RUNTIME_ERROR.",
        ]
    )


def _output(variant: int) -> str:
    advice = {
        0: "",
        1: " Think about the tiling and the schedule first, then write the code.",
        2: " First make it correct with the required instructions; then make it fast.",
    }[variant]
    return (
        "## Output format\n\nReply with the complete module in exactly one ```python code block "
        "(if there are several, the last one is used)." + advice
    )
