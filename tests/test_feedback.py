"""Feedback advice: each kind of policy violation gets the advice that fixes it."""

from __future__ import annotations

import pytest

from ptxgym.feedback import render_feedback
from ptxgym.languages.cuda.policy import MAX_SOURCE_CHARS, check_policy
from ptxgym.outcome import Outcome, Status
from ptxgym.tasks import get_task

TASK = get_task("PTX-H100-GEMM")
ENTRY = (
    'extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C,\n'
    "                    int M, int N, int K, cudaStream_t stream) { return 0; }\n"
)


def _advice(source: str) -> str:
    """The last paragraph of the feedback on ``source``, which the policy must refuse."""
    violations = check_policy(source, TASK).violations
    assert violations, "the policy accepted the source"
    message = "the source breaks the rules:\n" + "\n".join(f"- {v}" for v in violations)
    outcome = Outcome(TASK.id, Status.POLICY_VIOLATION, message, evaluator="policy")
    return render_feedback(outcome, TASK).rsplit("\n\n", 1)[1]


@pytest.mark.parametrize(
    ("source", "advice"),
    [
        ("__global__ void k() {}\n", 'Add the entry point: a function with C linkage (extern "C")'),
        ("//" + "x" * MAX_SOURCE_CHARS + "\n" + ENTRY, "Shorten the source below the limit"),
        ("??=define X 1\n" + ENTRY, "Write the flagged lines plainly"),
        ('#include "../secret.h"\n' + ENTRY, "Include only the allowed headers, by name"),
        ("#include <fstream>\n" + ENTRY, "Include only the allowed headers, by name"),
        ("#include <cublas_v2.h>\n" + ENTRY, "Remove the library and write that part yourself"),
        ('void* h = dlopen("x", 0);\n' + ENTRY, "Remove the run-time loading"),
        (
            "#pragma GCC system_header\n" + ENTRY,
            "Remove the directive, pragma or assembler construct",
        ),
        ('asm(".incbin \\"/etc/passwd\\"");\n' + ENTRY, "Remove the directive, pragma or"),
        ('#line 1 "other.cu"\n' + ENTRY, "Remove the directive, pragma or assembler construct"),
    ],
)
def test_each_policy_violation_gets_advice_that_fits_it(source: str, advice: str) -> None:
    text = _advice(source)
    assert text.startswith(advice)
    assert "Remove what the rules forbid" not in text


def test_several_kinds_of_violation_get_one_line_of_advice_each() -> None:
    lines = _advice("#include <fstream>\n#include <cstdio_x>\n#line 3\n").splitlines()
    assert [line.split(":")[0].split(",")[0] for line in lines] == [
        "Include only the allowed headers",
        "Remove the directive",
        "Add the entry point",
    ]


def test_a_host_call_refused_by_the_build_gets_host_code_advice() -> None:
    outcome = Outcome(
        TASK.id,
        Status.POLICY_VIOLATION,
        "the build breaks the rules: the host code calls fopen: host code may call only the "
        "CUDA runtime and a few C library functions (memory, strings, printing, math, exit)",
        evaluator="policy",
    )
    assert render_feedback(outcome, TASK).endswith(
        "Keep host code to preparing and launching the kernel, with the CUDA runtime and the C "
        "library functions the rules allow."
    )


def _with_tools(workloads: int) -> str:
    """The feedback on a passed outcome of ``workloads`` timed workloads, memcheck and the
    profile run on the first."""
    from ptxgym.outcome import InstructionProfile, SanitizerReport, WorkloadTiming

    timings = tuple(
        WorkloadTiming(f"w{index}", 1.0, 1.0, 1.0, (1.0,), "cupti") for index in range(workloads)
    )
    outcome = Outcome(
        TASK.id,
        Status.PASSED,
        "ok",
        evaluator="gpu",
        latency_ms=1.0,
        baseline_latency_ms=1.0,
        speedup=1.0,
        timings=timings,
        sanitizers=(SanitizerReport("memcheck", True),),
        profile=InstructionProfile(True, families={"compute": False, "data_movement": False}),
        tools_workload="w0",
    )
    return render_feedback(outcome, TASK)


def test_the_feedback_says_which_workload_the_tools_covered_in_a_pooled_task() -> None:
    pooled = _with_tools(5)
    assert "Memory safety (compute-sanitizer, one call of the kernel, on workload w0 only):" in (
        pooled
    )
    assert "threads / warps, on workload w0 only):" in pooled
    single = _with_tools(1)
    assert "workload w0 only" not in single
