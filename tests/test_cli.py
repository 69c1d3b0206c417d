"""The command line: list, prompt, compile."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ptxgym import paths
from ptxgym.cli import main

NAIVE_GEMM = paths.examples_dir() / "naive" / "gemm.cu"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in a fresh process, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "ptxgym", *args], capture_output=True, text=True, check=False
    )


def test_list_json_prints_all_30_ids() -> None:
    result = run("list", "--json")
    assert result.returncode == 0, result.stderr
    ids = [task["id"] for task in json.loads(result.stdout)]
    assert len(ids) == len(set(ids)) == 30


def test_list_filters_by_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "--gpu", "B200"]) == 0
    out = capsys.readouterr().out
    assert "PTX-B200-GEMM" in out and "PTX-H100-GEMM" not in out and "15 tasks" in out


def test_prompt_prints_the_prompt_and_token_counts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["prompt", "PTX-H100-GQADecode", "--knowledge", "none"]) == 0
    captured = capsys.readouterr()
    assert 'extern "C" int gqa_decode(' in captured.out
    assert "tokens" in captured.err


def test_unknown_task_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["prompt", "PTX-H100-Nope"]) == 2
    assert "unknown task 'PTX-H100-Nope'" in capsys.readouterr().err


@pytest.mark.nvcc
def test_compile_naive_gemm_for_sm90a() -> None:
    result = run("compile", "PTX-H100-GEMM", str(NAIVE_GEMM), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    outcome = json.loads(result.stdout)
    assert outcome["status"] == "COMPILED"
    assert outcome["compile"]["arch"] == "sm_90a"
    assert outcome["compile"]["kernels"]


@pytest.mark.nvcc
def test_compile_error_exits_nonzero_with_feedback(tmp_path: Path) -> None:
    broken = tmp_path / "broken.cu"
    broken.write_text(NAIVE_GEMM.read_text().replace("return", "retrun", 1))
    result = run("compile", "PTX-H100-GEMM", str(broken))
    assert result.returncode == 1
    assert "Status: COMPILE_ERROR" in result.stdout and "candidate.cu(" in result.stdout


def test_compile_of_non_utf8_file_is_a_format_error(tmp_path: Path) -> None:
    binary = tmp_path / "kernel.cu"
    binary.write_bytes(b"\xff\xfe\x00binary")
    result = run("compile", "PTX-H100-GEMM", str(binary))
    assert result.returncode == 1 and "FORMAT_ERROR" in result.stdout


def test_compile_of_missing_file_is_a_clear_error() -> None:
    result = run("compile", "PTX-H100-GEMM", "/nonexistent/kernel.cu")
    assert result.returncode == 2 and "no such file" in result.stderr


def test_eval_without_a_matching_gpu_says_so(tmp_path: Path) -> None:
    from ptxgym.gpus import visible_gpus

    if visible_gpus():
        pytest.skip("this machine has a GPU")
    result = run("eval", "PTX-H100-GEMM", str(NAIVE_GEMM))
    assert result.returncode == 2
    assert "needs any sm_90 GPU" in result.stderr and "no NVIDIA GPU is visible" in result.stderr


def test_baseline_without_a_gpu_says_so() -> None:
    from ptxgym.gpus import visible_gpus

    if visible_gpus():
        pytest.skip("this machine has a GPU")
    result = run("baseline", "PTX-B200-GQADecode")
    assert result.returncode == 2 and "needs any sm_100 GPU" in result.stderr
