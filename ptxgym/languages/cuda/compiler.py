"""Compile a candidate into a shared library with nvcc, cached by content hash.

The candidate is written verbatim as ``candidate.cu`` into a fresh build folder, next to the
knowledge pack's wrapper header, and compiled through a small ``build.cu`` of ours that includes it
and asserts the entry point's exact C signature. Nothing else is on the include path, and the static
policy (``ptxgym.languages.cuda.policy``) has already refused includes by path; before the real
build the host-side preprocessed source is also scanned for assembler ``.incbin``/``.include``,
which macros could otherwise assemble. The log the candidate sees is rebuilt from the compiler's
and the linker's output by ``ptxgym.languages.cuda.compiler_log``, from the diagnostics located in
the submission, each with its line quoted from our own copy of the source. A successful build
also carries the static inventory of its SASS (``ptxgym.build.sass``).

A build holds one of the machine's build slots (``ptxgym.build.budget``) while it runs, so that
builds in every process together stay within the machine's memory budget; the wait counts
against its deadline. What it may produce is capped: any file it writes at
``_FILE_SIZE_LIMIT_BYTES``, its object and library at ``MAX_LIBRARY_BYTES``.

Results are cached under ``<cache>/builds/<hash>``: a build folder is created under
``<cache>/tmp`` and renamed into place, so concurrent compiles of the same source are safe (the
first rename wins, the others reuse it). A successful build keeps its library and source; a
failed one keeps only its result record; a failure that came from the machine rather than the
source (a deadline, a killed compiler, a missing tool: ``CompileResult.transient``) is not
cached at all. The cache is bounded in entries and in bytes (``_prune``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from functools import cache
from pathlib import Path

from ptxgym import paths
from ptxgym.build import budget as build_budget
from ptxgym.build import cache as build_cache
from ptxgym.build import sandbox as build_sandbox
from ptxgym.build.result import (
    DEFAULT_COMPILE_TIMEOUT_S,
    CompileResult,
    CompilerUnavailable,
    KernelResources,
)
from ptxgym.build.sass import demangle, inventory
from ptxgym.languages.cuda.compiler_log import BuildFiles, compile_log, link_log
from ptxgym.languages.cuda.cpp_tokens import Lexer, string_runs
from ptxgym.languages.cuda.policy import ASSEMBLER_ESCAPE_RE, included_headers
from ptxgym.sandbox.processes import run_group
from ptxgym.tasks import Task, c_parameter_types, c_type_headers
from ptxgym.tasks.packs import pack_header_name

MAX_CACHED_BUILDS = 4000
MAX_CACHED_BYTES = 8 << 30
# Bump when the build recipe or the result record changes, to invalidate cached results (6: the
# log rebuilt from the submission's own diagnostics; logs cached before could quote host files;
# 7: the compilers' memory limit halved, which a failure's message names).
_RECIPE_VERSION = "7"
# Per compiler process: stops template/constexpr bombs. It is also what one build may commit, in
# the machine's build memory budget (ptxgym.build.budget), so it sets how many builds run at
# once: 8 GiB gave the H200 host (128 GiB) 8, for 16 trajectories, whose steps then waited for
# a slot (docs/benchmarks.md, seventeenth session). Every example, the expert attention kernel
# and the naive backward among them, builds within a 1-GiB address space (peak resident set
# 0.2 GB), so 4 GiB keeps four times that.
_MEMORY_LIMIT_BYTES = 4 << 30
# The largest object or library a build may keep. The examples' libraries are 1.0-1.3 MB, 1 MB of
# which is the static CUDA runtime, and an FA3-class kernel is a few MB; a large initialised
# array (host or device) is what goes past it, and belongs in memory filled at run time.
MAX_LIBRARY_BYTES = 32 << 20
# Every file a compiler process writes: the intermediates of a library at the cap are larger
# than it (the uncompressed cubin, the PTX text, the fatbinary written out as C source at
# about 2.7 bytes a byte), so a few times the cap, and no more.
_FILE_SIZE_LIMIT_BYTES = 4 * MAX_LIBRARY_BYTES
# Builds fan out over every core, while a worker or a tool run may hold the GPU alone (a timing,
# a profiled call) and needs the CPU to finish and let the next one have it: compilers yield.
COMPILER_NICENESS = 10

CANDIDATE_FILE = "candidate.cu"
OBJECT_FILE = "candidate.o"
LIBRARY_FILE = "candidate.so"
_BUILD_FILE = "build.cu"
_KEEP_DIR = "intermediates"


@cache
def nvcc_path() -> str:
    found = paths.cuda_tool("nvcc")
    if not found:
        raise CompilerUnavailable(
            "nvcc was not found on PATH or in $CUDA_HOME/bin: install the CUDA toolkit (12.8+)"
        )
    return found


@cache
def nvcc_version() -> str:
    out = subprocess.run(
        [nvcc_path(), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "unknown"


def _compile_flags(task: Task) -> list[str]:
    """nvcc and the flags every compile of a candidate uses (the build and its preprocessing)."""
    return [
        nvcc_path(),
        "-std=c++17",
        "-O3",
        "-lineinfo",
        "-Xcompiler",
        "-fPIC",
        "-Xptxas",
        "-v",
        *task.target.nvcc_flags,
        "-I.",
    ]


def nvcc_command(task: Task) -> list[str]:
    """The nvcc invocation that compiles the candidate to an object, inside the build folder."""
    return [
        *_compile_flags(task),
        "-keep",
        "-keep-dir",
        _KEEP_DIR,
        "-c",
        "-o",
        OBJECT_FILE,
        _BUILD_FILE,
    ]


def link_command(task: Task) -> list[str]:
    """The nvcc invocation that links the object into the shared library."""
    return [
        nvcc_path(),
        "-shared",
        *task.target.nvcc_flags,
        # Fail at build time, not at load time, on any symbol the CUDA runtime does not provide.
        "-Xlinker",
        "-z,defs",
        "-o",
        LIBRARY_FILE,
        OBJECT_FILE,
    ]


def _preprocess_command(task: Task) -> list[str]:
    return [*_compile_flags(task), "-E", "-o", "preprocessed.ii", _BUILD_FILE]


# Included before the candidate: __has_include, however the candidate spells it (token pasting
# gets past the policy's text checks), answers "no", so a build cannot tell whether a host path
# exists. It is a "system header" so that redefining the operator raises no warning. Every header
# the candidate includes (all on the policy's allow-list) is included first, with the real
# operator, so that the headers themselves still see their dependencies: CCCL decides with it
# whether cuda::std supports fp16/bf16, and newer libstdc++ (GCC 13+) includes <stdint.h> from
# <cstdint> only if __has_include finds it. The candidate's own includes then change nothing.
_NO_PROBE_HEADER_NAME = "ptxgym_no_host_probe.h"
_NO_PROBE_HEADER = (
    "#pragma GCC system_header\n"
    "#define __has_include(header) 0\n"
    "#define __has_include_next(header) 0\n"
)
# What build.cu itself needs (the signature check), also ahead of the guard.
_BUILD_HEADERS = ("<cuda/std/version>", "<cuda_bf16.h>", "<cuda_runtime.h>", "<type_traits>")


def build_source(task: Task, source: str) -> str:
    """Our translation unit: the headers (the candidate's and ours), the host-probe guard, the
    candidate, then a check of its entry point's C signature."""
    symbol = task.entry_point.symbol
    params = ", ".join(c_parameter_types(task.definition, task.entry_point))
    message = (
        f"the entry point {symbol} does not have the required signature: "
        f"{task.entry_point.signature}"
    ).replace('"', '\\"')
    types = c_type_headers(task.definition)  # fp16, fp8, int8 tensors' C types
    headers = dict.fromkeys((*_BUILD_HEADERS, *types, *included_headers(source, task)))
    return (
        "".join(f"#include {header}\n" for header in headers)
        + f'#include "{_NO_PROBE_HEADER_NAME}"\n'
        + f'#include "{CANDIDATE_FILE}"\n'
        + f"static_assert(std::is_same<decltype(&{symbol}), int (*)({params})>::value ||\n"
        + f"              std::is_same<decltype(&{symbol}), cudaError_t (*)({params})>::value,\n"
        + f'              "{message}");\n'
    )


def _pack_header(task: Task) -> bytes:
    path = paths.packs_dir() / task.target.pack / "wrappers.cuh"
    return path.read_bytes() if path.is_file() else b""


def source_hash(source: str, task: Task, translation_unit: str, pack_header: bytes) -> str:
    """Content hash of everything that determines the build's result (``translation_unit`` is
    :func:`build_source`'s, ``pack_header`` the task's pack header, as the build writes them)."""
    digest = hashlib.sha256()
    for part in (
        _RECIPE_VERSION,
        source,
        translation_unit,
        _NO_PROBE_HEADER,
        pack_header.decode("utf-8", "replace"),
        json.dumps([nvcc_command(task)[1:], link_command(task)[1:]]),
        nvcc_version(),
    ):
        digest.update(part.encode("utf-8", "surrogatepass"))
        digest.update(b"\0")
    return digest.hexdigest()


def compile_source(
    source: str,
    task: Task,
    *,
    timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S,
    cache_root: Path | None = None,
) -> CompileResult:
    """Build ``source`` for ``task``'s target, or return the cached result of an identical build.

    The source must already have passed :func:`ptxgym.languages.cuda.policy.check_policy`. A build
    first waits for one of the machine's build slots (``ptxgym.build.budget``), within
    ``timeout_s``.
    """
    root = cache_root or paths.cache_dir()
    # Made once: the hash covers them, and the build writes them.
    translation_unit, pack_header = build_source(task, source), _pack_header(task)
    key = source_hash(source, task, translation_unit, pack_header)
    final = root / "builds" / key[:2] / key
    if cached := build_cache.load(final, LIBRARY_FILE):
        return cached
    started = time.perf_counter()
    with build_budget.build_slot(_MEMORY_LIMIT_BYTES, timeout_s) as held:
        if not held:
            return CompileResult(
                ok=False,
                log=(
                    f"compile timed out after {timeout_s:.0f} s waiting for a build slot: other "
                    f"builds held the machine's build memory budget ({build_budget.BUDGET_ENV})"
                ),
                source_hash=key,
                arch=task.target.arch,
                seconds=round(time.perf_counter() - started, 3),
                timed_out=True,
                transient=True,
                command=tuple(nvcc_command(task)[1:]),
            )
        # Another process may have finished the same build while this one waited.
        if cached := build_cache.load(final, LIBRARY_FILE):
            return cached
        (root / "tmp").mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="build-", dir=root / "tmp"))
        try:
            result = _build(
                source, translation_unit, pack_header, task, key, work, started, timeout_s
            )
            if result.transient:
                return result
            _keep_only_what_is_reused(work, result.ok)
            published = build_cache.publish(work, final, result, LIBRARY_FILE)
            _prune(root / "builds")
            return published
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _keep_only_what_is_reused(work: Path, ok: bool) -> None:
    """Before a build folder enters the cache: a success keeps its library and the sources its
    line information names (tools show them), not its object; a failure keeps nothing (its
    result record is written next)."""
    if ok:
        (work / OBJECT_FILE).unlink(missing_ok=True)
        return
    for entry in work.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _prune(builds: Path) -> None:
    """Keep the cache bounded: drop the least recently used builds beyond
    ``MAX_CACHED_BUILDS`` entries or ``MAX_CACHED_BYTES`` bytes."""
    build_cache.prune(builds, max_builds=MAX_CACHED_BUILDS, max_bytes=MAX_CACHED_BYTES)


def _build(
    source: str,
    translation_unit: str,
    pack_header: bytes,
    task: Task,
    key: str,
    work: Path,
    started: float,
    timeout_s: float,
) -> CompileResult:
    """Build in ``work``, by ``timeout_s`` after ``started`` (a ``perf_counter`` reading taken
    before the build waited for its slot)."""
    (work / CANDIDATE_FILE).write_text(source, encoding="utf-8")
    (work / _BUILD_FILE).write_text(translation_unit, encoding="utf-8")
    (work / pack_header_name(task)).write_bytes(pack_header)
    (work / _NO_PROBE_HEADER_NAME).write_text(_NO_PROBE_HEADER, encoding="utf-8")
    command = nvcc_command(task)

    def result(ok: bool, log: str, **extra: object) -> CompileResult:
        return CompileResult(
            ok=ok,
            log=log,
            source_hash=key,
            arch=task.target.arch,
            seconds=round(time.perf_counter() - started, 3),
            command=tuple(command[1:]),
            **extra,  # type: ignore[arg-type]
        )

    def run(step: list[str]) -> tuple[int, str] | None:
        """Run one compiler step in what is left of the deadline; None when it passed."""
        left = timeout_s - (time.perf_counter() - started)
        if left <= 0:
            return None
        code, output, timed_out = _run(step, work, left)
        return None if timed_out else (code, output)

    def timed_out(step: str) -> CompileResult:
        message = f"{step} timed out after {timeout_s:.0f} s"
        return result(False, message, timed_out=True, transient=True)

    def failed(code: int, output: str, log: str, warnings: tuple[str, ...]) -> CompileResult:
        """A step that failed: stopped by a limit or the machine, or the source's own errors
        (``log``)."""
        if stopped := _stopped_by_limit_or_machine(code, output):
            message, transient = stopped
            return result(False, message, warnings=warnings, transient=transient)
        return result(False, log, warnings=warnings)

    if (finished := run(_preprocess_command(task))) is None:
        return timed_out("compile")
    code, output = finished
    if code == 0:
        text = (work / "preprocessed.ii").read_text(encoding="utf-8", errors="replace")
        if found := _assembler_escape(text):
            message = f"the preprocessed source {found}; it is not allowed"
            return result(False, message, policy_violation=message)
    (work / "preprocessed.ii").unlink(missing_ok=True)

    (work / _KEEP_DIR).mkdir()
    if (finished := run(command)) is None:
        return timed_out("compile")
    code, output = finished
    kernels = _parse_resources(output)
    files = BuildFiles(CANDIDATE_FILE, _BUILD_FILE, nvcc_path())
    log, warnings = compile_log(output, work, task, source, files)
    # The device image as the GPU loads it, before the fatbinary compresses it into the object.
    oversized = _oversized(*sorted((work / _KEEP_DIR).glob("*.cubin")), work / OBJECT_FILE)
    shutil.rmtree(work / _KEEP_DIR, ignore_errors=True)
    if code != 0:
        return failed(code, output, log or f"nvcc failed with exit code {code}", warnings)
    if oversized:
        return result(False, oversized, warnings=warnings)
    forbidden = _forbidden_host_calls(work / OBJECT_FILE)
    if forbidden:
        message = (
            f"the host code calls {', '.join(forbidden[:8])}: host code may call only the CUDA "
            "runtime and a few C library functions (memory, strings, printing, math, exit)"
        )
        return result(False, message, warnings=warnings, policy_violation=message)
    if (finished := run(link_command(task))) is None:
        return timed_out("link")
    code, output = finished
    if code != 0:
        return failed(code, output, link_log(output, work), warnings)
    if oversized := _oversized(work / LIBRARY_FILE):
        return result(False, oversized, warnings=warnings)
    exported = _exported_symbols(work / LIBRARY_FILE)
    if task.entry_point.symbol not in exported:
        return result(
            False,
            f"the library does not export {task.entry_point.symbol}: declare it "
            f'extern "C" and not static or inline',
            warnings=warnings,
        )
    sass = inventory(work / LIBRARY_FILE, task)
    return result(True, log, warnings=warnings, kernels=kernels, sass=sass)


# Large initialised data is what makes a build big; it can be made at run time instead.
_SIZE_ADVICE = "allocate large tables at run time and fill them there, not as initialised arrays"
# How a compiler tool says that a process of the build was stopped, not that the source has an
# error. Only the start of a line the tools print themselves is matched (a quoted source line
# begins with spaces). Running out of memory or writing too large a file is the source's doing:
# every compiler process has the same limits, and the build memory budget keeps the machine
# from running out first (the kernel's out-of-memory killer sends SIGKILL, a machine failure).
# (SIGXFSZ kills a process that writes past the limit, unless it ignores the signal, as a process
# started from Python does: then its write fails, "File too large".)
_FILE_SIZE_RE = re.compile(r"^\S.*(?:File size limit exceeded|File too large)", re.MULTILINE)
_OUT_OF_MEMORY_RE = re.compile(
    r"^\S.*(?:out of memory|virtual memory exhausted|std::bad_alloc)", re.MULTILINE
)
# Killed or crashed, out of disk space, or a tool missing: the machine's doing; so are the exit
# codes by which a launcher (the shell's convention, build_sandbox's) says it could not run one.
_COULD_NOT_RUN_CODES = (126, 127)
_MACHINE_TROUBLE_RE = re.compile(
    r"^(?:nvcc (?:fatal|error)\b"
    r"|\S.*(?:died due to signal|signal terminated program|No space left on device|: not found"
    r"|cannot execute))",
    re.MULTILINE,
)


def _stopped_by_limit_or_machine(code: int, output: str) -> tuple[str, bool] | None:
    """Why a failed compiler step (exit ``code``, ``output``) stopped other than on the source's
    errors: the message, and whether it is transient (the machine's doing, not to be cached).
    None when it stopped on the source's errors."""
    if code == -signal.SIGXFSZ or _FILE_SIZE_RE.search(output):
        limit, cap = _FILE_SIZE_LIMIT_BYTES >> 20, MAX_LIBRARY_BYTES >> 20
        return (
            f"the build wrote a file over {limit} MiB, the limit on any file a build writes "
            f"(its library may be at most {cap} MiB): {_SIZE_ADVICE}",
            False,
        )
    if _OUT_OF_MEMORY_RE.search(output):
        return (
            f"a compiler process ran out of memory: each may use {_MEMORY_LIMIT_BYTES >> 30} GiB "
            f"(large initialised arrays and deep template or constexpr recursion use it up)",
            False,
        )
    if code < 0:
        reason = f"a compiler process was killed (signal {-code})"
    elif code in _COULD_NOT_RUN_CODES or _MACHINE_TROUBLE_RE.search(output):
        reason = "a compiler process was killed or crashed, ran out of disk, or could not start"
    else:
        return None
    return f"{reason}: the build failed on this machine, not on the source; try again", True


def _oversized(*built: Path) -> str | None:
    """Why the first of the ``built`` files (device images, the object, the library) that is
    over ``MAX_LIBRARY_BYTES`` is too large, or None when none is (or exists)."""
    for path in built:
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            continue
        if size > MAX_LIBRARY_BYTES:
            what = {".cubin": "device code image", ".o": "object"}.get(path.suffix, "library")
            return (
                f"the built {what} is {size / (1 << 20):.0f} MiB, over the "
                f"{MAX_LIBRARY_BYTES >> 20} MiB a build may produce: {_SIZE_ADVICE}"
            )
    return None


# What the candidate's own object may leave for the linker: the CUDA runtime, the C++ runtime's
# support routines, and a few C library functions. Everything else (dlopen, system, fork,
# sockets, files, threads, the Python C API, cuBLAS under any name, weak or not) is refused, so a
# name assembled by macros or declared weak cannot reach a library at run time.
_ALLOWED_HOST_SYMBOL = re.compile(
    r"^(?:cuda\w*|__cuda\w*|_GLOBAL_OFFSET_TABLE_|__dso_handle|__stack_chk_fail"
    r"|__cxa_\w+|__gxx_personality_v0|_Unwind_\w+|_Zn[wa]\w*|_Zd[la]\w*"
    r"|_ZSt\d+__throw_\w+|_ZSt9terminatev|atexit|abort|exit|__assert_fail"
    r"|mem(?:cpy|move|set|cmp)|str(?:len|cmp|ncmp|chr)"
    r"|(?:f|s|sn|v|vf|vs|vsn)?printf|__printf_chk|__fprintf_chk|__sprintf_chk|__snprintf_chk"
    r"|puts|putchar|fputs|fputc|fflush|stdout|stderr"
    r"|malloc|calloc|realloc|free|aligned_alloc|posix_memalign"
    r"|(?:sqrt|cbrt|exp|exp2|expm1|log|log2|log10|log1p|pow|sin|cos|tan|tanh|erf|fabs|floor"
    r"|ceil|round|fmax|fmin|fma|fmod|ldexp|frexp|hypot|atan2|atan|asin|acos)f?)$"
)


def _forbidden_host_calls(obj: Path) -> list[str]:
    """Undefined symbols of the candidate's object that host code may not use, demangled."""
    names = _symbols(obj, "--undefined-only")
    forbidden = sorted(name for name in names if not _ALLOWED_HOST_SYMBOL.match(name))
    readable = demangle(forbidden)
    return [readable[name] for name in forbidden]


def _run(command: list[str], cwd: Path, timeout_s: float) -> tuple[int, str, bool]:
    """Run a compiler process in its own session, reading only the toolkit, the system and
    ``cwd`` (``ptxgym.build.sandbox``, where the kernel has Landlock), with resource limits and
    a lower CPU priority (``COMPILER_NICENESS``, inherited by cicc, ptxas and gcc); kill the
    group on timeout."""
    limited = command
    if build_sandbox.available():
        limited = build_sandbox.confined_command(limited, nvcc_path(), cwd)
    if shutil.which("prlimit"):
        limits = [f"--as={_MEMORY_LIMIT_BYTES}", f"--fsize={_FILE_SIZE_LIMIT_BYTES}", "--core=0"]
        limited = ["prlimit", *limits, "--", *limited]
    if shutil.which("nice"):
        limited = ["nice", "-n", str(COMPILER_NICENESS), *limited]
    environment = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(cwd),
        "TMPDIR": str(cwd),
        "LANG": "C",
        "LC_ALL": "C",
    }
    code, output = run_group(limited, env=environment, timeout_s=timeout_s, cwd=cwd)
    return (-1, "", True) if code is None else (code, output, False)


_FILE_DIRECTIVE_RE = re.compile(r"\.(incbin|include)\b", re.IGNORECASE)
# Every allowed header at once preprocesses to about 7 MB; macros can expand a small candidate
# far beyond that, and scanning costs about a second per few megabytes.
_MAX_PREPROCESSED_CHARS = 16 << 20


def _assembler_escape(preprocessed: str) -> str | None:
    """Why the preprocessed text may not be built (completing "the preprocessed source …"), or
    None. It may not hold a file directive anywhere, nor any assembler escape (file,
    macro-building or system-call directive) in its string literals, read as the compiler reads
    them (``ptxgym.languages.cuda.cpp_tokens``: adjacent literals joined, escapes decoded). Text
    too large to scan, or that cannot be tokenised for certain (a literal could hide where it
    ends), is refused too."""
    if len(preprocessed) > _MAX_PREPROCESSED_CHARS:
        return (
            f"is {len(preprocessed):,} characters, more than the {_MAX_PREPROCESSED_CHARS:,} "
            "that are scanned for assembler directives"
        )
    found = _FILE_DIRECTIVE_RE.search(preprocessed)
    lexer = Lexer(preprocessed)
    runs = string_runs(lexer.tokens())
    while found is None and (run := next(runs, None)) is not None:
        found = ASSEMBLER_ESCAPE_RE.search(run.text)
    if found is not None:
        return (
            f"holds the assembler directive or instruction {found.group()!r}, which reads "
            "files, builds directives from pieces, or calls the kernel directly"
        )
    if lexer.problems:
        problem = lexer.problems[0]
        return (
            f"cannot be read for certain ({problem.what}, line {problem.line}), so a literal "
            "could hide an assembler directive"
        )
    return None


_ENTRY_RE = re.compile(r"ptxas info\s*: Compiling entry function '([^']+)'")
_PROPERTIES_RE = re.compile(r"ptxas info\s*: Function properties for (\S+)")
_FRAME_RE = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
_USED_RE = re.compile(r"ptxas info\s*: Used (\d+) registers(?:, used (\d+) barriers)?(.*)")
_SMEM_RE = re.compile(r"(\d+) bytes smem")


def _parse_resources(output: str) -> tuple[KernelResources, ...]:
    """Per-entry-function registers, shared memory, stack and spills from ``ptxas -v``."""
    frames: dict[str, tuple[int, int, int]] = {}
    usage: dict[str, tuple[int, int, int]] = {}
    entries: list[str] = []
    current: str | None = None
    lines = output.splitlines()
    for index, line in enumerate(lines):
        if match := _ENTRY_RE.search(line):
            current = match.group(1)
            entries.append(current)
        elif (match := _PROPERTIES_RE.search(line)) and index + 1 < len(lines):
            if frame := _FRAME_RE.search(lines[index + 1]):
                frames[match.group(1)] = (int(frame[1]), int(frame[2]), int(frame[3]))
        elif (match := _USED_RE.search(line)) and current is not None:
            smem = _SMEM_RE.search(match.group(3))
            usage[current] = (
                int(match.group(1)),
                int(match.group(2) or 0),
                int(smem.group(1)) if smem else 0,
            )
    names = demangle(entries)
    kernels = []
    for mangled in entries:
        registers, barriers, shared = usage.get(mangled, (0, 0, 0))
        stack, spill_store, spill_load = frames.get(mangled, (0, 0, 0))
        kernels.append(
            KernelResources(
                names[mangled], registers, shared, stack, spill_store, spill_load, barriers
            )
        )
    return tuple(kernels)


def _exported_symbols(library: Path) -> set[str]:
    """Dynamic symbols the library defines (read with nm; the library is never loaded here)."""
    return _symbols(library, "-D", "--defined-only")


def _symbols(path: Path, *options: str) -> set[str]:
    """Symbol names ``nm`` lists for ``path`` with ``options``."""
    if not shutil.which("nm"):
        raise CompilerUnavailable("nm (binutils) is needed to inspect built objects")
    out = subprocess.run(
        ["nm", *options, str(path)], capture_output=True, text=True, check=False, timeout=60
    )
    return {line.split()[-1] for line in out.stdout.splitlines() if line.strip()}
