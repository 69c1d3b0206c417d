"""Hostile builds, one layer at a time, below the static policy (``compile_source`` directly):
the compile log, what a build may leave in the cache, which failures are cached, and how many
builds may run at once.

The log: a ``#line`` directive names any file, and the compiler then quotes that file's lines
under the diagnostics and notes located there ("previous definition is here", "declared here",
"defined here", include chains, template notes). Here the compiler reads what the user can (the
build sandbox, ``ptxgym.build.sandbox``, is turned off): only the log stands between the secret
and the model, as if the policy and the sandbox had both been fooled. Each construct points
its notes at a secret file made by the test, every line of which holds a random token.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import secrets
import time
from pathlib import Path

import pytest
from gemm_candidates import GEMM, HEADER, NAIVE_GEMM

from ptxgym.build import sandbox as build_sandbox
from ptxgym.build.budget import BUDGET_ENV, build_slot
from ptxgym.languages.cuda import compiler
from ptxgym.languages.cuda.compiler import (
    _BUILD_FILE,
    _FILE_SIZE_LIMIT_BYTES,
    _MEMORY_LIMIT_BYTES,
    CANDIDATE_FILE,
    MAX_LIBRARY_BYTES,
    CompileResult,
    compile_source,
    nvcc_path,
)
from ptxgym.languages.cuda.compiler_log import (
    MAX_LOG_CHARS,
    MAX_MESSAGE_CHARS,
    BuildFiles,
    compile_log,
    link_log,
)
from ptxgym.sandbox.processes import stat_fields

pytestmark = pytest.mark.nvcc

ENTRY = (
    'extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, '
    "int M, int N, int K, cudaStream_t stream) { return 0; }\n"
)
# In a construct: the secret file's path, and where the numbering of candidate.cu resumes (made
# a true ``#line`` so that diagnostics after it name lines of our copy).
SECRET = "@SECRET@"
RESUME = "@RESUME@"

# Each construct makes the compiler report something located in the secret file (its notes,
# most of them), and something located in the submission.
NOTE_CONSTRUCTS = {
    # gcc: 'warning: "LIMIT" redefined', note "this is the location of the previous definition".
    "macro_redefinition": [
        f'#line 1 "{SECRET}"',
        "#define LIMIT 10",
        RESUME,
        "#define LIMIT 11",
    ],
    # gcc: 'error: macro "ONE" passed 2 arguments', note 'macro "ONE" defined here'.
    "macro_arguments": [
        f'#line 3 "{SECRET}"',
        "#define ONE(x) (x)",
        RESUME,
        "int use_one = ONE(1, 2);",
    ],
    # gcc: "warning: 'int old_api(int)' is deprecated", note "declared here".
    "deprecated_declaration": [
        f'#line 5 "{SECRET}"',
        "[[deprecated]] int old_api(int v) { return v; }",
        RESUME,
        "int use_old = old_api(1);",
    ],
    # The front end: "function has already been defined (previous definition at line 7 of ...)",
    # over its echo of the line, __device__ expanded.
    "function_redefinition": [
        f'#line 7 "{SECRET}"',
        "__device__ int twice(int v) { return 2 * v; }",
        RESUME,
        "__device__ int twice(int v) { return v + v; }",
    ],
    # The front end: 'note #3327-D: candidate function template "pick" failed deduction'.
    "template_deduction_note": [
        f'#line 9 "{SECRET}"',
        "template <typename T> T pick(T a, T b) { return a < b ? a : b; }",
        RESUME,
        "float use_pick = pick(1, 2.0f);",
    ],
    # The front end: the overloads listed under the error, "(declared at line 11 of ...)".
    "overload_candidates": [
        f'#line 11 "{SECRET}"',
        "void over(int);",
        "void over(long);",
        RESUME,
        "void use_over() { over(1u); }",
    ],
    # gcc: a redefinition in the submission whose previous definition is in a system header
    # included from the secret file ("In file included from SECRET:13:").
    "system_header_include_chain": [
        f'#line 13 "{SECRET}"',
        "#include <assert.h>",
        RESUME,
        "#define __ASSERT_FUNCTION 1",
    ],
    # The front end: an error located in the secret file, "detected during instantiation of ...
    # at line N of candidate.cu" under it (a warning in the submission lets it instantiate).
    "template_backtrace": [
        f'#line 15 "{SECRET}"',
        "template <typename T> int bad_size() { return sizeof(T::missing); }",
        RESUME,
        "#warning instantiated below",
        "int use_bad = bad_size<int>();",
    ],
    # gcc: "call to 'warned' declared with attribute warning", the call inside a macro defined in
    # the secret file.
    "attribute_warning_in_macro": [
        f'#line 17 "{SECRET}"',
        '__attribute__((warning("careful"))) int warned(int v);',
        "int warned(int v) { return v; }",
        "#define CALL_WARNED warned(2)",
        RESUME,
        "int use_warned() { return CALL_WARNED; }",
    ],
}
SUBMISSION_DIAGNOSTIC_RE = re.compile(
    r"^candidate\.cu\((?P<line>\d+)\): (?:error|warning|remark|note): ", re.MULTILINE
)


class Secret:
    """A host file the build must never quote: every line holds the token."""

    def __init__(self, folder: Path) -> None:
        self.token = f"HOSTILE_SECRET_{secrets.token_hex(16)}"
        self.path = folder / f"secret_{secrets.token_hex(4)}.h"
        lines = (f"// {self.token} line {number}" for number in range(1, 80))
        self.path.write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def secret(tmp_path_factory: pytest.TempPathFactory) -> Secret:
    return Secret(tmp_path_factory.mktemp("build-secret"))


@pytest.fixture
def unconfined_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiler reads whatever the user can, as on a kernel without Landlock."""
    monkeypatch.setattr(build_sandbox, "available", lambda: False)


def render(construct: list[str], secret: Secret) -> str:
    """HEADER, the construct and the entry point, each ``RESUME`` a ``#line`` that gives the
    next line its true number in the source."""
    lines = HEADER.splitlines()
    for text in construct:
        if text == RESUME:
            text = f'#line {len(lines) + 2} "candidate.cu"'
        lines.append(text.replace(SECRET, str(secret.path)))
    return "\n".join(lines) + "\n" + ENTRY


def shown_texts(result: CompileResult) -> list[str]:
    return [result.log, *result.warnings]


def assert_quotes_are_our_copy(text: str, source: str) -> None:
    """Under a submission diagnostic, only its line from ``source`` (indented by two spaces) and
    a caret line; no other indented line anywhere."""
    our_lines = source.split("\n")
    quoted_line: int | None = None
    for line in text.split("\n"):
        if match := SUBMISSION_DIAGNOSTIC_RE.match(line):
            quoted_line = int(match["line"])
        elif line.startswith(" "):
            assert quoted_line is not None, (
                f"an indented line under no submission diagnostic: {line!r}"
            )
            ours = our_lines[quoted_line - 1] if 0 < quoted_line <= len(our_lines) else None
            caret = re.fullmatch(r" +\^", line) is not None
            assert caret or line == f"  {ours}", (
                f"under candidate.cu({quoted_line}), {line!r} is not our line {ours!r}"
            )
        else:
            quoted_line = None


@pytest.mark.usefixtures("unconfined_compiler")
@pytest.mark.parametrize("name", sorted(NOTE_CONSTRUCTS))
def test_notes_never_quote_a_file_that_line_directives_name(
    name: str, secret: Secret, tmp_path: Path
) -> None:
    source = render(NOTE_CONSTRUCTS[name], secret)
    result = compile_source(source, GEMM, cache_root=tmp_path)
    texts = shown_texts(result)
    everything = "\n".join(texts)
    assert SUBMISSION_DIAGNOSTIC_RE.search(everything), (
        f"{name}: nothing located in the submission:\n{everything}"
    )
    assert secret.token not in everything, f"{name} quoted the secret file:\n{everything}"
    for text in texts:
        assert_quotes_are_our_copy(text, source)


@pytest.mark.usefixtures("unconfined_compiler")
def test_the_quoted_line_is_our_copy_not_the_compilers_expansion(tmp_path: Path) -> None:
    # The front end echoes the line after macro expansion; the log shows the submission's line.
    source = HEADER + "#define USE_MISSING (missing_name + 1)\nint f() { return USE_MISSING; }\n"
    result = compile_source(source + ENTRY, GEMM, cache_root=tmp_path)
    assert 'candidate.cu(4): error: identifier "missing_name" is undefined\n' in result.log
    assert "\n  int f() { return USE_MISSING; }" in result.log
    assert "(missing_name + 1); }" not in result.log
    assert_quotes_are_our_copy(result.log, source + ENTRY)


# ------------------------------------------------------------------------------------------
# The log rebuilt from raw output: what no compiler run here produces on demand


def _compile_log(output: str, source: str) -> tuple[str, tuple[str, ...]]:
    """The log of a compile step that printed ``output``, as the build names its files."""
    files = BuildFiles(CANDIDATE_FILE, _BUILD_FILE, nvcc_path())
    return compile_log(output, Path("/build"), GEMM, source, files)


def test_a_quoted_line_holding_carriage_returns_stays_one_line(secret: Secret) -> None:
    # A quoted line of another file, cut at a carriage return or a form feed, would begin with
    # whatever that file holds: a "diagnostic located in the submission" of its own making.
    output = (
        'candidate.cu:4:19: error: macro "ONE" passed 2 arguments, but takes just 1\n'
        f'{secret.path}:3: note: macro "ONE" defined here\n'
        f"    3 | x\rcandidate.cu(1): error: {secret.token}\x0ccandidate.cu(2): error: "
        f"{secret.token}\n"
        "      | \n"
    )
    log, warnings = _compile_log(output, HEADER + "int a;\n")
    assert secret.token not in log + "".join(warnings)
    assert log.startswith('candidate.cu(4): error: macro "ONE" passed 2 arguments')


def test_the_line_after_a_cut_in_the_output_is_dropped(secret: Secret) -> None:
    # A long output is kept as head and tail (ptxgym.sandbox.processes); the tail's first line
    # starts anywhere, e.g. inside a quoted line of another file.
    output = (
        'candidate.cu(3): error: expected a ";"\n'
        "[... 4096 bytes of output omitted ...]\n"
        f"candidate.cu(9): error: {secret.token}\n"
        "candidate.cu(3): warning: a later one\n"
    )
    log, _ = _compile_log(output, HEADER + "int a\n")
    assert secret.token not in log
    assert "candidate.cu(3): warning: a later one" in log


def test_messages_and_the_log_are_capped() -> None:
    long_type = "very_long_template_name<" * 400
    output = "".join(
        f"candidate.cu({n}): error: {n} no instance of {long_type}\n" for n in range(40)
    )
    log, _ = _compile_log(output, HEADER)
    first = log.split("\n")[0]
    assert len(first) <= MAX_MESSAGE_CHARS + 40
    assert len(log) <= MAX_LOG_CHARS + 40
    assert "more diagnostics not shown" in log


def test_the_link_log_names_symbols_and_nothing_the_object_holds(secret: Secret) -> None:
    # A section of warning text (.gnu.warning.SYMBOL) is printed by the linker as it is: built by
    # the assembler, it could hold anything the assembler read.
    output = (
        "/usr/bin/ld: candidate.o: in function `gemm':\n"
        f"build.cudafe1.cpp:(.text+0x2c): warning: {secret.token}\n"
        f"build.cudafe1.cpp:(.text+0x2c): warning: x): undefined reference to `{secret.token}'\n"
        "/usr/bin/ld: /usr/local/cuda/lib64/libcudart_static.a(cudart_static.o): in function "
        "`cudaEventElapsedTime':\n"
        "(.text+0x40270): multiple definition of `cudaEventElapsedTime'; "
        "candidate.o:build.cudafe1.cpp:(.text+0x170): first defined here\n"
        "collect2: error: ld returned 1 exit status\n"
    )
    log = link_log(output, Path("/build"))
    assert secret.token not in log
    assert "multiple definition of 'cudaEventElapsedTime'" in log
    unknown = link_log(f"/usr/bin/ld: {secret.token}\n", Path("/build"))
    assert secret.token not in unknown and unknown.startswith("link error")


# ------------------------------------------------------------------------------------------
# What a build may produce and keep

HUGE_ARRAYS = {
    # 400 MiB in the host object: the assembler would write it, and the linker again.
    "host_400_mib": "char big_table[400 << 20] = {1};\n"
    + ENTRY.replace("{ return 0; }", "{ return big_table[M]; }"),
    # 40 MiB: within the file-size limit, over the library cap.
    "host_40_mib": "char big_table[40 << 20] = {1};\n"
    + ENTRY.replace("{ return 0; }", "{ return big_table[M]; }"),
    # 64 MiB of device memory: the compressed fatbinary is small, the image the GPU loads is not.
    "device_64_mib": "__device__ char big_table[64 << 20] = {1};\n"
    "__global__ void k(char* out) { out[0] = big_table[threadIdx.x]; }\n"
    + ENTRY.replace("{ return 0; }", "{ k<<<1, 1, 0, stream>>>((char*)C); return 0; }"),
    # 400 MiB of device memory, initialised in the image.
    "device_400_mib": "__device__ char big_table[400 << 20] = {1};\n"
    "__global__ void k(char* out) { out[0] = big_table[threadIdx.x]; }\n"
    + ENTRY.replace("{ return 0; }", "{ k<<<1, 1, 0, stream>>>((char*)C); return 0; }"),
}


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


@pytest.mark.parametrize("name", sorted(HUGE_ARRAYS))
def test_a_huge_initialised_array_is_a_compile_error_that_leaves_the_cache_small(
    name: str, tmp_path: Path
) -> None:
    source = HEADER + HUGE_ARRAYS[name]
    result = compile_source(source, GEMM, cache_root=tmp_path)
    assert not result.ok and not result.transient and result.policy_violation is None
    limits = (
        f"{_FILE_SIZE_LIMIT_BYTES >> 20} MiB",
        f"{MAX_LIBRARY_BYTES >> 20} MiB",
        f"{_MEMORY_LIMIT_BYTES >> 30} GiB",
    )
    assert any(limit in result.log for limit in limits), result.log
    assert folder_bytes(tmp_path) < 1 << 20, "the failure left more than its record"
    # It is the source's doing: the failure is cached, and found again at once.
    again = compile_source(source, GEMM, cache_root=tmp_path)
    assert again.cached and again.log == result.log


# ------------------------------------------------------------------------------------------
# Failures of the machine are never cached


def test_a_timed_out_build_is_not_cached(tmp_path: Path) -> None:
    source = NAIVE_GEMM + f"\n// timed out once {secrets.token_hex(8)}\n"
    first = compile_source(source, GEMM, timeout_s=0.05, cache_root=tmp_path)
    assert first.timed_out and not first.ok
    assert not list((tmp_path / "builds").glob("*/*")), "a timed-out build entered the cache"
    second = compile_source(source, GEMM, cache_root=tmp_path)
    assert second.ok and not second.cached, second.log
    assert first.transient


@pytest.mark.parametrize(
    ("code", "output"),
    [
        (-9, ""),  # killed (the kernel's out-of-memory killer)
        (-11, ""),  # crashed
        (127, ""),  # a launcher could not find the program
        (1, "nvcc fatal   : Could not set up the environment for the host compiler\n"),
        (1, "gcc: fatal error: cannot execute 'cc1plus': No such file or directory\n"),
        (1, "nvcc error   : 'cicc' died due to signal 9 (Kill signal)\n"),
        (1, "cc1plus: fatal error: build.cudafe1.cpp: No space left on device\n"),
    ],
    ids=["killed", "crashed", "not-found", "nvcc-fatal", "no-tool", "child-killed", "disk-full"],
)
def test_a_build_stopped_by_the_machine_is_not_cached(
    code: int, output: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = NAIVE_GEMM + f"\n// stopped once {secrets.token_hex(8)}\n"
    with monkeypatch.context() as patch:
        patch.setattr(compiler, "_run", lambda command, cwd, timeout_s: (code, output, False))
        first = compile_source(source, GEMM, cache_root=tmp_path)
    assert not first.ok and not first.timed_out, first.log
    assert not list((tmp_path / "builds").glob("*/*")), "a machine failure entered the cache"
    second = compile_source(source, GEMM, cache_root=tmp_path)
    assert second.ok and not second.cached, second.log
    assert first.transient and "not on the source" in first.log


# ------------------------------------------------------------------------------------------
# The machine's build memory budget


def _build_one(locks: str, budget_gib: str, cache: str, label: str, results: str) -> None:
    os.environ["PTXGYM_LOCK_DIR"] = locks
    os.environ[BUDGET_ENV] = budget_gib
    source = NAIVE_GEMM + f"\n// budget test {label}\n"
    result = compile_source(source, GEMM, cache_root=Path(cache))
    Path(results, f"{label}.json").write_text(json.dumps({"ok": result.ok, "log": result.log}))


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return f"{pid} (gone)"


def _asks_only(pid: int) -> bool:
    """An nvcc that builds nothing (``--version``, ``--dryrun``: what a process asks once, outside
    any build slot, to key its cache and find the toolkit), or one already gone."""
    try:
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True
    return b"--version" in arguments or b"--dryrun" in arguments


def compilers_under(ancestors: set[int]) -> set[int]:
    """Live nvcc processes that build, started by one of ``ancestors`` (directly or through
    launchers)."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_fields(stat)
            names[int(stat.parent.name)] = (stat.parent / "comm").read_text().strip()
        except (OSError, IndexError):
            continue
        if fields[0] not in ("Z", "X"):
            parents[int(stat.parent.name)] = int(fields[1])
    found = set()
    for pid, name in names.items():
        if name != "nvcc" or pid not in parents or _asks_only(pid):
            continue
        ancestor = parents[pid]
        for _ in range(8):
            if ancestor in ancestors:
                found.add(pid)
                break
            ancestor = parents.get(ancestor, 1)
    return found


def test_builds_in_several_processes_stay_within_the_budget(tmp_path: Path) -> None:
    # 8 GiB at 8 GiB a build: one slot, for three processes that each build a distinct source.
    budget = str(_MEMORY_LIMIT_BYTES >> 30)
    locks, results = tmp_path / "locks", tmp_path / "results"
    results.mkdir()
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(
            target=_build_one,
            args=(str(locks), budget, str(tmp_path / f"cache-{i}"), f"b{i}", str(results)),
        )
        for i in range(3)
    ]
    for process in processes:
        process.start()
    builders = {process.pid for process in processes if process.pid is not None}
    seen, overlapping = set(), 0
    deadline = time.monotonic() + 300
    while any(process.is_alive() for process in processes) and time.monotonic() < deadline:
        running = compilers_under(builders)
        seen |= running
        # Two builds at once overlap for the seconds a build takes; a sample that catches one
        # process ending as the next begins (seen once in CI, for under 10 ms) is not that.
        overlapping = overlapping + 1 if len(running) > 1 else 0
        assert overlapping < 5, f"{len(running)} builds ran at once in a one-build budget: " + (
            "; ".join(_command_line(pid) for pid in running)
        )
        time.sleep(0.01)
    for process in processes:
        process.join(timeout=60)
    reports = [json.loads(path.read_text()) for path in sorted(results.glob("*.json"))]
    assert len(reports) == 3 and all(report["ok"] for report in reports), reports
    assert len(seen) >= 3, "no compiler was ever seen running"


def test_a_build_waits_for_a_slot_within_its_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTXGYM_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv(BUDGET_ENV, str(_MEMORY_LIMIT_BYTES >> 30))
    source = NAIVE_GEMM + f"\n// waits {secrets.token_hex(8)}\n"
    with build_slot(_MEMORY_LIMIT_BYTES, timeout_s=0) as held:  # the machine's only slot
        assert held
        waited = compile_source(source, GEMM, timeout_s=0.5, cache_root=tmp_path)
    assert waited.timed_out and waited.transient and BUDGET_ENV in waited.log
    assert not list((tmp_path / "builds").glob("*/*"))
    assert compile_source(source, GEMM, cache_root=tmp_path).ok
