"""Action languages: what the agent writes its kernel in.

Each language is a subpackage that provides one :class:`ActionLanguage` object, named here by a
string entry point (``"module:attribute"``) and imported only when asked for, so a language's
toolchain is loaded by the processes that use it and no others.
"""

from __future__ import annotations

import importlib
from functools import cache

from ptxgym.languages.base import (
    MAX_ACTION_CHARS,
    ActionLanguage,
    Extraction,
    LanguageSections,
    PolicyReport,
    read_action,
)

LANGUAGES: dict[str, str] = {
    "cuda": "ptxgym.languages.cuda:CUDA",
    "triton": "ptxgym.languages.triton:TRITON",
}
DEFAULT_LANGUAGE = "cuda"


@cache
def get_language(name: str = DEFAULT_LANGUAGE) -> ActionLanguage:
    """The action language called ``name``; a clear ``ValueError`` for one that does not exist."""
    if name not in LANGUAGES:
        raise ValueError(f"unknown action language {name!r}; available: {', '.join(LANGUAGES)}")
    module, attribute = LANGUAGES[name].split(":")
    language: ActionLanguage = getattr(importlib.import_module(module), attribute)
    return language


__all__ = [
    "DEFAULT_LANGUAGE",
    "LANGUAGES",
    "MAX_ACTION_CHARS",
    "ActionLanguage",
    "Extraction",
    "LanguageSections",
    "PolicyReport",
    "get_language",
    "read_action",
]
