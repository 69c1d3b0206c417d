"""Action text → candidate source.

The action is a CUDA source or a model reply that holds one. From a reply the last fenced block
tagged as CUDA or C/C++ is taken (models often show a draft before the final version); with no
tagged block, the last untagged block; with no fence at all, the whole text if it looks like code.
"""

from __future__ import annotations

import re

from ptxgym.languages.base import MAX_ACTION_CHARS, Extraction

_CODE_TAGS = {"cuda", "cu", "cpp", "c++", "cxx", "cc", "c", "h", "hpp", "cuh"}
# A fence opens a line with three or more backticks, then an optional info string whose first
# word is the tag; it closes with a line of at least as many backticks and nothing else. Lines
# are matched one at a time, each pattern without backtracking, so finding fences is linear.
_FENCE_OPEN_RE = re.compile(r"[ \t]*(`{3,})[ \t]*([^\s`]*)")
_FENCE_CLOSE_RE = re.compile(r"[ \t]*(`{3,})[ \t]*")
_CODE_HINT_RE = re.compile(r'extern\s+"C"|__global__|#\s*include|asm\s*(volatile\s*)?\(')
_BAD_CONTROL_RE = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")


def extract_source(action: str) -> Extraction:
    """Take the candidate source out of an action. Raises ``TypeError`` for a non-string."""
    if not isinstance(action, str):
        raise TypeError(
            f"the action must be a str holding CUDA source or a model reply, "
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
            f"character {match.start()}); send CUDA source text",
        )
    if not action.strip():
        return Extraction(None, "the action is empty; send one ```cuda block with the kernel")

    blocks = _fenced_blocks(action)
    if blocks:
        tagged = [code for tag, code in blocks if tag in _CODE_TAGS]
        untagged = [code for tag, code in blocks if not tag]
        chosen = tagged or untagged
        if not chosen:
            tags = sorted({tag for tag, _ in blocks})
            return Extraction(
                None, f"no ```cuda block found (the reply's code blocks are tagged {tags})"
            )
        source = chosen[-1]
    elif _CODE_HINT_RE.search(action):
        source = action
    else:
        return Extraction(
            None, "no code found: put the complete kernel source in one ```cuda block"
        )
    if not source.strip():
        return Extraction(None, "the last ```cuda block is empty")
    return Extraction(source)


def _fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(lowercased tag, content) of each fenced block; an unclosed last block runs to the end.

    An opening line must end with a newline; a block's content runs from the line after its
    opening to the start of its closing line."""
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
