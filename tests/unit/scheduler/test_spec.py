"""Pure interval and cron math."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from mqhub.scheduler.spec import ScheduleSpec

T0 = datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC).timestamp()


def test_interval_first_and_next() -> None:
    """Without nohaste the first run is now; with it, one interval later."""
    assert ScheduleSpec(interval=5).first_time(T0) == T0
    assert ScheduleSpec(interval=5, nohaste=True).first_time(T0) == T0 + 5
    spec = ScheduleSpec(interval=10)
    assert spec.next_time(T0, T0) == T0 + 10
    assert spec.next_time(T0, T0 + 10) == T0 + 20


def test_interval_skips_missed_runs() -> None:
    """After downtime the next run is the first grid point in the future, not a backlog."""
    spec = ScheduleSpec(interval=10)
    assert spec.next_time(T0, T0 + 95) == T0 + 100


def test_cron_in_utc() -> None:
    """A cron schedule runs on its grid in UTC."""
    spec = ScheduleSpec(cron="*/5 * * * *", nohaste=True)
    first = spec.first_time(T0)
    assert datetime.fromtimestamp(first, tz=UTC) == datetime(2026, 1, 1, 12, 5,
                                                                      tzinfo=UTC)
    nxt = spec.next_time(first, first)
    assert nxt - first == 300
    assert spec.next_time(first, first + 3600 + 1) == first + 3900


def test_validation_and_round_trip() -> None:
    """Bad specs raise ValueError; encode/decode round-trips."""
    for bad in [dict(), dict(interval=1, cron="* * * * *"), dict(interval=0),
                dict(interval=-1), dict(cron="not a cron"), dict(interval=1, run_count=0),
                dict(interval=float("inf"))]:
        with pytest.raises(ValueError):
            ScheduleSpec(**bad)  # type: ignore[arg-type]
    spec = ScheduleSpec(cron="0 * * * *", nohaste=True, run_count=4)
    assert ScheduleSpec.decode(spec.encode()) == spec
