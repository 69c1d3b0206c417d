"""The expert kernel drafts (examples/expert/drafts/, issue 27) keep building while they wait for
their first GPU run: each passes the policy and builds for its task with no spills, its target
instructions in its SASS, and the CPU model of their shared-memory descriptors still agrees with
them."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from ptxgym.evaluate.build_step import build_candidate
from ptxgym.tasks import get_task

DRAFTS = Path(__file__).resolve().parents[1] / "examples" / "expert" / "drafts"
TASKS = {
    "gemm_cluster.cu": "PTX-H100-GEMM",
    "mha_fwd_causal_d128.cu": "PTX-H100-MHAFwdCausal-d128",
    "mha_fwd_d64.cu": "PTX-H100-MHAFwd-d64",
    "mha_fwd_d96.cu": "PTX-H100-MHAFwd-d96",
    "gqa_decode.cu": "PTX-H100-GQADecode",
}
# The instruction families each draft's SASS must hold: wgmma and TMA, except the memory-bound
# decode kernel, which qualifies through its bulk copies (UBLKCP) and has no matrix instruction.
FAMILIES = {draft: {"compute": True, "data_movement": True} for draft in TASKS}
FAMILIES["gqa_decode.cu"] = {"compute": False, "data_movement": True}


def test_every_draft_names_its_task() -> None:
    assert {path.name for path in DRAFTS.glob("*.cu")} == set(TASKS)


@pytest.mark.nvcc
@pytest.mark.parametrize(("draft", "task_id"), TASKS.items())
def test_a_draft_builds_without_spills_and_holds_its_target_instructions(
    draft: str, task_id: str
) -> None:
    stopped, build = build_candidate(get_task(task_id), (DRAFTS / draft).read_text(), 300.0)
    assert stopped is None and build is not None, stopped and stopped.message
    assert build.kernels and all(
        k.spill_store_bytes == 0 and k.spill_load_bytes == 0 and k.stack_bytes == 0
        for k in build.kernels
    )
    assert build.sass is not None and build.sass.families_present == FAMILIES[draft]


def test_the_descriptor_model_still_agrees_with_the_drafts() -> None:
    # Every element wgmma reads is the intended one for d128 (GPU-verified), d64 and d96, and
    # three wrong descriptors are caught: main() returns 0 only then.
    model = runpy.run_path(str(DRAFTS / "desc_check.py"))
    assert model["main"]() == 0
