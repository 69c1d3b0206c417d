"""What the compiler may read, on the CPU: nvcc and everything it starts run under a read
allow-list (``ptxgym.build.sandbox``): the toolkit, the system and the build folder. Whatever a
source makes the compiler open (an include by path, a ``#line`` naming another file, an assembler
``.incbin``), a file of the user's is not readable, so no layer after it (the policy, the log
trimming) is needed to keep it out of the feedback. These tests go below the policy on purpose:
they build sources the policy would refuse.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from ptxgym.build import sandbox as build_sandbox
from ptxgym.languages.cuda.compiler import _run, compile_source, nvcc_path
from ptxgym.tasks import get_task

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.skipif(not build_sandbox.available(), reason="the kernel has no Landlock"),
]

GEMM = get_task("PTX-H100-GEMM")
_ENTRY = (
    "#include <cuda_bf16.h>\n#include <cuda_runtime.h>\n"
    'extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C,'
    " int M, int N, int K, cudaStream_t stream) { return 0; }\n"
)


@pytest.fixture
def secret(tmp_path: Path) -> tuple[Path, str]:
    """A file of the user's (a valid C++ header, so that only its readability decides), and the
    random token in it."""
    token = secrets.token_hex(12)
    path = tmp_path / "home" / "secret.h"
    path.parent.mkdir()
    # The token on every line: a diagnostic that quotes any line of the file shows it.
    path.write_text("".join(f"static int token_{token}_{line} = 1;\n" for line in range(60)))
    return path, token


@pytest.mark.parametrize(
    "probe",
    [
        '#include "{path}"\n',
        "#include <{path}>\n",
        # The redefinition is the submission's, its note ("previous definition") quotes the file.
        '#line 3 "{path}"\nint twice = 1;\n#line 40 "candidate.cu"\nint twice = 2;\n',
    ],
    ids=["include-quoted", "include-angled", "line-then-redefinition"],
)
def test_a_build_reads_no_file_of_the_users(
    probe: str, secret: tuple[Path, str], tmp_path: Path
) -> None:
    path, token = secret
    result = compile_source(
        probe.format(path=path) + _ENTRY, GEMM, cache_root=tmp_path / "cache", timeout_s=120
    )
    assert token not in result.log and all(token not in w for w in result.warnings)
    # An include of a readable file would build (it is valid C++): refused.
    assert not result.ok


def test_compiler_processes_read_only_the_toolkit_the_system_and_their_folder(
    secret: tuple[Path, str], tmp_path: Path
) -> None:
    path, token = secret
    folder = tmp_path / "build"
    folder.mkdir()
    (folder / "own.txt").write_text("own file")
    code, output, _ = _run(["cat", "own.txt", str(path), "/proc/1/environ"], folder, 30)
    assert code != 0 and token not in output
    assert "own file" in output
    assert output.count("Permission denied") == 2
    # The toolkit and the system stay readable: the compiler's own headers and the loader's cache.
    assert any(nvcc_path().startswith(str(p)) for p in build_sandbox.readable_paths(nvcc_path()))
