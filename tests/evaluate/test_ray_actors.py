"""The Ray pool's actors as plain objects, without Ray: what a builder sends a judge, and what
the judge makes of it on its own node."""

from __future__ import annotations

from pathlib import Path

import pytest

from ptxgym import paths
from ptxgym.build.result import CompileResult
from ptxgym.build.sass import LISTING_FILE
from ptxgym.evaluate.ray_actors import Builder, Built, Judge
from ptxgym.outcome import Outcome, Status
from ptxgym.tasks import Task, get_task

GEMM = get_task("PTX-H100-GEMM")


class _ListingWitness:
    """Stands in for the judge's GPU evaluator: records what lies beside the library it is
    given (the count joins its counts with the listing found there)."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}

    def evaluate_build(self, task: Task, build: CompileResult, compile_seconds: float) -> Outcome:
        library = Path(build.library or "")
        beside = [path for path in library.parent.iterdir() if path != library]
        self.seen = {path.name: path.read_text(errors="replace") for path in beside}
        return Outcome(task.id, Status.PASSED, "witnessed", "gpu", compile=build)


@pytest.fixture
def built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Built, bytes]:
    monkeypatch.setenv("PTXGYM_CACHE", str(tmp_path))
    source = (paths.examples_dir() / "expert" / "gemm.cu").read_text()
    return Builder(compile_timeout_s=300).build(GEMM, source)


def test_the_builder_sends_the_builds_sass_listing(built: tuple[Built, bytes]) -> None:
    answer, library = built
    assert library.startswith(b"\x7fELF")
    assert "HGMMA" in answer.listing  # the expert GEMM's wgmma, as the count will join it


def test_the_judge_keeps_the_listing_beside_the_library_and_removes_both(
    built: tuple[Built, bytes],
) -> None:
    answer, library = built
    judge = Judge("compile-only", "sm_90a", None)
    witness = _ListingWitness()
    judge._evaluator = witness  # type: ignore[assignment]
    assert answer.build is not None
    outcome = judge.judge(GEMM, answer.build, library, 1.0, answer.listing)
    assert outcome.status is Status.PASSED
    assert witness.seen == {LISTING_FILE: answer.listing}
    assert outcome.compile == answer.build  # the record names the build where it was made
    assert not any(judge._scratch.iterdir())  # the request's folder is gone
