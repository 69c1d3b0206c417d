"""The log a build rebuilds from the compiler's and the linker's output
(``ptxgym.languages.cuda.compiler_log``), seen through real nvcc builds: a submission's
diagnostics quote our line with the compiler's column, our translation unit's are translated,
system headers are named and not echoed, ptxas quotes our PTX, the linker names the symbol.
Hostile output (a ``#line`` naming a secret file, carriage returns, cuts) is in
tests/hostile/test_hostile_build.py."""

from __future__ import annotations

import pytest
from gemm_candidates import GEMM, HEADER, NAIVE_GEMM, SIGNATURE

from ptxgym.evaluate.compile_only import CompileOnlyEvaluator
from ptxgym.languages.cuda.compiler import compile_source
from ptxgym.outcome import Status

pytestmark = pytest.mark.nvcc


def test_syntax_error_gives_compile_error_with_the_nvcc_line() -> None:
    source = HEADER + SIGNATURE + " {\n  int x = 1\n  return x;\n}\n"
    outcome = CompileOnlyEvaluator().evaluate(GEMM, source)
    assert outcome.status is Status.COMPILE_ERROR
    assert outcome.compile is not None
    assert 'candidate.cu(5): error: expected a ";"' in outcome.compile.log


def test_wrong_signature_names_the_required_one() -> None:
    source = HEADER + SIGNATURE.replace("int K,", "int K, int L,") + " { return 0; }\n"
    outcome = CompileOnlyEvaluator().evaluate(GEMM, source)
    assert outcome.status is Status.COMPILE_ERROR
    assert outcome.compile is not None
    assert "entry point does not match" in outcome.compile.log
    assert GEMM.entry_point.signature in outcome.compile.log


def test_ptx_errors_show_the_ptx_line() -> None:
    source = HEADER + '__global__ void k() { asm volatile("wgmma.bogus.sync;"); }\n'
    source += SIGNATURE + " { k<<<1, 1, 0, stream>>>(); return 0; }\n"
    outcome = CompileOnlyEvaluator().evaluate(GEMM, source)
    assert outcome.status is Status.COMPILE_ERROR
    assert outcome.compile is not None
    assert "ptxas error" in outcome.compile.log
    assert "wgmma.bogus.sync" in outcome.compile.log


def test_undefined_runtime_symbol_fails_at_link_time() -> None:
    source = HEADER + 'extern "C" int cudaNotARuntimeFunction(int);\n'
    source += SIGNATURE + " { return cudaNotARuntimeFunction(M); }\n"
    outcome = CompileOnlyEvaluator().evaluate(GEMM, source)
    assert outcome.status is Status.COMPILE_ERROR
    assert outcome.compile is not None
    assert "undefined reference to 'cudaNotARuntimeFunction'" in outcome.compile.log


def test_errors_inside_system_headers_name_the_header_but_do_not_echo_it() -> None:
    # An out-of-range std::get fails a static_assert located in <array> itself.
    source = "#include <array>\nstatic int bad = std::get<5>(std::array<int, 2>{});\n" + NAIVE_GEMM
    outcome = CompileOnlyEvaluator().evaluate(GEMM, source)
    assert outcome.status is Status.COMPILE_ERROR
    assert outcome.compile is not None
    log = outcome.compile.log
    assert "(system header)" in log
    assert "/usr/" not in log and "^" not in log.replace("candidate.cu", "")


def test_a_submission_diagnostic_quotes_our_line_with_the_compilers_column() -> None:
    source = HEADER + "int before = 1;\n#warning look here\n" + SIGNATURE + " { return 0; }\n"
    result = compile_source(source, GEMM)
    assert result.ok, result.log
    block = "candidate.cu(4): warning: #warning look here [-Wcpp]\n  #warning look here\n   ^"
    assert block in result.warnings


def test_a_multiple_definition_names_the_symbol() -> None:
    # The static CUDA runtime defines it too: the link fails, and says on what.
    source = HEADER + (
        'extern "C" cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) '
        "{ *ms = 0.f; return cudaSuccess; }\n"
    )
    result = compile_source(source + SIGNATURE + " { return 0; }\n", GEMM)
    assert not result.ok and result.policy_violation is None
    assert "multiple definition of 'cudaEventElapsedTime'" in result.log, result.log
