"""The task files: the full suite loads, and a bad file is rejected with file, field, problem."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from ptxgym import paths, tasks
from ptxgym.tasks import TaskFileError, load_tasks, render_signature

OPS = ["MHAFwd", "MHAFwdCausal", "MHABwd", "MHABwdCausal"]
EXPECTED_IDS = {
    f"PTX-{gpu}-{name}"
    for gpu in ("H100", "B200")
    for name in ["GEMM", "GQADecode", "GQAPrefill"]
    + [f"{op}-d{d}" for op in OPS for d in (64, 96, 128)]
}


def test_the_first_families_keep_their_30_ids() -> None:
    first = {"GEMM", "MHAFwd", "MHABwd", "GQA"}
    kept = {tid for tid, task in tasks.registry().items() if task.family in first}
    assert kept == EXPECTED_IDS
    assert len(EXPECTED_IDS) == 30


@pytest.mark.parametrize("task_id", sorted(EXPECTED_IDS))
def test_every_task_is_complete(task_id: str) -> None:
    task = tasks.get_task(task_id)
    assert task.turns == 8
    # The backward's gradients: what cuDNN's own backward needs (envs/ops/mha_bwd.yaml).
    expected = 2e-2 if task.family == "MHABwd" else 1e-2
    assert task.tolerance.atol == task.tolerance.rtol == expected
    # The outlier stage's, where the library itself needs more (envs/ops/mha_bwd.yaml, gqa.yaml).
    outlier = 0.4 if task.family == "MHABwd" else 2.5e-2 if task.op == "GQAPrefill" else None
    if outlier is not None:
        assert task.outlier_tolerance is not None
        assert task.outlier_tolerance.atol == task.outlier_tolerance.rtol == outlier
    else:
        assert task.outlier_tolerance is None
    assert task.target.arch == {"H100": "sm_90a", "B200": "sm_100a"}[task.gpu]
    assert set(task.target.instruction_families) == {"compute", "data_movement"}
    assert render_signature(task.definition, task.entry_point).startswith('extern "C" int ')
    for workload in task.workloads:
        assert set(workload.axes) == set(task.definition.var_axes)
    if "GQA" in task.op:
        assert len(task.workloads) >= 4
        assert task.definition.const_axes["num_qo_heads"] == 32
        assert task.definition.const_axes["num_kv_heads"] == 8
        assert task.definition.const_axes["head_dim"] == 128
        batch_sizes = {w.axes["batch_size"] for w in task.workloads}
        assert len(batch_sizes) >= 4, "the pool must mix batch sizes"


def test_derived_axes_follow_the_sequences() -> None:
    decode = tasks.get_task("PTX-H100-GQADecode")
    short = next(w for w in decode.workloads if w.name == "b512-short")
    pages = sum(-(-n // 16) for n in short.sequences["kv_lens"])
    assert short.axes["num_kv_indices"] == pages
    assert short.axes["len_indptr"] == 513
    prefill = tasks.get_task("PTX-H100-GQAPrefill")
    chunked = next(w for w in prefill.workloads if w.name == "b8-chunked")
    assert chunked.axes == {"batch_size": 8, "len_indptr": 9, "total_q": 8192, "total_kv": 65536}


def test_the_flop_models_count_the_operators_work() -> None:
    gemm = tasks.get_task("PTX-H100-GEMM")
    assert gemm.flops_of({"M": 3, "N": 5, "K": 7}, {}) == 2 * 3 * 5 * 7
    mha, causal = tasks.get_task("PTX-H100-MHAFwd-d64"), tasks.get_task("PTX-H100-MHAFwdCausal-d64")
    axes = {"B": 2, "S": 8, "H": 3}
    assert mha.flops_of(axes, {}) == 4 * 2 * 3 * 8 * 8 * 64
    assert causal.flops_of(axes, {}) == 4 * 2 * 3 * (8 * 9 // 2) * 64  # the pairs the mask keeps
    backward = tasks.get_task("PTX-H100-MHABwd-d64")
    assert backward.flops_of(axes, {}) == 5 * mha.flops_of(axes, {}) // 2
    decode = tasks.get_task("PTX-H100-GQADecode")
    assert decode.flops_of({}, {"kv_lens": [5, 7]}) == 4 * 32 * 128 * 12


def test_the_prefill_model_counts_the_pairs_its_causal_mask_keeps() -> None:
    prefill = tasks.get_task("PTX-H100-GQAPrefill")
    q_lens, kv_lens = [3, 1, 4], [5, 1, 9]
    # Query i of a sequence attends key j iff j <= i + kv_len - q_len (bottom-right aligned).
    pairs = sum(
        1
        for q, kv in zip(q_lens, kv_lens, strict=True)
        for i in range(q)
        for j in range(kv)
        if j <= i + kv - q
    )
    sequences = {"q_lens": q_lens, "kv_lens": kv_lens}
    assert prefill.flops_of({}, sequences) == 4 * 32 * 128 * pairs


def test_unknown_task_names_close_matches() -> None:
    with pytest.raises(KeyError, match="PTX-H100-MHAFwd-d128"):
        tasks.get_task("PTX-H100-MHAFwd-d12")


@pytest.fixture
def envs_copy(tmp_path: Path) -> Path:
    root = tmp_path / "envs"
    shutil.copytree(paths.envs_dir(), root)
    return root


Change = Callable[[dict[str, Any]], object]


def _edit(path: Path, change: Change) -> None:
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def _gemm(data: dict[str, Any]) -> dict[str, Any]:
    task: dict[str, Any] = data["tasks"][0]
    return task


BAD_FILES: list[tuple[Change, str]] = [
    (
        lambda d: _gemm(d)["definition"]["inputs"]["A"].update(dtype="float64"),
        r"gemm\.yaml: tasks\[0\] \(PTX-H100-GEMM\): definition\.inputs\.A\.dtype: Input should be",
    ),
    (
        lambda d: _gemm(d)["definition"]["inputs"]["A"].update(shape=["M", "X"]),
        r"gemm\.yaml.*definition: .*inputs\.A\.shape: unknown axes \['X'\]",
    ),
    (
        lambda d: _gemm(d)["entry_point"].update(signature='extern "C" int gemm(int M);'),
        r"gemm\.yaml.*entry_point\.signature: does not match the definition",
    ),
    (
        lambda d: _gemm(d)["workloads"][0]["axes"].pop("K"),
        r"gemm\.yaml.*workloads\[0\]\.axes: must set exactly the var axes; missing \['K'\]",
    ),
    (
        lambda d: d["defaults"]["callables"].update(reference="kernels_ref.gemm:nope"),
        r"gemm\.yaml.*callables\.reference: .*defines no top-level 'nope'",
    ),
    (
        lambda d: d["defaults"].update(turns=0),
        r"gemm\.yaml.*turns: Input should be greater than or equal to 1",
    ),
    (lambda d: d.update(gpus=["A100"]), r"gemm\.yaml: gpus: no target file for 'A100'"),
    (lambda d: d.update(colour="red"), r"gemm\.yaml: unknown top-level fields \['colour'\]"),
    (
        lambda d: _gemm(d).update(suffix="d7"),
        r"gemm\.yaml.*\(PTX-H100-GEMM-d7\).*id: .*names head dim 7",
    ),
    (lambda d: d["defaults"].update(flops="2 * M * N * Q"), r"gemm\.yaml.*flops: .*names 'Q'"),
    (lambda d: d["defaults"].update(flops="M - M"), r"gemm\.yaml.*flops: 0 on workload"),
    (
        lambda d: d["defaults"].update(min_coverage=1.5),
        r"gemm\.yaml.*min_coverage: Input should be less than or equal to 1",
    ),
    (
        lambda d: d["defaults"].update(category="matmul"),
        r"gemm\.yaml.*category: Input should be 'gemm', 'attention'",
    ),
    (
        lambda d: d["defaults"].update(kind="performance"),
        r"gemm\.yaml.*min_coverage: a performance task has no family to cover work",
    ),
    (
        lambda d: d["defaults"].update(min_coverage=0),
        r"gemm\.yaml.*min_coverage: an instruction task needs a share of work > 0",
    ),
    (lambda d: d["defaults"].update(bytes="M - M"), r"gemm\.yaml.*bytes: 0 on workload"),
    (
        lambda d: d["defaults"]["callables"].update(baseline_kind="vendor"),
        r"gemm\.yaml.*baseline_kind: Input should be 'library', 'torch\.compile' or 'eager'",
    ),
    (
        lambda d: _gemm(d)["definition"]["inputs"].update(M={"shape": ["M"], "dtype": "int32"}),
        r"gemm\.yaml.*entry_point: parameter names used twice: \['M'\]",
    ),
    (lambda d: _gemm(d).update(op="9GEMM"), r"gemm\.yaml.*id: 'PTX-H100-9GEMM' does not match"),
]


def test_ids_may_hold_digits_after_the_first_letter() -> None:
    for task_id in ("PTX-H100-GEMMFP16", "PTX-B200-MaxPool2d", "PTX-H100-QuantFP8Block"):
        match = tasks.TASK_ID_RE.match(task_id)
        assert match is not None and tasks.get_task(task_id).op == match["op"]
    assert tasks.TASK_ID_RE.match("PTX-H100-MHAFwd-d128")["head_dim"] == "128"  # type: ignore[index]


def test_an_entry_null_removes_a_default(envs_copy: Path) -> None:
    def change(data: dict[str, Any]) -> None:
        data["defaults"]["definition"] = {"axes": {"Unused": {"type": "const", "value": 1}}}
        data["tasks"][0]["definition"]["axes"]["Unused"] = None

    _edit(envs_copy / "ops" / "gemm.yaml", change)
    assert "Unused" not in load_tasks(envs_copy)["PTX-H100-GEMM"].definition.axes


def test_tolerances_come_from_the_output_the_task_or_the_dtype() -> None:
    # The first suite names one tolerance for every output, the float32 LSE included.
    assert tasks.get_task("PTX-H100-MHAFwd-d64").tolerance_for("LSE").atol == 1e-2
    quantiser = tasks.get_task("PTX-H100-QuantInt8Row")
    assert quantiser.tolerance is None
    assert quantiser.tolerance_for("q") == tasks.DTYPE_TOLERANCES["int8"]
    assert quantiser.tolerance_for("scale") == tasks.DTYPE_TOLERANCES["float32"]
    assert tasks.get_task("PTX-H100-Softmax").tolerance_for("p").atol == 1e-6
    assert set(tasks.DTYPE_TOLERANCES) == set(tasks.DTYPE_BYTES)


def test_byte_models_default_to_each_tensor_once() -> None:
    gemm = tasks.get_task("PTX-H100-GEMM")
    assert gemm.bytes is None
    assert gemm.bytes_of({"M": 2, "N": 3, "K": 4}, {}) == (2 * 4 + 3 * 4 + 2 * 3) * 2
    embedding = tasks.get_task("PTX-H100-Embedding")  # reads the rows it gathers, not the table
    assert embedding.bytes_of({"V": 10**6, "D": 8, "T": 5}, {}) == 4 * 5 * 8 + 4 * 5


@pytest.mark.parametrize(("change", "message"), BAD_FILES)
def test_bad_task_file_is_rejected_with_file_field_and_problem(
    envs_copy: Path, change: Change, message: str
) -> None:
    _edit(envs_copy / "ops" / "gemm.yaml", change)
    with pytest.raises(TaskFileError, match=message):
        load_tasks(envs_copy)


def test_bad_workload_expression_is_rejected(envs_copy: Path) -> None:
    def change(data: dict[str, Any]) -> None:
        data["tasks"][0]["derived_axes"]["num_kv_indices"] = "__import__('os')"

    _edit(envs_copy / "ops" / "gqa.yaml", change)
    with pytest.raises(TaskFileError, match=r"gqa\.yaml.*derived axis num_kv_indices: .*may not"):
        load_tasks(envs_copy)


def test_invalid_yaml_names_the_file(envs_copy: Path) -> None:
    (envs_copy / "ops" / "gemm.yaml").write_text("family: [unclosed\n")
    with pytest.raises(TaskFileError, match=r"gemm\.yaml: not valid YAML"):
        load_tasks(envs_copy)


@pytest.mark.parametrize(
    "path", sorted(paths.envs_dir().rglob("*.yaml")), ids=lambda path: path.name
)
def test_libyamls_loader_reads_every_task_file_as_the_pure_python_one(path: Path) -> None:
    # The loader takes libyaml's parser where PyYAML has it (tasks/loader.py); the two must agree.
    if not hasattr(yaml, "CSafeLoader"):
        pytest.skip("this PyYAML was built without libyaml: the loader uses the pure-Python one")
    text = path.read_text(encoding="utf-8")
    assert yaml.load(text, Loader=yaml.CSafeLoader) == yaml.load(text, Loader=yaml.SafeLoader)


def test_duplicate_ids_are_rejected(envs_copy: Path) -> None:
    shutil.copy(envs_copy / "ops" / "gemm.yaml", envs_copy / "ops" / "gemm_again.yaml")
    with pytest.raises(TaskFileError, match=r"gemm_again\.yaml: id PTX-H100-GEMM is already"):
        load_tasks(envs_copy)
