"""Pure schedule math: interval and cron specs, their next run times and their stored form.

This module imports neither Twisted nor zope. Cron expressions use croniter and are read in UTC.
A schedule that fell behind (the broker was down) runs once and then realigns to the future: it
never replays a backlog of missed runs.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any


def _croniter() -> Any:
    """The croniter class, imported on first use: a hub without cron schedules never loads
    croniter and dateutil (about 15 ms of startup)."""
    from croniter import croniter

    return croniter



@dataclass(frozen=True)
class ScheduleSpec:
    """A repeating schedule.

    :ivar interval: seconds between runs (> 0), or None for a cron schedule.
    :ivar cron: a cron expression (5 or 6 fields), or None for an interval schedule.
    :ivar nohaste: when False the first run is immediate; when True it is one period later.
    :ivar run_count: how many runs in total, then the schedule removes itself (-1 = forever).
    """

    interval: float | None = None
    cron: str | None = None
    nohaste: bool = False
    run_count: int = -1

    def __post_init__(self) -> None:
        """Validate: exactly one of interval / cron, a sane run_count."""
        if (self.interval is None) == (self.cron is None):
            raise ValueError("a schedule needs exactly one of interval or cron")
        if self.interval is not None and not (self.interval > 0 and math.isfinite(self.interval)):
            raise ValueError("interval must be a positive number of seconds")
        if self.cron is not None and not _croniter().is_valid(self.cron):
            raise ValueError(f"invalid cron expression {self.cron!r}")
        if self.run_count == 0 or self.run_count < -1:
            raise ValueError("run_count must be -1 (forever) or positive")

    def first_time(self, now: float) -> float:
        """When the first run is due for a schedule installed at ``now``."""
        if not self.nohaste:
            return now
        return self._after(now)

    def _after(self, t: float) -> float:
        """The first run time strictly after ``t`` on this schedule's own grid."""
        if self.interval is not None:
            return t + self.interval
        start = datetime.fromtimestamp(t, tz=UTC)
        return float(_croniter()(self.cron, start).get_next(float))

    def next_time(self, ran_at: float, now: float) -> float:
        """The run after the one due at ``ran_at``, skipping every run already missed by ``now``."""
        if self.interval is not None:
            nxt = ran_at + self.interval
            if nxt <= now:
                missed = math.floor((now - ran_at) / self.interval)
                nxt = ran_at + (missed + 1) * self.interval
            return nxt
        return self._after(max(ran_at, now))

    def encode(self) -> bytes:
        """The stored form (JSON)."""
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> ScheduleSpec:
        """Read the stored form back."""
        raw = json.loads(data)
        return cls(interval=raw.get("interval"), cron=raw.get("cron"),
                   nohaste=bool(raw.get("nohaste")), run_count=int(raw.get("run_count", -1)))
