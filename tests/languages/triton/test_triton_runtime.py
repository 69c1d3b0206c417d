"""What lets a Triton candidate run sealed, shown on a CPU (``ptxgym.languages.triton.runtime``,
``ptxgym.evaluate.compile_run``): Triton compiles for sm_90a without a GPU, so the compile run's
confinement and the sealed processes' cache hits can be exercised here with ``triton.compile``.

- Under the compile run's confinement (Landlock with an execute allow-list, seccomp allowing
  processes) ptxas and the C compiler run, and nothing else does (a shell, ``file``).
- A copy of that cache, in another folder, serves a sealed process (seccomp: no processes)
  without compiling: same kernel, same key; a kernel the cache lacks fails to compile there.
- The examples lower to the target instructions on sm_90a: the GEMM's tl.dot to HGMMA and its
  descriptors to UTMALDG, the attention's products to HGMMA.
- The SASS listing of a cache joins counts with the cubins that ran only, and refuses a name two
  different loaded kernels share.

Needs Triton (``pip install triton``; not in CI's ``.[dev]``), Landlock and libseccomp; skipped
where they are missing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from ptxgym import paths
from ptxgym.build.sass import (
    LISTING_FILE,
    mnemonic,
    module_listing,
    parse_sass,
    target_addresses,
)
from ptxgym.evaluate.compile_run import _snapshot
from ptxgym.evaluate.single_call import hand_candidate
from ptxgym.languages.base import ENTRY_TRITON
from ptxgym.languages.triton.runtime import (
    CACHE_FOLDER,
    compiler_programs,
    elf_interpreter,
    environment,
)
from ptxgym.sandbox import landlock
from ptxgym.tasks import get_task

pytest.importorskip("triton")
if landlock.abi_version() < 1:
    pytest.skip("needs Landlock", allow_module_level=True)

FACTS = {"TRITON_MOCK_PTX_VERSION": "ptxas (test)", "TRITON_LIBCUDA_PATH": "/usr/lib"}
EXAMPLES = paths.examples_dir() / "triton"
# A child that loads an example module and compiles one of its kernels for sm_90a, printing
# the kernel's hash: triton.compile takes a target, so no GPU is needed.
COMPILE = """
import importlib.util, json, os, subprocess, sys
from pathlib import Path
from ptxgym.languages.triton.runtime import compiler_programs, environment
from ptxgym.sandbox.isolation import confine, seal

folder, mode, example, kernel, signature, constants, options = sys.argv[1:8]
folder = Path(folder)
if mode == "compile":
    confine(folder, programs=compiler_programs())
    seal(network=False, processes=True)
else:
    confine(folder)
    seal(network=False)
os.environ.update(environment(folder, json.loads(sys.argv[8])))
for program in (["/bin/sh", "-c", "true"], ["file", "-b", sys.executable]):
    try:
        subprocess.run(program, capture_output=True, check=False)
        print("RAN", program[0])
    except OSError:
        pass
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

spec = importlib.util.spec_from_file_location("candidate", folder / example)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
function = getattr(module, kernel)
if not isinstance(function, triton.JITFunction):
    function = function.fn  # an autotuned kernel's own JITFunction
constants = {(int(k),): v for k, v in json.loads(constants).items()}
source = ASTSource(function, json.loads(signature), constants)
try:
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=json.loads(options))
except PermissionError as exc:
    print("REFUSED", exc)
else:
    print("HASH", compiled.hash)
"""
GEMM_SIGNATURE = {
    "a_desc": "tensordesc<bf16[128, 64]>",
    "b_desc": "tensordesc<bf16[128, 64]>",
    "c_desc": "tensordesc<bf16[128, 128]>",
    "M": "i32",
    "N": "i32",
    "K": "i32",
    "BLOCK_M": "constexpr",
    "BLOCK_N": "constexpr",
    "BLOCK_K": "constexpr",
    "GROUP_M": "constexpr",
}
GEMM_CONSTANTS = {"6": 128, "7": 128, "8": 64, "9": 8}
MHA_SIGNATURE = {
    "q_ptr": "*bf16",
    "k_ptr": "*bf16",
    "v_ptr": "*bf16",
    "o_ptr": "*bf16",
    "lse_ptr": "*fp32",
    "S": "i32",
    "H": "i32",
    "qk_scale": "fp32",
    "HEAD_DIM": "constexpr",
    "BLOCK_M": "constexpr",
    "BLOCK_N": "constexpr",
}


@pytest.fixture
def compile_in(tmp_path: Path) -> Callable[..., str]:
    """Runs ``COMPILE`` in a child confined to ``folder`` (the example copied there): its
    output."""
    script = tmp_path / "compile.py"
    script.write_text(COMPILE)

    def run(
        folder: Path,
        mode: str,
        example: str,
        kernel: str,
        signature: dict[str, str],
        constants: dict[str, int],
        options: dict[str, int],
    ) -> str:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / example).write_bytes((EXAMPLES / example).read_bytes())
        arguments = [json.dumps(value) for value in (signature, constants, options, FACTS)]
        result = subprocess.run(
            [sys.executable, str(script), str(folder), mode, example, kernel, *arguments],
            capture_output=True,
            text=True,
            timeout=600,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(paths.import_root())},
            check=False,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout

    return run


def test_the_environment_points_triton_at_the_folder_and_the_judges_facts() -> None:
    folder = Path("/somewhere")
    settings = environment(folder, FACTS)
    assert settings["TRITON_CACHE_DIR"] == str(folder / CACHE_FOLDER)
    assert settings["TRITON_MOCK_PTX_VERSION"] == FACTS["TRITON_MOCK_PTX_VERSION"]
    assert settings["TRITON_CACHE_AUTOTUNING"] == "1"
    assert settings["TRITON_CACHE_MANAGER"].endswith("triton.cache:RelocatableCache")


def test_the_compile_runs_programs_are_files_with_their_loader() -> None:
    programs = compiler_programs()
    assert any(program.name == "ptxas" for program in programs)
    assert all(program.is_file() and program == program.resolve() for program in programs)
    loader = elf_interpreter(Path(sys.executable).resolve())
    assert loader is not None and loader in programs


def test_kernels_compiled_confined_serve_a_sealed_process_from_a_copy(
    tmp_path: Path, compile_in: Callable[..., str]
) -> None:
    options = {"num_warps": 8, "num_stages": 4}
    run = tmp_path / "run"
    compiled = compile_in(
        run, "compile", "gemm.py", "gemm_kernel", GEMM_SIGNATURE, GEMM_CONSTANTS, options
    )
    assert "RAN" not in compiled  # neither a shell nor `file` could start
    assert "HASH" in compiled, compiled
    # The judge's snapshot, and a process's own copy of it (as a worker gets it).
    prepared = tmp_path / "prepared"
    assert _snapshot(run / CACHE_FOLDER, prepared / CACHE_FOLDER) is None
    (prepared / "candidate.py").write_text("")
    worker = tmp_path / "worker"
    worker.mkdir()
    hand_candidate(str(prepared / "candidate.py"), worker, ENTRY_TRITON)
    served = compile_in(
        worker, "sealed", "gemm.py", "gemm_kernel", GEMM_SIGNATURE, GEMM_CONSTANTS, options
    )
    assert served.split("HASH")[1] == compiled.split("HASH")[1]  # the same kernel, not compiled
    other = {**GEMM_CONSTANTS, "9": 4}
    refused = compile_in(worker, "sealed", "gemm.py", "gemm_kernel", GEMM_SIGNATURE, other, options)
    assert "REFUSED" in refused  # a kernel the cache lacks: ptxas cannot start there


def test_the_snapshot_takes_regular_files_only(tmp_path: Path) -> None:
    source = tmp_path / "cache"
    (source / "A").mkdir(parents=True)
    (source / "A" / "k.cubin").write_bytes(b"cubin")
    (source / "A" / "secret").symlink_to("/etc/passwd")
    assert _snapshot(source, tmp_path / "copy") is None
    assert [p.name for p in (tmp_path / "copy" / "A").iterdir()] == ["k.cubin"]


def _opcodes(listing: str) -> Counter[str]:
    totals: Counter[str] = Counter()
    for kernel in parse_sass(listing, "sm_90a"):
        totals.update(kernel.opcodes)
    return totals


def test_the_examples_lower_to_the_target_instructions_and_the_join_takes_loaded_cubins(
    tmp_path: Path, compile_in: Callable[..., str]
) -> None:
    run = tmp_path / "run"
    compile_in(
        run,
        "compile",
        "gemm.py",
        "gemm_kernel",
        GEMM_SIGNATURE,
        GEMM_CONSTANTS,
        {"num_warps": 8, "num_stages": 4},
    )
    for block_n, stages in ((64, 3), (128, 2)):  # the attention's two autotuned variants
        constants = {"8": 128, "9": 128, "10": block_n}
        options = {"num_warps": 8, "num_stages": stages}
        compile_in(
            run, "compile", "mha_fwd_d128.py", "mha_fwd_kernel", MHA_SIGNATURE, constants, options
        )
    cache = run / CACHE_FOLDER
    cubins = {p.relative_to(cache).as_posix(): p for p in sorted(cache.rglob("*.cubin"))}
    assert len(cubins) == 3
    listing = module_listing(cubins)
    (tmp_path / LISTING_FILE).write_text(listing)
    library = tmp_path / "candidate.py"
    task = get_task("PTX-H100-GEMM")
    gemm = next(name for name in cubins if name.endswith("gemm_kernel.cubin"))
    attention = [name for name in cubins if name.endswith("mha_fwd_kernel.cubin")]
    gemm_listing = target_addresses(library, task, modules={gemm})
    executed = {mnemonic(text) for f in gemm_listing.values() for text in f.targets.values()}
    assert {"HGMMA", "UTMALDG"} <= executed
    assert _opcodes(listing)["HGMMA"] > 0
    one = target_addresses(library, task, modules={attention[0]})
    assert set(one) == {"mha_fwd_kernel"}
    assert any("HGMMA" in text for text in one["mha_fwd_kernel"].targets.values())
    with pytest.raises(RuntimeError, match="both named mha_fwd_kernel"):
        target_addresses(library, task, modules=set(attention))
    # Without a join to make (the count's static look before its run), variants merge.
    every = target_addresses(library, task)
    assert set(every) == {"gemm_kernel", "mha_fwd_kernel"}
    assert len(every["mha_fwd_kernel"].targets) >= len(one["mha_fwd_kernel"].targets)
