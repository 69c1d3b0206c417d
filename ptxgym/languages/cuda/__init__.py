"""CUDA C++ with inline PTX, built by nvcc into a shared library with a C entry point.

Its parts, in the order a candidate meets them: ``extract`` (the last ```cuda block of a
reply), ``cpp_tokens`` (the C++ tokeniser every scan shares), ``policy`` (the static rules),
``compiler`` (the confined, cached nvcc build) and ``prompt`` (the contract the model is shown).
"""

from __future__ import annotations

from ptxgym.build.result import CompileResult
from ptxgym.languages.base import (
    ENTRY_C_ABI,
    ActionLanguage,
    Extraction,
    LanguageSections,
    PolicyReport,
)
from ptxgym.languages.cuda import prompt
from ptxgym.languages.cuda.compiler import compile_source
from ptxgym.languages.cuda.extract import extract_source
from ptxgym.languages.cuda.policy import check_policy
from ptxgym.tasks import Task


class CudaLanguage:
    """The :class:`~ptxgym.languages.base.ActionLanguage` for CUDA C++ and inline PTX."""

    name = "cuda"
    fence = "cuda"
    entry = ENTRY_C_ABI
    pack_wrappers = True

    def extract(self, action: str) -> Extraction:
        return extract_source(action)

    def check_policy(self, source: str, task: Task) -> PolicyReport:
        return check_policy(source, task)

    def build(self, source: str, task: Task, *, timeout_s: float) -> CompileResult:
        return compile_source(source, task, timeout_s=timeout_s)

    def prompt_sections(
        self, task: Task, *, variant: int, wrappers_shown: bool
    ) -> LanguageSections:
        return prompt.sections(task, variant=variant, wrappers_shown=wrappers_shown)


CUDA: ActionLanguage = CudaLanguage()
