"""benchmarks/disturbance.py on the CPU: each start-up activity's background program is the
start-up it names (a worker's with its CUPTI timer, a count run's with CUPTI's SASS metrics on
the helper the judge builds), and bad arguments are refused before any GPU work."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark, script

from ptxgym.evaluate.cupti_helper import HelperUnavailable, build_helper

disturbance = load_benchmark("disturbance")


def _program(activity: str) -> str:
    command = disturbance.unlocked_command(activity)
    assert command[:2] == [sys.executable, "-c"]
    ast.parse(command[2])  # a program Python runs
    return str(command[2])


def test_a_plain_start_up_makes_a_context_and_nothing_more() -> None:
    assert _program("startup") == "from ptxgym.device.gpus import make_context; make_context(0)"


def test_a_worker_s_start_up_sets_up_its_timer_after_the_context() -> None:
    program = _program("startup-worker")
    assert program.index("make_context(0)") < program.index("Timer()")


def test_a_count_run_s_start_up_prepares_cupti_on_the_built_helper() -> None:
    try:
        build_helper()
    except HelperUnavailable as exc:
        pytest.skip(f"the CUPTI helper cannot be built here: {exc}")
    program = _program("startup-count")
    helper = program.split("SassCounter(", 1)[1].split(")", 1)[0]
    assert Path(ast.literal_eval(helper)).is_file()
    assert program.index("make_context(0)") < program.index(".prepare(0)")


@pytest.mark.parametrize("arguments", [["--rounds", "0"], ["--processes", "0"], ["--seconds", "0"]])
def test_bad_arguments_are_refused(arguments: list[str]) -> None:
    ran = subprocess.run(
        [sys.executable, str(script("disturbance")), *arguments], capture_output=True, text=True
    )
    assert ran.returncode == 2
    assert "--rounds and --processes must be at least 1, --seconds above 0" in ran.stderr
