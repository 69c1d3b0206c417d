"""The expert kernel drafts (examples/expert/drafts/, issue 27) keep building while they wait for
their first GPU run: each passes the policy and builds for its task with no spills and its target
instructions in its SASS, and their desk checks (CPU models of their schedules, masks, barriers
and shared-memory descriptors) still pass."""

from __future__ import annotations

import subprocess
import sys

import pytest
from expert_examples import DRAFT_TASKS, DRAFTS, DRAFTS_MANIFEST

from ptxgym.evaluate.build_step import build_candidate
from ptxgym.tasks import get_task

TASKS = dict(DRAFT_TASKS)
DESK_CHECKS = list(DRAFTS_MANIFEST["checks"])
HELPERS = list(DRAFTS_MANIFEST["helpers"])  # modules the checks import; not run on their own


def test_the_drafts_manifest_names_every_draft_and_every_check() -> None:
    assert {path.name for path in DRAFTS.glob("*.cu")} == set(TASKS)
    assert {path.name for path in DRAFTS.glob("*.py")} == set(DESK_CHECKS) | set(HELPERS)
    assert not set(DESK_CHECKS) & set(HELPERS)


@pytest.mark.nvcc
@pytest.mark.parametrize(("draft", "task_id"), TASKS.items())
def test_a_draft_builds_without_spills_and_holds_wgmma_and_tma(draft: str, task_id: str) -> None:
    stopped, build = build_candidate(get_task(task_id), (DRAFTS / draft).read_text(), 300.0)
    assert stopped is None and build is not None, stopped and stopped.message
    assert build.kernels and all(
        k.spill_store_bytes == 0 and k.spill_load_bytes == 0 and k.stack_bytes == 0
        for k in build.kernels
    )
    assert build.sass is not None
    assert build.sass.families_present == {"compute": True, "data_movement": True}


@pytest.mark.parametrize("script", DESK_CHECKS)
def test_a_desk_check_passes(script: str) -> None:
    # Each script asserts its checks and exits non-zero on the first that fails.
    done = subprocess.run(
        [sys.executable, str(DRAFTS / script)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
