"""SchedulerService over a MemoryStore and a Clock: call_at, cancel, slices, schedules, sweeps."""

from __future__ import annotations

from typing import Any

import pytest
from zope.interface.verify import verifyObject

from mqhub.interfaces import IScheduler
from mqhub.scheduler.service import SchedulerService
from mqhub.scheduler.spec import ScheduleSpec
from mqhub.store.memory import MemoryStore
from mqhub.testing import START_TIME, result_of, start_clock


class Recorder:
    """A due handler that records (now, key, payload) per call."""

    def __init__(self) -> None:
        """Start empty."""
        self.calls: list[list[tuple[float, bytes, bytes]]] = []

    def __call__(self, rows: list[tuple[float, bytes, bytes]], batch: Any, now: float) -> None:
        """Record one slice."""
        self.calls.append([(now, k, p) for _, k, p in rows])

    @property
    def keys(self) -> list[bytes]:
        """Every key fired, in order."""
        return [k for call in self.calls for _, k, _ in call]


@pytest.fixture
def sched() -> SchedulerService:
    """A started scheduler on a Clock at START_TIME."""
    clock = start_clock()
    store = MemoryStore()
    store.open()
    s = SchedulerService(store, clock, slice_size=10)
    s.startService()
    return s


def test_provides_ischeduler(sched: SchedulerService) -> None:
    """The service declares and satisfies IScheduler."""
    assert verifyObject(IScheduler, sched)


def test_call_at_fires_once_at_its_time(sched: SchedulerService) -> None:
    """A one-shot row fires at its time with its payload and is removed."""
    rec = Recorder()
    sched.register(b"t/", rec)
    now = sched.clock.seconds()
    result_of(sched.call_at(now + 5, b"t/1", b"p"))
    sched.clock.advance(4.9)
    assert rec.calls == []
    sched.clock.advance(0.2)
    assert rec.keys == [b"t/1"] and rec.calls[0][0][2] == b"p"
    assert sched.store.stats()["due"] == 0 and sched.pending_keys() == {}
    sched.clock.advance(100)
    assert len(rec.calls) == 1


def test_call_at_replaces_and_cancel_reports(sched: SchedulerService) -> None:
    """call_at on an existing key moves it; cancel says whether it existed."""
    rec = Recorder()
    sched.register(b"t/", rec)
    now = sched.clock.seconds()
    sched.call_at(now + 5, b"t/1", b"a")
    sched.call_at(now + 8, b"t/1", b"b")
    sched.clock.advance(6)
    assert rec.calls == []
    sched.clock.advance(3)
    assert rec.calls[0][0][2] == b"b"
    sched.call_at(now + 20, b"t/2", b"c")
    assert result_of(sched.cancel(b"t/2")) is True
    assert result_of(sched.cancel(b"t/2")) is False
    sched.clock.advance(30)
    assert rec.keys == [b"t/1"]


def test_longest_prefix_wins_and_unhandled_rows_wait(sched: SchedulerService) -> None:
    """Rows go to the longest matching prefix; rows without a handler are kept for later."""
    short, long_ = Recorder(), Recorder()
    sched.register(b"a/", short)
    sched.register(b"a/b/", long_)
    now = sched.clock.seconds()
    sched.call_at(now + 1, b"a/x", b"")
    sched.call_at(now + 1, b"a/b/y", b"")
    sched.call_at(now + 1, b"zz", b"")
    sched.clock.advance(1.5)
    assert short.keys == [b"a/x"] and long_.keys == [b"a/b/y"]
    assert sched.store.stats()["due"] == 1
    late = Recorder()
    sched.register(b"zz", late)
    sched.clock.advance(61)
    assert late.keys == [b"zz"]


def test_due_rows_fire_in_slices_and_only_when_due(sched: SchedulerService) -> None:
    """25 due rows fire as slices of 10 on successive turns; future rows wait."""
    rec = Recorder()
    sched.register(b"k", rec)
    now = sched.clock.seconds()
    for i in range(25):
        sched.call_at(now + 1, b"k%02d" % i, b"")
    sched.call_at(now + 50, b"k-late", b"")
    sched.clock.advance(1.0)
    assert [len(c) for c in rec.calls] == [10, 10, 5]
    assert b"k-late" not in rec.keys
    sched.clock.advance(49)
    assert rec.keys[-1] == b"k-late"


def test_interval_schedule_nohaste_and_run_count(sched: SchedulerService) -> None:
    """Without nohaste a schedule runs at once; run_count stops it; counts are kept."""
    rec = Recorder()
    sched.register(b"s/", rec)
    result_of(sched.schedule(ScheduleSpec(interval=10, run_count=3), b"s/1", b"job"))
    sched.clock.advance(0)
    assert len(rec.calls) == 1
    for _ in range(50):
        sched.clock.advance(1)
    assert len(rec.calls) == 3 and sched.run_counts()[b"s/1"] == 3
    assert b"s/1" not in sched.schedules() and sched.store.stats()["due"] == 0
    times = [c[0][0] - START_TIME for c in rec.calls]
    assert times == [0, 10, 20]


def test_nohaste_cron_schedule_and_cancel(sched: SchedulerService) -> None:
    """A nohaste cron schedule first runs on its grid; cancel removes it."""
    rec = Recorder()
    sched.register(b"c/", rec)
    sched.schedule(ScheduleSpec(cron="* * * * *", nohaste=True), b"c/1", b"")
    sched.clock.advance(59)
    assert rec.calls == []
    sched.clock.advance(2)
    sched.clock.advance(60)
    assert len(rec.calls) == 2
    assert result_of(sched.cancel(b"c/1")) is True
    sched.clock.advance(600)
    assert len(rec.calls) == 2


def test_sweeps_run_in_slices(sched: SchedulerService) -> None:
    """A sweep is called with now and a budget, and again on the next turn while it has more."""
    calls: list[tuple[float, int]] = []
    remaining = [3]

    def sweep(now: float, budget: int) -> bool:
        calls.append((now, budget))
        remaining[0] -= 1
        return remaining[0] > 0

    sched.add_sweep("test", sweep, 5.0)
    sched.clock.advance(5)
    assert len(calls) == 3 and calls[0][1] == sched.sweep_budget
    sched.clock.advance(5)
    assert len(calls) == 4
    sched.stopService()
    sched.clock.advance(50)
    assert len(calls) == 4


def test_stopped_scheduler_fires_nothing(sched: SchedulerService) -> None:
    """After stopService nothing fires; a new service over the store picks the row up."""
    rec = Recorder()
    sched.register(b"t/", rec)
    sched.call_at(sched.clock.seconds() + 5, b"t/1", b"")
    sched.stopService()
    sched.clock.advance(10)
    assert rec.calls == []
    again = SchedulerService(sched.store, sched.clock)
    again.register(b"t/", rec)
    again.startService()
    sched.clock.advance(0)
    assert rec.keys == [b"t/1"]
    assert result_of(again.cancel(b"t/1")) is False


def test_missed_schedule_runs_once_after_downtime(sched: SchedulerService) -> None:
    """A schedule that missed ten runs while stopped runs once on restart, then on its grid."""
    rec = Recorder()
    sched.register(b"s/", rec)
    sched.schedule(ScheduleSpec(interval=10, nohaste=True), b"s/1", b"")
    sched.clock.advance(10)
    assert len(rec.calls) == 1
    sched.stopService()
    sched.clock.advance(100)
    again = SchedulerService(sched.store, sched.clock, slice_size=10)
    again.register(b"s/", rec)
    again.startService()
    sched.clock.advance(0)
    assert len(rec.calls) == 2
    sched.clock.advance(5)
    assert len(rec.calls) == 2
    sched.clock.advance(5)
    assert len(rec.calls) == 3
    assert again.run_counts()[b"s/1"] == 3
