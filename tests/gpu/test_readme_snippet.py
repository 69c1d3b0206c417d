"""The README's usage snippet, verbatim, as a plain script on a GPU host: no
``if __name__ == "__main__":`` guard, as RL scripts and notebooks are written. (On CPU,
tests/test_doc_snippets.py runs every snippet of the docs, this one compile-only.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
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


def test_the_readme_snippet_runs_as_a_plain_script(tmp_path: Path) -> None:
    snippet = _snippet()
    task_id = re.search(r'gym\.make\("([^"]+)"', snippet)
    assert task_id, "the snippet makes no env"
    if reason := incompatibility(get_task(task_id.group(1))):
        pytest.skip(reason)
    script = tmp_path / "snippet.py"
    script.write_text(snippet)
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])},
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "bootstrapping" not in result.stderr
    assert result.stdout.startswith("PASSED"), result.stdout[-2000:]
