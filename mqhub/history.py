"""A bounded in-memory history of the hub's figures: what the admin page charts.

A :class:`History` samples once a ``step`` (1 s) from counters the core and the protocols already
keep (nothing is counted per message for it): per-protocol publish, deliver and ack rates and
connections, dead-letter rates by reason, queue totals, process memory and store commit latency,
and per-queue depth, in flight, put rate and dead letters. Two :class:`Timeline` rings hold it:
``10m`` (one point a step, 600 points) and ``24h`` (one point a minute, the mean of that minute's
steps, 1,440 points).

Memory stays bounded whatever the number of queues: only the *tracked* queues have series of
their own (the busiest by put rate and the deepest, ``top`` in all, plus the few an operator is
looking at: :meth:`History.watch`); every other queue is summed into the label ``_other``. The
per-queue figures of the untracked queues come from a scan spread over the steps (at most
``scan_slice`` queues a step), so one step costs the reactor a few milliseconds even with
100,000 queues; the tracked queues are read every step.
"""

from __future__ import annotations

import heapq
import math
import os
import resource
import sys
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice, zip_longest
from operator import attrgetter
from typing import Any

from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from mqhub.introspect import Inspector, add_commit_observer, remove_commit_observer

log = Logger(namespace="mqhub.history")

#: Seconds between two samples (the ``10m`` window's resolution).
STEP = 1.0
#: Points of the fine ring (10 minutes of 1 s steps).
FINE_POINTS = 600
#: Seconds of one point of the coarse ring.
COARSE_STEP = 60.0
#: Points of the coarse ring (24 hours of 1 min).
COARSE_POINTS = 1440
#: Queues with series of their own (half the busiest by put rate, half the deepest).
TOP_QUEUES = 20
#: Queues kept tracked because an operator opened their detail (the oldest view goes first).
MAX_WATCHED = 10
#: Seconds a watched queue stays tracked after its detail was last read.
WATCH_SECONDS = 600.0
#: Queues read per step by the scan of the untracked ones.
SCAN_SLICE = 2000
#: The label of the sum over the untracked queues.
OTHER = "_other"
#: Windows the API serves, and the ring each reads.
WINDOWS = ("10m", "24h")
#: Per-queue families and the Queue figure each samples (``rate`` is derived from ``message_count``).
QUEUE_FAMILIES = ("queue_depth", "queue_in_flight", "queue_rate", "queue_dead")
#: Every family a History records (the ``series`` names of ``GET /api/history``).
FAMILIES = ("published", "delivered", "acked", "connections", "dead_lettered", "totals",
            *QUEUE_FAMILIES, "process", "store")

NAN = math.nan
#: A series key: (family, label), e.g. ("published", "nsq") or ("queue_depth", "_other").
Key = tuple[str, str]
_QUEUE_FIGURES = attrgetter("depth", "in_flight", "message_count", "dead_letter_count")


def rss_bytes() -> float:
    """The process's resident set size in bytes (/proc on Linux, else the peak from getrusage)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return float(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return float(peak if sys.platform == "darwin" else peak * 1024)


class Timeline:
    """Fixed-size rings of float points sharing one time axis; NaN marks "no sample".

    A series first seen mid-way is NaN before; one not written for a whole ring is dropped, so
    the number of series is bounded by what the sampler keeps sampling.
    """

    def __init__(self, size: int) -> None:
        """An empty timeline of ``size`` points."""
        self.size = size
        self.count = 0
        self.times = array("d", bytes(8 * size))
        self.series: dict[Key, array[float]] = {}
        self._written: dict[Key, int] = {}

    def append(self, t: float, sample: dict[Key, float]) -> None:
        """Add one point at time ``t``: ``sample``'s values, NaN for series it lacks."""
        pos = self.count % self.size
        self.times[pos] = t
        count = self.count
        for key, values in self.series.items():
            value = sample.get(key)
            if value is None:
                values[pos] = NAN
            else:
                values[pos] = value
                self._written[key] = count
        for key, value in sample.items():
            if key not in self.series:
                values = array("d", [NAN]) * self.size
                values[pos] = value
                self.series[key] = values
                self._written[key] = count
        self.count = count + 1

    def forget_stale(self) -> None:
        """Drop the series not written for a whole ring."""
        for key, written in list(self._written.items()):
            if self.count - written >= self.size:
                self.drop(key)

    def drop(self, key: Key) -> None:
        """Forget one series."""
        self.series.pop(key, None)
        self._written.pop(key, None)

    def order(self, last: int | None = None) -> list[int]:
        """Positions of the held points, oldest first (only the newest ``last`` when given)."""
        held = min(self.count, self.size)
        if last is not None:
            held = min(held, last)
        start = self.count - held
        return [(start + i) % self.size for i in range(held)]

    def read(self, keys: Iterable[Key]) -> tuple[list[float], dict[Key, list[float | None]]]:
        """(times, {key: values}) of the held points, oldest first; NaN becomes None."""
        positions = self.order()
        times = [self.times[p] for p in positions]
        out: dict[Key, list[float | None]] = {}
        for key in keys:
            values = self.series.get(key)
            if values is not None:
                out[key] = [None if values[p] != values[p] else values[p] for p in positions]
        return times, out

    def mean_of_last(self, n: int) -> dict[Key, float]:
        """Per series, the mean of its numbers among the newest ``n`` points (none: left out)."""
        positions = self.order(n)
        out: dict[Key, float] = {}
        for key, values in self.series.items():
            total, seen = 0.0, 0
            for p in positions:
                v = values[p]
                if v == v:
                    total += v
                    seen += 1
            if seen:
                out[key] = total / seen
        return out

    def nbytes(self) -> int:
        """Bytes the rings' points take."""
        return (len(self.series) + 1) * self.size * 8


class CommitStats:
    """The store's group commits during one step: how many, their seconds, the longest."""

    __slots__ = ("count", "seconds", "longest")

    def __init__(self) -> None:
        """No commit yet."""
        self.count = 0
        self.seconds = 0.0
        self.longest = 0.0


@dataclass
class Scan:
    """One pass over every queue, a slice a step, ranking them and summing the untracked."""

    queues: Iterator[Any]
    started: float
    #: family -> total over every scanned queue
    sums: dict[str, float] = field(default_factory=lambda: dict.fromkeys(QUEUE_FAMILIES, 0.0))
    #: bounded min-heaps of (score, name, figures) of the busiest and the deepest queues
    busiest: list[tuple[float, str, tuple[float, ...]]] = field(default_factory=list)
    deepest: list[tuple[float, str, tuple[float, ...]]] = field(default_factory=list)
    #: figures of the queues that were tracked (watched ones included) when read
    kept: dict[str, tuple[float, ...]] = field(default_factory=dict)
    queue_count: int = 0


class History:
    """Samples a hub every ``step`` seconds into a ``10m`` and a ``24h`` :class:`Timeline`.

    ``start()`` begins sampling on ``clock`` (the hub's reactor, or a Clock in tests) and adds a
    store commit observer; ``stop()`` ends both. ``sample()`` takes one sample now.
    """

    def __init__(self, inspector: Inspector, *, step: float = STEP, fine_points: int = FINE_POINTS,
                 coarse_step: float = COARSE_STEP, coarse_points: int = COARSE_POINTS,
                 top: int = TOP_QUEUES, scan_slice: int = SCAN_SLICE,
                 memory: Callable[[], float] = rss_bytes) -> None:
        """:param top: queues with series of their own, besides the watched ones.
        :param memory: returns the process memory in bytes (injected in tests).
        """
        self.inspector = inspector
        self.clock = inspector.hub.clock
        self.step = step
        self.coarse_step = coarse_step
        self.top = top
        self.scan_slice = scan_slice
        self.memory = memory
        self.fine = Timeline(fine_points)
        self.coarse = Timeline(coarse_points)
        self.tracked: set[str] = set()
        self.watched: dict[str, float] = {}  # queue -> when its watch ends
        self._minute: float | None = None  # start of the coarse point being gathered
        self._in_minute = 0
        self._last_t: float | None = None
        self._totals: dict[Key, int] = {}  # monotonic totals at the previous sample
        self._queue_last: dict[str, tuple[int, float]] = {}  # tracked queue -> (count, when)
        self._scan: Scan | None = None
        self._counts: dict[str, int] = {}  # message counts at the last scan (non-zero only)
        self._last_scan: float | None = None
        self._other: dict[str, float] = {}
        self._queue_total = 0
        self._commits = CommitStats()  # since the last sample
        self._loop: LoopingCall | None = None

    # running ------------------------------------------------------------------------------

    def start(self) -> None:
        """Sample every ``step`` seconds from now on, and observe the store's commits."""
        if self._loop is not None:
            return
        add_commit_observer(self.inspector.hub.store, self.observe_commit)
        self._loop = LoopingCall(self._tick)
        self._loop.clock = self.clock
        self._loop.start(self.step, now=True)

    def stop(self) -> None:
        """Stop sampling (the history is kept)."""
        if self._loop is None:
            return
        if self._loop.running:
            self._loop.stop()
        self._loop = None
        remove_commit_observer(self.inspector.hub.store, self.observe_commit)

    def _tick(self) -> None:
        """One LoopingCall step: a sample that fails is logged, and sampling goes on."""
        try:
            self.sample()
        except Exception:  # noqa: BLE001 - the history must never stop the admin listener
            log.failure("history sample failed")

    def observe_commit(self, seconds: float) -> None:
        """A store commit took ``seconds`` (a commit observer; may run in the writer thread)."""
        c = self._commits
        c.count += 1
        c.seconds += seconds
        if seconds > c.longest:
            c.longest = seconds

    def watch(self, name: str) -> None:
        """Track queue ``name`` for the next ``WATCH_SECONDS`` (its detail is being looked at)."""
        now = self.clock.seconds()
        self.watched.pop(name, None)
        self.watched[name] = now + WATCH_SECONDS
        while len(self.watched) > MAX_WATCHED:
            del self.watched[next(iter(self.watched))]
        if self.inspector.broker.queue(name) is not None:
            self.tracked.add(name)  # sampled from the next step (the next scan's end settles _other)

    # sampling -----------------------------------------------------------------------------

    def sample(self) -> None:
        """Take one sample at the clock's time and add it to the rings."""
        t = float(self.clock.seconds())
        dt = t - self._last_t if self._last_t is not None else 0.0
        sample: dict[Key, float] = {}
        self._protocols(sample, dt)
        self._dead_lettered(sample, dt)
        self._advance_scan(t)
        self._queues(sample, t)
        self._process(sample, dt)
        self._last_t = t
        self._append(t, sample)

    def _rate(self, key: Key, total: int, dt: float) -> float:
        """Per-second rate of the monotonic ``total`` of ``key`` since the previous sample (0 at
        the first sample)."""
        before = self._totals.get(key, 0)  # a total first seen now started from zero
        self._totals[key] = total
        if dt <= 0:
            return 0.0
        return round(max(0, total - before) / dt, 2)

    def _protocols(self, sample: dict[Key, float], dt: float) -> None:
        """Published, delivered and acked rates and open connections, per protocol."""
        ins = self.inspector
        for protocol, row in ins.totals().items():
            for family in ("published", "delivered", "acked"):
                key = (family, protocol)
                sample[key] = self._rate(key, row.get(family, 0), dt)
        for protocol, n in ins.connection_counts().items():
            sample[("connections", protocol)] = float(n)

    def _dead_lettered(self, sample: dict[Key, float], dt: float) -> None:
        """Messages dead-lettered per second, by reason."""
        for reason, n in list(self.inspector.broker.counters.dead.items()):
            key = ("dead_lettered", reason)
            sample[key] = self._rate(key, n, dt)

    def _process(self, sample: dict[Key, float], dt: float) -> None:
        """Process memory and the store commits since the previous sample."""
        sample[("process", "rss_bytes")] = self.memory()
        c, self._commits = self._commits, CommitStats()
        if c.count:
            sample[("store", "commit_ms_mean")] = round(c.seconds / c.count * 1000.0, 3)
            sample[("store", "commit_ms_max")] = round(c.longest * 1000.0, 3)
        sample[("store", "commits")] = round(c.count / dt, 2) if dt > 0 else 0.0

    # queues -------------------------------------------------------------------------------

    def _advance_scan(self, t: float) -> None:
        """Scan the next slice of queues; at the end of a pass choose the tracked queues.

        The loop is the one place whose cost grows with the number of queues: figures are
        summed in locals, and a queue is ranked only when it beats the smallest of a full
        ranking (most queues of a big hub are idle and cost four attribute reads).
        """
        scan = self._scan
        if scan is None:
            scan = self._scan = Scan(iter(self.inspector.broker.queues()), t)
        period = scan.started - self._last_scan if self._last_scan is not None else 0.0
        half = max(1, self.top // 2)
        size = 2 * half
        counts, tracked, kept = self._counts, self.tracked, scan.kept
        busiest, deepest = scan.busiest, scan.deepest
        busy_floor = busiest[0][0] if len(busiest) >= size else 0.0
        deep_floor = deepest[0][0] if len(deepest) >= size else 0.0
        depth_sum = in_flight_sum = rate_sum = dead_sum = 0.0
        read = live = 0
        for q in islice(scan.queues, self.scan_slice):
            read += 1
            if q.deleted:
                continue
            live += 1
            depth, in_flight, total, dead = _QUEUE_FIGURES(q)
            name = q.name
            depth_sum += depth
            in_flight_sum += in_flight
            dead_sum += dead
            rate = 0.0
            if total:  # counts are kept (in place, one dict) for queues that had traffic
                before = counts.get(name)
                if before != total:
                    counts[name] = total
                    if before is not None and period > 0 and total > before:
                        rate = (total - before) / period
                        rate_sum += rate
            if rate > busy_floor or depth > deep_floor or name in tracked:
                figures = (float(depth), float(in_flight), round(rate, 2), float(dead))
                if name in tracked:
                    kept[name] = figures
                if rate > busy_floor:
                    _push(busiest, size, (rate, name, figures))
                    if len(busiest) >= size:
                        busy_floor = busiest[0][0]
                if depth > deep_floor:
                    _push(deepest, size, (float(depth), name, figures))
                    if len(deepest) >= size:
                        deep_floor = deepest[0][0]
        sums = scan.sums
        sums["queue_depth"] += depth_sum
        sums["queue_in_flight"] += in_flight_sum
        sums["queue_rate"] += rate_sum
        sums["queue_dead"] += dead_sum
        scan.queue_count += live
        if read == self.scan_slice:
            return  # more queues to read next step
        self._finish_scan(scan, half)
        self._scan = None

    def _finish_scan(self, scan: Scan, half: int) -> None:
        """Choose the tracked queues and sum the rest into ``_other``."""
        busiest = sorted(scan.busiest, reverse=True)
        deepest = sorted(scan.deepest, reverse=True)
        figures = {name: f for _, name, f in busiest + deepest}
        figures.update(scan.kept)
        # the top ``half`` of each ranking, then (hysteresis) tracked queues still among the
        # top 2 * half, then the runners-up, until ``top`` queues are chosen
        ranked = dict.fromkeys(_interleave(busiest[:half], deepest[:half]))
        runners_up = _interleave(busiest[half:], deepest[half:])
        for name in [n for n in runners_up if n in self.tracked] + runners_up:
            if len(ranked) >= self.top:
                break
            ranked[name] = None
        now = self.clock.seconds()
        for name, until in list(self.watched.items()):
            if until <= now:
                del self.watched[name]
        broker = self.inspector.broker
        chosen = {name for name in [*ranked, *self.watched] if broker.queue(name) is not None}
        other = dict(scan.sums)
        for name in chosen:
            f = figures.get(name)
            if f is None:  # watched after the scan had passed it: its figures now
                depth, in_flight, _, dead = _QUEUE_FIGURES(broker.queue(name))
                f = (float(depth), float(in_flight), 0.0, float(dead))
            for family, value in zip(QUEUE_FAMILIES, f, strict=True):
                other[family] -= value
        self._other = {family: max(0.0, round(v, 2)) for family, v in other.items()}
        for name in self.tracked - chosen:
            self._queue_last.pop(name, None)
            for family in QUEUE_FAMILIES:
                self.fine.drop((family, name))
                self.coarse.drop((family, name))
        self.tracked = chosen
        if len(self._counts) > scan.queue_count:  # queues were deleted: forget their counts
            self._counts = {n: c for n, c in self._counts.items() if broker.queue(n) is not None}
        self._last_scan = scan.started
        self._queue_total = scan.queue_count

    def _queues(self, sample: dict[Key, float], t: float) -> None:
        """The tracked queues read now, ``_other`` from the last full scan, and the totals."""
        totals = dict.fromkeys(QUEUE_FAMILIES, 0.0)
        broker = self.inspector.broker
        for name in self.tracked:
            q = broker.queue(name)
            if q is None:
                continue
            depth, in_flight, total, dead = _QUEUE_FIGURES(q)
            last = self._queue_last.get(name)
            if last is None:
                last = (self._counts.get(name, total), self._last_scan or t)
            rate = max(0, total - last[0]) / (t - last[1]) if t > last[1] else 0.0
            self._queue_last[name] = (total, t)
            for family, value in zip(QUEUE_FAMILIES, (depth, in_flight, round(rate, 2), dead),
                                     strict=True):
                sample[(family, name)] = float(value)
                totals[family] += value
        if self._last_scan is None:
            return  # no pass over every queue yet: no _other, no totals
        for family, value in self._other.items():
            sample[(family, OTHER)] = value
            totals[family] += value
        sample[("totals", "queues")] = float(self._queue_total)
        sample[("totals", "depth")] = totals["queue_depth"]
        sample[("totals", "in_flight")] = totals["queue_in_flight"]
        sample[("totals", "dead_letters")] = totals["queue_dead"]

    # rings --------------------------------------------------------------------------------

    def _append(self, t: float, sample: dict[Key, float]) -> None:
        """Add the sample to the fine ring; at a minute's end, the minute's mean to the coarse."""
        minute = math.floor(t / self.coarse_step) * self.coarse_step
        if self._minute is not None and minute != self._minute and self._in_minute:
            self.coarse.append(self._minute, self.fine.mean_of_last(self._in_minute))
            self._in_minute = 0
            self.fine.forget_stale()
            self.coarse.forget_stale()
        self._minute = minute
        self.fine.append(t, sample)
        self._in_minute = min(self._in_minute + 1, self.fine.size)

    # reading ------------------------------------------------------------------------------

    def timeline(self, window: str) -> Timeline:
        """The ring behind ``window`` (``10m`` or ``24h``).

        :raises ValueError: for another window.
        """
        if window == "10m":
            return self.fine
        if window == "24h":
            return self.coarse
        raise ValueError(f"unknown window {window!r}; one of {', '.join(WINDOWS)}")

    def read(self, window: str = "10m", series: Iterable[str] = ()) -> dict[str, Any]:
        """The ``GET /api/history`` document: times and, per family asked, {label: values}.

        ``series`` holds family names (``published``) or one series each (``queue_depth:NAME``);
        empty: every family.

        :raises ValueError: for an unknown window or family.
        """
        line = self.timeline(window)
        wanted = [s for s in series if s] or list(FAMILIES)
        keys: list[Key] = []
        for name in wanted:
            family, _, label = name.partition(":")
            if family not in FAMILIES:
                raise ValueError(f"unknown series {family!r}; one of {', '.join(FAMILIES)}")
            keys += [k for k in line.series if k[0] == family and (not label or k[1] == label)]
        times, values = line.read(sorted(keys))
        out: dict[str, dict[str, list[float | None]]] = {}
        for name in wanted:
            out.setdefault(name.partition(":")[0], {})
        for (family, label), points in values.items():
            out[family][label] = points
        step = self.step if window == "10m" else self.coarse_step
        return {"window": window, "step": step, "t": [round(x, 3) for x in times],
                "series": out}

    def queue_history(self, name: str, window: str = "10m") -> dict[str, Any]:
        """One queue's series (``depth``, ``in_flight``, ``rate``, ``dead``) for its detail;
        ``tracked`` says whether it has series of its own yet.

        :raises ValueError: for an unknown window.
        """
        line = self.timeline(window)
        times, values = line.read([(family, name) for family in QUEUE_FAMILIES])
        out: dict[str, Any] = {"window": window, "tracked": name in self.tracked,
                               "t": [round(x, 3) for x in times]}
        for family in QUEUE_FAMILIES:
            out[family.removeprefix("queue_")] = values.get((family, name), [None] * len(times))
        return out

    def nbytes(self) -> int:
        """Bytes the rings' points take (the scan's per-queue counts are on top)."""
        return self.fine.nbytes() + self.coarse.nbytes()


def _interleave(*rankings: list[tuple[float, str, tuple[float, ...]]]) -> list[str]:
    """Names of the rankings taken in turn (first of each, then second of each...), once each."""
    names: dict[str, None] = {}
    for row in zip_longest(*rankings):
        for item in row:
            if item is not None:
                names.setdefault(item[1], None)
    return list(names)


def _push(heap: list[tuple[float, str, tuple[float, ...]]], size: int,
          item: tuple[float, str, tuple[float, ...]]) -> None:
    """Keep the ``size`` largest items of a min-heap."""
    if len(heap) < size:
        heapq.heappush(heap, item)
    elif item > heap[0]:
        heapq.heapreplace(heap, item)


__all__ = ["History", "Timeline", "FAMILIES", "WINDOWS", "OTHER", "rss_bytes"]
