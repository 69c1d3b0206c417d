"""A private judge starts as a program of its own, never by running the user's script again.

multiprocessing's ``spawn`` imports the parent's main script in the child: a script without an
``if __name__ == "__main__":`` guard (an RL script, the README's snippet) then starts a judge
inside the judge's own start-up, which fails ("bootstrapping phase"), and every later step with
it. Here a plain script, no guard, starts a private judge (a stand-in that needs no GPU), asks it
once, and must run its body exactly once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

_STAND_IN = """
from ptxgym.evaluate.judge_settings import JudgeSettings
from ptxgym.evaluate.verdict import Verdict
from ptxgym.outcome import Status


class StandInJudge:
    def __init__(self, device: int, settings: JudgeSettings) -> None:
        self.device_info = {"name": "stand-in"}

    def evaluate(self, task, library, language="cuda"):
        return Verdict(Status.PASSED, f"{task.id}: {library}")

    def baseline_ms(self, task):
        return {}

    def close(self) -> None:
        pass
"""

_SCRIPT = """
import os
from pathlib import Path
from ptxgym.evaluate.local_gpu import _JudgeHandle
from ptxgym.evaluate.judge_settings import JudgeSettings
from ptxgym.tasks import get_task

with Path(__file__).with_suffix(".runs").open("a") as runs:
    runs.write("ran\\n")
handle = _JudgeHandle.local(0, JudgeSettings(concurrency=1), factory="stand_in_judge:StandInJudge")
print(handle.evaluate(get_task("PTX-H100-GEMM"), "lib.so").result(timeout=60).message)
handle.close()
print("exit code", handle.process.returncode)
# Nothing left behind: the judge is reaped, no zombie or other child of this process remains.
print("children", open(f"/proc/self/task/{os.getpid()}/children").read().split())
"""


def test_a_script_without_a_main_guard_starts_a_private_judge(tmp_path: Path) -> None:
    (tmp_path / "stand_in_judge.py").write_text(_STAND_IN)
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_SCRIPT))
    root = Path(__file__).resolve().parents[2]
    path = os.pathsep.join([str(tmp_path), str(root), os.environ.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": path},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["PTX-H100-GEMM: lib.so", "exit code 0", "children []"]
    assert "bootstrapping" not in result.stderr
    # The script's body ran once: in the user's process only, never in the judge's.
    assert script.with_suffix(".runs").read_text() == "ran\n"
