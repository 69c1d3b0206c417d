"""The README's usage snippet, verbatim, as a plain script on a GPU host: no
``if __name__ == "__main__":`` guard, as RL scripts and notebooks are written. (On CPU,
tests/test_doc_snippets.py runs every snippet of the docs, this one compile-only.)"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from ptxgym.evaluate.local_gpu import incompatibility
from ptxgym.tasks import get_task

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


def _snippet() -> str:
    readme = (ROOT / "README.md").read_text()
    usage = readme.split("## Use", 1)[1]
    # The block ends at a fence on a line of its own (the snippet's comments mention ```cuda).
    found = re.search(r"^```python\n(.*?)^```$", usage, re.DOTALL | re.MULTILINE)
    assert found, "the README's usage section has no python block"
    return found.group(1)


def test_the_readme_snippet_runs_as_a_plain_script(
    run_script: Callable[[str], subprocess.CompletedProcess[str]],
) -> None:
    snippet = _snippet()
    task_id = re.search(r'gym\.make\("([^"]+)"', snippet)
    assert task_id, "the snippet makes no env"
    if reason := incompatibility(get_task(task_id.group(1))):
        pytest.skip(reason)
    result = run_script(snippet)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "bootstrapping" not in result.stderr
    assert result.stdout.startswith("PASSED"), result.stdout[-2000:]
