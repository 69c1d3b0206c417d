"""run_group: deadlines kill the whole group; a flood of output is cut to its head and tail."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from ptxgym.sandbox.processes import HEAD_BYTES, TAIL_BYTES, run_group


def test_long_output_keeps_head_and_tail_only() -> None:
    program = "import sys; sys.stdout.write('BEGIN' + 'x' * 5_000_000 + 'END')"
    code, output = run_group([sys.executable, "-c", program], env=dict(os.environ), timeout_s=30)
    assert code == 0
    assert output.startswith("BEGIN") and output.endswith("END")
    assert "bytes of output omitted" in output
    assert len(output) < HEAD_BYTES + TAIL_BYTES + 100


def test_deadline_kills_the_children_too(tmp_path: Path) -> None:
    # The shell's child would outlive a kill of the shell alone, and leave its mark.
    mark = tmp_path / "survived"
    started = time.perf_counter()
    code, output = run_group(
        ["sh", "-c", f"(sleep 2; touch {mark}) & wait"], env=dict(os.environ), timeout_s=0.5
    )
    assert code is None and output == ""
    assert time.perf_counter() - started < 2
    time.sleep(3)
    assert not mark.exists()
