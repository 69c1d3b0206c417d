"""The expert CUDA kernels of examples/manifest.yaml and the drafts of
examples/expert/drafts/manifest.yaml: for the CPU build tests, the GPU test and
benchmarks/experts.py."""

from __future__ import annotations

from typing import Any

import yaml

from ptxgym import paths

ENTRIES: list[dict[str, Any]] = [
    entry
    for entry in yaml.safe_load((paths.examples_dir() / "manifest.yaml").read_text())["examples"]
    # CUDA's: the Triton examples have their own tests (tests/gpu/test_triton.py).
    if entry["kind"] == "expert" and entry.get("language", "cuda") == "cuda"
]


def families_of(entry: dict[str, Any]) -> dict[str, bool]:
    """The manifest's ``families`` of an expert kernel as the profile reports them (both when
    the entry names none)."""
    named = entry.get("families", ["compute", "data_movement"])
    return {family: family in named for family in ("compute", "data_movement")}


# (file, task id, the families it executes), one per task an expert kernel solves.
EXPERTS = [
    (entry["file"], task_id, families_of(entry)) for entry in ENTRIES for task_id in entry["tasks"]
]

DRAFTS = paths.examples_dir() / "expert" / "drafts"
DRAFTS_MANIFEST: dict[str, Any] = yaml.safe_load((DRAFTS / "manifest.yaml").read_text())
# (file in DRAFTS, task id) of each draft.
DRAFT_TASKS = [(entry["file"], entry["task"]) for entry in DRAFTS_MANIFEST["drafts"]]
