"""Without cupti-python the judge refuses to start, unless the user asked for host-synchronised
timing; then every timing says so (DESIGN.md: the gpu evaluator never falls back silently).

cupti-python is hidden from a child process by a package of the same name, earlier on its path,
that fails to import: what a host without the wheel sees.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ptxgym.evaluate.local_gpu import incompatibility
from ptxgym.tasks import get_task

pytestmark = pytest.mark.gpu

EVALUATE_BOTH_WAYS = """
import json
from ptxgym import paths
from ptxgym.evaluate.judge_settings import JudgeSettings
from ptxgym.evaluate.local_gpu import LocalGPUEvaluator
from ptxgym.tasks import get_task

task = get_task("PTX-H100-GEMM")
source = (paths.examples_dir() / "naive" / "gemm.cu").read_text()
quick = dict(stage_timeout_s=60.0, warmup=2, iters=5, trials=3, profile=False, memcheck=False)
try:
    LocalGPUEvaluator(settings=JudgeSettings(**quick)).evaluate(task, source)
    refusal = ""
except Exception as exc:
    refusal = f"{type(exc).__name__}: {exc}"
asked = LocalGPUEvaluator(settings=JudgeSettings(timing_method="host-sync", **quick))
outcome = asked.evaluate(task, source).to_dict()
print(json.dumps({
    "refusal": refusal,
    "status": outcome["status"],
    "methods": sorted({timing["method"] for timing in outcome["timings"]}),
}))
"""


def test_without_cupti_the_judge_refuses_unless_host_sync_was_asked_for(tmp_path: Path) -> None:
    reason = incompatibility(get_task("PTX-H100-GEMM"))
    if reason is not None:
        pytest.skip(reason)
    shadow = tmp_path / "shadow" / "cupti"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("cupti-python hidden by the test")\n')
    path = os.pathsep.join(filter(None, [str(shadow.parent), os.environ.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", EVALUATE_BOTH_WAYS],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=480,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert "CUPTI cannot time on this host" in answer["refusal"], answer
    assert "timing_method='host-sync'" in answer["refusal"], answer
    assert answer["status"] == "PASSED", answer
    assert answer["methods"] == ["host-sync"], answer
