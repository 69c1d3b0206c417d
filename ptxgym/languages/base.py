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


# Control bytes other than tab, line feed, vertical tab, form feed and carriage return.
_BAD_CONTROL_RE = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")


@dataclass(frozen=True)
class SourceRules:
    """How one language's candidate is found in an action, and how its messages name it."""

    fence: str  # the tag the prompt asks the model to answer in ("cuda")
    tags: frozenset[str]  # the fence tags taken as this language's code
    hint: re.Pattern[str]  # what makes unfenced text look like code of this language
    text: str  # what the action should be made of ("CUDA source")
    holding: str  # what an action holds ("CUDA source", "a Triton module")
    content: str  # what the fenced block holds ("the kernel")
    complete: str  # the whole candidate ("the complete kernel source")


def extract_fenced(action: str, rules: SourceRules) -> Extraction:
    """Take the candidate out of an action: the last fenced block tagged as the language's code
    (models often show a draft before the final version); with no tagged block, the last
    untagged block; with no fence at all, the whole text if it looks like code. Raises
    ``TypeError`` for a non-string."""
    if not isinstance(action, str):
        raise TypeError(
            f"the action must be a str holding {rules.holding} or a model reply, "
            f"not {type(action).__name__}"
        )
    if len(action) > MAX_ACTION_CHARS:
        return Extraction(
            None, f"the action is {len(action):,} characters; at most {MAX_ACTION_CHARS:,} are read"
        )
    try:
        action.encode("utf-8")
    except UnicodeEncodeError as exc:
        return Extraction(None, f"the action is not valid UTF-8 text (at character {exc.start})")
    if match := _BAD_CONTROL_RE.search(action):
        return Extraction(
            None,
            f"the action holds binary data (control byte {ord(match.group()):#04x} at "
            f"character {match.start()}); send {rules.text} text",
        )
    fence = f"```{rules.fence}"
    if not action.strip():
        return Extraction(None, f"the action is empty; send one {fence} block with {rules.content}")
    blocks = fenced_blocks(action)
    if blocks:
        tagged = [code for tag, code in blocks if tag in rules.tags]
        untagged = [code for tag, code in blocks if not tag]
        chosen = tagged or untagged
        if not chosen:
            tags = sorted({tag for tag, _ in blocks})
            return Extraction(
                None, f"no {fence} block found (the reply's code blocks are tagged {tags})"
            )
        source = chosen[-1]
    elif rules.hint.search(action):
        source = action
    else:
        return Extraction(None, f"no code found: put {rules.complete} in one {fence} block")
    if not source.strip():
        return Extraction(None, f"the last {fence} block is empty")
    return Extraction(source)


def read_action(path: Path) -> str:
    """A file's text as an action. Bytes that are not UTF-8 become lone surrogates, which every
    language's ``extract`` reports as invalid UTF-8 (a format error, not a crash)."""
    return path.read_bytes().decode("utf-8", errors="surrogateescape")
