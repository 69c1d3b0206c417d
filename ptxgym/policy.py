"""Static policy: what a candidate source may contain before anything compiles it.

Rules (DESIGN §3–4): a size limit; includes only from an allow-list of CUDA and C++ standard
headers, or the knowledge pack's own wrapper header, never by path; no computed includes,
``#embed``, ``__has_include`` probes of other files, assembler ``.incbin``/``.include``, or
``#pragma GCC dependency`` (each would let the compiler read a host file); no cuBLAS, cuDNN,
CUTLASS/CuTe, FlashInfer or torch, by header, by name or through the dynamic loader; and the
entry point must be defined. The source is scanned after comments are removed, line
continuations joined and digraphs undone, so those cannot hide a directive.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ptxgym.tasks import Task

MAX_SOURCE_CHARS = 200_000
"""Longest accepted candidate source (an expert FA3 kernel is about 30k characters)."""

ALLOWED_SYSTEM_HEADERS = frozenset(
    {
        # CUDA runtime, driver types (TMA tensor maps), numeric types, warp-level helpers
        "cuda.h",
        "cudaTypedefs.h",
        "cuda_runtime.h",
        "cuda_runtime_api.h",
        "cuda_bf16.h",
        "cuda_fp16.h",
        "cuda_fp8.h",
        "cuda_pipeline.h",
        "cuda_awbarrier.h",
        "device_launch_parameters.h",
        "vector_types.h",
        "vector_functions.h",
        "math_constants.h",
        "mma.h",
        "cooperative_groups.h",
        "cooperative_groups/memcpy_async.h",
        "cooperative_groups/reduce.h",
        "cuda/barrier",
        "cuda/pipeline",
        "cuda/ptx",
        # C and C++ standard library, the parts a kernel's host code needs
        "stdint.h",
        "stddef.h",
        "stdio.h",
        "stdlib.h",
        "string.h",
        "math.h",
        "float.h",
        "limits.h",
        "assert.h",
        "cstdint",
        "cstddef",
        "cstdio",
        "cstdlib",
        "cstring",
        "cmath",
        "cfloat",
        "climits",
        "cassert",
        "type_traits",
        "utility",
        "limits",
        "array",
        "algorithm",
        "initializer_list",
        "tuple",
        "new",
    }
)

_FORBIDDEN_LIBRARIES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"cublas", re.IGNORECASE), "cuBLAS is the GEMM baseline"),
    (re.compile(r"cudnn", re.IGNORECASE), "cuDNN is the attention baseline"),
    (re.compile(r"\bcutlass|\bcute\b|\bcute/", re.IGNORECASE), "CUTLASS/CuTe is a library"),
    (re.compile(r"flashinfer", re.IGNORECASE), "FlashInfer is the GQA baseline"),
    (re.compile(r"\btorch\b|\bATen\b|\bc10::|\bat::"), "libtorch is off limits"),
    (re.compile(r"\b(thrust|cub)/"), "Thrust/CUB are libraries"),
)
_LOADER_RE = re.compile(r"\b(dlopen|dlmopen|dlsym|dlvsym|__libc_dlopen_mode)\b")
# Assembler directives that read files (.incbin, .include) or build directives from pieces
# (.irp, .irpc, .rept, .macro, .altmacro: ".inc\\d" with d = bin), and raw system calls.
# PTX uses none of them.
ASSEMBLER_ESCAPE_RE = re.compile(
    r"\.(incbin|include|irpc?|rept|macro|altmacro)\b|\bsyscall\b|\bsysenter\b|\bint\s+\$?0x80\b",
    re.IGNORECASE,
)
# The preprocessor takes any whitespace but a newline around a directive's '#' (form feed and
# vertical tab included).
_DIRECTIVE_RE = re.compile(r"^[^\S\n]*#[^\S\n]*(\w+)[^\S\n]*(.*)$", re.MULTILINE)
_HAS_INCLUDE_RE = re.compile(r"__has_include(?:_next)?\s*\(\s*([^)]*)\)")
_PRAGMA_OPERATOR_RE = re.compile(r"_Pragma\s*\(\s*(\"([^\"]*)\")?")
_HEADER_RE = re.compile(r"^(<([^<>\"]+)>|\"([^<>\"]+)\")\s*$")
_ALLOWED_PRAGMA_WORDS = frozenset(
    {
        "unroll",
        "nounroll",
        "once",
        "pack",
        "push_macro",
        "pop_macro",
        "nv_diag_suppress",
        "nv_diag_default",
        "nv_diag_warning",
        "nv_diag_error",
        "diag_suppress",
        "GCC",
        "clang",
    }
)


def pack_header_name(task: Task) -> str:
    """The quoted include that brings the task's knowledge-pack wrappers into a candidate."""
    return f"ptxgym_{task.target.pack}.cuh"


@dataclass(frozen=True)
class PolicyReport:
    """Every rule the source breaks; empty when it may be compiled."""

    violations: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.violations


def check_policy(source: str, task: Task) -> PolicyReport:
    """Check ``source`` against the static policy for ``task``."""
    if len(source) > MAX_SOURCE_CHARS:
        return PolicyReport(
            (f"the source is {len(source):,} characters; the limit is {MAX_SOURCE_CHARS:,}",)
        )
    code, strings = _strip_comments(_normalise(source))
    violations: list[str] = []

    for match in _DIRECTIVE_RE.finditer(code):
        directive, argument = match.group(1), match.group(2).strip()
        if directive in ("include", "include_next", "import"):
            violations += _check_header(argument, task, f"#{directive}")
        elif directive == "embed":
            violations.append("#embed is not allowed: it reads a file into the program")
        elif directive == "pragma":
            violations += _check_pragma(argument)
    for match in _HAS_INCLUDE_RE.finditer(code):
        violations += _check_header(match.group(1).strip(), task, "__has_include")
    for match in _PRAGMA_OPERATOR_RE.finditer(code):
        if match.group(1) is None:
            # A pragma built by a macro (_Pragma(#x)) cannot be checked here.
            violations.append("_Pragma is allowed only with a string literal")
        else:
            violations += _check_pragma(match.group(2))

    everything = code + "\n" + "\n".join(strings)
    if found := ASSEMBLER_ESCAPE_RE.search(everything):
        violations.append(
            f"the assembler directive or instruction {found.group()!r} is not allowed: "
            "it reads files, assembles directives from pieces, or calls the kernel directly"
        )
    for pattern, reason in _FORBIDDEN_LIBRARIES:
        if found := pattern.search(everything):
            violations.append(f"uses {found.group()!r}: {reason}; write the kernel yourself")
    if found := _LOADER_RE.search(everything):
        violations.append(f"uses {found.group()!r}: loading libraries at run time is not allowed")

    symbol = task.entry_point.symbol
    if not re.search(rf'extern\s+"C"[^;{{]*\b{symbol}\s*\(|extern\s+"C"\s*\{{', code) or not (
        re.search(rf"\b{symbol}\s*\(", code)
    ):
        violations.append(
            f"the entry point is missing: define it with C linkage, exactly "
            f"{task.entry_point.signature}"
        )
    return PolicyReport(tuple(dict.fromkeys(violations)))


def included_headers(source: str, task: Task) -> tuple[str, ...]:
    """The allowed headers ``source`` includes (``#include``, ``#include_next``, ``#import``), as
    written (``<name>`` or ``"name"``), in order of first appearance."""
    code, _ = _strip_comments(_normalise(source))
    headers = [
        argument
        for match in _DIRECTIVE_RE.finditer(code)
        if match.group(1) in ("include", "include_next", "import")
        and not _check_header(argument := match.group(2).strip(), task, "#include")
    ]
    return tuple(dict.fromkeys(headers))


def _check_header(argument: str, task: Task, how: str) -> list[str]:
    match = _HEADER_RE.match(argument)
    if not match:
        return [f'{how} {argument!r}: only a literal <header> or "header" may be included']
    name = match.group(2) or match.group(3)
    for pattern, reason in _FORBIDDEN_LIBRARIES:
        if pattern.search(name):
            return [f"{how} {argument}: {reason}; the kernel must not use it"]
    if name.startswith("/") or ".." in name or "\\" in name:
        return [f"{how} {argument}: include headers by name, never by path"]
    if match.group(2) is not None:
        if name in ALLOWED_SYSTEM_HEADERS:
            return []
        return [
            f"{how} {argument}: not an allowed header (allowed: CUDA runtime/driver types, "
            f"cuda_bf16.h and the other CUDA numeric headers, and a few C++ standard headers)"
        ]
    if name == pack_header_name(task):
        return []
    return [
        f"{how} {argument}: the only quoted include available is "
        f'"{pack_header_name(task)}" (the knowledge pack\'s wrappers)'
    ]


def _check_pragma(argument: str) -> list[str]:
    words = argument.split()
    if not words:
        return []
    if words[0] not in _ALLOWED_PRAGMA_WORDS or "dependency" in words:
        return [f"#pragma {argument!r} is not allowed"]
    return []


def _normalise(source: str) -> str:
    """Join line continuations and undo the ``%:`` digraph and ``??=`` trigraph for ``#``."""
    text = source.replace("\r\n", "\n").replace("\r", "\n")
    text = re.sub(r"\\[ \t]*\n", "", text)
    return text.replace("%:", "#").replace("??=", "#")


# A raw string literal's opening: R" with an optional encoding prefix (u8R", uR", UR", LR").
_RAW_STRING_RE = re.compile(r'(?:u8|u|U|L)?R"')


def _strip_comments(text: str) -> tuple[str, list[str]]:
    """Remove comments; return the code (string literals kept) and the literals' contents.

    Adjacent literals are also returned joined, so ``".inc" "bin"`` is seen as ``.incbin``.
    """
    out: list[str] = []
    strings: list[str] = []
    i, n = 0, len(text)
    last_string_end = -1
    while i < n:
        ch = text[i]
        if text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            out.append(" ")
            i = n if end < 0 else end + 2
        elif ch in "uULR" and (raw := _RAW_STRING_RE.match(text, i)):
            if i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_"):
                # R" inside a longer identifier (fooR"x") is an ordinary string after a name.
                out.append(ch)
                i += 1
                continue
            start = raw.end()
            open_paren = text.find("(", start)
            delimiter = text[start:open_paren] if open_paren >= 0 else ""
            close = text.find(f'){delimiter}"', open_paren + 1) if open_paren >= 0 else -1
            end = n if close < 0 else close + len(delimiter) + 2
            content = text[open_paren + 1 : close] if close >= 0 else text[i:]
            _record_string(strings, content, text, last_string_end, i)
            out.append(text[i:end])
            last_string_end, i = end, end
        elif ch in "\"'":
            j = i + 1
            while j < n and text[j] != ch and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            end = min(j + 1, n)
            if ch == '"':
                _record_string(strings, text[i + 1 : j], text, last_string_end, i)
                last_string_end = end
            out.append(text[i:end])
            i = end
        else:
            out.append(ch)
            i += 1
    return "".join(out), strings


def _record_string(strings: list[str], content: str, text: str, last_end: int, start: int) -> None:
    if strings and last_end >= 0 and not text[last_end:start].strip():
        strings.append(strings[-1] + content)
    strings.append(content)
