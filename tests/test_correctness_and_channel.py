"""The judge's comparison of outputs, and the untrusted-to-trusted message channel (CPU torch)."""

from __future__ import annotations

import multiprocessing

import pytest

from ptxgym import channel
from ptxgym.correctness import check_outputs
from ptxgym.tasks import get_task

torch = pytest.importorskip("torch")

GEMM = get_task("PTX-H100-GEMM")
AXES = {"M": 6, "N": 5, "K": 3}


def reference() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {"C": torch.randn(6, 5, generator=generator)}


def test_exact_output_passes() -> None:
    ref = reference()
    report = check_outputs(GEMM, "trial0", "w", AXES, {"C": ref["C"].bfloat16()}, ref)
    assert report.ok and report.outputs[0].total == 30


def test_unwritten_elements_fail_as_nan_and_are_located() -> None:
    ref = reference()
    out = ref["C"].bfloat16()
    out[4, 2] = float("nan")
    report = check_outputs(GEMM, "trial0", "w", AXES, {"C": out}, ref)
    check = report.outputs[0]
    assert not report.ok and check.problem == "numerical"
    assert check.non_finite == 1 and check.mismatched == 1
    assert check.worst[0].index == (4, 2)


def test_numerical_error_reports_the_worst_elements_first() -> None:
    ref = reference()
    out = ref["C"].clone()
    out[1, 1] += 0.5
    out[2, 3] += 3.0
    report = check_outputs(GEMM, "trial1", "w", AXES, {"C": out.bfloat16()}, ref)
    check = report.outputs[0]
    assert check.mismatched == 2
    assert [w.index for w in check.worst] == [(2, 3), (1, 1)]
    assert check.max_abs_error == pytest.approx(3.0, rel=0.02)


def test_tolerance_is_atol_plus_rtol_times_reference() -> None:
    ref = {"C": torch.full((6, 5), 100.0)}
    inside = {"C": torch.full((6, 5), 100.0 + 0.9, dtype=torch.float32).bfloat16()}
    assert check_outputs(GEMM, "t", "w", AXES, inside, ref).ok  # 1.01 allowed
    outside = {"C": torch.full((6, 5), 102.0).bfloat16()}
    assert not check_outputs(GEMM, "t", "w", AXES, outside, ref).ok


@pytest.mark.parametrize(
    ("out", "problem"),
    [(torch.zeros(6, 4, dtype=torch.bfloat16), "shape"), (torch.zeros(6, 5), "dtype")],
)
def test_shape_and_dtype_are_checked_first(out: torch.Tensor, problem: str) -> None:
    report = check_outputs(GEMM, "t", "w", AXES, {"C": out}, reference())
    assert report.first_problem == problem


def test_missing_output_fails() -> None:
    assert not check_outputs(GEMM, "t", "w", AXES, {}, reference()).ok


def test_channel_round_trip_keeps_dtype_shape_and_bits() -> None:
    left, right = multiprocessing.Pipe()
    tensors = {
        "o": torch.randn(3, 4).bfloat16(),
        "lse": torch.randn(2, 3),
        "idx": torch.arange(5, dtype=torch.int32),
    }
    channel.send(left, {"kind": "check", "stage": "trial0"}, tensors)
    header, received = channel.receive(right)
    assert header == {"kind": "check", "stage": "trial0"}
    for name, tensor in tensors.items():
        assert received[name].dtype == tensor.dtype
        assert torch.equal(received[name], tensor)


@pytest.mark.parametrize(
    "frames",
    [
        [b"not json"],
        [b'{"kind": "check", "tensors": [{"name": "x", "dtype": "object", "shape": [1]}]}', b""],
        [
            b'{"kind": "check", "tensors": [{"name": "x", "dtype": "float32", "shape": [4]}]}',
            b"\x00" * 3,
        ],
        [b'{"kind": "check", "tensors": "many"}'],
        [b"\x80\x04\x95pickle"],
    ],
)
def test_channel_rejects_malformed_messages(frames: list[bytes]) -> None:
    left, right = multiprocessing.Pipe()
    for frame in frames:
        left.send_bytes(frame)
    with pytest.raises(channel.ChannelError):
        channel.receive(right)
