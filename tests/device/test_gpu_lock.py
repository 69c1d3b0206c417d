"""The GPU lock on the CPU: exclusive holders alone and first come first served, across processes
and threads; shared holders together, never with an exclusive one, which goes before later ones;
a timing keeps start-ups out unless its settings let them beside it, waits for contexts and
checks at once, and may keep start-ups waiting for its process's next timing; holders of every
kind mixed never wait on each other for good; a child confined to its own folder takes the locks
its spec names on a machine where no lock file was made yet; and the start-ups of workers and
tool runs make their CUDA context holding the start-up lock shared (without it when the judge's
settings turn that off)."""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ptxgym.device import lock as gpu_lock
from ptxgym.device.lock import (
    exclusive_gpu,
    gpu_lock_for,
    holding,
    lock_path,
    profiler_lock_path,
    shared_gpu,
    startup_hold,
    startup_lock_for,
    startup_lock_path,
)
from ptxgym.evaluate.judge_settings import JudgeSettings, timing_hold
from ptxgym.sandbox import landlock
from ptxgym.sandbox.isolation import readable_paths, restrict_files


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


def _take_locks_confined(folder: str, locks: str, gpu: str, startups: str) -> None:
    """As a tool run does: writes confined to its own folder, then the start-up lock and the
    GPU's taken shared."""
    if not restrict_files(Path(folder), [*readable_paths(), Path(locks)]):
        raise SystemExit("not confined")
    with startup_hold(Path(startups)):
        pass
    with holding(Path(gpu), exclusive=False):
        pass


@pytest.mark.skipif(landlock.abi_version() < 1, reason="the kernel has no Landlock")
@pytest.mark.parametrize("made_first", [True, False], ids=["made-first", "missing"])
def test_a_confined_child_takes_the_locks_its_spec_names_on_a_fresh_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, made_first: bool
) -> None:
    # Missing: what making the spec's lock files first prevents. The count run of the judge's
    # CUPTI self-test, the first on a fresh host to take the GPU's lock, failed so.
    monkeypatch.setenv("PTXGYM_LOCK_DIR", str(tmp_path / "locks"))
    startups = startup_lock_for(0, locked=True)
    assert startups is not None
    gpu = gpu_lock_for(0) if made_first else str(lock_path(0))
    folder = tmp_path / "child"
    folder.mkdir()
    process = multiprocessing.get_context("fork").Process(
        target=_take_locks_confined,
        args=(str(folder), str(tmp_path / "locks"), gpu, startups),
    )
    process.start()
    process.join(timeout=30)
    assert process.exitcode is not None
    assert (process.exitcode == 0) is made_first


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


def test_exclusive_holders_of_one_process_pass_the_gpu_on_before_waiting_shared_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Released between them, the lock let every waiting start-up in after each holder.
    monkeypatch.setenv("PTXGYM_LOCK_DIR", str(tmp_path / "locks"))
    order = _chain(4, 0.1)
    assert order == ["e0", "e1", "e2", "e3", "shared"]


def test_a_chain_of_exclusive_holders_lets_waiting_shared_ones_in_when_it_grows_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTXGYM_LOCK_DIR", str(tmp_path / "locks"))
    order = _chain(10, 0.1, chain_s=0.25)
    # In after the chain's first holders (the chain was young), not after all ten.
    assert 1 <= order.index("shared") < 10
    assert sorted(order) == sorted([*(f"e{i}" for i in range(10)), "shared"])


def _startup_entered_during(timing: Any) -> bool:
    """Whether a start-up arriving while ``timing`` (an exclusive hold) is held got its
    start-up lock before the timing ended."""
    entered: list[float] = []

    def start_up() -> None:
        with startup_hold(startup_lock_path(0)):
            entered.append(time.monotonic())

    with timing:
        thread = threading.Thread(target=start_up)
        thread.start()
        time.sleep(0.3)
        ended = time.monotonic()
    thread.join(timeout=30)
    assert len(entered) == 1
    return entered[0] < ended


@pytest.mark.parametrize(
    ("iters", "startups_beside_iters", "beside"),
    [(50, None, False), (5, 50, False), (50, 50, True), (200, 50, True)],
    ids=["kept-out", "few-calls", "as-many-calls", "more-calls"],
)
def test_a_timing_keeps_start_ups_out_unless_its_protocol_lets_them_beside(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    iters: int,
    startups_beside_iters: int | None,
    beside: bool,
) -> None:
    monkeypatch.setenv("PTXGYM_LOCK_DIR", str(tmp_path / "locks"))
    settings = JudgeSettings(iters=iters, startups_beside_iters=startups_beside_iters)
    assert settings.startups_beside_timings is beside
    assert _startup_entered_during(timing_hold(0, settings)) is beside


def test_an_exclusive_hold_that_is_no_timing_leaves_start_ups_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The profiler's call: it holds the GPU's lock alone, and a context changes no count.
    monkeypatch.setenv("PTXGYM_LOCK_DIR", str(tmp_path / "locks"))
    assert _startup_entered_during(holding(lock_path(0), exclusive=True))
    assert not _startup_entered_during(exclusive_gpu(0))


def test_the_judges_own_protocol_lets_start_ups_beside_and_a_short_one_keeps_them_out() -> None:
    assert JudgeSettings().startups_beside_timings
    assert not JudgeSettings(warmup=2, iters=5, trials=3).startups_beside_timings


def test_the_settings_refuse_a_threshold_below_one_call() -> None:
    with pytest.raises(ValueError, match="startups_beside_iters"):
        JudgeSettings(startups_beside_iters=0)


@pytest.mark.usefixtures("lock_files")
def test_a_timing_waits_for_contexts_and_checks_at_once_and_before_later_ones() -> None:
    # Both turnstiles are taken first: the timing waits for the longer of the two holds in
    # progress, not for one and then the other, and neither lock lets anyone new in meanwhile.
    events: dict[str, float] = {}

    def hold(label: str, hold: Any, seconds: float) -> None:
        with hold:
            events[label] = time.monotonic()
            time.sleep(seconds)

    start = time.monotonic()
    threads = [
        threading.Thread(target=hold, args=("context", startup_hold(startup_lock_path(0)), 0.4)),
        threading.Thread(target=hold, args=("checks", shared_gpu(0), 0.4)),
    ]
    for thread in threads:
        thread.start()
    time.sleep(0.05)
    threads.append(threading.Thread(target=hold, args=("timing", exclusive_gpu(0), 0.2)))
    threads[-1].start()
    time.sleep(0.05)
    late = {
        "late context": startup_hold(startup_lock_path(0)),
        "late checks": shared_gpu(0),
    }
    for label, held in late.items():
        threads.append(threading.Thread(target=hold, args=(label, held, 0.0)))
        threads[-1].start()
    for thread in threads:
        thread.join(timeout=30)
    assert 0.35 <= events["timing"] - start < 0.7, events
    assert events["late context"] >= events["timing"] + 0.15, events
    assert events["late checks"] >= events["timing"] + 0.15, events


def _entries_after_a_lingering_timing(
    linger_s: float, chain_s: float = 5.0, timings: int = 1
) -> dict[str, float]:
    """``timings`` timings of 0.1 s, each next one arriving 0.05 s after the last ended, with a
    start-up and a check arriving during the first: when each got in, from the first's end."""
    entered: dict[str, float] = {}

    def enter(label: str, hold: Any) -> None:
        with hold:
            entered[label] = time.monotonic()

    lingering = exclusive_gpu(0, chain_s=chain_s, linger_s=linger_s)
    waiting = [
        threading.Thread(target=enter, args=("start-up", startup_hold(startup_lock_path(0)))),
        threading.Thread(target=enter, args=("checks", shared_gpu(0))),
    ]
    with lingering:
        for thread in waiting:
            thread.start()
        time.sleep(0.1)
    first_ended = time.monotonic()
    for index in range(1, timings):
        time.sleep(0.05)
        with exclusive_gpu(0, chain_s=chain_s, linger_s=linger_s):
            entered[f"timing {index}"] = time.monotonic()
            time.sleep(0.1)
    for thread in waiting:
        thread.join(timeout=30)
    return {label: when - first_ended for label, when in entered.items()}


@pytest.fixture
def lock_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU's lock files in a folder of the test's own, as the judge's start leaves them."""
    monkeypatch.setenv("PTXGYM_LOCK_DIR", str(tmp_path / "locks"))
    _make_lock_files()


@pytest.mark.parametrize(
    ("linger_s", "start_up_window"),
    [(0.5, (0.4, 1.5)), (0.0, (0.0, 0.2))],
    ids=["lingering", "not-lingering"],
)
@pytest.mark.usefixtures("lock_files")
def test_a_lingering_timing_keeps_start_ups_waiting_but_lets_checks_in(
    linger_s: float, start_up_window: tuple[float, float]
) -> None:
    entered = _entries_after_a_lingering_timing(linger_s)
    assert entered["checks"] < 0.2, entered
    # Lingering: the timer released it, with no timing after the first.
    assert start_up_window[0] <= entered["start-up"] < start_up_window[1], entered


@pytest.mark.usefixtures("lock_files")
def test_the_next_timing_takes_over_a_linger_and_the_chain_s_limit_ends_it() -> None:
    # Timings 0.05 s apart, each within the last one's linger: the start-up waits for the
    # chain's limit (0.6 s from the first timing's start), not for the last timing.
    entered = _entries_after_a_lingering_timing(linger_s=0.3, chain_s=0.6, timings=10)
    assert entered["timing 1"] < entered["start-up"], entered
    assert 0.35 <= entered["start-up"] < 1.0, entered
    assert entered["timing 9"] > entered["start-up"], entered


@pytest.mark.usefixtures("lock_files")
def test_a_chain_ended_by_age_lets_the_waiting_start_ups_in_before_the_next() -> None:
    # Two threads time back to back, so the chain only ends by age: each start-up waits for
    # the end of the chain it arrived in, not for a later one (flock serves no one in order,
    # and without the pause the next holder won the turnstile about every other time).
    chain_s, until = 0.3, time.monotonic() + 2.5
    waits: list[float] = []

    def time_back_to_back() -> None:
        while time.monotonic() < until:
            with exclusive_gpu(0, chain_s=chain_s, linger_s=0.05):
                time.sleep(0.02)

    timings = [threading.Thread(target=time_back_to_back) for _ in range(2)]
    for thread in timings:
        thread.start()
    time.sleep(0.1)
    while time.monotonic() < until - 0.5:
        arrived = time.monotonic()
        with startup_hold(startup_lock_path(0)):
            waits.append(time.monotonic() - arrived)
        time.sleep(0.01)
    for thread in timings:
        thread.join(timeout=30)
    assert len(waits) >= 4, waits
    assert max(waits) < chain_s + 0.2, waits


# A program that is interrupted while it waits in line for the GPU (SIGINT in its main thread),
# then says whether the next exclusive and shared holders still get in.
_INTERRUPTED_IN_LINE = """
import os, signal, threading, time
from ptxgym.device.lock import exclusive_gpu, shared_gpu

def holder():
    with exclusive_gpu(0, chain_s=5.0):
        time.sleep(0.5)

threading.Thread(target=holder).start()
time.sleep(0.1)
threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
try:
    with exclusive_gpu(0, chain_s=5.0):
        print("not interrupted")
except KeyboardInterrupt:
    print("interrupted in line")
time.sleep(0.6)  # the holder has let go: its turn must not go to the interrupted waiter
for name, hold in (("exclusive", exclusive_gpu), ("shared", shared_gpu)):
    entered = threading.Event()
    def enter():
        with hold(0):
            entered.set()
    threading.Thread(target=enter, daemon=True).start()
    print(name, entered.wait(5))
os._exit(0)
"""


def test_a_waiter_interrupted_in_line_leaves_it(tmp_path: Path) -> None:
    import subprocess

    environment = {**os.environ, "PTXGYM_LOCK_DIR": str(tmp_path / "locks")}
    result = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_IN_LINE],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
    )
    assert result.stdout.split("\n")[:3] == ["interrupted in line", "exclusive True", "shared True"]


def _mixed_holder(locks: str, log: str, label: str, seed: int) -> None:
    """Holds of every kind, in a random order, each written to ``log`` with when it began and
    ended."""
    import random

    os.environ["PTXGYM_LOCK_DIR"] = locks
    choose = random.Random(seed)
    holds = {
        "timing": lambda: exclusive_gpu(0, chain_s=0.01),
        "lingering-timing": lambda: exclusive_gpu(0, chain_s=0.02, linger_s=0.005),
        "long-timing": lambda: exclusive_gpu(0, chain_s=0.01, startups_beside=True),
        "profile": lambda: holding(lock_path(0), exclusive=True, chain_s=0.01),
        "checks": lambda: shared_gpu(0),
        "start-up": lambda: startup_hold(startup_lock_path(0)),
    }

    def work(thread: int) -> None:
        for _ in range(25):
            kind = choose.choice(list(holds))
            with holds[kind]():
                began = time.monotonic()
                time.sleep(choose.uniform(0.0, 0.004))
                ended = time.monotonic()
            with open(log, "a") as out:
                out.write(f"{label}-{thread} {kind} {began} {ended}\n")

    threads = [threading.Thread(target=work, args=(index,)) for index in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_holders_of_every_kind_mixed_never_deadlock_and_keep_the_rules(tmp_path: Path) -> None:
    log = tmp_path / "log"
    locks = str(tmp_path / "locks")
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=_mixed_holder, args=(locks, str(log), f"p{index}", index))
        for index in range(3)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
    stuck = [process for process in processes if process.exitcode is None]
    for process in stuck:
        process.kill()
    assert not stuck, "holders waited on each other for good"
    assert all(process.exitcode == 0 for process in processes)
    holds = [line.split() for line in log.read_text().splitlines()]
    assert len(holds) == 3 * 3 * 25
    spans = [(kind, float(began), float(ended)) for _, kind, began, ended in holds]

    def overlapping(first: set[str], second: set[str]) -> list[tuple[str, str]]:
        return [
            (a[0], b[0])
            for a in spans
            for b in spans
            if a is not b and a[0] in first and b[0] in second and a[1] < b[2] and b[1] < a[2]
        ]

    exclusive = {"timing", "lingering-timing", "long-timing", "profile"}
    assert not overlapping(exclusive, exclusive | {"checks"})
    assert not overlapping({"timing", "lingering-timing"}, {"start-up"})
    assert {kind for kind, _, _ in spans} == exclusive | {"checks", "start-up"}


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
    _make_lock_files()
    monkeypatch.setattr(module, maker, _probe_lock)
    monkeypatch.setattr(sys.modules[__name__], "_LOCK_FILE", [str(startup_lock_path(0))])
    return str(startup_lock_path(0)) if locked else None


def _make_lock_files() -> None:
    """The GPU's lock files, as the judge's start leaves them (before it starts workers and
    tool runs, which cannot make them once confined)."""
    with shared_gpu(0), startup_hold(startup_lock_path(0)):
        pass


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
    _make_lock_files()
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
