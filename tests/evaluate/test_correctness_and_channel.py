"""The judge's comparison of outputs, and the untrusted-to-trusted message channel (CPU torch)."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from multiprocessing.connection import Connection

import pytest

from ptxgym.evaluate.correctness import check_outputs
from ptxgym.sandbox import channel
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


def test_worst_ratio_is_how_far_past_its_tolerance_the_worst_element_is() -> None:
    ref = {"C": torch.full((6, 5), 100.0)}
    # 1.01 allowed at 100 (atol 1e-2 + rtol 1e-2 x 100): 102 is 2/1.01 past it, 100.5 within.
    out = torch.full((6, 5), 100.5)
    out[3, 1] = 102.0
    check = check_outputs(GEMM, "t", "w", AXES, {"C": out.bfloat16()}, ref).outputs[0]
    assert not check.ok and check.worst_ratio == pytest.approx(2.0 / 1.01, rel=1e-3)
    passing = check_outputs(GEMM, "t", "w", AXES, {"C": torch.full((6, 5), 100.5).bfloat16()}, ref)
    assert passing.ok and passing.outputs[0].worst_ratio == pytest.approx(0.5 / 1.01, rel=1e-3)


def test_the_outlier_stage_is_checked_with_the_tasks_outlier_tolerance() -> None:
    from ptxgym.tasks import Tolerance

    loose = GEMM.model_copy(update={"outlier_tolerance": Tolerance(atol=0.1, rtol=0.1)})
    ref = {"C": torch.full((6, 5), 1.0)}
    out = {"C": torch.full((6, 5), 1.125).bfloat16()}  # 0.125 off: 0.02 allowed, or 0.2
    assert not check_outputs(loose, "trial0", "w", AXES, out, ref).ok
    outliers = check_outputs(loose, "outliers", "w", AXES, out, ref, outliers=True)
    assert outliers.ok and outliers.outputs[0].worst_ratio == pytest.approx(0.125 / 0.2)
    # A task without one checks its outlier stage like the others.
    assert not check_outputs(GEMM, "outliers", "w", AXES, out, ref, outliers=True).ok


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
        # Shapes torch would refuse with errors of its own, or take for others.
        [
            b'{"kind": "check", "tensors": [{"name": "x", "dtype": "float32", "shape": '
            b"[0, 9223372036854775813]}]}",
            b"",
        ],
        [b'{"kind": "check", "tensors": [{"name": "x", "dtype": "float32", "shape": [1.5]}]}'],
        [b'{"kind": "check", "tensors": [{"name": "x", "dtype": "float32", "shape": [true]}]}'],
        [b'{"kind": "check", "tensors": [{"name": "x", "dtype": "float32", "shape": "4"}]}'],
        [b'{"kind": "check", "tensors": [5]}'],
    ],
)
def test_channel_rejects_malformed_messages(frames: list[bytes]) -> None:
    left, right = multiprocessing.Pipe()
    for frame in frames:
        left.send_bytes(frame)
    with pytest.raises(channel.ChannelError):
        channel.receive(right)


def _send_through_arena(conn: Connection, size: int) -> None:
    """A worker's side: take the arena, send two messages through it, in turn."""
    arena = channel.Arena.attach(conn, size)
    for value in (1.0, 2.0):
        outputs = {"O": torch.full((64, 64), value).bfloat16(), "LSE": torch.full((7,), value)}
        channel.send(conn, {"kind": "check", "value": value}, outputs, arena)
        conn.recv_bytes()  # the judge's "continue": only then may the arena be reused
    arena.close()


def test_outputs_cross_processes_through_the_arena() -> None:
    parent, child = multiprocessing.get_context("spawn").Pipe()
    size = channel.arena_bytes([64 * 64 * 2, 7 * 4])
    arena = channel.Arena.create(size)
    worker = multiprocessing.get_context("spawn").Process(
        target=_send_through_arena, args=(child, size)
    )
    worker.start()
    arena.share(parent, worker.pid)
    for value in (1.0, 2.0):
        header, tensors = channel.receive(parent, arena)
        assert header == {"kind": "check", "value": value}
        assert tensors["O"].dtype == torch.bfloat16 and tensors["O"].shape == (64, 64)
        assert bool((tensors["O"] == value).all()) and bool((tensors["LSE"] == value).all())
        copies = {name: tensor.clone() for name, tensor in tensors.items()}
        del tensors
        parent.send_bytes(b"continue")
        assert bool((copies["O"] == value).all())
    worker.join(timeout=60)
    assert worker.exitcode == 0
    arena.close()


def _send_from_the_gpu_through_a_pinned_arena(conn: Connection, size: int) -> None:
    """A worker's side on a GPU: pin its mapping of the arena, send CUDA outputs through it."""
    arena = channel.Arena.attach(conn, size)
    assert arena.pin() and arena.pinned_at is not None
    outputs = {"O": torch.arange(1 << 20, device="cuda", dtype=torch.float32)}
    channel.send(conn, {"kind": "check"}, outputs, arena)
    conn.recv_bytes()
    arena.close()
    assert arena.pinned_at is None


@pytest.mark.gpu
def test_a_pinned_arena_carries_gpu_outputs_both_ways() -> None:
    parent, child = multiprocessing.get_context("spawn").Pipe()
    size = channel.arena_bytes([4 << 20])
    arena = channel.Arena.create(size)
    worker = multiprocessing.get_context("spawn").Process(
        target=_send_from_the_gpu_through_a_pinned_arena, args=(child, size)
    )
    worker.start()
    arena.share(parent, worker.pid)
    assert arena.pin()
    _, tensors = channel.receive(parent, arena)
    on_gpu = tensors["O"].to("cuda")
    del tensors
    arena.wipe()
    parent.send_bytes(b"continue")
    assert bool((on_gpu == torch.arange(1 << 20, device="cuda", dtype=torch.float32)).all())
    worker.join(timeout=60)
    assert worker.exitcode == 0
    arena.close()
    assert arena.pinned_at is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="what a machine without CUDA does")
def test_without_cuda_an_arena_stays_pageable_and_works() -> None:
    arena = channel.Arena.create(channel.arena_bytes([512]))
    assert not arena.pin() and arena.pinned_at is None
    arena.close()


def test_a_message_too_big_for_the_arena_is_refused_by_the_sender() -> None:
    arena = channel.Arena.create(channel.arena_bytes([16]))
    left, _ = multiprocessing.Pipe()
    with pytest.raises(ValueError, match="does not fit"):
        channel.send(left, {"kind": "check"}, {"O": torch.zeros(100)}, arena)
    arena.close()


@pytest.mark.parametrize(
    ("offset", "problem"),
    [
        (-256, "bad arena offset"),
        (3, "bad arena offset"),
        ("0", "bad arena offset"),
        (False, "bad arena offset"),
        (512, "pass the arena's end"),
        (1 << 40, "pass the arena's end"),
    ],
)
def test_hostile_arena_descriptions_are_refused(offset: object, problem: str) -> None:
    arena = channel.Arena.create(channel.arena_bytes([512]))
    left, right = multiprocessing.Pipe()
    item = {"name": "O", "dtype": "float32", "shape": [64], "offset": offset}
    left.send_bytes(json.dumps({"kind": "check", "tensors": [item]}).encode())
    with pytest.raises(channel.ChannelError, match=problem):
        channel.receive(right, arena)
    arena.close()


def test_an_arena_offset_without_an_arena_is_refused() -> None:
    left, right = multiprocessing.Pipe()
    item = {"name": "O", "dtype": "float32", "shape": [4], "offset": 0}
    left.send_bytes(json.dumps({"kind": "check", "tensors": [item]}).encode())
    with pytest.raises(channel.ChannelError, match="no arena"):
        channel.receive(right)


def test_a_wipe_zeroes_what_was_read_and_nothing_else() -> None:
    # The judge wipes what it read before it answers: a later message naming the same offsets
    # without writing them finds zeros, not outputs it could pass off as new.
    arena = channel.Arena.create(channel.arena_bytes([512, 512, 512]))
    assert arena.buffer is not None
    left, right = multiprocessing.Pipe()
    outputs = {"O": torch.full((128,), 1.0), "LSE": torch.full((128,), 2.0)}
    channel.send(left, {"kind": "check"}, outputs, arena)
    arena.buffer[1024:1032] = b"\x07" * 8  # beyond the message's tensors
    _, tensors = channel.receive(right, arena)
    copies = {name: tensor.clone() for name, tensor in tensors.items()}
    del tensors
    assert arena.read_extents == [(0, 512), (512, 512)]
    arena.wipe()
    assert not any(arena.buffer[:1024]) and arena.buffer[1024:1032] == b"\x07" * 8
    assert arena.read_extents == []
    assert bool((copies["O"] == 1.0).all()) and bool((copies["LSE"] == 2.0).all())
    arena.close()


@pytest.mark.parametrize("offsets", [{"O": 0, "LSE": 256}, {"LSE": 512, "O": 256}])
def test_tensors_that_overlap_in_the_arena_are_refused(offsets: dict[str, int]) -> None:
    arena = channel.Arena.create(channel.arena_bytes([512, 512]))
    left, right = multiprocessing.Pipe()
    items = [
        {"name": name, "dtype": "float32", "shape": [128], "offset": offset}
        for name, offset in offsets.items()
    ]
    left.send_bytes(json.dumps({"kind": "check", "tensors": items}).encode())
    with pytest.raises(channel.ChannelError, match="overlaps another tensor"):
        channel.receive(right, arena)
    arena.close()


def test_a_tensor_described_twice_is_refused() -> None:
    arena = channel.Arena.create(channel.arena_bytes([512, 512]))
    left, right = multiprocessing.Pipe()
    items = [
        {"name": "O", "dtype": "float32", "shape": [128], "offset": offset} for offset in (0, 512)
    ]
    left.send_bytes(json.dumps({"kind": "check", "tensors": items}).encode())
    with pytest.raises(channel.ChannelError, match="described twice"):
        channel.receive(right, arena)
    arena.close()


def test_a_message_that_stops_within_itself_times_out() -> None:
    left, right = multiprocessing.Pipe()
    left.send_bytes(
        b'{"kind": "check", "tensors": [{"name": "x", "dtype": "float32", "shape": [4]}]}'
    )
    os.write(left.fileno(), (16).to_bytes(4, "big") + b"\x00" * 8)  # half the frame
    started = time.monotonic()
    with pytest.raises(channel.ChannelTimeout):
        channel.receive(right, timeout_s=0.3)
    assert 0.3 <= time.monotonic() - started < 5
    _silent, listening = multiprocessing.Pipe()  # and a message that never began
    with pytest.raises(channel.ChannelTimeout):
        channel.receive(listening, timeout_s=0.1)


def test_with_an_arena_every_tensor_must_lie_in_it() -> None:
    # Else a frame the sender never sends would be waited for.
    arena = channel.Arena.create(channel.arena_bytes([16]))
    left, right = multiprocessing.Pipe()
    channel.send(left, {"kind": "check"}, {"O": torch.zeros(4)})  # as frames, not in the arena
    with pytest.raises(channel.ChannelError, match="'O' is not in the arena"):
        channel.receive(right, arena)
    arena.close()


def test_a_closed_channel_is_an_end_of_file_even_within_a_message() -> None:
    left, right = multiprocessing.Pipe()
    os.write(left.fileno(), (64).to_bytes(4, "big") + b"{")
    left.close()
    with pytest.raises(EOFError):
        channel.receive(right, timeout_s=5)


def test_an_int8_output_still_holding_the_poison_fails_within_a_step_of_tolerance() -> None:
    quantiser = get_task("PTX-H100-QuantInt8Row")
    axes = {"M": 2, "N": 128}
    q = torch.zeros((2, 128), dtype=torch.int8)
    q[0, 0] = -127  # the row's largest magnitude, negative: the quantiser writes -127 here
    references = {"q": q.clone(), "scale": torch.ones(2)}
    written = {"q": q.clone(), "scale": torch.ones(2)}
    off_by_one = written["q"].clone()
    off_by_one[1, 5] = 1  # one step: the int8 tolerance allows it
    assert check_outputs(quantiser, "t", "w", axes, {**written, "q": off_by_one}, references).ok
    unwritten = written["q"].clone()
    unwritten[0, 0] = -128  # the worker's poison, one step from the reference's -127
    report = check_outputs(quantiser, "t", "w", axes, {**written, "q": unwritten}, references)
    check = report.outputs[0]
    assert not report.ok and check.non_finite == 1 and check.worst[0].index == (0, 0)


def test_float8_and_float16_outputs_are_checked_in_their_dtypes() -> None:
    fp8 = get_task("PTX-H100-QuantFP8Row")
    axes = {"M": 1, "N": 128}
    values = torch.linspace(-448, 448, 128).reshape(1, 128)
    references = {"q": values.to(torch.float8_e4m3fn), "scale": torch.ones(1)}
    step = values.to(torch.float8_e4m3fn).float() * 1.1  # about one e4m3 step away
    outputs = {"q": step.to(torch.float8_e4m3fn), "scale": torch.ones(1)}
    assert check_outputs(fp8, "t", "w", axes, outputs, references).ok
    wrong_dtype = {"q": values.to(torch.float16), "scale": torch.ones(1)}
    report = check_outputs(fp8, "t", "w", axes, wrong_dtype, references)
    assert report.first_problem == "dtype"
