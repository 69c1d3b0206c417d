"""Every Python snippet of the README and docs/ runs as written, as a plain script (no
``__main__`` guard added, nothing defined ahead of it), in a fresh folder. On a machine
without a GPU the envs evaluate compile-only, so this needs nvcc; tests/gpu/test_readme_snippet.py
runs the README's on a GPU. docs/benchmarks.md holds records of runs, not snippets."""

from __future__ import annotations

import re
import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# A fence alone on its line, indented or not (snippets inside list items are indented).
_BLOCK_RE = re.compile(r"^([ \t]*)```python\n(.*?)^\1```[ \t]*$", re.DOTALL | re.MULTILINE)


def _snippets() -> list[tuple[str, str]]:
    found = []
    for document in DOCUMENTS:
        if document.name == "benchmarks.md":
            continue
        text = document.read_text(encoding="utf-8")
        for match in _BLOCK_RE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{document.relative_to(ROOT)}:{line}", textwrap.dedent(match.group(2))))
    return found


def test_snippets_are_found() -> None:
    places = [place for place, _ in _snippets()]
    assert any(place.startswith("README.md") for place in places)
    assert len(places) >= 6


@pytest.mark.nvcc
@pytest.mark.parametrize(("place", "code"), _snippets(), ids=[p for p, _ in _snippets()])
def test_snippet_runs_as_a_plain_script(
    place: str, code: str, run_script: Callable[[str], subprocess.CompletedProcess[str]]
) -> None:
    result = run_script(code)
    assert result.returncode == 0, f"{place}:\n{result.stderr[-3000:]}"
