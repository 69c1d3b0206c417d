"""FlashInfer-Trace interop: the models match FlashInfer-Bench's JSON, and every task converts."""

from __future__ import annotations

import ast
import copy
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import BaseModel, ValidationError

from ptxgym import tasks
from ptxgym.build.result import CompileResult
from ptxgym.interop import flashinfer_trace as trace
from ptxgym.interop.flashinfer_schema import to_json
from ptxgym.interop.flashinfer_trace import (
    STATUS_MAP,
    BuildSpec,
    Correctness,
    Definition,
    Environment,
    Evaluation,
    EvaluationStatus,
    Performance,
    Solution,
    SourceFile,
    Trace,
    TraceExportError,
    Workload,
    to_dict,
)
from ptxgym.outcome import Outcome, Status

# The tasks FlashInfer-Trace can describe (trace.export_problem says why the others cannot).
TASK_IDS = [tid for tid, task in tasks.registry().items() if trace.export_problem(task) is None]
GQA_IDS = [t for t in TASK_IDS if "GQA" in t]

# --------------------------------------------------------------------------------------------
# Documents in FlashInfer-Bench's format, written after their examples and tests
# (examples/ffi/Example-FlashInfer-Trace, tests/integration/flashinfer/test_gqa_paged_decode.py,
# docs/flashinfer-trace/*.mdx): explicit nulls where their jsonl writer leaves them.

DECODE_REFERENCE = """import math

import torch


def run(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale):
    batch_size, num_qo_heads, head_dim = q.shape
    _, page_size, num_kv_heads, _ = k_cache.shape
    group = num_qo_heads // num_kv_heads
    output = torch.empty_like(q)
    lse = torch.empty((batch_size, num_qo_heads), dtype=torch.float32, device=q.device)
    for b in range(batch_size):
        pages = kv_indices[kv_indptr[b] : kv_indptr[b + 1]].long()
        n = (pages.numel() - 1) * page_size + int(kv_last_page_len[b])
        k = k_cache[pages].reshape(-1, num_kv_heads, head_dim)[:n].float()
        v = v_cache[pages].reshape(-1, num_kv_heads, head_dim)[:n].float()
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        s = torch.einsum("hd,nhd->hn", q[b].float(), k) * sm_scale
        lse[b] = torch.logsumexp(s, dim=-1) / math.log(2.0)
        output[b] = torch.einsum("hn,nhd->hd", torch.softmax(s, dim=-1), v).to(q.dtype)
    return output, lse
"""

DEFINITION_DOC: dict[str, Any] = {
    "name": "gqa_paged_decode_h32_kv8_d128_ps1",
    "description": "Batch GQA decode over a paged KV cache. Captured from Llama 3.1 8B.",
    "op_type": "gqa_paged",
    "tags": ["stage:decode", "status:verified", "model:llama-3.1-8b"],
    "axes": {
        "batch_size": {"type": "var"},
        "num_qo_heads": {"type": "const", "value": 32},
        "num_kv_heads": {"type": "const", "value": 8},
        "head_dim": {"type": "const", "value": 128},
        "num_pages": {"type": "var"},
        "page_size": {"type": "const", "value": 1},
        "len_indptr": {"type": "var", "description": "Length of kv_indptr array."},
        "num_kv_indices": {"type": "var", "description": "Total number of KV page indices."},
    },
    "constraints": ["len_indptr == batch_size + 1", "num_kv_indices == num_pages"],
    "inputs": {
        "q": {"shape": ["batch_size", "num_qo_heads", "head_dim"], "dtype": "bfloat16"},
        "k_cache": {
            "shape": ["num_pages", "page_size", "num_kv_heads", "head_dim"],
            "dtype": "bfloat16",
        },
        "v_cache": {
            "shape": ["num_pages", "page_size", "num_kv_heads", "head_dim"],
            "dtype": "bfloat16",
        },
        "kv_indptr": {
            "shape": ["len_indptr"],
            "dtype": "int32",
            "description": "KV page offsets for each sequence.",
        },
        "kv_indices": {"shape": ["num_kv_indices"], "dtype": "int32"},
        "kv_last_page_len": {"shape": ["batch_size"], "dtype": "int32"},
        "sm_scale": {"shape": None, "dtype": "float32", "description": "Softmax scale."},
    },
    "outputs": {
        "output": {"shape": ["batch_size", "num_qo_heads", "head_dim"], "dtype": "bfloat16"},
        "lse": {
            "shape": ["batch_size", "num_qo_heads"],
            "dtype": "float32",
            "description": "The 2-based log-sum-exp of attention logits.",
        },
    },
    "reference": DECODE_REFERENCE,
}

BLOB = (
    "blob/workloads/gqa_paged/gqa_paged_decode_h32_kv8_d128_ps1/"
    "gqa_paged_decode_h32_kv8_d128_ps1_a1b2c3d4-0000-4000-8000-000000000001.safetensors"
)
WORKLOAD_RECORD: dict[str, Any] = {
    "definition": "gqa_paged_decode_h32_kv8_d128_ps1",
    "workload": {
        "uuid": "a1b2c3d4-0000-4000-8000-000000000001",
        "axes": {"batch_size": 32, "num_pages": 4096, "len_indptr": 33, "num_kv_indices": 4096},
        "inputs": {
            "q": {"type": "random"},
            "k_cache": {"type": "random"},
            "v_cache": {"type": "random"},
            "kv_indptr": {"type": "safetensors", "path": BLOB, "tensor_key": "kv_indptr"},
            "kv_indices": {"type": "safetensors", "path": BLOB, "tensor_key": "kv_indices"},
            "kv_last_page_len": {
                "type": "safetensors",
                "path": BLOB,
                "tensor_key": "kv_last_page_len",
            },
            "sm_scale": {"type": "scalar", "value": 0.08838834764831845},
        },
    },
    "solution": None,
    "evaluation": None,
}

SOLUTION_DOC: dict[str, Any] = {
    "name": "gqa_paged_decode_cuda_splitkv_v1",
    "definition": "gqa_paged_decode_h32_kv8_d128_ps1",
    "description": "Split-KV decode with a final merge kernel.",
    "author": "gpt-5-2025-08-07",
    "spec": {
        "language": "cuda",
        "target_hardware": ["NVIDIA_H100"],
        "entry_point": "kernel.cu::gqa_paged_decode",
        "dependencies": [],
        "destination_passing_style": True,
        "binding": "tvm-ffi",
    },
    "sources": [
        {"path": "kernel.h", "content": "#pragma once\n#include <cuda_bf16.h>\n"},
        {
            "path": "kernel.cu",
            "content": '#include "kernel.h"\n#include <tvm/ffi/function.h>\n'
            "void gqa_paged_decode(tvm::ffi::TensorView q) {}\n",
        },
    ],
}

ENVIRONMENT_DOC: dict[str, Any] = {
    "hardware": "NVIDIA_H100",
    "libs": {"torch": "2.8.0", "cuda": "12.8", "flashinfer": "0.4.1"},
}

PASSED_TRACE_DOC: dict[str, Any] = {
    "definition": "gqa_paged_decode_h32_kv8_d128_ps1",
    "workload": WORKLOAD_RECORD["workload"],
    "solution": "gqa_paged_decode_cuda_splitkv_v1",
    "evaluation": {
        "status": "PASSED",
        "environment": ENVIRONMENT_DOC,
        "timestamp": "2025-10-01T12:45:00Z",
        "log": "",
        "correctness": {
            "max_relative_error": 0.0078125,
            "max_absolute_error": 0.00390625,
            "extra": None,
        },
        "performance": {
            "latency_ms": 0.0412,
            "reference_latency_ms": 12.7,
            "speedup_factor": 308.25,
        },
    },
}

COMPILE_ERROR_TRACE_DOC: dict[str, Any] = {
    "definition": "gqa_paged_decode_h32_kv8_d128_ps1",
    "workload": WORKLOAD_RECORD["workload"],
    "solution": "gqa_paged_decode_cuda_splitkv_v2",
    "evaluation": {
        "status": "COMPILE_ERROR",
        "environment": ENVIRONMENT_DOC,
        "timestamp": "2025-10-01T12:46:10Z",
        "log": 'kernel.cu(3): error: identifier "tvm" is undefined\n',
        "correctness": None,
        "performance": None,
    },
}

NUMERICAL_TRACE_DOC: dict[str, Any] = {
    "definition": "gqa_paged_decode_h32_kv8_d128_ps1",
    "workload": WORKLOAD_RECORD["workload"],
    "solution": "gqa_paged_decode_cuda_splitkv_v3",
    "evaluation": {
        "status": "INCORRECT_NUMERICAL",
        "environment": ENVIRONMENT_DOC,
        "timestamp": "2025-10-01T12:47:00Z",
        "log": "",
        "correctness": {
            "max_relative_error": 3.5,
            "max_absolute_error": 0.25,
            "extra": {"matched_ratio": 0.97},
        },
        "performance": None,
    },
}

DOCUMENTS: list[tuple[type[BaseModel], dict[str, Any]]] = [
    (Definition, DEFINITION_DOC),
    (Trace, WORKLOAD_RECORD),
    (Workload, WORKLOAD_RECORD["workload"]),
    (Solution, SOLUTION_DOC),
    (Environment, ENVIRONMENT_DOC),
    (Trace, PASSED_TRACE_DOC),
    (Trace, COMPILE_ERROR_TRACE_DOC),
    (Trace, NUMERICAL_TRACE_DOC),
]


@pytest.mark.parametrize(("model", "document"), DOCUMENTS, ids=lambda x: getattr(x, "__name__", ""))
def test_flashinfer_documents_parse_and_dump_back_identically(
    model: type[BaseModel], document: dict[str, Any]
) -> None:
    parsed = model.model_validate(document)
    assert to_dict(parsed) == document
    from_json = model.model_validate_json(json.dumps(document))
    assert from_json == parsed
    assert to_dict(from_json) == document


def test_workload_record_dumps_explicit_nulls_like_flashinfer() -> None:
    record = Trace(
        definition="d",
        workload=Workload(axes={"M": 2}, inputs={"A": trace.RandomInput()}, uuid="u"),
    )
    assert to_dict(record) == {
        "definition": "d",
        "workload": {"axes": {"M": 2}, "inputs": {"A": {"type": "random"}}, "uuid": "u"},
        "solution": None,
        "evaluation": None,
    }
    assert record.is_workload_trace()


def test_untagged_axes_and_inputs_resolve_as_their_union_does() -> None:
    # Their unions are untagged, so a file written with exclude_unset may lack "type".
    doc = copy.deepcopy(DEFINITION_DOC)
    doc["axes"]["batch_size"] = {}
    doc["axes"]["head_dim"] = {"value": 128}
    parsed = Definition.model_validate(doc)
    assert isinstance(parsed.axes["batch_size"], trace.AxisVar)
    assert isinstance(parsed.axes["head_dim"], trace.AxisConst)
    inputs = {"a": {}, "b": {"value": 1.5}, "c": {"path": "x.safetensors", "tensor_key": "c"}}
    workload = Workload.model_validate({"uuid": "u", "axes": {}, "inputs": inputs})
    assert [spec.type for spec in workload.inputs.values()] == ["random", "scalar", "safetensors"]


def _invalid(model: type[BaseModel], document: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        model.model_validate(document)


def test_their_validators_are_enforced() -> None:
    bad = copy.deepcopy(DEFINITION_DOC)
    bad["reference"] = "def forward(q):\n    return q\n"
    _invalid(Definition, bad)
    bad = copy.deepcopy(DEFINITION_DOC)
    bad["axes"]["batch_size"] = {"type": "unknown"}
    _invalid(Definition, bad)
    bad = copy.deepcopy(DEFINITION_DOC)
    bad["outputs"]["q"] = bad["inputs"]["q"]
    _invalid(Definition, bad)
    bad = copy.deepcopy(DEFINITION_DOC)
    bad["inputs"]["q"]["shape"] = ["batch_size", "heads"]
    _invalid(Definition, bad)
    bad = copy.deepcopy(DEFINITION_DOC)
    bad["constraints"] = ["len_indptr =="]
    _invalid(Definition, bad)
    bad = copy.deepcopy(DEFINITION_DOC)
    bad["layout"] = "row-major"  # unknown fields are refused, not dropped
    _invalid(Definition, bad)

    bad = copy.deepcopy(SOLUTION_DOC)
    bad["sources"][0]["path"] = "../kernel.h"
    _invalid(Solution, bad)
    bad = copy.deepcopy(SOLUTION_DOC)
    bad["spec"]["entry_point"] = "kernel.cu:gqa_paged_decode"
    _invalid(Solution, bad)
    bad = copy.deepcopy(SOLUTION_DOC)
    bad["spec"]["entry_point"] = "main.cu::gqa_paged_decode"
    _invalid(Solution, bad)
    bad = copy.deepcopy(SOLUTION_DOC)
    bad["spec"]["language"] = "ptx"
    _invalid(Solution, bad)

    bad = copy.deepcopy(PASSED_TRACE_DOC)
    bad["evaluation"]["performance"] = None
    _invalid(Trace, bad)
    bad = copy.deepcopy(NUMERICAL_TRACE_DOC)
    bad["evaluation"]["performance"] = {"latency_ms": 1.0}
    _invalid(Trace, bad)
    bad = copy.deepcopy(COMPILE_ERROR_TRACE_DOC)
    bad["evaluation"]["correctness"] = {}
    _invalid(Trace, bad)
    bad = copy.deepcopy(PASSED_TRACE_DOC)
    bad["evaluation"]["status"] = "MEMORY_ERROR"
    _invalid(Trace, bad)
    _invalid(Correctness, {"max_absolute_error": -1.0})
    _invalid(Performance, {"latency_ms": -1.0})


def test_nan_errors_round_trip_as_strings() -> None:
    correctness = Correctness(max_relative_error=math.nan, max_absolute_error=math.inf)
    text = correctness.model_dump_json()
    assert json.loads(text) == {
        "max_relative_error": "NaN",
        "max_absolute_error": "Infinity",
        "extra": None,
    }
    again = Correctness.model_validate_json(text)
    assert math.isnan(again.max_relative_error) and again.max_absolute_error == math.inf


# --------------------------------------------------------------------------------------------
# Definitions from tasks


def test_tasks_that_flashinfer_trace_cannot_describe_say_why(tmp_path: Path) -> None:
    pooling = tasks.get_task("PTX-H100-MaxPool2d")
    assert "var axes ['Ho', 'Wo'] are bound by no input" in (trace.export_problem(pooling) or "")
    embedding = tasks.get_task("PTX-H100-Embedding")
    assert "integer inputs ['ids']" in (trace.export_problem(embedding) or "")
    with pytest.raises(trace.TraceExportError, match="bound by no input"):
        trace.definition_from_task(pooling)
    assert trace.write_trace_set(tmp_path, [pooling, embedding]) == []


def test_definition_names_are_unique_and_follow_the_rule() -> None:
    names = {tid: trace.definition_name(tasks.get_task(tid)) for tid in TASK_IDS}
    assert len(set(names.values())) == len(TASK_IDS)
    assert names["PTX-H100-GQADecode"] == "gqa_paged_decode_h32_kv8_d128_ps16_sm90a"
    assert names["PTX-B200-GQAPrefill"] == "gqa_ragged_prefill_causal_h32_kv8_d128_sm100a"
    assert names["PTX-H100-MHAFwdCausal-d64"] == "mha_fwd_causal_d64_sm90a"
    assert names["PTX-B200-MHABwd-d128"] == "mha_bwd_d128_sm100a"
    assert names["PTX-H100-GEMM"] == "gemm_sm90a"


@pytest.mark.parametrize("task_id", TASK_IDS)
def test_definition_matches_the_task(task_id: str) -> None:
    task = tasks.get_task(task_id)
    definition = trace.definition_from_task(task)
    assert Definition.model_validate_json(definition.model_dump_json()) == definition
    assert Definition.model_validate(to_dict(definition)) == definition
    assert definition.op_type.replace("_", "").isalnum() and definition.op_type.islower()
    assert {f"gpu:{task.gpu}", f"arch:{task.arch}", f"ptxgym:{task.id}"} <= set(definition.tags)

    # Inputs and outputs: same names, order, shapes and dtypes; the layout is in the text.
    for ours, theirs in (
        (task.definition.inputs, definition.inputs),
        (task.definition.outputs, definition.outputs),
    ):
        assert list(theirs) == list(ours)
        for name, spec in ours.items():
            assert theirs[name].shape == spec.shape
            assert theirs[name].dtype == spec.dtype
            assert spec.layout in (theirs[name].description or "")

    # Axes: every const kept with its value; every var kept that an input binds, since
    # FlashInfer-Bench reads var axes off input shapes.
    assert definition.const_axes == task.definition.const_axes
    bound = {a for spec in definition.inputs.values() for a in spec.shape or []}
    assert set(definition.var_axes) == set(task.definition.var_axes) & bound
    for constraint in definition.constraints:
        names = {
            n.id for n in ast.walk(ast.parse(constraint, mode="eval")) if isinstance(n, ast.Name)
        }
        assert names <= set(definition.axes)
        assert constraint in task.definition.constraints


@pytest.mark.parametrize("task_id", TASK_IDS)
def test_reference_is_self_contained_python_with_run(task_id: str) -> None:
    task = tasks.get_task(task_id)
    source = trace.definition_from_task(task).reference
    compile(source, task_id, "exec")  # catches a misplaced __future__ import, unlike ast.parse
    module = ast.parse(source)
    runs = [n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "run"]
    assert len(runs) == 1
    run = runs[0]
    assert [a.arg for a in run.args.args] == list(task.definition.inputs)
    assert not run.args.vararg and not run.args.kwarg and not run.args.kwonlyargs
    # kernels_ref is inlined, so the reference runs where ptxgym is not installed.
    for node in ast.walk(module):
        if isinstance(node, ast.ImportFrom):
            assert not (node.module or "").startswith("kernels_ref")
        if isinstance(node, ast.Import):
            assert all(not a.name.startswith("kernels_ref") for a in node.names)
    function = task.callables.reference.split(":")[1]
    assert any(isinstance(n, ast.FunctionDef) and n.name == function for n in module.body)
    call = ast.unparse(run)
    for key in task.callables.params:
        assert f"{key}=" in call
    for name, spec in task.definition.outputs.items():
        assert f"outputs[{name!r}].to(torch.{spec.dtype})" in call


# --------------------------------------------------------------------------------------------
# Workloads


@pytest.mark.parametrize("task_id", TASK_IDS)
def test_workloads_for_every_task(task_id: str, tmp_path: Path) -> None:
    task = tasks.get_task(task_id)
    definition = trace.definition_from_task(task)
    records = trace.workloads_from_task(task, tmp_path)
    assert len(records) == len(task.workloads)
    assert records == trace.workloads_from_task(task, tmp_path)  # deterministic
    uuids = {r.workload.uuid for r in records}
    assert len(uuids) == len(records)
    for record, spec in zip(records, task.workloads, strict=True):
        assert record.is_workload_trace()
        assert record.definition == definition.name
        assert Trace.model_validate_json(record.model_dump_json()) == record
        assert to_dict(Trace.model_validate(to_dict(record))) == to_dict(record)
        assert record.workload.axes == {a: spec.axes[a] for a in definition.var_axes}
        assert list(record.workload.inputs) == list(definition.inputs)
        for name, source in record.workload.inputs.items():
            if definition.inputs[name].dtype in trace._FLOAT_DTYPES:
                assert isinstance(source, trace.RandomInput)
            else:
                assert isinstance(source, trace.SafetensorsInput)
                assert source.tensor_key == name
                assert (tmp_path / source.path).is_file()
                assert not Path(source.path).is_absolute()


def test_workloads_without_blob_dir() -> None:
    records = trace.workloads_from_task(tasks.get_task("PTX-H100-MHAFwd-d64"))
    assert all(isinstance(s, trace.RandomInput) for s in records[0].workload.inputs.values())
    for task_id in GQA_IDS:
        with pytest.raises(TraceExportError, match="blob_dir"):
            trace.workloads_from_task(tasks.get_task(task_id))


def _prefix(lengths: list[int]) -> list[int]:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


def _blobs(root: Path, record: Trace) -> dict[str, np.ndarray[Any, Any]]:
    from safetensors.numpy import load_file

    tensors: dict[str, np.ndarray[Any, Any]] = {}
    for name, source in record.workload.inputs.items():
        if isinstance(source, trace.SafetensorsInput):
            tensors[name] = load_file(root / source.path)[source.tensor_key]
    return tensors


@pytest.mark.parametrize("gpu", ["H100", "B200"])
def test_decode_blobs_hold_the_page_table_of_the_sequences(gpu: str, tmp_path: Path) -> None:
    task = tasks.get_task(f"PTX-{gpu}-GQADecode")
    page = task.definition.const_axes["page_size"]
    records = trace.workloads_from_task(task, tmp_path)
    for record, spec in zip(records, task.workloads, strict=True):
        kv_lens = spec.sequences["kv_lens"]
        pages = [-(-n // page) for n in kv_lens]
        blobs = _blobs(tmp_path, record)
        assert set(blobs) == {"kv_indptr", "kv_indices", "kv_last_page_len"}
        assert all(b.dtype == np.int32 for b in blobs.values())
        assert blobs["kv_indptr"].tolist() == _prefix(pages)
        assert blobs["kv_last_page_len"].tolist() == [(n - 1) % page + 1 for n in kv_lens]
        axes = record.workload.axes
        assert blobs["kv_indptr"].shape == (axes["len_indptr"],)
        assert blobs["kv_last_page_len"].shape == (axes["batch_size"],)
        # A permutation of the cache's pages: every page used once, scattered.
        indices = blobs["kv_indices"]
        assert indices.shape == (axes["num_kv_indices"],)
        assert sorted(indices.tolist()) == list(range(axes["num_pages"]))
        assert indices.tolist() != list(range(axes["num_pages"]))


@pytest.mark.parametrize("gpu", ["H100", "B200"])
def test_prefill_blobs_hold_the_indptr_of_the_sequences(gpu: str, tmp_path: Path) -> None:
    task = tasks.get_task(f"PTX-{gpu}-GQAPrefill")
    records = trace.workloads_from_task(task, tmp_path)
    for record, spec in zip(records, task.workloads, strict=True):
        blobs = _blobs(tmp_path, record)
        assert set(blobs) == {"qo_indptr", "kv_indptr"}
        assert blobs["qo_indptr"].dtype == blobs["kv_indptr"].dtype == np.int32
        assert blobs["qo_indptr"].tolist() == _prefix(spec.sequences["q_lens"])
        assert blobs["kv_indptr"].tolist() == _prefix(spec.sequences["kv_lens"])
        assert record.workload.axes["total_q"] == blobs["qo_indptr"][-1]
        assert record.workload.axes["total_kv"] == blobs["kv_indptr"][-1]
        assert "batch_size" not in record.workload.axes  # no input binds it


def test_write_trace_set_lays_out_their_dataset(tmp_path: Path) -> None:
    written = trace.write_trace_set(tmp_path, tasks.registry().values())
    assert len(written) == 2 * len(TASK_IDS)
    definitions = sorted((tmp_path / "definitions").rglob("*.json"))
    assert len(definitions) == len(TASK_IDS)
    for path in definitions:
        definition = trace.read_definition(path)
        assert path == tmp_path / "definitions" / definition.op_type / f"{definition.name}.json"
        workloads = tmp_path / "workloads" / definition.op_type / f"{definition.name}.jsonl"
        records = trace.read_jsonl(workloads)
        assert records and all(r.definition == definition.name for r in records)
        for line in workloads.read_text().splitlines():
            assert json.loads(line)["solution"] is None
            assert json.loads(line)["evaluation"] is None
        for record in records:
            for source in record.workload.inputs.values():
                if isinstance(source, trace.SafetensorsInput):
                    prefix = f"blob/workloads/{definition.op_type}/{definition.name}/"
                    assert source.path.startswith(prefix)
                    assert (tmp_path / source.path).is_file()
    # Written again, the same bytes.
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    trace.write_trace_set(tmp_path, tasks.registry().values())
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


# --------------------------------------------------------------------------------------------
# Solutions and traces

SOURCE = (
    '#include <cuda_bf16.h>\nextern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, '
    "__nv_bfloat16* C, int M, int N, int K, cudaStream_t stream) { return 0; }\n"
)


def test_solution_from_source() -> None:
    task = tasks.get_task("PTX-H100-GEMM")
    solution = trace.solution_from_source(task, SOURCE, name="gemm_wgmma_v1")
    assert to_dict(solution) == {
        "name": "gemm_wgmma_v1",
        "definition": "gemm_sm90a",
        "author": "ptxgym",
        "description": solution.description,
        "spec": {
            "language": "cuda",
            "target_hardware": ["NVIDIA_H100"],
            "entry_point": "candidate.cu::gemm",
            "dependencies": [],
            "destination_passing_style": True,
        },
        "sources": [{"path": "candidate.cu", "content": SOURCE}],
    }
    assert 'extern "C" int gemm(' in (solution.description or "")
    assert Solution.model_validate_json(solution.model_dump_json()) == solution
    b200 = trace.solution_from_source(tasks.get_task("PTX-B200-GEMM"), SOURCE, name="s", author="m")
    assert b200.spec.target_hardware == ["NVIDIA_B200"] and b200.author == "m"
    with pytest.raises(ValidationError):
        trace.solution_from_source(task, "", name="empty")


ENVIRONMENT = Environment(hardware="NVIDIA_H200", libs={"torch": "2.8.0", "cuda": "12.8"})


def _outcome(status: Status, task_id: str = "PTX-H100-GEMM") -> Outcome:
    timed = status is Status.PASSED
    return Outcome(
        task_id=task_id,
        status=status,
        message=f"step ended with {status.value}",
        evaluator="test",
        compile=CompileResult(
            ok=status.compiled,
            log="ptxas info: 128 registers",
            source_hash="h",
            arch="sm_90a",
            seconds=1.0,
        )
        if status not in (Status.FORMAT_ERROR, Status.POLICY_VIOLATION)
        else None,
        latency_ms=1.25 if timed else None,
        baseline_latency_ms=1.5 if timed else None,
        speedup=1.2 if timed else None,
        qualified=True if timed else None,
    )


@pytest.mark.parametrize("status", list(Status))
def test_every_status_maps_to_a_valid_trace(status: Status) -> None:
    task = tasks.get_task("PTX-H100-GEMM")
    workload = trace.workloads_from_task(task)[0].workload
    record = trace.trace_from_outcome(
        task, workload, "gemm_wgmma_v1", _outcome(status), environment=ENVIRONMENT
    )
    evaluation = record.evaluation
    assert evaluation is not None
    expected = STATUS_MAP[status]
    assert evaluation.status is expected
    if status.value in EvaluationStatus.__members__:
        assert expected.value == status.value  # shared statuses map to themselves
    # Ours is kept: first line of the log, and correctness.extra where there is one.
    assert evaluation.log.splitlines()[0].startswith(f"ptxgym_status: {status.value}")
    assert (evaluation.correctness is not None) == (
        expected in (EvaluationStatus.PASSED, EvaluationStatus.INCORRECT_NUMERICAL)
    )
    if evaluation.correctness is not None:
        assert evaluation.correctness.extra is not None
        assert evaluation.correctness.extra["ptxgym_status"] == status.value
        assert math.isnan(evaluation.correctness.max_absolute_error)  # not measured: unknown
    if expected is EvaluationStatus.PASSED:
        assert evaluation.performance == Performance(
            latency_ms=1.25, reference_latency_ms=1.5, speedup_factor=1.2
        )
    else:
        assert evaluation.performance is None
    # NaN != NaN, so compare the JSON, which is what is stored.
    text = record.model_dump_json()
    assert Trace.model_validate_json(text).model_dump_json() == text
    assert Evaluation.model_validate_json(evaluation.model_dump_json()).status is expected


def test_status_map_covers_every_status() -> None:
    assert set(STATUS_MAP) == set(Status)
    assert set(STATUS_MAP.values()) == set(EvaluationStatus)


def test_trace_uses_given_correctness_and_workload_spec() -> None:
    task = tasks.get_task("PTX-H100-GEMM")
    measured = Correctness(max_relative_error=0.004, max_absolute_error=0.002, extra={"n": 3})
    record = trace.trace_from_outcome(
        task,
        task.workloads[0],
        "gemm_wgmma_v1",
        _outcome(Status.PASSED),
        environment=ENVIRONMENT,
        correctness=measured,
        timestamp="2025-10-01T00:00:00+00:00",
    )
    assert record.evaluation is not None and record.evaluation.correctness is not None
    assert record.evaluation.correctness.max_absolute_error == 0.002
    assert record.evaluation.correctness.extra == {
        "n": 3,
        "ptxgym_status": "PASSED",
        "atol": 0.01,
        "rtol": 0.01,
    }
    assert record.evaluation.timestamp == "2025-10-01T00:00:00+00:00"
    assert record.workload == trace.workloads_from_task(task)[0].workload
    assert Trace.model_validate_json(record.model_dump_json()) == record
    assert Trace.model_validate(to_dict(record)) == record


def test_trace_refuses_a_foreign_outcome_and_a_blobless_gqa_workload() -> None:
    gemm = tasks.get_task("PTX-H100-GEMM")
    with pytest.raises(TraceExportError, match="PTX-B200-GEMM"):
        trace.trace_from_outcome(
            gemm,
            gemm.workloads[0],
            "s",
            _outcome(Status.PASSED, "PTX-B200-GEMM"),
            environment=ENVIRONMENT,
        )
    decode = tasks.get_task("PTX-H100-GQADecode")
    with pytest.raises(TraceExportError, match="blob_dir"):
        trace.trace_from_outcome(
            decode,
            decode.workloads[0],
            "s",
            _outcome(Status.RUNTIME_ERROR, decode.id),
            environment=ENVIRONMENT,
        )


def test_model_round_trips_through_json() -> None:
    """Every model, built in Python, survives JSON unchanged."""
    workload = Workload(
        axes={"M": 4},
        inputs={
            "A": trace.RandomInput(),
            "s": trace.ScalarInput(value=0.5),
            "i": trace.SafetensorsInput(path="blob/x.safetensors", tensor_key="i"),
        },
        uuid="u",
    )
    definition = Definition(
        name="d",
        op_type="gemm",
        axes={"M": trace.AxisVar(), "N": trace.AxisConst(value=4, description="cols")},
        inputs={"A": trace.TensorSpec(shape=["M", "N"], dtype="bfloat16")},
        outputs={"B": trace.TensorSpec(shape=["M", "N"], dtype="float32")},
        reference="def run(A):\n    return A\n",
    )
    solution = Solution(
        name="s",
        definition="d",
        author="a",
        spec=BuildSpec(language=trace.Language.CUDA, target_hardware=["x"], entry_point="k.cu::f"),
        sources=[SourceFile(path="k.cu", content="x")],
    )
    evaluation = Evaluation(
        status=EvaluationStatus.PASSED,
        environment=ENVIRONMENT,
        timestamp="t",
        correctness=Correctness(),
        performance=Performance(latency_ms=1.0),
    )
    record = Trace(definition="d", workload=workload, solution="s", evaluation=evaluation)
    models: list[BaseModel] = [workload, definition, solution, evaluation, record, ENVIRONMENT]
    for model in models:
        assert type(model).model_validate_json(model.model_dump_json()) == model
        assert type(model).model_validate_json(to_json(model)) == model
        assert type(model).model_validate(to_dict(model)) == model
    # Type tags are written even though they were left at their defaults.
    assert to_dict(definition)["axes"] == {
        "M": {"type": "var"},
        "N": {"type": "const", "value": 4, "description": "cols"},
    }
