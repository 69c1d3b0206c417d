"""The GPU locks' occupancy, read from the kernel's locks table: its lines parsed, a start-up
counted as delaying only a timing that waits for it, and real holders of the locks (shared,
then an exclusive one arriving and waiting, then alone, then none) seen in the right states,
with the waiting time put on the shared holder."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from ptxgym.device.lock import holding, startup_hold, startup_lock_of
from ptxgym.device.occupancy import (
    LOCKS_TABLE,
    STATES,
    FileLock,
    LockInodes,
    OccupancySampler,
    read_table,
    state_of,
)

TABLE = """\
1: FLOCK  ADVISORY  READ 2289 fe:00:2146497 0 EOF
1: -> FLOCK  ADVISORY  WRITE 2301 fe:00:2146497 0 EOF
2: FLOCK  ADVISORY  WRITE 2301 fe:00:2146498 0 EOF
3: POSIX  ADVISORY  WRITE 77 fe:00:99 0 EOF
4: FLOCK  ADVISORY  READ 2290 00:2a:2146497 0 EOF
5: OFDLCK ADVISORY  READ -1 00:05:12 0 EOF
"""


def test_the_table_s_flock_lines_are_read_with_waiters_apart() -> None:
    assert read_table(TABLE) == [
        FileLock(held=True, exclusive=False, pid=2289, inode=2146497),
        FileLock(held=False, exclusive=True, pid=2301, inode=2146497),
        FileLock(held=True, exclusive=True, pid=2301, inode=2146498),
        FileLock(held=True, exclusive=False, pid=2290, inode=2146497),
    ]


def test_a_state_is_named_from_the_lock_file_and_its_turnstile() -> None:
    locks = read_table(TABLE)
    assert state_of(locks, LockInodes(2146497, 2146498)) == (
        "shared, a timing waiting",
        [2289, 2290],
    )
    assert state_of(locks, LockInodes(2146497, 1)) == ("shared", [2289, 2290])
    assert state_of(locks, LockInodes(2146498, 1)) == ("alone", [])
    assert state_of(locks, LockInodes(5, 6)) == ("free", [])


# A start-up (pid 40) holds the start-up lock (inode 30) shared; the GPU's lock (10) is free.
STARTUP = "1: FLOCK  ADVISORY  READ 40 fe:00:30 0 EOF\n"


def test_a_start_up_delays_only_a_timing_that_keeps_start_ups_out() -> None:
    inodes = LockInodes(gpu=10, gpu_turnstile=11, startups=30, startups_turnstile=31)
    assert state_of(read_table(STARTUP), inodes) == ("shared", [40])
    # A timing that keeps start-ups out has both turnstiles and waits for the start-up.
    keeping_out = STARTUP + (
        "2: FLOCK  ADVISORY  WRITE 50 fe:00:31 0 EOF\n3: FLOCK  ADVISORY  WRITE 50 fe:00:11 0 EOF\n"
    )
    assert state_of(read_table(keeping_out), inodes) == ("shared, a timing waiting", [40])
    # One that lets them beside it has only the GPU's turnstile, then its lock: it waits for
    # nobody while the start-up makes its context.
    beside = STARTUP + "2: FLOCK  ADVISORY  WRITE 50 fe:00:11 0 EOF\n"
    assert state_of(read_table(beside), inodes) == ("shared", [40])
    beside += "3: FLOCK  ADVISORY  WRITE 50 fe:00:10 0 EOF\n"
    assert state_of(read_table(beside), inodes) == ("alone", [])


@pytest.mark.skipif(not LOCKS_TABLE.is_file(), reason="no /proc/locks on this machine")
def test_real_holders_are_seen_in_each_state(tmp_path: Path) -> None:
    lock_file = tmp_path / "gpu-test.lock"
    with holding(lock_file, exclusive=False):  # makes both files
        pass
    sampler = OccupancySampler(lock_file, kind_of=lambda pid: f"pid {pid}", interval_s=0.002)
    time.sleep(0.2)  # free
    exclusive_arrived = threading.Event()

    def timing() -> None:
        time.sleep(0.3)
        exclusive_arrived.set()
        with holding(lock_file, exclusive=True, chain_s=0.0):
            time.sleep(0.4)  # alone

    thread = threading.Thread(target=timing)
    with holding(lock_file, exclusive=False):
        thread.start()
        time.sleep(0.2)  # shared, then the exclusive holder arrives and waits
        assert exclusive_arrived.wait(5)
        time.sleep(0.4)
    thread.join()
    time.sleep(0.2)  # free
    occupancy = sampler.stop()
    seconds = occupancy.seconds
    assert set(seconds) == set(STATES)
    # Each state's span, within the slack a loaded machine's sleeps and thread switches allow.
    assert 0.25 <= seconds["alone"] <= 0.8, seconds
    assert 0.25 <= seconds["shared, a timing waiting"] <= 0.8, seconds
    assert 0.1 <= seconds["shared"] <= 0.6, seconds
    assert seconds["free"] >= 0.25, seconds
    assert occupancy.waited_on == {f"pid {os.getpid()}": seconds["shared, a timing waiting"]}
    assert occupancy.shares()["alone"] == pytest.approx(seconds["alone"] / sum(seconds.values()))


@pytest.mark.skipif(not LOCKS_TABLE.is_file(), reason="no /proc/locks on this machine")
def test_a_timing_waiting_on_a_real_start_up_is_put_on_it(tmp_path: Path) -> None:
    lock_file = tmp_path / "gpu-startups.lock"
    startups = startup_lock_of(lock_file)
    with holding(lock_file, exclusive=False), startup_hold(startups):  # makes the files
        pass
    sampler = OccupancySampler(lock_file, kind_of=lambda pid: "start-up", interval_s=0.002)

    def timing() -> None:
        with holding(lock_file, exclusive=True, chain_s=0.0, startups=startups):
            time.sleep(0.3)  # alone

    thread = threading.Thread(target=timing)
    with startup_hold(startups):
        time.sleep(0.1)  # shared
        thread.start()
        time.sleep(0.4)  # the timing waits for the start-up
    thread.join()
    occupancy = sampler.stop()
    seconds = occupancy.seconds
    assert 0.25 <= seconds["shared, a timing waiting"] <= 0.8, seconds
    assert 0.2 <= seconds["alone"] <= 0.7, seconds
    assert dict(occupancy.waited_on) == {"start-up": seconds["shared, a timing waiting"]}


@pytest.mark.skipif(not LOCKS_TABLE.is_file(), reason="no /proc/locks on this machine")
def test_a_lock_file_made_after_the_start_is_found(tmp_path: Path) -> None:
    lock_file = tmp_path / "gpu-late.lock"
    sampler = OccupancySampler(lock_file, kind_of=str, interval_s=0.002)
    time.sleep(0.05)
    with holding(lock_file, exclusive=True, chain_s=0.0):
        time.sleep(0.3)
    occupancy = sampler.stop()
    assert occupancy.seconds["alone"] >= 0.15, occupancy.seconds


def test_a_machine_without_the_table_is_told_so(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="cannot be sampled"):
        OccupancySampler(tmp_path / "x.lock", kind_of=str, table=tmp_path / "no-locks")
