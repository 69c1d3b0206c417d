"""Rebuild the log a candidate sees from the compiler's and the linker's output.

This is a security boundary. A ``#line`` directive can name any file, and the compiler then
quotes that file's lines under the diagnostics and notes it locates there (its echo of the
source line, "previous definition is here", include chains, template backtraces); the
assembler and the linker print what they assembled or what the object holds. Where the build
runs unconfined (no Landlock, ``ptxgym.build.sandbox``), that file can be any the user may read,
and this log is all that stands between it and the model. So the output is never trimmed and
passed on: it is read for the lines that begin a diagnostic, and the log is built anew from
them. A diagnostic located in the submission shows its message and its line quoted from our own
copy of the source, never the compiler's echo; one in our translation unit is translated; one in
the pack's or a system header is named with its message; any other is only counted as "outside
the submission". ptxas's are quoted from the PTX the build generated, the linker's name the
symbol. Everything is capped (``MAX_LOG_CHARS``, ``MAX_DIAGNOSTICS``, ``MAX_MESSAGE_CHARS``,
``MAX_QUOTE_CHARS``).

:func:`compile_log` reads the compile step's output, :func:`link_log` the link step's;
``ptxgym.languages.cuda.compiler`` runs the build and calls them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from ptxgym.build import sandbox as build_sandbox
from ptxgym.tasks import Task
from ptxgym.tasks.packs import pack_header_name

MAX_LOG_CHARS = 6000
MAX_DIAGNOSTICS = 12
# One diagnostic's message (a message can hold a whole demangled template type or a macro's
# text) and one quoted source line.
MAX_MESSAGE_CHARS = 400
MAX_QUOTE_CHARS = 200


@dataclass(frozen=True)
class BuildFiles:
    """What the log must know of the build whose output it reads: the names its diagnostics give
    the submission and our translation unit, and the nvcc that ran (the headers of its toolkit
    are system headers)."""

    submission: str
    translation_unit: str
    nvcc: str


# Front-end (EDG) diagnostics "file(12): error: ..." (also "warning #177-D:", "note #3326-D:")
# and host-compiler (gcc) ones "file:12:5: error: ...". Only a line that begins with one is read:
# everything else a compiler prints (its echo of the source line, carets, include chains,
# template backtraces, the assembler's messages) can quote a file that a ``#line`` directive, an
# include or an assembler directive named, and is never passed on.
_FRONT_END_RE = re.compile(
    r"^(?P<file>[^\s()][^()]*?)\((?P<line>\d+)\): "
    r"(?P<kind>error|warning|remark|note|catastrophic error|internal error)(?: #[\w-]+)?: "
    r"(?P<message>.*)$"
)
_HOST_COMPILER_RE = re.compile(
    r"^(?P<file>[^\s:]+):(?P<line>\d+)(?::(?P<column>\d+))?: "
    r"(?P<kind>error|warning|fatal error|note): (?P<message>.*)$"
)
# The front end's caret line under its echo of the source line (both indented by two spaces).
_CARET_RE = re.compile(r"^ *\^$")
_PTXAS_RE = re.compile(
    r"^ptxas (?P<file>\S+), line (?P<line>\d+); (?P<kind>error|warning)\s*: (?P<message>.*)$"
)
_PTXAS_OTHER_RE = re.compile(r"^ptxas (?P<kind>warning|error|fatal)\s*: (?P<message>.*)$")
# The linker's "FILE:(SECTION+OFFSET): undefined reference to `SYMBOL'", anchored: its warning
# lines ("FILE:(SECTION+OFFSET): warning: TEXT") print text the object holds, which may read alike.
_LINKER_RE = r"^\S*\([^)\s]*\): {} [`'](?P<symbol>[^`']+)'"
_UNDEFINED_RE = re.compile(_LINKER_RE.format("undefined reference to"))
_MULTIPLE_RE = re.compile(_LINKER_RE.format("multiple definition of"))
# Where ``ProcessGroup`` cut a long output: the line after the mark starts mid-line.
_OMITTED_RE = re.compile(r"^\[\.\.\. \d+ bytes of output omitted \.\.\.\]$")
_SYSTEM_FOLDERS = ("/usr/local/cuda", "/usr/include", "/usr/lib/gcc", "/opt/nvidia")


@dataclass(frozen=True)
class _Diagnostic:
    """One diagnostic's first line, parsed: where, what kind, the message, and the column when
    the compiler gave one that fits our copy of the source (1-based, tabs as ``tab_width``)."""

    file: str
    line: int
    kind: str
    message: str
    column: int | None = None
    tab_width: int = 1


def compile_log(
    output: str, work: Path, task: Task, source: str, files: BuildFiles
) -> tuple[str, tuple[str, ...]]:
    """The log of the compile step (``output``, run in the build folder ``work``), rebuilt from
    the diagnostics that help: those located in the submission, each with its line quoted from
    ``source`` (our copy, never the compiler's echo); those in our translation unit translated;
    those in the pack's or a system header named with their message; ptxas's, with the line of
    our PTX. Returns the log and its warnings."""
    blocks: list[str] = []
    warnings: list[str] = []
    source_lines = source.split("\n")
    lines = _output_lines(output, work)
    # The last block a diagnostic started: a note located in the submission is added to it.
    current: int | None = None
    for index, line in enumerate(lines):
        if diagnostic := _parse_diagnostic(lines, index, source_lines):
            if diagnostic.kind == "note":
                if current is not None and diagnostic.file == files.submission:
                    blocks[current] += "\n" + _submission_block(diagnostic, source_lines)
                continue
            block = _diagnostic_block(diagnostic, task, source_lines, files)
            if diagnostic.kind == "warning":
                warnings.append(block)
            blocks.append(block)
            current = len(blocks) - 1
            continue
        current = None
        if match := _PTXAS_RE.match(line):
            ptx_line = _ptx_line(work, match["file"], int(match["line"]))
            block = f"ptxas {match['kind']}: {_capped(match['message'], MAX_MESSAGE_CHARS)}"
            block += f" (PTX line {match['line']}"
            block += f": {_capped(ptx_line.strip(), MAX_QUOTE_CHARS)})" if ptx_line else ")"
            if match["kind"] == "warning":
                warnings.append(block)
            blocks.append(block)
        elif match := _PTXAS_OTHER_RE.match(line):
            block = f"ptxas {match['kind']}: {_capped(match['message'], MAX_MESSAGE_CHARS)}"
            if match["kind"] == "warning":
                warnings.append(block)
            if match["kind"] != "fatal" or not blocks:
                blocks.append(block)
        elif line.endswith("Assembler messages:"):
            # The host assembler's messages quote what it assembled, which can be a file.
            blocks.append("error: the host assembler refused the host code (not shown)")
        elif line.startswith(("nvcc fatal", "nvcc error")):
            blocks.append(_capped(line, MAX_MESSAGE_CHARS))
    return _joined(blocks), tuple(dict.fromkeys(warnings))[:MAX_DIAGNOSTICS]


def link_log(output: str, work: Path) -> str:
    """The log of the link step (``output``, run in the build folder ``work``): the symbols
    that are missing or defined twice. The linker's other messages are not shown: they can quote
    what the object holds (a section of warning text, built from anything the assembler read)."""
    blocks = []
    for line in _output_lines(output, work):
        if match := _UNDEFINED_RE.match(line):
            symbol = _capped(match["symbol"], MAX_QUOTE_CHARS)
            blocks.append(
                f"link error: undefined reference to {symbol!r} "
                "(only the CUDA runtime is linked; define every function you call)"
            )
        elif match := _MULTIPLE_RE.match(line):
            symbol = _capped(match["symbol"], MAX_QUOTE_CHARS)
            blocks.append(
                f"link error: multiple definition of {symbol!r} (the statically linked CUDA "
                "runtime, or another definition in your source, defines it too: rename yours)"
            )
    return _joined(blocks) or "link error (the linker's messages are not shown)"


def _output_lines(output: str, work: Path) -> list[str]:
    """The output's lines, the build folder's path taken out. Split at newlines only (a quoted
    line of another file may hold a carriage return or a form feed, and must stay one line),
    without the partial line that follows a cut."""
    lines = output.replace(str(work) + "/", "").split("\n")
    return [
        line
        for index, line in enumerate(lines)
        if not _OMITTED_RE.match(line) and not (index and _OMITTED_RE.match(lines[index - 1]))
    ]


def _parse_diagnostic(lines: list[str], index: int, source_lines: list[str]) -> _Diagnostic | None:
    """The diagnostic that line ``index`` begins, if it begins one. The front end gives no
    column in its first line: it is taken from the caret under its echo of the line, when that
    echo is our own line (tabs shown as one space); only the caret's position is kept."""
    if match := _HOST_COMPILER_RE.match(lines[index]):
        return _Diagnostic(
            os.path.normpath(match["file"]),
            int(match["line"]),
            match["kind"],
            match["message"],
            int(match["column"]) if match["column"] else None,
            tab_width=8,  # gcc counts columns with tabs expanded to 8
        )
    if not (match := _FRONT_END_RE.match(lines[index])):
        return None
    number, column = int(match["line"]), None
    for position in range(index + 1, len(lines) - 1):
        echo, caret = lines[position], lines[position + 1]
        if _FRONT_END_RE.match(echo) or _HOST_COMPILER_RE.match(echo):
            break
        if _CARET_RE.match(caret):
            ours = _source_line(source_lines, number).replace("\t", " ").rstrip()
            if ours and echo[2:].rstrip() == ours:
                column = caret.index("^") - 1
            break
    return _Diagnostic(
        os.path.normpath(match["file"]), number, match["kind"], match["message"], column
    )


def _diagnostic_block(
    diagnostic: _Diagnostic, task: Task, source_lines: list[str], files: BuildFiles
) -> str:
    """What the model reads of one diagnostic, by where it is located."""
    kind = "error" if diagnostic.kind.endswith("error") else diagnostic.kind
    message = _capped(diagnostic.message.strip(), MAX_MESSAGE_CHARS)
    file = diagnostic.file
    if file == files.submission:
        return _submission_block(diagnostic, source_lines)
    if file == files.translation_unit:
        if "static assertion failed" in message:
            return f"{kind}: the entry point does not match: {task.entry_point.signature}"
        if "is undefined" in message:
            return f"{kind}: the entry point {task.entry_point.symbol} is not defined"
        return f"{kind}: {message}"
    if file == pack_header_name(task):
        return f"{file}({diagnostic.line}): {kind}: {message}"
    if any(Path(file).is_relative_to(folder) for folder in _system_folders(files.nvcc)):
        return f"{Path(file).name}({diagnostic.line}) (system header): {kind}: {message}"
    return f"{kind} in a file outside the submission (not shown)"


def _submission_block(diagnostic: _Diagnostic, source_lines: list[str]) -> str:
    """A diagnostic located in the submission (its ``file``): its message, then its line from
    our copy of the source and a caret under the column, if the compiler gave one."""
    kind = "error" if diagnostic.kind.endswith("error") else diagnostic.kind
    message = _capped(diagnostic.message.strip(), MAX_MESSAGE_CHARS)
    block = f"{diagnostic.file}({diagnostic.line}): {kind}: {message}"
    text = _source_line(source_lines, diagnostic.line).expandtabs(diagnostic.tab_width).rstrip()
    if not text.strip():
        return block
    # A long line is shown as a window around the column.
    start = 0
    if diagnostic.column is not None and diagnostic.column > MAX_QUOTE_CHARS:
        start = diagnostic.column - MAX_QUOTE_CHARS // 2
    shown = text[start : start + MAX_QUOTE_CHARS]
    lead = "..." if start else ""
    block += f"\n  {lead}{shown}" + ("..." if start + MAX_QUOTE_CHARS < len(text) else "")
    if diagnostic.column is not None and 0 < diagnostic.column - start <= len(shown) + 1:
        block += "\n  " + " " * (len(lead) + diagnostic.column - start - 1) + "^"
    return block


def _source_line(source_lines: list[str], number: int) -> str:
    """Line ``number`` (1-based) of our copy of the source; empty when there is none."""
    return source_lines[number - 1].removesuffix("\r") if 0 < number <= len(source_lines) else ""


@cache
def _system_folders(nvcc: str) -> tuple[Path, ...]:
    """Folders whose headers are the system's or the toolkit's (``nvcc``'s own installation, as
    it reports it: ``nvcc`` may be a wrapper script outside the toolkit)."""
    toolkit = build_sandbox.toolkit_root(nvcc) or Path(nvcc).resolve().parent.parent
    return (toolkit, *(Path(folder) for folder in _SYSTEM_FOLDERS))


def _capped(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _joined(blocks: list[str]) -> str:
    """The blocks, each once, capped in number and in characters."""
    unique = list(dict.fromkeys(blocks))
    shown = unique[:MAX_DIAGNOSTICS]
    if len(unique) > len(shown):
        shown.append(f"... {len(unique) - len(shown)} more diagnostics not shown")
    log = "\n".join(shown)
    if len(log) > MAX_LOG_CHARS:
        log = log[:MAX_LOG_CHARS] + "\n... (log truncated)"
    return log


def _ptx_line(work: Path, ptx_file: str, line: int) -> str | None:
    """Line ``line`` of the PTX file ptxas named, read only inside the build folder ``work``."""
    path = (work / ptx_file).resolve()
    if not path.is_relative_to(work.resolve()) or not path.is_file():
        return None
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return lines[line - 1] if 0 < line <= len(lines) else None
