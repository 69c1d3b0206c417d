"""Static policy: what a candidate source may contain before anything compiles it.

Rules (DESIGN §3–4): a size limit; includes only from an allow-list of CUDA and C++ standard
headers, or the knowledge pack's own wrapper header, never by path; no computed includes,
``#embed``, ``__has_include`` probes of other files, line-control directives (``#line``, ``# N
"file"``: the compiler would quote that file's lines), assembler ``.incbin``/``.include``, or
``#pragma GCC dependency`` (each would let the compiler read a host file); only the usual
directives and pragmas; no cuBLAS, cuDNN, CUTLASS/CuTe, FlashInfer or torch, by header, by name
or through the dynamic loader; and the entry point must be defined.

The source is read as gcc reads it, as preprocessing tokens (``ptxgym.languages.cuda.cpp_tokens``:
line splices, comments, literals of every kind, digit separators, digraphs), so no spelling can hide
a directive, a name or a string from the scan. Where that reading is not certain (an unterminated
literal or comment, a malformed raw string, a stray backslash, non-ASCII outside literals,
trigraphs, escapes whose meaning depends on the compiler's version), the source is refused.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ptxgym.languages.base import PolicyReport
from ptxgym.languages.cuda.cpp_tokens import (
    Kind,
    Token,
    code_text,
    directive_lines,
    string_runs,
    tokenise,
)
from ptxgym.tasks import Task
from ptxgym.tasks.packs import pack_header_name

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
_HEADER_DIRECTIVES = frozenset({"include", "include_next", "import"})
# Directives a kernel may use; every other one (#line and the linemarker "# N", #embed, #ident,
# #assert …) is refused, known or not.
_ALLOWED_DIRECTIVES = _HEADER_DIRECTIVES | {
    "define",
    "undef",
    "if",
    "ifdef",
    "ifndef",
    "elif",
    "elifdef",
    "elifndef",
    "else",
    "endif",
    "error",
    "warning",
    "pragma",
}
_HEADER_NAME_RE = re.compile(r'<([^<>"]+)>|"([^<>"]+)"')
_HAS_INCLUDE = frozenset({"__has_include", "__has_include_next"})
# C++17 has no trigraphs and gcc and nvcc's front end ignore them, but a compiler in another
# mode would replace them (``??/`` is a backslash): refused so that no reading depends on it.
_TRIGRAPH_RE = re.compile(r"\?\?[=/'()!<>-]")
_PRAGMA_STRING_RE = re.compile(r'L?"(?:[^"\\]|\\.)*"')
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
# The pragmas of the GCC and clang namespaces a kernel may use (GCC dependency reads a file).
_ALLOWED_PRAGMA_NAMESPACES = {
    "GCC": frozenset(
        {
            "diagnostic",
            "unroll",
            "ivdep",
            "push_options",
            "pop_options",
            "optimize",
            "target",
            "visibility",
            "poison",
            "warning",
            "error",
        }
    ),
    "clang": frozenset({"diagnostic", "loop", "unroll"}),
}
MAX_VIOLATIONS_SHOWN = 20
"""A source with many broken rules gets the first ones and a count, not a wall of text."""


def check_policy(source: str, task: Task) -> PolicyReport:
    """Check ``source`` against the static policy for ``task``."""
    if len(source) > MAX_SOURCE_CHARS:
        return PolicyReport(
            (f"the source is {len(source):,} characters; the limit is {MAX_SOURCE_CHARS:,}",)
        )
    lexed = tokenise(source)
    tokens = lexed.tokens
    violations = [
        f"line {problem.line}: {problem.what}: the source must read the same to this check "
        "as to the compiler"
        for problem in lexed.problems
    ]
    if trigraph := _TRIGRAPH_RE.search(source):
        line = source.count("\n", 0, trigraph.start()) + 1
        violations.append(
            f"line {line}: the trigraph {trigraph.group()!r} is not allowed (compilers disagree "
            "on whether to replace it)"
        )
    for hash_token, line_tokens in directive_lines(tokens):
        violations += _check_directive(hash_token, line_tokens, task)
    violations += _check_operators(tokens, task)

    runs = list(string_runs(tokens))
    violations += [
        f"line {run.line}: delimited or named escape sequences (\\o{{…}}, \\x{{…}}, \\u{{…}}, "
        "\\N{…}) are not allowed: what they mean depends on the compiler's version"
        for run in runs
        if run.delimited_escape
    ]
    everything = code_text(tokens) + "\n" + "\n".join(run.text for run in runs)
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

    if not _defines_entry_point(tokens, task.entry_point.symbol):
        violations.append(
            f"the entry point is missing: define it with C linkage, exactly "
            f"{task.entry_point.signature}"
        )
    unique = list(dict.fromkeys(violations))
    if len(unique) > MAX_VIOLATIONS_SHOWN:
        hidden = len(unique) - MAX_VIOLATIONS_SHOWN
        unique = [*unique[:MAX_VIOLATIONS_SHOWN], f"… and {hidden:,} more"]
    return PolicyReport(tuple(unique))


def included_headers(source: str, task: Task) -> tuple[str, ...]:
    """The allowed headers ``source`` includes (``#include``, ``#include_next``, ``#import``), as
    written (``<name>`` or ``"name"``), in order of first appearance."""
    headers = [
        line_tokens[1].text
        for _, line_tokens in directive_lines(tokenise(source).tokens)
        if line_tokens
        and line_tokens[0].text in _HEADER_DIRECTIVES
        and not _check_header(line_tokens[1:], task, "#include")
    ]
    return tuple(dict.fromkeys(headers))


def _check_directive(hash_token: Token, line_tokens: Sequence[Token], task: Task) -> list[str]:
    """The rules a directive breaks (``line_tokens``: what follows its ``#`` on its line)."""
    if not line_tokens:
        return []  # the null directive
    name, arguments = line_tokens[0], line_tokens[1:]
    where = f"line {hash_token.line}"
    if name.kind is Kind.NUMBER or name.text == "line":
        return [
            f'{where}: line-control directives (#line N "file", # N "file") are not '
            "allowed: they make the compiler quote lines of other files"
        ]
    if name.text == "embed":
        return [f"{where}: #embed is not allowed: it reads a file into the program"]
    if name.kind is not Kind.IDENTIFIER or name.text not in _ALLOWED_DIRECTIVES:
        return [f"{where}: the directive #{name.text} is not allowed"]
    if name.text in _HEADER_DIRECTIVES:
        return _check_header(arguments, task, f"{where}: #{name.text}")
    if name.text == "pragma":
        return _check_pragma(arguments, where)
    return []


def _check_operators(tokens: Sequence[Token], task: Task) -> list[str]:
    """``__has_include`` with a header other than an allowed one, ``_Pragma`` with anything but
    one string literal or with a pragma that is not allowed, and ``__has_embed``."""
    violations: list[str] = []
    for index, token in enumerate(tokens):
        if token.kind is not Kind.IDENTIFIER:
            continue
        following = tokens[index + 1 : index + 4]
        opens = bool(following) and following[0].text == "("
        closed = len(following) == 3 and following[2].text == ")"
        if token.text in _HAS_INCLUDE and opens:
            argument = following[1:2] if closed else following[1:]
            violations += _check_header(argument, task, f"line {token.line}: {token.text}")
        elif token.text == "_Pragma":
            literal = following[1] if closed else None
            if literal is None or not _PRAGMA_STRING_RE.fullmatch(literal.text):
                # A pragma built by a macro (_Pragma(#x)) cannot be checked here.
                violations.append(
                    f"line {token.line}: _Pragma is allowed only with one string literal"
                )
                continue
            text = literal.text[literal.text.index('"') + 1 : -1]
            pragma = tokenise(re.sub(r'\\([\\"])', r"\1", text))
            violations += [
                f"line {token.line}: _Pragma({literal.text}): {problem.what}"
                for problem in pragma.problems
            ]
            violations += _check_pragma(pragma.tokens, f"line {token.line}")
        elif token.text == "__has_embed":
            violations.append(f"line {token.line}: __has_embed is not allowed: it probes files")
    return violations


def _check_header(arguments: Sequence[Token], task: Task, how: str) -> list[str]:
    """The rules broken by an include of ``arguments`` (the tokens naming the header)."""
    argument = code_text(arguments).strip()
    match = _HEADER_NAME_RE.fullmatch(argument)
    if len(arguments) != 1 or arguments[0].kind is not Kind.HEADER_NAME or not match:
        return [f'{how} {argument!r}: only a literal <header> or "header" may be included']
    name = match.group(1) or match.group(2)
    for pattern, reason in _FORBIDDEN_LIBRARIES:
        if pattern.search(name):
            return [f"{how} {argument}: {reason}; the kernel must not use it"]
    if name.startswith("/") or ".." in name or "\\" in name:
        return [f"{how} {argument}: include headers by name, never by path"]
    if match.group(1) is not None:
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


def _check_pragma(tokens: Sequence[Token], where: str) -> list[str]:
    if not tokens:
        return []
    first = tokens[0]
    namespace = _ALLOWED_PRAGMA_NAMESPACES.get(first.text)
    allowed = first.kind is Kind.IDENTIFIER and first.text in _ALLOWED_PRAGMA_WORDS
    if allowed and namespace is not None:
        allowed = (
            len(tokens) > 1 and tokens[1].kind is Kind.IDENTIFIER and tokens[1].text in namespace
        )
    if not allowed:
        return [f"{where}: #pragma {code_text(tokens).strip()!r} is not allowed"]
    return []


_OPEN_BRACES = frozenset({"{", "<%"})


def _defines_entry_point(tokens: Sequence[Token], symbol: str) -> bool:
    """Whether ``symbol`` is called or declared somewhere (``symbol (``) and given C linkage:
    inside ``extern "C" {`` anywhere, or after an ``extern "C"`` before the next ``;`` or ``{``.

    One pass, so that many ``extern "C"`` cannot make it slow."""
    named = linked = in_linkage = False
    for index, token in enumerate(tokens[:-1]):
        following = tokens[index + 1]
        if token.text == "extern" and following.text == '"C"':
            after = tokens[index + 2] if index + 2 < len(tokens) else None
            if after is not None and after.text in _OPEN_BRACES:
                linked = True
            in_linkage = True
        elif token.kind is Kind.PUNCTUATOR and (token.text == ";" or token.text in _OPEN_BRACES):
            in_linkage = False
        elif token.text == symbol and following.text == "(":
            named = True
            linked = linked or in_linkage
    return named and linked
