"""Action text → candidate module.

The action is a Python module or a model reply that holds one. From a reply the last fenced block
tagged as Python (or Triton) is taken (models often show a draft before the final version); with no
tagged block, the last untagged block; with no fence at all, the whole text if it looks like a
Triton module.
"""

from __future__ import annotations

import re

from ptxgym.languages.base import MAX_ACTION_CHARS, Extraction, fenced_blocks

_CODE_TAGS = {"python", "py", "python3", "triton"}
_CODE_HINT_RE = re.compile(
    r"^\s*(?:import\s+triton\b|from\s+triton\b|@triton\.jit\b)", re.MULTILINE
)
# Control bytes other than tab, line feed, vertical tab, form feed and carriage return.
_BAD_CONTROL_RE = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")


def extract_source(action: str) -> Extraction:
    """Take the candidate module out of an action. Raises ``TypeError`` for a non-string."""
    if not isinstance(action, str):
        raise TypeError(
            f"the action must be a str holding a Triton module or a model reply, "
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
            f"character {match.start()}); send Python source text",
        )
    if not action.strip():
        return Extraction(None, "the action is empty; send one ```python block with the module")

    blocks = fenced_blocks(action)
    if blocks:
        tagged = [code for tag, code in blocks if tag in _CODE_TAGS]
        untagged = [code for tag, code in blocks if not tag]
        chosen = tagged or untagged
        if not chosen:
            tags = sorted({tag for tag, _ in blocks})
            return Extraction(
                None, f"no ```python block found (the reply's code blocks are tagged {tags})"
            )
        source = chosen[-1]
    elif _CODE_HINT_RE.search(action):
        source = action
    else:
        return Extraction(
            None, "no code found: put the complete Triton module in one ```python block"
        )
    if not source.strip():
        return Extraction(None, "the last ```python block is empty")
    return Extraction(source)
