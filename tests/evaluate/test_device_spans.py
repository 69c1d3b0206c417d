"""What a timed call is charged: the device span of the work its API calls launched
(``ptxgym.evaluate.timing.device_spans_ms``), checked on hand-made CUPTI records."""

from __future__ import annotations

import random
import sys
import types

import pytest

from ptxgym.evaluate import timing
from ptxgym.evaluate.timing import device_spans_ms

MS = 1_000_000  # CUPTI timestamps are nanoseconds


def test_a_call_is_charged_from_its_first_device_start_to_its_last_end() -> None:
    # Bracket 1 launches a kernel (correlation 1) and, from another API call, a copy on a side
    # stream (2) that ends last; an API call outside every bracket (3) launched work that
    # overlaps in time but is not the call's.
    api = [(10 * MS, 1), (11 * MS, 2), (30 * MS, 3)]
    device = {1: [(12 * MS, 14 * MS)], 2: [(13 * MS, 17 * MS)], 3: [(15 * MS, 40 * MS)]}
    assert device_spans_ms(api, device, [(9 * MS, 11 * MS)]) == [5.0]


def test_the_bracket_bounds_are_inclusive_and_the_records_need_not_be_sorted() -> None:
    api = [(20 * MS, 2), (10 * MS, 1)]
    device = {1: [(10 * MS, 11 * MS)], 2: [(21 * MS, 24 * MS)]}
    assert device_spans_ms(api, device, [(10 * MS, 10 * MS), (20 * MS, 20 * MS)]) == [1.0, 3.0]


def test_a_call_that_launched_nothing_on_the_device_is_charged_its_host_time() -> None:
    api = [(10 * MS, 1)]  # an API call with no device work (say, cudaGetLastError)
    assert device_spans_ms(api, {}, [(9 * MS, 12 * MS)]) == [3.0]
    assert device_spans_ms([], {}, [(0, 2 * MS)]) == [2.0]


def test_bisection_agrees_with_scanning_every_record() -> None:
    generator = random.Random(7)
    api = [(generator.randrange(0, 10_000), correlation) for correlation in range(2_000)]
    device = {
        correlation: [
            (start, start + generator.randrange(1, 50))
            for start in (generator.randrange(0, 10_000) for _ in range(generator.randrange(3)))
        ]
        for correlation in range(2_000)
    }
    brackets = [(begin, begin + generator.randrange(0, 300)) for begin in range(0, 10_000, 97)]

    def scanned(begin: int, end: int) -> float:
        windows = [w for start, c in api if begin <= start <= end for w in device.get(c, ())]
        if not windows:
            return (end - begin) / 1e6
        return (max(stop for _, stop in windows) - min(start for start, _ in windows)) / 1e6

    assert device_spans_ms(api, device, brackets) == [scanned(b, e) for b, e in brackets]


class _FakeCupti:
    """Stands in for cupti-python's module: records which activity kinds are on."""

    class ActivityKind:
        RUNTIME, DRIVER, CONCURRENT_KERNEL, MEMCPY, MEMSET = range(5)

    def __init__(self) -> None:
        self.enabled: set[int] = set()

    def activity_register_callbacks(self, requested: object, completed: object) -> None:
        pass

    def activity_enable(self, kind: int) -> None:
        self.enabled.add(kind)

    def activity_disable(self, kind: int) -> None:
        self.enabled.discard(kind)

    def activity_flush_all(self, flag: int) -> None:
        pass


def test_api_calls_are_recorded_only_around_the_timed_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The preparations between the calls make thousands of API calls; only the calls' own
    # count, and reading the others' records cost most of a measurement's time.
    fake = _FakeCupti()
    package = types.ModuleType("cupti")
    package.cupti = fake  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupti", package)
    recorder = timing._Cupti()
    kind = _FakeCupti.ActivityKind
    device_kinds = {kind.CONCURRENT_KERNEL, kind.MEMCPY, kind.MEMSET}
    recorder.start()
    assert fake.enabled == device_kinds
    with recorder.recording_api():
        assert fake.enabled == device_kinds | {kind.RUNTIME, kind.DRIVER}
    assert fake.enabled == device_kinds
    recorder.stop()
    assert fake.enabled == set()
