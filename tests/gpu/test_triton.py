"""Triton candidates through the real pipeline on an sm_90 GPU (``pytest -m gpu``; needs Triton).

- The three Triton examples pass through the env with the judge's default settings (memcheck and
  the CUPTI-counted profile included), and the GEMM qualifies with executed HGMMA and UTMALDG.
- Compiling and autotuning happen in the compile run, not in the worker: the worker cannot
  compile (a kernel it lacks is a RUNTIME_ERROR that says so), and the timed latency is that of
  the kernels alone.
- A hostile module the policy would have refused, judged anyway, can neither start a program nor
  write outside its folder, in the compile run or the worker; the next evaluation passes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ptxgym import paths
from ptxgym.env import PTXKernelEnv
from ptxgym.evaluate.judge_settings import JudgeSettings
from ptxgym.evaluate.local_gpu import LocalGPUEvaluator, incompatibility
from ptxgym.languages.triton.build import build_module
from ptxgym.tasks import get_task

pytestmark = pytest.mark.gpu
pytest.importorskip("triton")

EXAMPLES = paths.examples_dir() / "triton"
GEMM = get_task("PTX-H100-GEMM")
# What the manifest lists for Triton, with the task each solves.
CASES = [
    ("gemm.py", "PTX-H100-GEMM"),
    ("mha_fwd_d128.py", "PTX-H100-MHAFwd-d128"),
    ("gqa_decode.py", "PTX-H100-GQADecode"),
]


@pytest.fixture(autouse=True)
def _sm90() -> None:
    if reason := incompatibility(GEMM):
        pytest.skip(reason)


@pytest.fixture(scope="module")
def evaluator() -> Iterator[LocalGPUEvaluator]:
    pool = LocalGPUEvaluator(language="triton")  # the judge's default settings
    yield pool
    pool.close()


def _step(evaluator: LocalGPUEvaluator, task_id: str, source: str) -> dict[str, Any]:
    if "GQA" in task_id:
        pytest.importorskip("flashinfer")  # the GQA baselines are FlashInfer's
    env = PTXKernelEnv(task_id, evaluator=evaluator, language="triton")
    env.reset(seed=0)
    try:
        info: dict[str, Any] = env.step(f"```python\n{source}```")[4]
    finally:
        env.close()
    return info


@pytest.mark.parametrize(("example", "task_id"), CASES)
def test_each_triton_example_passes_with_the_default_settings(
    evaluator: LocalGPUEvaluator, example: str, task_id: str
) -> None:
    info = _step(evaluator, task_id, (EXAMPLES / example).read_text())
    outcome = info["outcome"]
    assert info["status"] == "PASSED", info["feedback"]
    stages = outcome["stage_seconds"]
    assert stages["compile_run"] > 0  # JIT (and the attention's autotuning) ran there
    assert outcome["speedup"] > 0
    # The worker cannot compile (a miss is a RUNTIME_ERROR): its timed calls ran kernels the
    # compile run had made, and a call's latency is far below one kernel's compile time.
    assert outcome["latency_ms"] < 100
    assert outcome["sanitizers"] and outcome["sanitizers"][0]["errors"] == 0


def test_the_triton_gemm_qualifies_with_executed_hgmma_and_tma(
    evaluator: LocalGPUEvaluator,
) -> None:
    info = _step(evaluator, "PTX-H100-GEMM", (EXAMPLES / "gemm.py").read_text())
    assert info["status"] == "PASSED", info["feedback"]
    profile = info["outcome"]["profile"]
    assert profile["method"] == "cupti", profile
    assert profile["warp_counts"].get("HGMMA", 0) > 0, profile
    assert profile["warp_counts"].get("UTMALDG", 0) > 0, profile
    assert profile["families"] == {"compute": True, "data_movement": True}
    assert info["outcome"]["qualified"] is True
    # 8192^3 in 128x128x64 tiles of m64n128k16 wgmma: every multiply-add is the HGMMA's.
    assert profile["coverage"] == pytest.approx(1.0, rel=0.01)


def test_the_naive_gqa_decode_does_not_qualify(evaluator: LocalGPUEvaluator) -> None:
    info = _step(evaluator, "PTX-H100-GQADecode", (EXAMPLES / "gqa_decode.py").read_text())
    assert info["status"] == "PASSED", info["feedback"]
    assert info["outcome"]["qualified"] is False


def _judge_without_policy(source: str, evaluator: LocalGPUEvaluator) -> dict[str, Any]:
    """Judge ``source`` as if the policy had missed it (built as the Triton build does, the
    policy skipped): what stands is the compile run's and the worker's confinement."""
    build = build_module(source, GEMM)
    assert build.ok, build.log
    return evaluator.evaluate_build(GEMM, build, 0.0).to_dict()


def test_a_hostile_module_cannot_start_programs_or_write_outside(
    evaluator: LocalGPUEvaluator, tmp_path: Path
) -> None:
    canary = tmp_path / "escaped"
    escape = f'''
import os, subprocess
from pathlib import Path


def _try(what):
    try:
        what()
    except Exception:
        pass


def _escape():
    os.system("touch {canary}")
    _try(lambda: subprocess.run(["/bin/sh", "-c", "touch {canary}"]))
    _try(lambda: Path("{canary}").write_text("x"))
'''
    source = (EXAMPLES / "gemm.py").read_text()
    source = source.replace("import triton\n", escape + "\n_escape()\nimport triton\n", 1)
    source = source.replace(
        "def gemm(A, B, C, M, N, K):\n", "def gemm(A, B, C, M, N, K):\n    _escape()\n"
    )
    outcome = _judge_without_policy(source, evaluator)
    assert not canary.exists(), outcome["message"]
    # It fails alone: an honest module right after it passes.
    info = _step(evaluator, "PTX-H100-GEMM", (EXAMPLES / "gemm.py").read_text())
    assert info["status"] == "PASSED", info["feedback"]


def test_the_policy_stops_an_escape_through_the_object_graph(evaluator: LocalGPUEvaluator) -> None:
    source = (
        (EXAMPLES / "gemm.py")
        .read_text()
        .replace(
            "    a_desc = ",
            "    os_ = ().__class__.__bases__[0].__subclasses__()\n    a_desc = ",
            1,
        )
    )
    info = _step(evaluator, "PTX-H100-GEMM", source)
    assert info["status"] == "POLICY_VIOLATION"
    assert "__subclasses__" in info["message"] or "__class__" in info["message"]


def test_a_kernel_compiled_only_after_the_compile_run_fails_and_says_why() -> None:
    # A specialisation that changes from call to call (module state the policy would refuse):
    # the compile run compiles the first, the worker's second call needs another.
    source = (EXAMPLES / "gemm.py").read_text()
    source = source.replace("GROUP_M = 8\n", "GROUP_M = 8\n_CALLS = [0]\n", 1)
    source = source.replace("    grid = (", "    _CALLS[0] += 1\n    grid = (", 1).replace(
        "GROUP_M=GROUP_M,", "GROUP_M=1 << (_CALLS[0] % 4),", 1
    )
    evaluator = LocalGPUEvaluator(
        language="triton", settings=JudgeSettings(memcheck=False, profile=False)
    )
    outcome = _judge_without_policy(source, evaluator)
    assert outcome["status"] == "RUNTIME_ERROR", outcome["message"]
    assert "had to be compiled during the evaluation" in outcome["message"]
