"""Hostile candidates that the static policy or the build must stop, on a machine without a GPU.

Every ``stage: cpu`` kernel of the catalogue (``catalogue.py`` describes the header) goes
through the compile-only evaluator and must end with one of its ``expect`` statuses, without its
secret-file probe ever echoing the secret's token into the outcome. Kernels marked
``defended: no (issue 8)`` are holes found in today's checks: they are expected to fail
(``xfail``, not strict, so the day one is fixed shows up as XPASS).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from catalogue import (
    CANARY_PLACEHOLDER,
    CPU_STATUSES,
    SECRET_PLACEHOLDER,
    Attack,
    Secret,
    catalogue_paths,
    load,
    load_all,
    make_secret,
    parse_header,
)

from ptxgym import paths
from ptxgym.build.result import DEFAULT_COMPILE_TIMEOUT_S
from ptxgym.evaluate.compile_only import CompileOnlyEvaluator
from ptxgym.languages.cuda.policy import MAX_SOURCE_CHARS
from ptxgym.outcome import Outcome, Status
from ptxgym.tasks import get_task

GEMM = get_task("PTX-H100-GEMM")
CATALOGUE = load_all()
CPU_ATTACKS = [attack for attack in CATALOGUE if attack.stage == "cpu"]
GPU_ATTACKS = [attack for attack in CATALOGUE if attack.stage == "gpu"]


def _param(attack: Attack) -> object:
    marks = []
    if not attack.defended:
        marks.append(pytest.mark.xfail(reason=f"not defended yet: {attack.attack}", strict=False))
    return pytest.param(attack, id=attack.name, marks=marks)


@pytest.fixture(scope="module")
def secret(tmp_path_factory: pytest.TempPathFactory) -> Secret:
    return make_secret(tmp_path_factory.mktemp("hostile-secret"))


def _everything_shown(outcome: Outcome) -> str:
    """Every text of the outcome that reaches the model or a record."""
    parts = [outcome.message, outcome.worker_log]
    if outcome.compile is not None:
        parts += [outcome.compile.log, *outcome.compile.warnings]
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------
# The catalogue itself


def test_the_catalogue_has_at_least_twenty_attacks_with_unique_names() -> None:
    assert len(CATALOGUE) >= 20
    names = [attack.name for attack in CATALOGUE]
    assert len(set(names)) == len(names)
    assert all(re.fullmatch(r"[a-z0-9_]+", name) for name in names), names
    descriptions = [attack.attack for attack in CATALOGUE]
    assert len(set(descriptions)) == len(descriptions), "two files claim the same attack"
    assert {attack.stage for attack in CATALOGUE} == {"cpu", "gpu"}


@pytest.mark.parametrize("path", catalogue_paths(), ids=lambda path: path.stem)
def test_every_file_has_a_well_formed_header(path: Path) -> None:
    fields = parse_header(path)  # raises on a malformed header
    attack = load(path)
    assert attack.expect, path.name
    assert not (attack.expect - set(Status)), path.name
    assert Status.COMPILED not in attack.expect, "COMPILED never means an attack was stopped"
    if attack.stage == "cpu":
        assert attack.expect <= CPU_STATUSES
        assert attack.max_speedup is None
    assert len(fields["why"]) >= 40, f"{path.name}: say why the attack would pay"
    # Every kernel defines the task's entry point, so only the attack decides its fate.
    assert re.search(r'extern "C" int gemm\(', attack.source), path.name
    # Placeholders are the only way a test path gets in; nothing points at a real host file.
    for placeholder in re.findall(r"@[A-Z_]+@", attack.source):
        assert placeholder in (SECRET_PLACEHOLDER, CANARY_PLACEHOLDER), path.name
    assert "/etc/" not in attack.source and "/home/" not in attack.source, path.name


def test_placeholders_are_rendered() -> None:
    attack = next(a for a in CATALOGUE if SECRET_PLACEHOLDER in a.source)
    rendered = attack.render("/tmp/x/secret.h", "/tmp/x/canary")
    assert SECRET_PLACEHOLDER not in rendered and "/tmp/x/secret.h" in rendered


# ------------------------------------------------------------------------------------------
# The attacks


@pytest.mark.nvcc
@pytest.mark.parametrize("attack", [_param(attack) for attack in CPU_ATTACKS])
def test_cpu_attack_is_stopped_before_it_runs(
    attack: Attack, secret: Secret, tmp_path: Path
) -> None:
    timeout = attack.compile_timeout_s or DEFAULT_COMPILE_TIMEOUT_S
    started = time.perf_counter()
    outcome = CompileOnlyEvaluator(compile_timeout_s=timeout).evaluate(
        GEMM, attack.render(secret.path, tmp_path / "canary")
    )
    shown = _everything_shown(outcome)
    assert secret.token not in shown, f"{attack.name} read the secret file back:\n{shown}"
    assert outcome.status in attack.expect, (
        f"{attack.name}: {outcome.status} not in {sorted(attack.expect)}\n{shown}"
    )
    assert not (tmp_path / "canary").exists()
    if attack.compile_timeout_s is not None:
        # A bomb is cut off at its deadline, not after the compiler gives up on its own.
        assert time.perf_counter() - started < attack.compile_timeout_s + 30


@pytest.mark.nvcc
@pytest.mark.parametrize("attack", [pytest.param(a, id=a.name) for a in GPU_ATTACKS])
def test_gpu_attack_gets_past_the_build(attack: Attack, secret: Secret, tmp_path: Path) -> None:
    # A run decides these (tests/hostile/test_hostile_gpu.py); that test means something only if
    # the kernel really reaches the GPU, unless its header counts a build failure as stopped.
    outcome = CompileOnlyEvaluator().evaluate(GEMM, attack.render(secret.path, tmp_path / "canary"))
    assert outcome.status in {Status.COMPILED} | (attack.expect & CPU_STATUSES), (
        f"{attack.name}: {outcome.status}\n{_everything_shown(outcome)}"
    )


def test_compile_bombs_use_a_short_deadline() -> None:
    bombs = [attack for attack in CPU_ATTACKS if attack.name.startswith("compile_bomb")]
    assert len(bombs) >= 2
    for bomb in bombs:
        assert bomb.compile_timeout_s == 5
        assert bomb.expect == {Status.COMPILE_ERROR}


def test_very_long_source_is_a_policy_violation() -> None:
    naive = (paths.examples_dir() / "naive" / "gemm.cu").read_text()
    filler = []
    size = 0
    index = 0
    while size < 300_000:
        line = (
            f"__device__ __forceinline__ float unrolled_step_{index}(float x, float y) "
            f"{{ return fmaf(x, {index % 97}.0f, y); }}\n"
        )
        filler.append(line)
        size += len(line)
        index += 1
    source = "".join(filler) + naive
    assert len(source) > 300_000 > MAX_SOURCE_CHARS
    outcome = CompileOnlyEvaluator().evaluate(GEMM, source)
    assert outcome.status is Status.POLICY_VIOLATION
    assert f"{MAX_SOURCE_CHARS:,}" in outcome.message
    assert outcome.compile is None  # refused before anything compiled
