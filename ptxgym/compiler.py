"""Compile a candidate into a shared library with nvcc, cached by content hash.

The candidate is written verbatim as ``candidate.cu`` into a fresh build folder, next to the
knowledge pack's wrapper header, and compiled through a small ``build.cu`` of ours that includes
it and asserts the entry point's exact C signature. Nothing else is on the include path, and the
static policy (``ptxgym.policy``) has already refused includes by path; before the real build the
host-side preprocessed source is also scanned for assembler ``.incbin``/``.include``, which macros
could otherwise assemble. The compiler log is trimmed to what helps the next attempt and never
echoes a line of a file outside the submission. A successful build also carries the static
inventory of its SASS (``ptxgym.sass``).

Results (success or failure) are cached under ``<cache>/builds/<hash>``: a build folder is
created under ``<cache>/tmp`` and renamed into place, so concurrent compiles of the same source
are safe (the first rename wins, the others reuse it).
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from pathlib import Path

from ptxgym import paths
from ptxgym.policy import ASSEMBLER_ESCAPE_RE, included_headers, pack_header_name
from ptxgym.processes import run_group
from ptxgym.sass import SassInventory, demangle, inventory
from ptxgym.tasks import Task, c_parameter_types

DEFAULT_TIMEOUT_S = 180.0
MAX_CACHED_BUILDS = 4000
_RECIPE_VERSION = "5"  # bump when the build recipe changes, to invalidate cached results
_MEMORY_LIMIT_BYTES = 8 << 30  # per compiler process: stops template/constexpr bombs
_FILE_SIZE_LIMIT_BYTES = 512 << 20
# Builds fan out over every core, while a worker or a tool run may hold the GPU alone (a timing,
# a profiled call) and needs the CPU to finish and let the next one have it: compilers yield.
COMPILER_NICENESS = 10
_MAX_LOG_CHARS = 6000
_MAX_DIAGNOSTICS = 12

CANDIDATE_FILE = "candidate.cu"
OBJECT_FILE = "candidate.o"
LIBRARY_FILE = "candidate.so"
_BUILD_FILE = "build.cu"
_RESULT_FILE = "result.json"
_KEEP_DIR = "intermediates"


class CompilerUnavailable(RuntimeError):
    """nvcc (or the binutils it needs) is not installed: no candidate can be built here."""


@dataclass(frozen=True)
class KernelResources:
    """What ptxas reports for one ``__global__`` function."""

    name: str
    registers: int
    shared_bytes: int
    stack_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    barriers: int


@dataclass(frozen=True)
class CompileResult:
    """The outcome of building one candidate for one task's target."""

    ok: bool
    log: str
    source_hash: str
    arch: str
    seconds: float
    cached: bool = False
    timed_out: bool = False
    warnings: tuple[str, ...] = ()
    kernels: tuple[KernelResources, ...] = ()
    library: str | None = None
    command: tuple[str, ...] = field(default=(), repr=False)
    sass: SassInventory | None = field(default=None, repr=False)
    # Set when the build itself found something the policy forbids (what the source scan cannot
    # see: directives assembled by macros, calls to functions host code may not use).
    policy_violation: str | None = None


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
    headers = dict.fromkeys((*_BUILD_HEADERS, *included_headers(source, task)))
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
    timeout_s: float = DEFAULT_TIMEOUT_S,
    cache_root: Path | None = None,
) -> CompileResult:
    """Build ``source`` for ``task``'s target, or return the cached result of an identical build.

    The source must already have passed :func:`ptxgym.policy.check_policy`.
    """
    root = cache_root or paths.cache_dir()
    # Made once: the hash covers them, and the build writes them.
    translation_unit, pack_header = build_source(task, source), _pack_header(task)
    key = source_hash(source, task, translation_unit, pack_header)
    final = root / "builds" / key[:2] / key
    if cached := _load_cached(final):
        return cached
    (root / "tmp").mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="build-", dir=root / "tmp"))
    try:
        result = _build(source, translation_unit, pack_header, task, key, work, timeout_s)
        (work / _RESULT_FILE).write_text(json.dumps(asdict(result)), encoding="utf-8")
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(work, final)
        except OSError:
            # Another process finished the same build first: use its result.
            if cached := _load_cached(final):
                return cached
            raise
        _prune(root / "builds")
        return _with_library_path(result, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _load_cached(folder: Path) -> CompileResult | None:
    try:
        data = json.loads((folder / _RESULT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    os.utime(folder)  # recently used: kept longest by _prune
    data["kernels"] = tuple(KernelResources(**k) for k in data["kernels"])
    data["warnings"] = tuple(data["warnings"])
    data["command"] = tuple(data["command"])
    if data["sass"] is not None:
        data["sass"] = SassInventory.from_dict(data["sass"])
    return _with_library_path(CompileResult(**{**data, "cached": True}), folder)


def _with_library_path(result: CompileResult, folder: Path) -> CompileResult:
    return replace(result, library=str(folder / LIBRARY_FILE)) if result.ok else result


def _prune(builds: Path) -> None:
    """Keep the cache bounded: drop the least recently used builds beyond the limit."""
    entries = [entry for prefix in builds.iterdir() for entry in prefix.iterdir()]
    if len(entries) <= MAX_CACHED_BUILDS:
        return
    entries.sort(key=lambda p: p.stat().st_mtime)
    for entry in entries[: len(entries) - MAX_CACHED_BUILDS]:
        shutil.rmtree(entry, ignore_errors=True)


def _build(
    source: str,
    translation_unit: str,
    pack_header: bytes,
    task: Task,
    key: str,
    work: Path,
    timeout_s: float,
) -> CompileResult:
    started = time.perf_counter()
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

    code, output, timed_out = _run(_preprocess_command(task), work, timeout_s)
    if timed_out:
        return result(False, f"compile timed out after {timeout_s:.0f} s", timed_out=True)
    if code == 0:
        text = (work / "preprocessed.ii").read_text(encoding="utf-8", errors="replace")
        if found := _assembler_escape(text):
            message = (
                f"the preprocessed source holds the assembler directive or instruction "
                f"{found!r}, which reads files, builds directives from pieces, or calls the "
                "kernel directly; it is not allowed"
            )
            return result(False, message, policy_violation=message)
    (work / "preprocessed.ii").unlink(missing_ok=True)

    (work / _KEEP_DIR).mkdir()
    remaining = max(1.0, timeout_s - (time.perf_counter() - started))
    code, output, timed_out = _run(command, work, remaining)
    if timed_out:
        return result(False, f"compile timed out after {timeout_s:.0f} s", timed_out=True)
    kernels = _parse_resources(output)
    log, warnings = _trim_log(output, work, task)
    shutil.rmtree(work / _KEEP_DIR, ignore_errors=True)
    if code != 0:
        return result(False, log or f"nvcc failed with exit code {code}", warnings=warnings)
    forbidden = _forbidden_host_calls(work / OBJECT_FILE)
    if forbidden:
        message = (
            f"the host code calls {', '.join(forbidden[:8])}: host code may call only the CUDA "
            "runtime and a few C library functions (memory, strings, printing, math, exit)"
        )
        return result(False, message, warnings=warnings, policy_violation=message)
    remaining = max(1.0, timeout_s - (time.perf_counter() - started))
    code, output, timed_out = _run(link_command(task), work, remaining)
    if timed_out:
        return result(False, f"link timed out after {timeout_s:.0f} s", timed_out=True)
    if code != 0:
        log, _ = _trim_log(output, work, task)
        return result(False, log or f"linking failed with exit code {code}", warnings=warnings)
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
    """Run a compiler process in its own session with resource limits and a lower CPU priority
    (``COMPILER_NICENESS``, inherited by cicc, ptxas and gcc); kill the group on timeout."""
    limited = command
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


_STRING_LITERAL_RE = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
_FILE_DIRECTIVE_RE = re.compile(r"\.(incbin|include)\b", re.IGNORECASE)


def _assembler_escape(preprocessed: str) -> str | None:
    """Find file directives in the preprocessed text, and any assembler escape (file,
    macro-building or system-call directive) in its joined, unescaped string literals."""
    if found := _FILE_DIRECTIVE_RE.search(preprocessed):
        return found.group()
    joined: list[str] = []
    last_end = -1
    for match in _STRING_LITERAL_RE.finditer(preprocessed):
        try:
            text = codecs.decode(match.group(1), "unicode_escape")
        except UnicodeDecodeError:
            text = match.group(1)
        if joined and not preprocessed[last_end : match.start()].strip():
            joined[-1] += text
        else:
            joined.append(text)
        last_end = match.end()
    for text in joined:
        if found := ASSEMBLER_ESCAPE_RE.search(text):
            return found.group()
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


# Front-end (EDG) diagnostics "file(12): error: ..." and host-compiler (gcc) diagnostics
# "file:12:5: error: ...".
_DIAGNOSTIC_RE = re.compile(
    r"^(?:(?P<file>[^\s()][^()]*?)\((?P<line>\d+)\): (?P<kind>error|warning|remark)[^:]*"
    r"|(?P<gfile>[^\s:]+):(?P<gline>\d+)(?::\d+)?: (?P<gkind>error|warning|fatal error)): "
    r"(?P<message>.*)$"
)
_PTXAS_RE = re.compile(
    r"^ptxas (?P<file>\S+), line (?P<line>\d+); (?P<kind>error|warning)\s*: (?P<message>.*)$"
)
_PTXAS_OTHER_RE = re.compile(r"^ptxas (?P<kind>warning|error|fatal)\s*: (?P<message>.*)$")
_UNDEFINED_RE = re.compile(r"undefined reference to [`'](?P<symbol>[^`']+)'")
_SYSTEM_PREFIXES = ("/usr/local/cuda", "/usr/include", "/usr/lib/gcc", "/opt/nvidia")


def _trim_log(output: str, work: Path, task: Task) -> tuple[str, tuple[str, ...]]:
    """Keep errors and warnings that help; never echo a line from a file outside the build."""
    blocks: list[str] = []
    warnings: list[str] = []
    lines = output.replace(str(work) + "/", "").splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        if match := _DIAGNOSTIC_RE.match(line):
            # The diagnostic's continuation lines: the echoed source line, the caret, notes.
            continuation = []
            while index < len(lines) and not _starts_message(lines[index]):
                continuation.append(lines[index])
                index += 1
            block = _diagnostic_block(match, continuation, task)
            if "warning" in (match["kind"], match["gkind"]):
                warnings.append(block)
            blocks.append(block)
        elif match := _PTXAS_RE.match(line):
            ptx_line = _ptx_line(work, match["file"], int(match["line"]))
            block = f"ptxas {match['kind']}: {match['message']} (PTX line {match['line']}"
            block += f": {ptx_line.strip()})" if ptx_line else ")"
            if match["kind"] == "warning":
                warnings.append(block)
            blocks.append(block)
        elif match := _PTXAS_OTHER_RE.match(line):
            block = f"ptxas {match['kind']}: {match['message']}"
            if match["kind"] == "warning":
                warnings.append(block)
            if match["kind"] != "fatal" or not blocks:
                blocks.append(block)
        elif match := _UNDEFINED_RE.search(line):
            blocks.append(
                f"link error: undefined reference to {match['symbol']!r} "
                "(only the CUDA runtime is linked; define every function you call)"
            )
        elif line.startswith(("nvcc fatal", "nvcc error")):
            blocks.append(line)
    unique = list(dict.fromkeys(blocks))
    shown = unique[:_MAX_DIAGNOSTICS]
    if len(unique) > len(shown):
        shown.append(f"... {len(unique) - len(shown)} more diagnostics not shown")
    log = "\n".join(shown)
    if len(log) > _MAX_LOG_CHARS:
        log = log[:_MAX_LOG_CHARS] + "\n... (log truncated)"
    return log, tuple(dict.fromkeys(warnings))


def _starts_message(line: str) -> bool:
    return bool(
        _DIAGNOSTIC_RE.match(line)
        or line.startswith(("ptxas", "nvcc", "/usr/bin/ld", "collect2"))
        or re.match(r"^\d+ errors? detected", line)
    )


def _diagnostic_block(match: re.Match[str], continuation: list[str], task: Task) -> str:
    file = match["file"] or match["gfile"]
    line = match["line"] or match["gline"]
    kind = (match["kind"] or match["gkind"]).replace("fatal error", "error")
    message = match["message"].strip()
    if file == CANDIDATE_FILE:
        body = "\n".join(text for text in continuation if text.strip())
        return f"{file}({line}): {kind}: {message}" + (f"\n{body}" if body else "")
    if file == _BUILD_FILE:
        if "static assertion failed" in message:
            return f"{kind}: the entry point does not match: {task.entry_point.signature}"
        if "is undefined" in message:
            return f"{kind}: the entry point {task.entry_point.symbol} is not defined"
        return f"{kind}: {message}"
    if file == pack_header_name(task):
        return f"{file}({line}): {kind}: {message}"
    if file.startswith(_SYSTEM_PREFIXES):
        return f"{Path(file).name}(system header): {kind}: {message}"
    return f"{kind} in a file outside the submission (not shown)"


def _ptx_line(work: Path, ptx_file: str, line: int) -> str | None:
    path = (work / ptx_file).resolve()
    if not path.is_relative_to(work.resolve()) or not path.is_file():
        return None
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return lines[line - 1] if 0 < line <= len(lines) else None
