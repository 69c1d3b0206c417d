"""Action text → candidate module.

The action is a Python module or a model reply that holds one. From a reply the last fenced block
tagged as Python (or Triton) is taken (models often show a draft before the final version); with no
tagged block, the last untagged block; with no fence at all, the whole text if it looks like a
Triton module.
"""

from __future__ import annotations

import re

from ptxgym.languages.base import Extraction, SourceRules, extract_fenced

_RULES = SourceRules(
    fence="python",
    tags=frozenset({"python", "py", "python3", "triton"}),
    hint=re.compile(r"^\s*(?:import\s+triton\b|from\s+triton\b|@triton\.jit\b)", re.MULTILINE),
    text="Python source",
    holding="a Triton module",
    content="the module",
    complete="the complete Triton module",
)


def extract_source(action: str) -> Extraction:
    """Take the candidate module out of an action. Raises ``TypeError`` for a non-string."""
    return extract_fenced(action, _RULES)
