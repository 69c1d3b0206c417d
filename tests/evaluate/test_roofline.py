"""The speed-of-light bounds (``ptxgym.evaluate.roofline``): byte models against hand counts, the
devices' peaks, the bound of a timed call and the fault of a call faster than the GPU can be."""

from __future__ import annotations

import pytest

from ptxgym.evaluate.roofline import peaks_for, speed_of_light
from ptxgym.feedback import speed_of_light_line
from ptxgym.outcome import FAULT_RATIO, WorkloadTiming
from ptxgym.tasks import get_task

GEMM = get_task("PTX-H100-GEMM")
H200 = peaks_for("NVIDIA H200", 132)


def timing(workload: str, latency_ms: float) -> WorkloadTiming:
    return WorkloadTiming(workload, latency_ms, 1.0, 1.0 / latency_ms, (latency_ms,), "cupti")


def test_the_byte_models_count_each_tensor_once() -> None:
    assert GEMM.bytes_of({"M": 3, "N": 5, "K": 7}, {}) == (3 * 7 + 5 * 7 + 3 * 5) * 2
    mha = get_task("PTX-H100-MHAFwd-d64")
    b, s, h, d = 2, 8, 3, 64
    # Q, K, V and O in bf16, LSE [B, H, S] in float32.
    assert mha.bytes_of({"B": b, "S": s, "H": h}, {}) == 4 * b * s * h * d * 2 + b * h * s * 4
    backward = get_task("PTX-H100-MHABwd-d64")
    # Q, K, V, O, dO (bf16), LSE (float32) in; dQ, dK, dV out (as the definition types them).
    outputs = {spec.dtype for spec in backward.definition.outputs.values()}
    per_output = {"bfloat16": 2, "float32": 4}[outputs.pop()]
    assert not outputs
    expected = 5 * b * s * h * d * 2 + b * h * s * 4 + 3 * b * s * h * d * per_output
    assert backward.bytes_of({"B": b, "S": s, "H": h}, {}) == expected


def test_a_device_is_matched_by_name_and_scaled_to_its_sms() -> None:
    assert H200 is not None and (H200.tflops, H200.dram_gbps) == (989.4, 4800.0)
    sxm = peaks_for("NVIDIA H100 80GB HBM3")
    pcie = peaks_for("NVIDIA H100 PCIe")
    assert sxm is not None and sxm.dram_gbps == 3350.0
    assert pcie is not None and pcie.tflops == 756.0
    half = peaks_for("NVIDIA H200", 66)  # a MIG slice with half the SMs
    assert half is not None and half.tflops == pytest.approx(989.4 / 2)
    assert "scaled to 66 SMs" in half.source
    assert peaks_for("NVIDIA A100-SXM4-80GB") is None


def test_the_bound_of_the_cublas_gemm_on_the_h200() -> None:
    assert H200 is not None
    # cuBLAS's 8192^3 GEMM took 1.4299 ms on the H200 (docs/benchmarks.md).
    bound = speed_of_light(GEMM, [timing("m8192-n8192-k8192", 1.4299)], H200)
    assert bound is not None
    flops, moved = 2 * 8192**3, 3 * 8192 * 8192 * 2
    assert (bound.flops, bound.bytes) == (flops, moved)
    assert bound.limit == "compute"
    assert bound.bound_ms == pytest.approx(flops / 989.4e12 * 1e3)  # 1.111 ms
    assert bound.achieved_tflops == pytest.approx(flops / 1.4299e-3 / 1e12)
    assert bound.mfu == pytest.approx(0.777, abs=1e-3)
    assert bound.bandwidth_use == pytest.approx(moved / 1.4299e-3 / 4.8e12)
    assert bound.of_bound == pytest.approx(1.4299 / bound.bound_ms)
    assert not bound.fault
    line = speed_of_light_line(bound)
    assert line.startswith("Speed of light on NVIDIA H200: 768.9 TFLOP/s (78% of the 989")
    assert "the compute-bound floor is 1.1113 ms and this kernel takes 1.29x it" in line


def test_a_call_faster_than_the_gpu_can_be_is_a_fault() -> None:
    assert H200 is not None
    floor = 2 * 8192**3 / 989.4e12 * 1e3
    fast = speed_of_light(GEMM, [timing("m8192-n8192-k8192", floor * 0.95)], H200)
    assert fast is not None and not fast.fault  # within the peaks' margin
    forged = speed_of_light(GEMM, [timing("m8192-n8192-k8192", floor * FAULT_RATIO * 0.99)], H200)
    assert forged is not None and forged.fault


def test_a_pooled_tasks_bound_sums_its_workloads_and_decode_is_memory_bound() -> None:
    assert H200 is not None
    decode = get_task("PTX-H100-GQADecode")
    timings = [timing(workload.name, 0.5) for workload in decode.workloads]
    bound = speed_of_light(decode, timings, H200)
    assert bound is not None and bound.limit == "memory"
    assert bound.latency_ms == pytest.approx(0.5 * len(decode.workloads))
    moved = sum(decode.bytes_of(workload.axes, workload.sequences) for workload in decode.workloads)
    assert bound.bytes == moved
    assert bound.bound_ms == pytest.approx(moved / 4.8e12 * 1e3, rel=1e-6)
    assert speed_of_light(decode, [], H200) is None
