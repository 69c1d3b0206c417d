"""What an action language is: the contract every language the agent may write in fulfils, and
the records it hands to the next stage.

A language takes its candidate out of the action (:class:`Extraction`), checks it against its
static rules before any tool sees it (:class:`PolicyReport`), builds it into a library the judge
loads (:class:`~ptxgym.build.result.CompileResult`), and states its own contract in the prompt
(:class:`LanguageSections`). The stages around it (prompt, evaluators, env) call only this
protocol, so a second language is one more subpackage of ``ptxgym.languages``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ptxgym.build.result import CompileResult
from ptxgym.tasks import Task

MAX_ACTION_CHARS = 2_000_000
"""Longest action examined at all; a model reply with reasoning is far shorter."""


@dataclass(frozen=True)
class Extraction:
    """The candidate source, or why none could be taken from the action."""

    source: str | None
    error: str | None = None


@dataclass(frozen=True)
class PolicyReport:
    """Every rule the source breaks; empty when it may be compiled."""

    violations: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.violations


@dataclass(frozen=True)
class LanguageSections:
    """The prompt's language-specific parts: what the model writes and how (the introduction's
    words), the build (one line of the target section), the entry point's contract, the rules,
    and the output format."""

    kernel: str
    """What the model writes, e.g. "CUDA kernel"."""
    approach: str
    """How it reaches the target instructions, e.g. "using inline PTX where CUDA C++ has no
    equivalent"."""
    build: str
    interface: str
    rules: str
    output: str


ENTRY_C_ABI = "c-abi"
"""A build is a shared library whose C entry point takes device pointers, the axes and a stream
(``ptxgym.evaluate.worker.Entry``)."""
ENTRY_TRITON = "triton"
"""A build is a Python module whose entry takes torch tensors and the axes; its kernels are
compiled by a confined run on the GPU host before the evaluation
(``ptxgym.evaluate.compile_run``)."""


class ActionLanguage(Protocol):
    """One language a candidate may be written in."""

    name: str
    fence: str
    """The code-block tag the prompt asks the model to answer in."""
    entry: str
    """How the judge's processes load and call a build (``ENTRY_C_ABI`` or ``ENTRY_TRITON``)."""
    pack_wrappers: bool
    """Whether candidates can use the knowledge pack's C++ wrappers (the prompt shows them only
    then)."""

    def extract(self, action: str) -> Extraction: ...

    def check_policy(self, source: str, task: Task) -> PolicyReport: ...

    def build(self, source: str, task: Task, *, timeout_s: float) -> CompileResult: ...

    def prompt_sections(
        self, task: Task, *, variant: int, wrappers_shown: bool
    ) -> LanguageSections: ...


# A fence opens a line with three or more backticks, then an optional info string whose first
# word is the tag; it closes with a line of at least as many backticks and nothing else. Lines
# are matched one at a time, each pattern without backtracking, so finding fences is linear.
_FENCE_OPEN_RE = re.compile(r"[ \t]*(`{3,})[ \t]*([^\s`]*)")
_FENCE_CLOSE_RE = re.compile(r"[ \t]*(`{3,})[ \t]*")


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(lowercased tag, content) of each fenced block of a reply; an unclosed last block runs to
    the end. An opening line must end with a newline; a block's content runs from the line after
    its opening to the start of its closing line."""
    blocks: list[tuple[str, str]] = []
    fence = 0  # the open block's number of backticks; 0 outside a block
    tag, content_start = "", 0
    line_start = 0
    while line_start < len(text):
        newline = text.find("\n", line_start)
        line_end = len(text) if newline < 0 else newline
        if not fence:
            opening = _FENCE_OPEN_RE.match(text, line_start, line_end)
            if opening is not None and newline >= 0:
                fence, tag, content_start = len(opening.group(1)), opening.group(2), line_end + 1
        else:
            closing = _FENCE_CLOSE_RE.fullmatch(text, line_start, line_end)
            if closing is not None and len(closing.group(1)) >= fence:
                blocks.append((tag.lower(), text[content_start:line_start]))
                fence = 0
        line_start = line_end + 1
    if fence:
        blocks.append((tag.lower(), text[content_start:]))
    return blocks


def read_action(path: Path) -> str:
    """A file's text as an action. Bytes that are not UTF-8 become lone surrogates, which every
    language's ``extract`` reports as invalid UTF-8 (a format error, not a crash)."""
    return path.read_bytes().decode("utf-8", errors="surrogateescape")
