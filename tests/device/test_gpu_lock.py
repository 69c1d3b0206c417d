"""The GPU lock on the CPU: exclusive holders alone and first come first served, across processes
and threads; shared holders together, never with an exclusive one, which goes before later ones;
and the start-ups of workers and tool runs make their CUDA context holding the GPU shared (without
it when the judge's settings turn that off)."""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from ptxgym.device import lock as gpu_lock
from ptxgym.device.lock import exclusive_gpu, holding, lock_path, profiler_lock_path


def _hold(cache: str, locks: str, log: str, label: str) -> None:
    import os

    os.environ["PTXGYM_CACHE"] = cache
    os.environ["PTXGYM_LOCK_DIR"] = locks
    for _ in range(3):
        with exclusive_gpu(0):
            with open(log, "a") as out:
                out.write(f"{label} start {time.monotonic()}\n")
            time.sleep(0.05)
            with open(log, "a") as out:
                out.write(f"{label} end {time.monotonic()}\n")


def test_processes_never_hold_the_gpu_at_once(tmp_path: Path) -> None:
    # Each with a cache folder of its own, as separate test sessions and benchmark runs have: the
    # lock is the machine's, not the cache's (a lock in the cache let them time at once).
    log = tmp_path / "log"
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(
            target=_hold,
            args=(str(tmp_path / f"cache-{i}"), str(tmp_path / "locks"), str(log), f"p{i}"),
        )
        for i in range(3)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    events = [line.split() for line in log.read_text().splitlines()]
    assert len(events) == 18
    # Held intervals alternate start/end of the same holder: no two overlap.
    for start, end in zip(events[::2], events[1::2], strict=True):
        assert start[1] == "start" and end[1] == "end" and start[0] == end[0]


def test_threads_are_served_in_arrival_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTXGYM_LOCK_DIR", str(tmp_path / "locks"))
    served: list[int] = []
    with exclusive_gpu(0):  # held while the others line up
        threads = []
        for index in range(5):
            thread = threading.Thread(target=_take, args=(index, served))
            thread.start()
            threads.append(thread)
            time.sleep(0.05)  # arrival order 0, 1, 2, 3, 4
    for thread in threads:
        thread.join(timeout=30)
    assert served == [0, 1, 2, 3, 4]
    assert lock_path(0).parent == tmp_path / "locks"


def _take(index: int, served: list[int]) -> None:
    with exclusive_gpu(0) as waited:
        assert waited >= 0
        served.append(index)


def test_shared_holders_overlap_and_never_meet_an_exclusive_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTXGYM_LOCK_DIR", str(tmp_path / "locks"))
    inside: list[str] = []
    mutex = threading.Lock()
    overlaps: list[tuple[str, ...]] = []

    def hold(label: str, exclusive: bool) -> None:
        with holding(lock_path(0), exclusive=exclusive):
            with mutex:
                inside.append(label)
                overlaps.append(tuple(inside))
            time.sleep(0.2)
            with mutex:
                inside.remove(label)

    readers = [threading.Thread(target=hold, args=(f"r{i}", False)) for i in range(3)]
    for reader in readers:
        reader.start()
    time.sleep(0.05)
    writer = threading.Thread(target=hold, args=("w", True))
    writer.start()
    for thread in [*readers, writer]:
        thread.join(timeout=30)
    assert max(len(seen) for seen in overlaps) == 3  # the three shared holders were in at once
    assert ("w",) in overlaps  # and the exclusive one was alone


def test_a_waiting_exclusive_holder_goes_before_later_shared_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTXGYM_LOCK_DIR", str(tmp_path / "locks"))
    order: list[str] = []

    def hold(label: str, exclusive: bool, seconds: float) -> None:
        with holding(lock_path(0), exclusive=exclusive):
            order.append(label)
            time.sleep(seconds)

    first = threading.Thread(target=hold, args=("first shared", False, 0.3))
    first.start()
    time.sleep(0.05)
    writer = threading.Thread(target=hold, args=("exclusive", True, 0.1))
    writer.start()
    time.sleep(0.05)
    late = threading.Thread(target=hold, args=("late shared", False, 0.0))
    late.start()
    for thread in (first, writer, late):
        thread.join(timeout=30)
    assert order == ["first shared", "exclusive", "late shared"]


def _chain(
    exclusive: int, seconds: float, chain_s: float = gpu_lock.EXCLUSIVE_CHAIN_S
) -> list[str]:
    """``exclusive`` threads of this process, each holding the GPU alone for ``seconds``, lined
    up in order; a shared holder arrives once the first of them holds it. The order they got
    it in."""
    order: list[str] = []

    def hold(label: str, exclusive: bool) -> None:
        with holding(lock_path(0), exclusive=exclusive, chain_s=chain_s):
            order.append(label)
            time.sleep(seconds if exclusive else 0.0)

    threads = []
    for index in range(exclusive):
        threads.append(threading.Thread(target=hold, args=(f"e{index}", True)))
        threads[-1].start()
        time.sleep(0.02)
        if index == 0:
            threads.append(threading.Thread(target=hold, args=("shared", False)))
            threads[-1].start()
            time.sleep(0.02)
    for thread in threads:
        thread.join(timeout=60)
    return order


def test_exclusive_holders_of_one_process_pass_the_gpu_on_before_waiting_start_ups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Released between them, the lock let every waiting start-up in after each holder.
    monkeypatch.setenv("PTXGYM_LOCK_DIR", str(tmp_path / "locks"))
    order = _chain(4, 0.1)
    assert order == ["e0", "e1", "e2", "e3", "shared"]


def test_a_chain_of_exclusive_holders_lets_waiting_start_ups_in_when_it_grows_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTXGYM_LOCK_DIR", str(tmp_path / "locks"))
    order = _chain(10, 0.1, chain_s=0.25)
    # In after the chain's first holders (the chain was young), not after all ten.
    assert 1 <= order.index("shared") < 10
    assert sorted(order) == sorted([*(f"e{i}" for i in range(10)), "shared"])


# A stand-in for ``make_context`` in a start-up: writes to its standard output whether the lock
# of ``_LOCK_FILE`` could be taken alone now ("held": someone holds it), then ends the process.
# The lock's path is read before the start-up scrubs the environment.
_LOCK_FILE: list[str] = []


def _probe_lock(*arguments: object) -> None:
    os.write(1, _lock_state().encode() + b"\n")
    os._exit(0)


def _lock_state() -> str:
    """Whether the lock of ``_LOCK_FILE`` could be taken alone now: "free", or "held"."""
    import fcntl

    descriptor = os.open(_LOCK_FILE[0], os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return "free"
    except BlockingIOError:
        return "held"
    finally:
        os.close(descriptor)


def _start_up(target: object, args: tuple[object, ...]) -> None:
    """Run a start-up in a forked child (which inherits the stand-in) and wait for its end."""
    process = multiprocessing.get_context("fork").Process(target=target, args=args)
    process.start()
    process.join(timeout=60)
    assert process.exitcode == 0


def _probe_contexts_of(
    module: object, maker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, locked: bool
) -> str | None:
    """Put the stand-in in place of ``module``'s context maker (named ``maker``); the lock
    file to hand the start-up (None when it is to start without the lock)."""
    monkeypatch.setenv("PTXGYM_LOCK_DIR", str(tmp_path / "locks"))
    with holding(lock_path(0), exclusive=False):
        pass  # the judge makes the lock's files before it starts workers and tool runs
    monkeypatch.setattr(module, maker, _probe_lock)
    monkeypatch.setattr(sys.modules[__name__], "_LOCK_FILE", [str(lock_path(0))])
    return str(lock_path(0)) if locked else None


@pytest.mark.parametrize("locked", [True, False], ids=["locked", "lock_startups_off"])
def test_a_worker_makes_its_context_holding_the_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, locked: bool
) -> None:
    from ptxgym.evaluate import worker

    startup_lock = _probe_contexts_of(worker, "make_context", tmp_path, monkeypatch, locked)
    log = tmp_path / "worker.log"
    _judge_end, child = multiprocessing.get_context("fork").Pipe()  # kept open meanwhile
    _start_up(worker.worker_main, (child, 0, str(log), str(tmp_path / "home"), startup_lock))
    assert log.read_text().splitlines()[-1] == ("held" if locked else "free")


@pytest.mark.parametrize("locked", [True, False], ids=["locked", "lock_startups_off"])
def test_a_tool_run_makes_its_context_holding_the_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, locked: bool
) -> None:
    from ptxgym.evaluate import single_call

    startup_lock = _probe_contexts_of(single_call, "DriverContext", tmp_path, monkeypatch, locked)
    spec = {"gpu_lock": str(lock_path(0)), "startup_lock": startup_lock, "profiler_lock": None}
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    output = _run_job_output(spec_path, tmp_path, tmp_path / "out")
    assert output.splitlines()[-1] == ("held" if locked else "free")


def _run_job_output(spec_path: Path, folder: Path, output: Path) -> str:
    """What a single-call program with the spec ``spec_path``, started in ``folder`` (where its
    writes are confined), writes to its standard output (through the file ``output``), run in a
    forked child."""
    from ptxgym.evaluate import single_call

    def run() -> None:
        os.dup2(os.open(output, os.O_WRONLY | os.O_CREAT, 0o600), 1)
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 (the child's, to its end)
        os.chdir(folder)
        sys.exit(single_call.run_job(str(spec_path)))

    _start_up(run, ())
    return output.read_text()


# A single-call program in a fresh Python, its GPU's part stood in for by this module's
# _StandInContext and _ProbingEntry (which probes the lock file given): prints what they say,
# then its exit code and whether torch was imported along the way.
_STAND_IN_RUN = """
import importlib.util, json, sys
spec_path, this_file, lock_file = sys.argv[1:]
found = importlib.util.spec_from_file_location("gpu_lock_tests", this_file)
tests = importlib.util.module_from_spec(found)
found.loader.exec_module(tests)
from ptxgym.evaluate import single_call
from ptxgym.evaluate import worker
tests._LOCK_FILE[:] = [lock_file]
single_call.DriverContext = tests._StandInContext
single_call.profiled = lambda cuda, launch: launch()
worker.Entry = tests._ProbingEntry
code = single_call.run_job(spec_path)
print(json.dumps({"code": code, "torch": "torch" in sys.modules}))
"""


def test_a_profile_run_loads_and_calls_the_candidate_in_its_turn_without_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two processes profiling at once: the driver refuses one (12 of 16 runs, eight at a time,
    # each with a temporary folder of its own, as Nsight Compute's own lock then sees none of
    # the others: docs/benchmarks.md, ninth session). A profile run takes the turn with its
    # writes confined (so the lock's file is made for it) and before the candidate's library
    # is loaded; a sanitizer run takes none. Here the GPU's part is stood in for: the library's
    # loading and the call say whether the turn is held. The program talks to the CUDA driver
    # itself: importing torch was most of a run's start-up CPU time on the H200 host, where
    # the CPU bounds 16 trajectories.
    import subprocess

    import numpy

    from ptxgym.evaluate.single_call import CallJob, PendingCall, call_seconds
    from ptxgym.sandbox.isolation import python_environment
    from ptxgym.tasks import get_task

    monkeypatch.setenv("PTXGYM_LOCK_DIR", str(tmp_path / "locks"))
    with holding(lock_path(0), exclusive=False):
        pass  # the GPU lock's files, as the judge's start leaves them
    profile_run = PendingCall(device=0, prefix="profile-", under_profiler=True)
    sanitizer_run = PendingCall(device=0, prefix="memcheck-")
    spec = json.loads((profile_run.folder / "spec.json").read_text())
    sanitizer_spec = json.loads((sanitizer_run.folder / "spec.json").read_text())
    sanitizer_run.close()
    assert sanitizer_spec["profiler_lock"] is None
    assert spec["profiler_lock"] == str(profiler_lock_path())
    task = get_task("PTX-H100-GEMM")
    inputs = {name: numpy.full(4, index, numpy.uint8) for index, name in enumerate("AB")}
    library = tmp_path / "x.so"
    library.write_bytes(b"a stand-in library")
    profile_run.hand_over(CallJob(task, str(library), task.workloads[0].payload(), inputs))

    arguments = [str(profile_run.folder / "spec.json"), __file__, spec["profiler_lock"]]
    try:
        result = subprocess.run(
            [sys.executable, "-c", _STAND_IN_RUN, *arguments],
            capture_output=True,
            text=True,
            env=python_environment(profile_run.folder),
            cwd=profile_run.folder,
            timeout=120,
        )
    finally:
        profile_run.close()
    assert result.returncode == 0, result.stderr
    text = result.stdout
    # The judge's input files reached the program, each to its own input.
    assert text.splitlines()[:4] == [
        "upload: 00000000",
        "upload: 01010101",
        "load: held",
        "call: held",
    ], text
    assert "profiler_wait" in call_seconds(text)
    assert json.loads(text.splitlines()[-1]) == {"code": 0, "torch": False}


class _StandInContext:
    """A stand-in for the program's CUDA context: says what it is asked to upload."""

    def upload(self, data: bytes) -> object:
        os.write(1, b"upload: " + data.hex().encode() + b"\n")
        return None

    def poisoned(self, elements: int, dtype: str) -> object:
        return None

    def stream(self) -> int:
        return 0

    def synchronize(self) -> None:
        pass


class _ProbingEntry:
    """A stand-in for the candidate's library: its loading and its call say whether the lock of
    ``_LOCK_FILE`` is held."""

    def __init__(self, library: str, task: object) -> None:
        os.write(1, b"load: " + _lock_state().encode() + b"\n")

    def __call__(self, *arguments: object) -> int:
        os.write(1, b"call: " + _lock_state().encode() + b"\n")
        return 0
