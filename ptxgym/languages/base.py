"""What an action language is: the contract every language the agent may write in fulfils, and
the records it hands to the next stage.

A language takes its candidate out of the action (:class:`Extraction`), checks it against its
static rules before any tool sees it (:class:`PolicyReport`), builds it into a library the judge
loads (:class:`~ptxgym.build.result.CompileResult`), and states its own contract in the prompt
(:class:`LanguageSections`). The stages around it (prompt, evaluators, env) call only this
protocol, so a second language is one more subpackage of ``ptxgym.languages``.
"""

from __future__ import annotations

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
    """The prompt's language-specific parts: the build command (one line of the target
    section), the entry point's contract, the rules, and the output format."""

    build: str
    interface: str
    rules: str
    output: str


class ActionLanguage(Protocol):
    """One language a candidate may be written in."""

    name: str
    fence: str
    """The code-block tag the prompt asks the model to answer in."""

    def extract(self, action: str) -> Extraction: ...

    def check_policy(self, source: str, task: Task) -> PolicyReport: ...

    def build(self, source: str, task: Task, *, timeout_s: float) -> CompileResult: ...

    def prompt_sections(
        self, task: Task, *, variant: int, wrappers_shown: bool
    ) -> LanguageSections: ...


def read_action(path: Path) -> str:
    """A file's text as an action. Bytes that are not UTF-8 become lone surrogates, which every
    language's ``extract`` reports as invalid UTF-8 (a format error, not a crash)."""
    return path.read_bytes().decode("utf-8", errors="surrogateescape")
