"""The command line: list, prompt, compile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ptxgym import paths
from ptxgym.cli import main
from ptxgym.tasks import CATEGORIES, registry

NAIVE_GEMM = paths.examples_dir() / "naive" / "gemm.cu"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in a fresh process, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "ptxgym", *args], capture_output=True, text=True, check=False
    )


def test_list_json_prints_every_id() -> None:
    result = run("list", "--json")
    assert result.returncode == 0, result.stderr
    ids = [task["id"] for task in json.loads(result.stdout)]
    assert len(ids) == len(set(ids)) == len(registry())


def test_list_filters_by_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "--gpu", "B200"]) == 0
    out = capsys.readouterr().out
    b200 = sum(task.gpu == "B200" for task in registry().values())
    assert "PTX-B200-GEMM" in out and "PTX-H100-GEMM" not in out and f"{b200} tasks" in out


def test_list_categories_counts_tasks_and_performance_tasks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["list", "--category"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:] if line.strip()}
    attention = sum(task.category == "attention" for task in registry().values())
    assert rows["gemm"][1] == "0" and rows["attention"] == [str(attention), "0"]
    assert rows["elementwise"][0] == rows["elementwise"][1]  # all performance tasks
    assert main(["list", "--category", "--json"]) == 0
    counts = json.loads(capsys.readouterr().out)
    assert sum(entry["tasks"] for entry in counts.values()) == len(registry())
    assert list(counts) == [name for name in CATEGORIES if name in counts]


def test_list_one_category(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "--category", "softmax", "--gpu", "H100", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {task["id"] for task in listed} == {
        tid for tid, t in registry().items() if t.category == "softmax" and t.gpu == "H100"
    }
    assert all(task["kind"] == "performance" and task["category"] == "softmax" for task in listed)
    assert main(["list", "--category", "nope"]) == 2
    assert "one of gemm, attention" in capsys.readouterr().err


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
    from ptxgym.device.gpus import visible_gpus

    if visible_gpus():
        pytest.skip("this machine has a GPU")
    result = run("eval", "PTX-H100-GEMM", str(NAIVE_GEMM))
    assert result.returncode == 2
    assert "needs any sm_90 GPU" in result.stderr and "no NVIDIA GPU is visible" in result.stderr


def test_baseline_without_a_gpu_says_so() -> None:
    from ptxgym.device.gpus import visible_gpus

    if visible_gpus():
        pytest.skip("this machine has a GPU")
    result = run("baseline", "PTX-B200-GQADecode")
    assert result.returncode == 2 and "needs any sm_100 GPU" in result.stderr


def test_list_by_gpu_name_in_any_case_includes_the_gpus_that_run_the_tasks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name in ("h100", "H200", "h200"):
        assert main(["list", "--gpu", name, "--json"]) == 0
        ids = [task["id"] for task in json.loads(capsys.readouterr().out)]
        h100 = sum(task.gpu == "H100" for task in registry().values())
        assert len(ids) == h100 and all(task_id.startswith("PTX-H100-") for task_id in ids)
    assert main(["list", "--gpu", "gb200", "--json"]) == 0
    assert "PTX-B200-GEMM" in capsys.readouterr().out


def test_list_with_an_unknown_gpu_names_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "--gpu", "A100"]) == 2
    assert "one of B200, GB200, H100, H200" in capsys.readouterr().err


def test_output_cut_short_by_the_reader_ends_quietly() -> None:
    # The prompt (over 100,000 characters) outgrows the pipe's buffer, so the CLI is still
    # writing when the reader leaves after one line, as `ptxgym prompt ID | head -1` does.
    # Unbuffered, Python writes once per print and drops what the pipe refused, so the
    # test runs with buffered output, as a shell runs the CLI by default.
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    process = subprocess.Popen(
        [sys.executable, "-m", "ptxgym", "prompt", "PTX-H100-GEMM"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
    )
    assert process.stdout is not None and process.stderr is not None
    assert process.stdout.readline() == "# Task PTX-H100-GEMM\n"
    process.stdout.close()
    stderr = process.stderr.read()
    assert process.wait() == 141
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr


def test_missing_nvcc_with_a_wrong_cuda_home_is_a_one_line_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ptxgym", "compile", "PTX-H100-GEMM", str(NAIVE_GEMM)],
        capture_output=True,
        text=True,
        check=False,
        # An empty PATH, so that nvcc can only come from CUDA_HOME.
        env={**os.environ, "PATH": str(tmp_path), "CUDA_HOME": str(tmp_path / "no-cuda")},
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "nvcc was not found" in result.stderr and "no-cuda has no bin/nvcc" in result.stderr


def test_eval_json_without_a_gpu_prints_json_saying_why() -> None:
    from ptxgym.device.gpus import visible_gpus

    if visible_gpus():
        pytest.skip("this machine has a GPU")
    result = run("eval", "PTX-H100-GEMM", str(NAIVE_GEMM), "--json")
    assert result.returncode == 2
    assert "no NVIDIA GPU is visible" in json.loads(result.stdout)["error"]
