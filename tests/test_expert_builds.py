"""Every expert CUDA kernel of examples/manifest.yaml builds for its task with no spills and holds
the target instructions it executes on the GPU (tests/gpu/test_expert_examples.py) in its SASS,
with no inline PTX of its own (only the pack's wrappers, which a model is given too); and the CPU
model of the MHA forward kernels' shared-memory descriptors still agrees with them."""

from __future__ import annotations

import re
import runpy

import pytest
from expert_examples import ENTRIES, EXPERTS

from ptxgym import paths
from ptxgym.evaluate.build_step import build_candidate
from ptxgym.tasks import get_task


def test_every_expert_kernel_file_is_in_the_manifest() -> None:
    on_disk = {f"expert/{path.name}" for path in (paths.examples_dir() / "expert").glob("*.cu")}
    assert on_disk == {entry["file"] for entry in ENTRIES}


# An asm statement, once comments are gone (a comment may quote the PTX a wrapper issues).
_ASM_STATEMENT = re.compile(r"\b(?:asm|__asm__)\s*(?:volatile\s*|__volatile__\s*)?\(")
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)


@pytest.mark.parametrize("example", sorted({entry["file"] for entry in ENTRIES}))
def test_an_expert_kernel_issues_ptx_only_through_the_packs_wrappers(example: str) -> None:
    # The experts prove the tasks solvable with the pack: a wrapper one needs goes into the pack
    # (with its GPU check in tests/gpu/pack_h100_wrappers.cu), not into the kernel alone.
    code = _COMMENT.sub("", (paths.examples_dir() / example).read_text())
    found = [match.group(0) for match in _ASM_STATEMENT.finditer(code)]
    assert not found, f"{example} has inline PTX of its own: {found}"


@pytest.mark.nvcc
@pytest.mark.parametrize(("example", "task_id", "families"), EXPERTS)
def test_an_expert_kernel_builds_without_spills_and_holds_its_target_instructions(
    example: str, task_id: str, families: dict[str, bool]
) -> None:
    source = (paths.examples_dir() / example).read_text()
    stopped, build = build_candidate(get_task(task_id), source, 300.0)
    assert stopped is None and build is not None, stopped and stopped.message
    assert build.kernels and all(
        k.spill_store_bytes == 0 and k.spill_load_bytes == 0 and k.stack_bytes == 0
        for k in build.kernels
    )
    assert build.sass is not None and build.sass.families_present == families


def test_the_descriptor_model_still_agrees_with_the_mha_kernels() -> None:
    # Every element wgmma reads is the intended one for d128, d64 and d96 (all three H200-verified
    # since), and three wrong descriptors are caught: main() returns 0 only then.
    model = runpy.run_path(str(paths.examples_dir() / "expert" / "desc_check.py"))
    assert model["main"]() == 0
