"""nvcc builds: success and inspection, cache hits and what the cache keeps, concurrency,
timeouts. The log a build rebuilds is tested in test_compiler_log.py."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from gemm_candidates import GEMM, HEADER, NAIVE_GEMM, SIGNATURE

from ptxgym.build import budget as build_budget
from ptxgym.evaluate.compile_only import CompileOnlyEvaluator
from ptxgym.languages.cuda import compiler
from ptxgym.languages.cuda.compiler import COMPILER_NICENESS, build_source, compile_source
from ptxgym.outcome import Status
from ptxgym.sandbox import processes
from ptxgym.sandbox.processes import stat_fields
from ptxgym.tasks import get_task

pytestmark = pytest.mark.nvcc


@pytest.mark.parametrize("task_id", ["PTX-H100-GEMM", "PTX-B200-GEMM"])
def test_naive_gemm_compiles_and_is_inspected(task_id: str) -> None:
    outcome = CompileOnlyEvaluator().evaluate(get_task(task_id), NAIVE_GEMM)
    assert outcome.status is Status.COMPILED, outcome.compile
    build = outcome.compile
    assert build is not None and build.library is not None and Path(build.library).is_file()
    assert build.arch == get_task(task_id).arch
    assert build.kernels and all(k.registers > 0 for k in build.kernels)


def test_cublas_include_is_a_policy_violation_and_nothing_compiles() -> None:
    outcome = CompileOnlyEvaluator().evaluate(GEMM, "#include <cublas_v2.h>\n" + NAIVE_GEMM)
    assert outcome.status is Status.POLICY_VIOLATION
    assert outcome.compile is None
    assert "cuBLAS" in outcome.message


def test_second_identical_compile_hits_the_cache() -> None:
    source = NAIVE_GEMM + "\n// cache test\n"
    first = compile_source(source, GEMM)
    started = time.perf_counter()
    second = compile_source(source, GEMM)
    elapsed = time.perf_counter() - started
    assert first.ok and not first.cached
    assert second.ok and second.cached and second.library == first.library
    assert second.source_hash == first.source_hash
    assert elapsed < first.seconds


def test_failed_builds_are_cached_too() -> None:
    source = HEADER + SIGNATURE + " { return undefined_name; }\n"
    first, second = compile_source(source, GEMM), compile_source(source, GEMM)
    assert not first.ok and not first.cached
    assert second.cached and second.log == first.log


def test_concurrent_compiles_of_one_source_are_safe(tmp_path: Path) -> None:
    source = NAIVE_GEMM + "\n// concurrency test\n"
    with ThreadPoolExecutor(4) as pool:
        results = list(
            pool.map(lambda _: compile_source(source, GEMM, cache_root=tmp_path), range(4))
        )
    assert all(r.ok for r in results)
    assert len({r.library for r in results}) == 1
    assert len(list((tmp_path / "builds").glob("*/*"))) == 1
    assert not any((tmp_path / "tmp").iterdir()), "temporary build folders must be removed"


def test_calls_outside_the_allowed_host_functions_are_refused_at_build_time() -> None:
    # A weak declaration links even when undefined, and pasting hides the name from the source
    # scan: only the object's symbol table shows what the host code would call.
    source = HEADER + "#define CAT(a, b) a##b\n"
    source += 'extern "C" __attribute__((weak)) int CAT(cub, lasCreate_v2)(void**);\n'
    source += 'extern "C" int hidden_library_call(int);\n'
    source += (
        SIGNATURE + " { void* h; CAT(cub, lasCreate_v2)(&h); return hidden_library_call(M); }\n"
    )
    outcome = CompileOnlyEvaluator().evaluate(GEMM, source)
    assert outcome.status is Status.POLICY_VIOLATION, outcome.message
    assert "hidden_library_call" in outcome.message
    assert "cublasCreate_v2" in outcome.message


# A template instantiated 2^24 times: the compiler runs until its deadline.
COMPILE_BOMB = (
    HEADER + "template <int N> __device__ __forceinline__ float f(float a) {\n"
    "  return f<N - 1>(a * 1.0001f + __sinf(a)) + f<N - 1>(a + 1.f); }\n"
    "template <> __device__ __forceinline__ float f<0>(float a) { return a; }\n"
    "__global__ void k(float* x) { x[0] = f<24>(x[0]); }\n"
    + SIGNATURE
    + " { k<<<1, 1, 0, stream>>>((float*)C); return 0; }\n"
)


@pytest.fixture
def build_groups(monkeypatch: pytest.MonkeyPatch) -> set[int]:
    """The process groups that this test's builds start (``ptxgym.sandbox.processes.ProcessGroup``),
    so that it looks only at its own compilers, whatever else builds on the machine."""
    groups: set[int] = set()
    # A slot of its own even while other builds on the machine hold theirs: these tests judge
    # the build's processes, not the build budget (tests/build/test_build_budget.py does).
    monkeypatch.setenv(build_budget.BUDGET_ENV, "4096")

    class Recorded(processes.ProcessGroup):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            groups.add(self.process.pid)  # the leader of a new session: its group's id

    monkeypatch.setattr(processes, "ProcessGroup", Recorded)
    return groups


def test_compile_bomb_times_out_and_its_processes_are_killed(
    build_groups: set[int], tmp_path: Path
) -> None:
    # Another build's compiler, as when builds run beside the tests: not this test's to judge.
    decoy_program = tmp_path / "cicc"
    shutil.copy("/bin/sleep", decoy_program)
    decoy = subprocess.Popen([str(decoy_program), "60"], start_new_session=True)
    try:
        started = time.perf_counter()
        result = compile_source(COMPILE_BOMB, GEMM, timeout_s=3, cache_root=tmp_path / "cache")
        assert result.timed_out and not result.ok
        assert time.perf_counter() - started < 15
        # It timed out building, not waiting for a build slot.
        assert build_groups, "the build started no process group"
        assert not _live_processes("cicc", build_groups), "the compiler's group must be killed"
        assert decoy.poll() is None and str(decoy.pid) in _live_processes("cicc", {decoy.pid})
    finally:
        decoy.kill()
        decoy.wait()


def test_the_compiler_runs_at_a_lower_cpu_priority(build_groups: set[int], tmp_path: Path) -> None:
    """cicc, started by nvcc, has the niceness the build asked for: builds yield the CPU to the
    processes that hold the GPU."""
    own = os.nice(0)
    with ThreadPoolExecutor(max_workers=1) as pool:
        build = pool.submit(compile_source, COMPILE_BOMB, GEMM, timeout_s=8, cache_root=tmp_path)
        niceness: list[int] = []
        deadline = time.monotonic() + 8
        while not niceness and time.monotonic() < deadline:
            for pid in _live_processes("cicc", build_groups):
                with contextlib.suppress(OSError, IndexError):
                    niceness.append(int(stat_fields(Path(f"/proc/{pid}/stat"))[16]))
            time.sleep(0.05)
        assert build.result().timed_out
    assert niceness and set(niceness) == {min(own + COMPILER_NICENESS, 19)} and min(niceness) > own


def _live_processes(name: str, groups: set[int]) -> list[str]:
    """Processes called ``name`` in one of the process ``groups`` that still run (zombies,
    already dead, are left out)."""
    if not groups:
        return []
    listed = ",".join(map(str, sorted(groups)))
    found = subprocess.run(
        ["pgrep", "-x", "-g", listed, name], capture_output=True, text=True
    ).stdout.split()
    live = []
    for pid in found:
        try:
            state = stat_fields(Path(f"/proc/{pid}/stat"))[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            live.append(pid)
    return live


def test_compile_errors_never_echo_a_host_file(tmp_path: Path) -> None:
    secret = "TOP_SECRET_HOST_VALUE"
    host_file = tmp_path / "host_secret.h"
    host_file.write_text(f"int {secret} = ;\n")
    outcome = CompileOnlyEvaluator().evaluate(GEMM, f'#include "{host_file}"\n' + NAIVE_GEMM)
    assert outcome.status is Status.POLICY_VIOLATION
    assert secret not in outcome.message


def test_the_candidates_headers_come_before_the_host_probe_guard() -> None:
    # Standard headers may use __has_include themselves (libstdc++ 13's <cstdint> includes
    # <stdint.h> only if it finds it), so they are included while the real operator still works.
    source = "#include <cstdint>\n#include <cuda/barrier>\n" + NAIVE_GEMM
    build = build_source(GEMM, source)
    guard = build.index("ptxgym_no_host_probe.h")
    for header in ("<cstdint>", "<cuda/barrier>", "<cuda/std/version>", "<type_traits>"):
        assert -1 < build.index(f"#include {header}") < guard
    assert build.index('#include "candidate.cu"') > guard


def test_a_pasted_has_include_cannot_tell_whether_a_host_file_exists(tmp_path: Path) -> None:
    existing = tmp_path / "exists.h"
    existing.write_text("")
    for path in (existing, tmp_path / "missing.h"):
        source = (
            HEADER
            + "#define CAT(a, b) a##b\n"
            + f'#if CAT(__has_, include)("{path}")\n'
            + "#define FOUND 1\n#else\n#define FOUND 0\n#endif\n"
            + 'static_assert(FOUND == 0, "the build saw a host file");\n'
            + SIGNATURE
            + " { return 0; }\n"
        )
        result = compile_source(source, GEMM)
        assert result.ok, f"{path.name}: {result.log}"


def test_cccl_headers_keep_their_bf16_support() -> None:
    # CCCL decides with __has_include whether cuda::std supports bf16: its configuration must be
    # made before the build turns the operator off for the candidate.
    source = (
        "#include <cuda/barrier>\n"
        + HEADER
        + 'static_assert(_CCCL_HAS_NVBF16(), "cuda::std lost bf16 support");\n'
        + SIGNATURE
        + " { return 0; }\n"
    )
    result = compile_source(source, GEMM)
    assert result.ok, result.log


def test_the_cache_keeps_a_library_without_its_object_and_a_failure_as_its_record(
    tmp_path: Path,
) -> None:
    built = compile_source(NAIVE_GEMM + "\n// kept files\n", GEMM, cache_root=tmp_path)
    assert built.ok and built.library is not None
    folder = Path(built.library).parent
    assert {path.name for path in folder.iterdir()} >= {"candidate.so", "candidate.cu"}
    assert not (folder / "candidate.o").exists() and not (folder / "intermediates").exists()
    failed = compile_source(
        HEADER + SIGNATURE + " { return missing; }\n", GEMM, cache_root=tmp_path
    )
    assert not failed.ok
    (record,) = (tmp_path / "builds").glob(f"*/{failed.source_hash}/*")
    assert record.name == "result.json"


def test_the_cache_is_bounded_in_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    builds = tmp_path / "builds"
    for age, name in enumerate(["old", "middle", "new"]):
        entry = builds / name[:2] / name
        entry.mkdir(parents=True)
        (entry / "candidate.so").write_bytes(b"\0" * 1000)
        os.utime(entry, (1000 + age, 1000 + age))
    monkeypatch.setattr(compiler, "MAX_CACHED_BYTES", 2500)
    compiler._prune(builds)
    assert sorted(path.name for path in builds.glob("*/*")) == ["middle", "new"]
