"""Action text → candidate source.

The action is a CUDA source or a model reply that holds one. From a reply the last fenced block
tagged as CUDA or C/C++ is taken (models often show a draft before the final version); with no
tagged block, the last untagged block; with no fence at all, the whole text if it looks like code.
"""

from __future__ import annotations

import re

from ptxgym.languages.base import MAX_ACTION_CHARS, Extraction, SourceRules, extract_fenced

__all__ = ["MAX_ACTION_CHARS", "extract_source"]

_RULES = SourceRules(
    fence="cuda",
    tags=frozenset({"cuda", "cu", "cpp", "c++", "cxx", "cc", "c", "h", "hpp", "cuh"}),
    hint=re.compile(r'extern\s+"C"|__global__|#\s*include|asm\s*(volatile\s*)?\('),
    text="CUDA source",
    holding="CUDA source",
    content="the kernel",
    complete="the complete kernel source",
)


def extract_source(action: str) -> Extraction:
    """Take the candidate source out of an action. Raises ``TypeError`` for a non-string."""
    return extract_fenced(action, _RULES)
