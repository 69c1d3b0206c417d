"""The machine's build memory budget on the CPU: processes hold at most ``budget // per build``
slots at once, observed through their own word and the kernel's lock table; a build waits for a
slot only up to its deadline; the budget comes from the environment or the host's memory."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest

from ptxgym.build import budget as build_budget
from ptxgym.build.budget import BUDGET_ENV, build_slot, slot_count, slot_path

PER_BUILD = 8 << 30
HOLDERS = 5


def _hold_until_released(locks: str, budget_gib: str, folder: str) -> None:
    """A process that takes a slot, says so with a file of its own, and holds it until the test
    releases it."""
    os.environ["PTXGYM_LOCK_DIR"] = locks
    os.environ[BUDGET_ENV] = budget_gib
    with build_slot(PER_BUILD, timeout_s=300) as held:
        if not held:
            raise SystemExit(3)
        marker = Path(folder) / f"holding-{os.getpid()}"
        marker.write_text("")
        release = Path(folder) / f"release-{os.getpid()}"
        while not release.exists():
            time.sleep(0.005)
        marker.unlink()


def slot_lock_holders(slots: int) -> set[int]:
    """The processes that hold a flock on one of the first ``slots`` slot files now, from the
    kernel's table of locks (``/proc/locks``: ``N: FLOCK ADVISORY WRITE PID MAJ:MIN:INODE ...``)."""
    files = set()
    for index in range(slots):
        if slot_path(index).exists():
            status = slot_path(index).stat()
            device = f"{os.major(status.st_dev):02x}:{os.minor(status.st_dev):02x}"
            files.add(f"{device}:{status.st_ino}")
    holders = set()
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if fields[1:4] == ["FLOCK", "ADVISORY", "WRITE"] and fields[5:6] and fields[5] in files:
            holders.add(int(fields[4]))
    return holders


def test_processes_hold_no_more_slots_than_the_budget_makes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 16 GiB at 8 GiB a build: two slots, for five processes that all want one.
    monkeypatch.setenv("PTXGYM_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv(BUDGET_ENV, "16")
    assert slot_count(PER_BUILD) == 2
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(
            target=_hold_until_released,
            args=(str(tmp_path / "locks"), "16", str(tmp_path)),
        )
        for _ in range(HOLDERS)
    ]
    for process in processes:
        process.start()
    pids = {process.pid for process in processes}
    released: set[int] = set()
    most_at_once = 0
    deadline = time.monotonic() + 120
    try:
        while len(released) < HOLDERS:
            assert time.monotonic() < deadline, f"stuck with {len(released)} released"
            holding = {int(path.name.split("-")[1]) for path in tmp_path.glob("holding-*")}
            locked = slot_lock_holders(slots=HOLDERS)
            assert len(holding) <= 2, f"{len(holding)} processes say they hold a slot"
            assert len(locked) <= 2 and locked <= pids, f"slot files locked by {locked}"
            most_at_once = max(most_at_once, len(holding))
            # Once as many hold a slot as can, let one go: the next waiter may take its slot.
            if len(holding) == min(2, HOLDERS - len(released)) and holding - released:
                chosen = min(holding - released)
                (tmp_path / f"release-{chosen}").touch()
                released.add(chosen)
            time.sleep(0.002)
    finally:
        for pid in pids - released:
            (tmp_path / f"release-{pid}").touch()
        for process in processes:
            process.join(timeout=60)
    assert [process.exitcode for process in processes] == [0] * HOLDERS
    assert most_at_once == 2, "the budget's two slots were never both used"


def test_a_build_waits_for_a_slot_only_until_its_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTXGYM_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv(BUDGET_ENV, "16")
    with build_slot(PER_BUILD, timeout_s=1) as first, build_slot(PER_BUILD, timeout_s=1) as second:
        assert first and second
        assert slot_lock_holders(slots=2) == {os.getpid()}
        with build_slot(PER_BUILD, timeout_s=0.2) as third:
            assert not third, "a third build got a slot of a two-slot budget"
    with build_slot(PER_BUILD, timeout_s=0) as again:
        assert again, "slots are given back at the end of the block"
    assert not slot_lock_holders(slots=2)


def test_the_budget_comes_from_the_environment_or_the_hosts_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(BUDGET_ENV, "40")
    assert slot_count(PER_BUILD) == 5
    monkeypatch.setenv(BUDGET_ENV, "1.5")
    assert slot_count(PER_BUILD) == 1, "a budget below one build still lets one build run"
    for wrong in ("", "0", "-8", "lots"):
        monkeypatch.setenv(BUDGET_ENV, wrong)
        with pytest.raises(ValueError, match=BUDGET_ENV):
            slot_count(PER_BUILD)
    monkeypatch.delenv(BUDGET_ENV)
    host = build_budget.host_memory_bytes()
    assert 0 < host <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert slot_count(PER_BUILD) == max(1, host // 2 // PER_BUILD)
