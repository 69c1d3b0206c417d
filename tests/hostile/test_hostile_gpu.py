"""Hostile candidates on the GPU: each is stopped, and the next, honest step is unaffected.

Runs on an sm_90 host (``pytest -m gpu``). Every ``stage: gpu`` kernel of the catalogue, and
every ``stage: cpu`` kernel that today's static checks let through (``defended: no``: those
reach the GPU), is stepped through one env; right after each, the naive example GEMM is stepped
on the same env and must still reach PASSED with the speedup of the first correct step (±5 %).

An attack counts as stopped when env.step returns (does not raise), its status is one of
``expect``, a PASSED comes with an honest speedup (at most ``max_speedup``), the secret file's
token is nowhere in what the step returns, the canary file was not written, and the feedback
stays short. Attacks marked ``defended: no (issue 8)`` are expected not to be stopped yet
(``xfail``, not strict: XPASS tells us one became defended). The timing protocol is shortened
as in tests/gpu/test_gpu_evaluation.py; the correctness protocol is not.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from catalogue import Attack, Secret, load_all, make_secret
from gemm_candidates import GEMM, NAIVE_GEMM

from ptxgym import paths
from ptxgym.env import PTXKernelEnv
from ptxgym.evaluate.judge_settings import JudgeSettings
from ptxgym.evaluate.local_gpu import LocalGPUEvaluator, incompatibility
from ptxgym.outcome import Status

pytestmark = pytest.mark.gpu

# Neither memcheck (tests/gpu/test_gpu_sanitizer.py) nor the profile: these tests are about the
# evaluation's defences, and 2 steps per attack are slow enough already.
SETTINGS = JudgeSettings(
    stage_timeout_s=20.0, warmup=2, iters=5, trials=3, memcheck=False, profile=False
)
MAX_FEEDBACK_CHARS = 20_000
SPEEDUP_TOLERANCE = 0.05

ATTACKS = [a for a in load_all() if a.stage == "gpu" or not a.defended]


@dataclass
class Run:
    """What stepping one attack, then the honest kernel, returned."""

    info: dict[str, Any] | None
    raised: str | None
    canary_written: bool
    after: dict[str, Any]


@dataclass
class Bench:
    env: PTXKernelEnv
    secret: Secret
    canaries: Path
    honest_speedups: list[float]  # three honest steps before any attack
    files_before: dict[str, tuple[int, int]]
    runs: dict[str, Run] = field(default_factory=dict)


def snapshot() -> dict[str, tuple[int, int]]:
    """Size and modification time of every file a candidate has no business touching: the
    repository and ptxgym's cache (its build cache, judge sockets and baselines aside,
    which the evaluation itself writes), and the top level of the home folder."""
    repository = Path(__file__).resolve().parents[2]
    cache = paths.cache_dir()
    # Written by the evaluation and the test run themselves: build cache, judge sockets,
    # and the GPU host script's output folder.
    skipped = {".git", "__pycache__", ".pytest_cache", "builds", "judges", ".venv", "out"}
    files: dict[str, tuple[int, int]] = {}
    for root in (repository, cache):
        if not root.is_dir():
            continue
        for path in root.rglob("*"):
            if skipped & set(path.relative_to(root).parts) or not path.is_file():
                continue
            if path.name == "baselines.json" or "canar" in str(path):
                continue
            stat = path.stat()
            files[str(path)] = (stat.st_size, stat.st_mtime_ns)
    for path in Path.home().glob("*"):
        if path.is_file():
            stat = path.stat()
            files[str(path)] = (stat.st_size, stat.st_mtime_ns)
    return files


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    reason = incompatibility(GEMM)
    if reason is not None:
        pytest.skip(reason)
    env = PTXKernelEnv(
        "PTX-H100-GEMM",
        turns=100_000,
        history="feedback-only",
        evaluator=LocalGPUEvaluator(settings=SETTINGS),
    )
    env.reset(seed=0)
    # The honest kernel's reference speed: the median of three steps, so that one step disturbed
    # by something outside the protocol cannot fail every "next step" check below.
    honest = [env.step(NAIVE_GEMM)[4] for _ in range(3)]
    for info in honest:
        assert info["status"] == "PASSED", info["feedback"]
    # Canaries go where a worker must never write: ptxgym's own cache folder (a test-private
    # one, see tests/conftest.py).
    canaries = paths.cache_dir() / "hostile-canaries"
    canaries.mkdir(parents=True, exist_ok=True)
    yield Bench(
        env=env,
        secret=make_secret(tmp_path_factory.mktemp("hostile-secret")),
        canaries=canaries,
        honest_speedups=[float(i["outcome"]["speedup"]) for i in honest],
        files_before=snapshot(),
    )
    env.close()


def run_attack(bench: Bench, attack: Attack) -> Run:
    """Step the attack, then the honest kernel; once per attack, shared by the tests below."""
    if attack.name in bench.runs:
        return bench.runs[attack.name]
    canary = bench.canaries / f"{attack.name}.canary"
    canary.unlink(missing_ok=True)
    info: dict[str, Any] | None = None
    raised: str | None = None
    try:
        info = bench.env.step(attack.render(bench.secret.path, canary))[4]
    except Exception as exc:  # a step must report a status, never raise: recorded as a failure
        raised = f"{type(exc).__name__}: {exc}"
    # A forked child may write the canary a moment after the step; the honest step takes
    # seconds, so look after it.
    after = bench.env.step(NAIVE_GEMM)[4]
    canary_written = canary.exists()
    canary.unlink(missing_ok=True)
    run = Run(info, raised, canary_written, after)
    bench.runs[attack.name] = run
    return run


def problems(attack: Attack, run: Run, secret: Secret) -> list[str]:
    """Why the attack was not stopped; empty when it was."""
    if run.info is None:
        return [f"env.step raised instead of reporting a status: {run.raised}"]
    info = run.info
    found = []
    status = Status(info["status"])
    if status not in attack.expect:
        expected = " | ".join(sorted(s.value for s in attack.expect))
        found.append(f"status {status.value}, expected {expected}")
    speedup = info["outcome"]["speedup"]
    if status is Status.PASSED and status in attack.expect:
        limit = attack.max_speedup if attack.max_speedup is not None else 0.0
        if speedup is None or speedup > limit:
            found.append(f"PASSED with speedup {speedup}; an honest run is at most {limit}")
    shown = json.dumps(info["outcome"], default=str) + info["feedback"] + info["message"]
    if secret.token in shown:
        found.append("the secret file's content came back in the step's outcome or feedback")
    if run.canary_written:
        found.append("the canary file was written: the escape worked")
    if len(info["feedback"]) > MAX_FEEDBACK_CHARS:
        found.append(f"the feedback is {len(info['feedback']):,} characters long")
    return found


def _summary(run: Run) -> str:
    if run.info is None:
        return f"raised: {run.raised}"
    return run.info["feedback"][:3000]


def _attack_param(attack: Attack) -> object:
    marks = []
    if not attack.defended:
        marks.append(pytest.mark.xfail(reason=f"not defended yet: {attack.attack}", strict=False))
    return pytest.param(attack, id=attack.name, marks=marks)


@pytest.mark.parametrize("attack", [_attack_param(a) for a in ATTACKS])
def test_attack_is_stopped(bench: Bench, attack: Attack) -> None:
    run = run_attack(bench, attack)
    found = problems(attack, run, bench.secret)
    assert not found, f"{attack.name}: " + "; ".join(found) + "\n" + _summary(run)


@pytest.mark.parametrize("attack", [pytest.param(a, id=a.name) for a in ATTACKS])
def test_the_next_step_is_unaffected(bench: Bench, attack: Attack) -> None:
    after = run_attack(bench, attack).after
    assert after["status"] == "PASSED", after["feedback"]
    # The honest steps after every attack so far show a drift (the GPU's clock over minutes of
    # load) apart from one disturbed step.
    so_far = [
        run.after["outcome"]["speedup"]
        for run in bench.runs.values()
        if run.after.get("outcome", {}).get("speedup") is not None
    ]
    assert after["outcome"]["speedup"] == pytest.approx(
        statistics.median(bench.honest_speedups), rel=SPEEDUP_TOLERANCE
    ), (
        f"after {attack.name}: {after['feedback']}\nhonest speedups before the attacks: "
        f"{bench.honest_speedups}; after each attack so far, in order: {so_far}"
    )


def test_no_file_outside_the_workers_folders_changed(bench: Bench) -> None:
    for attack in ATTACKS:
        run_attack(bench, attack)
    after = snapshot()
    changed = sorted(
        path
        for path in set(bench.files_before) | set(after)
        if bench.files_before.get(path) != after.get(path)
    )
    assert not changed, f"files changed during the hostile runs: {changed[:20]}"
