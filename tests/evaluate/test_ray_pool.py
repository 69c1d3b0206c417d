"""The Ray pool evaluator on a real local Ray cluster, with compile-only judges (CPU only): many
envs at once through one pool, a judge killed mid-run, dispatch by GPU generation, candidate
failures as outcomes, the evaluator's own failures as exceptions, and the CLI's served pool
(``ptxgym.evaluate.ray_served``, over the connection of ``ptxgym.evaluate.ray_connection``).

Builds are real nvcc builds; the sources differ by a comment only where a fresh build is
wanted, so that the on-disk cache answers the rest quickly.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import pytest

from ptxgym import paths
from ptxgym.cli import main
from ptxgym.evaluate import ray_connection, ray_pool, ray_served
from ptxgym.evaluate.errors import EvaluatorError
from ptxgym.evaluate.evaluator import make_evaluator
from ptxgym.evaluate.ray_actors import PoolSpec, generation
from ptxgym.evaluate.ray_pool import NoJudgeError, RayEvaluator
from ptxgym.evaluate.ray_served import parse_spec
from ptxgym.outcome import Outcome, Status
from ptxgym.tasks import get_task

ray = pytest.importorskip("ray", reason="needs Ray: pip install 'ptxgym[ray]'")

pytestmark = pytest.mark.nvcc

GEMM_FILE = paths.examples_dir() / "naive" / "gemm.cu"
GEMM = GEMM_FILE.read_text(encoding="utf-8")
H100_GEMM = get_task("PTX-H100-GEMM")


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    """One local Ray cluster for the module. Its CPUs are logical: more than the machine's
    cores, so that every pool of the module fits at once (nvcc's builds are what load them)."""
    ray.init(num_cpus=8, include_dashboard=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def pool(cluster: None) -> Iterator[RayEvaluator]:
    """A small compile-only pool serving sm_90, shared by the tests that do not kill anything."""
    evaluator = RayEvaluator(
        judge="compile-only", arches=("sm_90",), builders=1, builds_per_builder=1
    )
    yield evaluator
    evaluator.close()


def test_64_steps_of_8_envs_are_each_answered_once_though_a_judge_is_killed(
    cluster: None,
) -> None:
    evaluator = RayEvaluator(
        judge="compile-only",
        arches=("sm_90", "sm_90"),
        builders=1,
        builds_per_builder=2,
        max_in_flight=2,
    )
    # Four distinct sources: four real builds, then cache hits.
    sources = [f"// variant {index}\n{GEMM}" for index in range(4)]
    envs = [gym.make("PTX-H100-GEMM", evaluator=evaluator) for _ in range(8)]
    statuses: list[str] = []
    recorded = threading.Lock()
    killed: list[str] = []

    def play(index: int) -> None:
        env = envs[index]
        env.reset(seed=index)
        for turn in range(8):
            *_, info = env.step(sources[(index + turn) % len(sources)])
            with recorded:
                statuses.append(info["status"])

    def kill_a_busy_judge() -> None:
        # Once the run is under way, the first judge seen holding a request (or, failing that
        # within a few seconds, the first judge) is killed.
        deadline = time.monotonic() + 120
        while evaluator.stats().answered < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
        busy_until = time.monotonic() + 5
        target = evaluator.members()[0]
        while time.monotonic() < busy_until:
            loads = evaluator.stats().judges
            busy = [i for i, load in enumerate(loads) if load.in_flight > 0]
            if busy:
                target = evaluator.members()[busy[0]]
                break
            time.sleep(0.002)
        ray.kill(target.handle)
        killed.append(target.describe())

    players = [threading.Thread(target=play, args=(index,)) for index in range(8)]
    killer = threading.Thread(target=kill_a_busy_judge)
    try:
        for thread in [*players, killer]:
            thread.start()
        for thread in [*players, killer]:
            thread.join(timeout=600)
        # The replacement starts in the background; the other judge may have served the rest.
        deadline = time.monotonic() + 120
        while evaluator.stats().replaced < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = evaluator.stats()
    finally:
        for env in envs:
            env.close()
        evaluator.close()
    assert killed, "no judge was killed"
    assert len(statuses) == 64 and set(statuses) == {"COMPILED"}, statuses
    assert stats.submitted == stats.answered == stats.settled == 64
    assert stats.failed == stats.cancelled == stats.duplicate_answers == 0
    assert stats.actor_deaths == 1 and stats.replaced == 1 and stats.retried >= 1
    # Backpressure: no judge ever held more than its cap, however many requests waited.
    assert all(load.peak_in_flight <= 2 for load in stats.judges)
    assert sum(load.requests for load in stats.judges) == 64 + stats.retried
    assert all(load.alive for load in stats.judges)


def test_a_task_no_judge_serves_is_refused_at_once(pool: RayEvaluator) -> None:
    b200 = get_task("PTX-B200-GEMM")
    started = time.monotonic()
    with pytest.raises(
        NoJudgeError, match=r"needs an sm_100 judge; this pool's judges serve sm_90"
    ):
        pool.evaluate(b200, GEMM)
    future = pool.submit(b200, GEMM)
    assert future.done() and isinstance(future.exception(), NoJudgeError)
    env = gym.make("PTX-B200-GEMM", evaluator=pool)
    env.reset()
    with pytest.raises(NoJudgeError):
        env.step(GEMM)
    assert time.monotonic() - started < 5


def test_candidate_failures_come_back_as_outcomes(pool: RayEvaluator) -> None:
    broken = f"// broken {time.time_ns()}\n" + GEMM.replace("return", "retrun", 1)
    outcome = pool.evaluate(H100_GEMM, broken)
    assert outcome.status is Status.COMPILE_ERROR
    assert outcome.compile is not None and "candidate.cu(" in outcome.compile.log
    forbidden = "#include <cublas_v2.h>\n" + GEMM
    assert pool.evaluate(H100_GEMM, forbidden).status is Status.POLICY_VIOLATION
    compiled = pool.evaluate(H100_GEMM, GEMM)
    assert compiled.status is Status.COMPILED and compiled.evaluator == "compile-only"
    assert compiled.compile is not None and compiled.compile.ok
    assert "pool_wait" in compiled.stage_seconds
    assert pool.stats().duplicate_answers == 0


def test_evaluate_async_awaits_the_pool(pool: RayEvaluator) -> None:
    async def both() -> list[Outcome]:
        return await asyncio.gather(*(pool.evaluate_async(H100_GEMM, GEMM) for _ in range(2)))

    assert [outcome.status for outcome in asyncio.run(both())] == [Status.COMPILED] * 2


def test_an_exception_inside_an_actor_is_the_evaluators_failure_not_a_death(
    pool: RayEvaluator,
) -> None:
    # A task the builder cannot read (no entry point): its code raises inside the actor.
    unreadable = H100_GEMM.model_copy(update={"entry_point": None})
    before = pool.stats()
    with pytest.raises(EvaluatorError, match=r"builder .* failed: AttributeError"):
        pool.evaluate(unreadable, GEMM)
    after = pool.stats()
    assert after.actor_deaths == before.actor_deaths and after.retried == before.retried
    assert after.failed == before.failed + 1
    # The builder lives on.
    assert pool.evaluate(H100_GEMM, GEMM).status is Status.COMPILED


def test_the_cli_serves_a_named_pool_that_run_reaches(
    cluster: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = "test-cli-pool"
    shape = ["--judge", "compile-only", "--arch", "sm_90", "--builders", "1"]
    assert main(["serve", "--name", name, *shape, "--builds-per-builder", "1"]) == 0
    try:
        served = capsys.readouterr().out
        assert "judge 0 on" in served and "serving sm_90" in served
        assert f"ray://auto/{name}" in served
        assert main(["serve", "--name", name, *shape]) == 2  # one pool per name
        assert "already runs" in capsys.readouterr().err
        out = tmp_path / "run.jsonl"
        arguments = ["run", "--tasks", "PTX-H100-GEMM", "--variants", "0", "--turns", "2"]
        arguments += ["--files", str(GEMM_FILE), "--out", str(out), "--no-progress"]
        assert main([*arguments, "--evaluator", f"ray://auto/{name}"]) == 0
        records = [json.loads(line) for line in out.read_text().splitlines()]
        assert [record["status"] for record in records] == ["COMPILED", "COMPILED"]
        # gym.make takes the same spec; the env's client leaves the served pool running.
        env = gym.make("PTX-H100-GEMM", evaluator=f"ray://auto/{name}")
        env.reset()
        assert env.step(GEMM)[-1]["status"] == "COMPILED"
        env.close()
        assert main(["serve", "--status", "--name", name]) == 0
        assert "builder 1 on" in capsys.readouterr().out
    finally:
        assert main(["serve", "--stop", "--name", name]) == 0
    assert main(["serve", "--status", "--name", name]) == 2
    assert f"no pool named {name!r}" in capsys.readouterr().err


def test_evaluator_specs_parse_and_bad_ones_are_refused() -> None:
    assert parse_spec("ray://10.0.0.5:10001") == ("ray://10.0.0.5:10001", "ptxgym")
    assert parse_spec("ray://auto/mine") == ("auto", "mine")
    for bad in ("ray://", "ray:/auto", "gpu2"):
        with pytest.raises(ValueError):
            make_evaluator(bad, H100_GEMM)
    assert generation("sm_90a") == generation("sm_90") == "sm_90"
    with pytest.raises(ValueError, match="not a GPU architecture"):
        PoolSpec(judge="compile-only", arches=("hopper",))
    with pytest.raises(ValueError, match="give pool, or the shape"):
        RayEvaluator(pool="ptxgym", judge="compile-only")


def test_ray_pool_still_gives_the_names_of_connecting_and_serving() -> None:
    # They moved to modules of their own; ``ptxgym serve``, the docs and users import them
    # from ray_pool as before, and must get the very same objects.
    moved = {
        "import_ray": ray_connection,
        "connected": ray_connection,
        "NAMESPACE": ray_served,
        "DEFAULT_POOL": ray_served,
        "DEFAULT_ARCHES": ray_served,
        "parse_spec": ray_served,
        "plan_pool": ray_served,
        "serve_pool": ray_served,
        "pool_members": ray_served,
        "stop_pool": ray_served,
    }
    for name, home in moved.items():
        assert name in ray_pool.__all__ and getattr(ray_pool, name) is getattr(home, name), name
    assert all(hasattr(ray_pool, name) for name in ray_pool.__all__)


def test_ray_is_imported_only_for_a_ray_evaluator_and_its_absence_is_explained() -> None:
    script = (
        "import sys\n"
        "import ptxgym.cli, ptxgym.evaluate.ray_pool as ray_pool, ptxgym.integrations.verl\n"
        "assert 'ray' not in sys.modules, 'imported without need'\n"
        "sys.modules['ray'] = None  # as if it were not installed\n"
        "try:\n"
        "    ray_pool.RayEvaluator(judge='compile-only')\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "pip install 'ptxgym[ray]'" in result.stdout


@pytest.mark.gpu
def test_a_gpu_judge_runs_checks_and_times_like_the_local_evaluator(cluster: None) -> None:
    from ptxgym.evaluate.judge_settings import JudgeSettings
    from ptxgym.evaluate.local_gpu import incompatibility

    if reason := incompatibility(H100_GEMM):
        pytest.skip(reason)
    evaluator = RayEvaluator(gpus=1, settings=JudgeSettings(memcheck=False, profile=False))
    try:
        (judge,) = [member for member in evaluator.members() if member.role == "judge"]
        assert judge.arch == "sm_90" and judge.placement.device != "cpu"
        outcome = evaluator.evaluate(H100_GEMM, f"// gpu {time.time_ns()}\n{GEMM}")
        again = evaluator.evaluate(H100_GEMM, GEMM)
    finally:
        evaluator.close()
    for result in (outcome, again):
        assert result.status is Status.PASSED and result.evaluator == "gpu", result.message
        assert result.latency_ms and result.baseline_latency_ms and result.speedup
        # The record names the build where the builder made it, not the judge's scratch copy.
        assert result.compile is not None and result.compile.library is not None
        assert "ray-judge" not in result.compile.library
