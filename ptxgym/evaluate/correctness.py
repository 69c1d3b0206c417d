"""Compare a candidate's outputs with the reference: shape, dtype, then allclose, no NaN/Inf.

Runs in the trusted judge process. The reference is float32; the candidate's output is upcast.
An element passes when ``|out - ref| <= atol + rtol * |ref|`` (``torch.allclose``'s rule, with
each output's tolerance: ``Task.tolerance_for``) and is finite; outputs are poisoned before each
call (NaN, or a value no correct kernel writes for integers), so an unwritten element fails.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ptxgym.outcome import CheckReport, Mismatch, OutputCheck
from ptxgym.tasks import Task, TensorSpec, Tolerance

if TYPE_CHECKING:
    import torch

_WORST_SHOWN = 5
# What the worker fills integer outputs with before each call, by element size (floating outputs
# get NaN): a value no correct kernel writes (int8 quantisers clamp to [-127, 127]).
INTEGER_POISON: dict[int, int] = {4: -0x7EADBEEF, 1: -0x80}


def check_outputs(
    task: Task,
    stage: str,
    workload: str,
    axes: dict[str, int],
    outputs: dict[str, torch.Tensor],
    references: dict[str, torch.Tensor],
    *,
    outliers: bool = False,
) -> CheckReport:
    """Check every output of the definition; ``outputs`` may come from an untrusted process.
    ``outliers``: the inputs were the outlier stage's (its tolerance may be the task's own)."""
    checks = []
    for name, spec in task.definition.outputs.items():
        if name not in outputs:
            checks.append(OutputCheck(name, False, "shape", "the output was not returned"))
            continue
        tolerance = task.tolerance_for(name, outliers=outliers)
        checks.append(_check_one(name, spec, axes, outputs[name], references[name], tolerance))
    return CheckReport(stage, workload, tuple(checks))


def _check_one(
    name: str,
    spec: TensorSpec,
    axes: dict[str, int],
    out: torch.Tensor,
    ref: torch.Tensor,
    tolerance: Tolerance,
) -> OutputCheck:
    import torch

    shape = tuple(axes[a] for a in spec.shape)
    if tuple(out.shape) != shape:
        return OutputCheck(name, False, "shape", f"shape {tuple(out.shape)}, expected {shape}")
    expected_dtype = getattr(torch, spec.dtype)  # task dtypes are named as torch names them
    if out.dtype != expected_dtype:
        return OutputCheck(name, False, "dtype", f"dtype {out.dtype}, expected {expected_dtype}")
    atol, rtol = tolerance.atol, tolerance.rtol
    got = out.to(device=ref.device, dtype=torch.float32)
    expected = ref.to(torch.float32)
    finite = torch.isfinite(got)
    if not out.dtype.is_floating_point:
        # An integer element still holding the poison was not written: it fails like a NaN,
        # also where the tolerance (an int8 step) would reach the poison from the reference.
        poison = float(INTEGER_POISON[out.element_size()])
        finite &= (got != poison) | (expected == poison)
    diff = (got - expected).abs()
    allowed = atol + rtol * expected.abs()
    bad = ~finite | (diff > allowed)
    diff_finite = torch.where(finite, diff, torch.zeros_like(diff))
    rel = diff_finite / (expected.abs() + 1e-8)
    ratio = torch.where(
        allowed > 0,
        diff_finite / allowed.clamp_min(torch.finfo(torch.float32).tiny),
        torch.where(diff_finite > 0, float("inf"), 0.0),
    )
    # One read back from the GPU for all five numbers, not one each: the judge checks the
    # outputs of several evaluations at once, and each read back waits for its stream.
    if diff.numel():
        numbers = torch.stack(
            [
                bad.sum().double(),
                (~finite).sum().double(),
                diff_finite.max().double(),
                rel.max().double(),
                ratio.max().double(),
            ]
        ).tolist()
    else:
        numbers = [0.0] * 5
    mismatched, non_finite = int(numbers[0]), int(numbers[1])
    max_abs, max_rel, worst_ratio = float(numbers[2]), float(numbers[3]), float(numbers[4])
    worst: tuple[Mismatch, ...] = ()
    if mismatched:
        # Rank by how far past the tolerance an element is; non-finite ones first.
        excess = torch.where(finite, diff - allowed, torch.full_like(diff, float("inf")))
        flat = excess.flatten()
        count = min(_WORST_SHOWN, mismatched)
        positions = torch.topk(flat, count).indices.tolist()
        worst = tuple(
            Mismatch(
                tuple(int(i) for i in _unravel(p, shape)),
                float(got.flatten()[p].item()),
                float(expected.flatten()[p].item()),
            )
            for p in positions
        )
    ok = mismatched == 0
    detail = "" if ok else f"{mismatched} of {diff.numel()} elements outside tolerance"
    return OutputCheck(
        name,
        ok,
        "" if ok else "numerical",
        detail,
        max_abs,
        max_rel,
        mismatched,
        non_finite,
        int(diff.numel()),
        worst,
        worst_ratio,
    )


def _unravel(position: int, shape: tuple[int, ...]) -> list[int]:
    index = []
    for size in reversed(shape):
        index.append(position % size)
        position //= size
    return list(reversed(index))
