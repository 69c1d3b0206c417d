"""Triton: a Python module of ``@triton.jit`` kernels and one entry function over torch tensors.

Its parts, in the order a candidate meets them: ``extract`` (the last ```python block of a
reply), ``policy`` (the static rules, an allow-list over Python's own syntax tree), ``build``
(byte-compiled, never run, and kept in the build cache), ``prompt`` (the contract the model is
shown). On the GPU host: ``runtime`` (what the judge's processes need to run the module with its
kernels compiled ahead: ``ptxgym.evaluate.compile_run``) and ``cache`` (the Triton cache those
processes copy). Nothing here imports Triton or torch, except ``cache`` and ``runtime`` when a
candidate runs: the policy, the build and the prompt work on any machine.
"""

from __future__ import annotations

from ptxgym.build.result import CompileResult
from ptxgym.languages.base import (
    ENTRY_TRITON,
    ActionLanguage,
    Extraction,
    LanguageSections,
    PolicyReport,
)
from ptxgym.languages.triton import prompt
from ptxgym.languages.triton.build import build_module
from ptxgym.languages.triton.extract import extract_source
from ptxgym.languages.triton.policy import check_policy
from ptxgym.tasks import Task


class TritonLanguage:
    """The :class:`~ptxgym.languages.base.ActionLanguage` for Triton modules."""

    name = "triton"
    fence = "python"
    entry = ENTRY_TRITON
    pack_wrappers = False

    def extract(self, action: str) -> Extraction:
        return extract_source(action)

    def check_policy(self, source: str, task: Task) -> PolicyReport:
        return check_policy(source, task)

    def build(self, source: str, task: Task, *, timeout_s: float) -> CompileResult:
        # Byte-compiling takes milliseconds: no deadline to keep.
        return build_module(source, task)

    def prompt_sections(
        self, task: Task, *, variant: int, wrappers_shown: bool
    ) -> LanguageSections:
        return prompt.sections(task, variant=variant, wrappers_shown=wrappers_shown)


TRITON: ActionLanguage = TritonLanguage()
