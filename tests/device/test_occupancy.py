"""The GPU lock's occupancy, read from the kernel's locks table: its lines parsed, and real
holders of a lock file (shared, then an exclusive one arriving and waiting, then alone, then
none) seen in the right states, with the waiting time put on the shared holder."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from ptxgym.device.lock import holding
from ptxgym.device.occupancy import (
    LOCKS_TABLE,
    STATES,
    FileLock,
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
    assert state_of(locks, 2146497, 2146498) == ("shared, a timing waiting", [2289, 2290])
    assert state_of(locks, 2146497, 1) == ("shared", [2289, 2290])
    assert state_of(locks, 2146498, 1) == ("alone", [])
    assert state_of(locks, 5, 6) == ("free", [])


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
