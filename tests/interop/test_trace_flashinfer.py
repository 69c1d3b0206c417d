"""Our FlashInfer-Trace export (``ptxgym.interop.flashinfer_trace``) read by FlashInfer-Bench's own
models.

``tests/interop/test_trace.py`` checks the export against ptxgym's copy of the schema; this checks
it against flashinfer-bench itself where it is installed (``pip install flashinfer-bench``: it needs
torch and flashinfer-python), and skips elsewhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ptxgym import tasks
from ptxgym.interop import flashinfer_trace as trace
from ptxgym.outcome import Outcome, Status

fib = pytest.importorskip("flashinfer_bench.data")

SOURCE = (
    '#include <cuda_bf16.h>\nextern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, '
    "__nv_bfloat16* C, int M, int N, int K, cudaStream_t stream) { return 0; }\n"
)
ENVIRONMENT = trace.Environment(hardware="NVIDIA_H200", libs={"torch": "2.8.0"})


def _outcome(status: Status) -> Outcome:
    timed = status is Status.PASSED
    return Outcome(
        "PTX-H100-GEMM",
        status,
        f"step ended with {status.value}",
        "test",
        latency_ms=1.25 if timed else None,
        baseline_latency_ms=1.5 if timed else None,
        speedup=1.2 if timed else None,
        qualified=True if timed else None,
    )


def test_their_trace_set_loads_our_dataset(tmp_path: Path) -> None:
    trace.write_trace_set(tmp_path, tasks.registry().values())
    gemm = tasks.get_task("PTX-H100-GEMM")
    solution = trace.solution_from_source(gemm, SOURCE, name="gemm_v1")
    name = trace.definition_name(gemm)
    solutions = tmp_path / "solutions" / trace.op_type(gemm) / name
    solutions.mkdir(parents=True)
    (solutions / "gemm_v1.json").write_text(json.dumps(trace.to_dict(solution)))
    workload = trace.workloads_from_task(gemm)[0].workload
    records = [
        trace.trace_from_outcome(
            gemm, workload, "gemm_v1", _outcome(status), environment=ENVIRONMENT
        )
        for status in Status
    ]
    traces = tmp_path / "traces" / trace.op_type(gemm)
    traces.mkdir(parents=True)
    (traces / f"{name}.jsonl").write_text("".join(r.model_dump_json() + "\n" for r in records))

    theirs = fib.TraceSet.from_path(str(tmp_path))

    assert sorted(theirs.definitions) == sorted(
        trace.definition_name(task) for task in tasks.registry().values()
    )
    for task in tasks.registry().values():
        ours = trace.workloads_from_task(task, tmp_path)
        loaded = theirs.workloads[trace.definition_name(task)]
        assert [t.workload.uuid for t in loaded] == [t.workload.uuid for t in ours]
    assert theirs.get_solution("gemm_v1") is not None
    statuses = [t.evaluation.status.value for t in theirs.traces[name]]
    assert statuses == [trace.STATUS_MAP[status].value for status in Status]


@pytest.mark.parametrize("status", list(Status))
def test_their_trace_model_reads_ours_back_unchanged(status: Status) -> None:
    gemm = tasks.get_task("PTX-H100-GEMM")
    workload = trace.workloads_from_task(gemm)[0].workload
    record = trace.trace_from_outcome(
        gemm, workload, "gemm_v1", _outcome(status), environment=ENVIRONMENT
    )
    text = record.model_dump_json()
    assert fib.Trace.model_validate_json(text).model_dump_json() == text
