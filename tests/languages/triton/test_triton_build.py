"""The Triton build (``ptxgym.languages.triton.build``): byte-compiled, never run, kept in the
build cache; the examples build, and a syntax error is a COMPILE_ERROR that quotes its line."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import pytest

import ptxgym  # noqa: F401  (registers the tasks)
from ptxgym import paths
from ptxgym.evaluate.compile_only import CompileOnlyEvaluator
from ptxgym.languages import get_language
from ptxgym.languages.triton.build import MODULE_FILE, build_module
from ptxgym.tasks import get_task

EXAMPLES = [
    ("triton/gemm.py", "PTX-H100-GEMM"),
    ("triton/mha_fwd_d128.py", "PTX-H100-MHAFwd-d128"),
    ("triton/gqa_decode.py", "PTX-H100-GQADecode"),
]


@pytest.mark.parametrize(("example", "task_id"), EXAMPLES)
def test_each_example_is_compiled_through_the_env(example: str, task_id: str) -> None:
    source = (paths.examples_dir() / example).read_text()
    env = gym.make(task_id, language="triton", evaluator="compile-only")
    env.reset()
    _, reward, _, _, info = env.step(f"My module:\n```python\n{source}```\n")
    env.close()
    assert info["status"] == "COMPILED", info["feedback"]
    assert "kernels are compiled" in info["message"]
    assert info["outcome"]["compile"]["language"] == "triton"
    assert reward == pytest.approx(0.1)


def test_the_build_keeps_the_module_in_the_cache_and_reuses_it(tmp_path: Path) -> None:
    task = get_task("PTX-H100-GEMM")
    source = (paths.examples_dir() / "triton" / "gemm.py").read_text()
    first = build_module(source, task, cache_root=tmp_path)
    again = build_module(source, task, cache_root=tmp_path)
    assert first.ok and not first.cached and again.cached
    assert first.library == again.library
    assert first.library is not None and Path(first.library).name == MODULE_FILE
    assert Path(first.library).read_text() == source
    assert first.arch == "sm_90a" and first.language == "triton"


def test_a_syntax_error_is_a_compile_error_quoting_the_line() -> None:
    task = get_task("PTX-H100-GEMM")
    source = "import triton\n\n\ndef gemm(A, B, C, M, N, K):\n    return (M +\n"
    outcome = CompileOnlyEvaluator(language="triton").evaluate(task, source)
    assert outcome.status.value == "COMPILE_ERROR"
    assert outcome.compile is not None
    assert outcome.compile.log.startswith("candidate.py(5): error:")
    assert "return (M +" in outcome.compile.log


def test_the_build_runs_nothing_of_the_module(tmp_path: Path) -> None:
    task = get_task("PTX-H100-GEMM")
    canary = tmp_path / "ran"
    # Would write the canary if the build executed it (the policy refuses it; the build is
    # called here directly to show it only compiles).
    source = f"open({str(canary)!r}, 'w').write('x')\ndef gemm(A, B, C, M, N, K):\n    pass\n"
    result = get_language("triton").build(source, task, timeout_s=10.0)
    assert result.ok and not canary.exists()


def test_a_cuda_evaluator_refuses_a_triton_env() -> None:
    with pytest.raises(ValueError, match="evaluates cuda sources, not triton"):
        gym.make("PTX-H100-GEMM", language="triton", evaluator=CompileOnlyEvaluator())


def test_an_unknown_language_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown action language 'rust'"):
        gym.make("PTX-H100-GEMM", language="rust")


def test_the_command_line_takes_the_language(capsys: pytest.CaptureFixture[str]) -> None:
    from ptxgym.cli import main

    example = str(paths.examples_dir() / "triton" / "gemm.py")
    assert main(["compile", "PTX-H100-GEMM", example, "--language", "triton"]) == 0
    assert "COMPILED" in capsys.readouterr().out
    assert main(["compile", "PTX-H100-GEMM", example]) == 1  # read as CUDA, it is no kernel
    capsys.readouterr()
    assert main(["prompt", "PTX-H100-GEMM", "--language", "triton"]) == 0
    assert "def gemm(A, B, C, M, N, K) -> None" in capsys.readouterr().out
