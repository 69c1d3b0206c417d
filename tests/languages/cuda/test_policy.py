"""The static policy: includes, forbidden libraries, file-reading tricks, the entry point."""

from __future__ import annotations

import pytest

from ptxgym.languages.cuda.policy import (
    MAX_SOURCE_CHARS,
    MAX_VIOLATIONS_SHOWN,
    check_policy,
    included_headers,
)
from ptxgym.tasks import get_task

TASK = get_task("PTX-H100-GEMM")
ENTRY = (
    'extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C,\n'
    "                    int M, int N, int K, cudaStream_t stream) { return 0; }\n"
)


def violations(source: str) -> str:
    return "\n".join(check_policy(source, TASK).violations)


def test_a_plain_kernel_passes() -> None:
    source = "#include <cuda_runtime.h>\n#include <cuda_bf16.h>\n#include <cstdint>\n" + ENTRY
    assert check_policy(source, TASK).ok


def test_the_pack_header_may_be_included() -> None:
    assert check_policy('#include "ptxgym_h100.cuh"\n' + ENTRY, TASK).ok
    assert "only quoted include" in violations('#include "ptxgym_b200.cuh"\n' + ENTRY)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ('#include "/etc/passwd"\n', "never by path"),
        ("#include </etc/passwd>\n", "never by path"),
        ('#include "../x.h"\n', "never by path"),
        ('#include "sub/../../x.h"\n', "never by path"),
        ("#include <cublas_v2.h>\n", "cuBLAS"),
        ("#include <cudnn.h>\n", "cuDNN"),
        ("#include <cutlass/gemm/gemm.h>\n", "CUTLASS"),
        ("#include <cute/tensor.hpp>\n", "CUTLASS"),
        ("#include <torch/extension.h>\n", "libtorch"),
        ("#include <thrust/sort.h>\n", "Thrust"),
        ("#include <fstream>\n", "not an allowed header"),
        ("#include <dlfcn.h>\n", "not an allowed header"),
        ('#define F "/etc/passwd"\n#include F\n', "only a literal"),
        ("%:include </etc/passwd>\n", "never by path"),
        ("#inc\\\nlude </etc/passwd>\n", "never by path"),
        ("/* x */ #  include_next </etc/passwd>\n", "never by path"),
        ("#embed </etc/passwd>\n", "#embed"),
        ("#if __has_include(</etc/passwd>)\n#endif\n", "never by path"),
        ('#pragma GCC dependency "/etc/passwd"\n', "not allowed"),
        ('_Pragma("GCC dependency \\"x\\"")\n', "not allowed"),
        ('asm(".incbin \\"/etc/passwd\\"");\n', ".incbin"),
        ('asm(".inc" "bin \\"/etc/passwd\\"");\n', ".incbin"),
        ("#define S(x) #x\nasm(S(.incbin));\n", ".incbin"),
        ('void* h = dlopen("libcublas.so", 2);\n', "dlopen"),
        ('extern "C" int cublasCreate_v2(void**);\n', "cuBLAS"),
        ("auto t = torch::empty({1});\n", "libtorch"),
    ],
)
def test_forbidden_source_is_rejected(source: str, message: str) -> None:
    found = violations(source + ENTRY)
    assert found, "expected a violation"
    assert message in found


def test_comments_and_strings_do_not_hide_or_fake_directives() -> None:
    commented = "// #include </etc/passwd>\n/* #include <fstream> */\n" + ENTRY
    assert check_policy(commented, TASK).ok
    in_string = 'const char* s = "#include <fstream>";\n' + ENTRY
    assert check_policy(in_string, TASK).ok


def test_missing_entry_point_names_the_signature() -> None:
    found = violations('#include <cuda_runtime.h>\nextern "C" int gem() { return 0; }\n')
    assert "entry point is missing" in found
    assert TASK.entry_point.signature in found


def test_oversized_source_is_rejected_without_scanning() -> None:
    assert "limit" in violations(ENTRY + "//" + "x" * MAX_SOURCE_CHARS)


HONEST_TRICKY_SOURCE = (
    "%:include <cstdint>\n"
    "#include <cuda_runtime.h> // the runtime\n"
    "#inc\\\f\nlude <cuda_bf16.h>\n"
    "#if defined(__has_include) && __has_include(<cuda_fp16.h>)\n"
    "#endif\n"
    '#define UNROLL _Pragma("unroll")\n'
    "#pragma GCC diagnostic push\n"
    "#pragma nv_diag_suppress 177\n"
    "constexpr int kBig = 1'000'000;\n"
    "constexpr unsigned kMask = 0xFFFF'FFFFu;\n"
    'const char* kNote = R"x(a "quoted" /* not a comment */ )" still)x";\n'
    "const char kQuote = '\"';\n"
    'const char* kUtf8 = u8"caf\u00e9";\n'
    '__device__ int lane() { int l; asm volatile("mov.u32 %0, %%laneid;" : "=r"(l)); '
    "return l; }\n"
    'extern"C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C,\n'
    "                   int M, int N, int K, cudaStream_t stream) { UNROLL for (;;) {} }\n"
)


def test_an_honest_source_with_every_lexical_feature_passes() -> None:
    assert violations(HONEST_TRICKY_SOURCE) == ""
    assert included_headers(HONEST_TRICKY_SOURCE, TASK) == (
        "<cstdint>",
        "<cuda_runtime.h>",
        "<cuda_bf16.h>",
    )


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ('#ident "x"\n', "#ident is not allowed"),
        ("#assert machine(x86)\n", "#assert is not allowed"),
        ('# "x"\n', 'the directive #"x" is not allowed'),
        ('#line 7 "x.cu"\n', "line-control"),
        ('# 7 "x.cu" 2\n', "line-control"),
        ("#pragma GCC system_header\n", "not allowed"),
        ("#pragma GCC\n", "not allowed"),
        ('_Pragma("GCC system_header")\n', "not allowed"),
        ('_Pragma(u8"unroll")\n', "only with one string literal"),
        ('_Pragma("unroll" "2")\n', "only with one string literal"),
        ("#if __has_embed(<x>)\n#endif\n", "__has_embed"),
        ('asm(".in" "cl" "ude \\"x\\"");\n', ".include"),
        ('asm("\\x2eincbin \\"x\\"");\n', ".incbin"),
        ('asm(".re" u8"pt 2");\n', ".rept"),
        ('const char* s = "??/";\n', "trigraph"),
        ('asm("\\x{2e}incbin");\n', "delimited or named escape"),
        ("/* never closed\n", "an unterminated comment"),
        ('const char* s = R"(a\\\nb)";\n', "a line continuation inside a raw string"),
        ("int caf\u00e9 = 0;\n", "non-ASCII"),
        ("int \\u0061 = 0;\n", "universal character name"),
        ("int x = 0;\0\n", "NUL"),
        ("int x = a \\ b;\n", "stray backslash"),
    ],
    ids=repr,
)
def test_what_the_compiler_might_read_otherwise_is_refused(source: str, message: str) -> None:
    found = violations(source + ENTRY)
    assert message in found, found


def test_violations_name_their_line_and_are_capped() -> None:
    source = "".join(f'#include "x{index}.h"\n' for index in range(50)) + ENTRY
    found = check_policy(source, TASK).violations
    assert found[0].startswith("line 1: #include")
    assert len(found) == MAX_VIOLATIONS_SHOWN + 1
    assert found[-1] == "… and 30 more"
