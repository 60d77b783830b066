"""The cyclic garbage collector's settings for the broker process (set by the twistd tap only).

CPython starts a young-generation collection whenever the tracked containers allocated minus
those freed exceed ``threshold0`` (700 by default). The hot paths are batch-oriented: one read
builds a thousand entry tuples, delivery tuples, key tuples and lists at once, so the default
threshold is crossed by every batch's *transient* objects and the collector runs about once
per 600 messages, walking every young container each time (and the whole heap now and then).
Measured in the server under ``mqhub bench nsq`` (MPUB 16 B): 1,250 young and 4 full
collections in a 4 s run, about 0.5 µs of the 3.5 µs of server CPU per message; with
``threshold0`` at 50,000 one or none ran and the server spent 2.8–2.9 µs per message
(benchmarks/results/nsq.md). Reference cycles are still collected, only later: the threshold
counts live growth, so the collector runs when 50,000 more containers stay alive than died.

That count is net of frees, and the frees of old objects count too: a queue whose consumer
acknowledges (frees) old entries as fast as its producer adds new ones keeps the count near
zero while the young generation grows without a collection. With the core's remembered tail
holding up to ~322,000 entries of 16 B (benchmarks/results/nsq.md part 7), one young collection
then walked ~330,000 new objects in one go: 37-44 ms with the reactor stopped, and the longest
gap between two deliveries in ``mqhub bench fairness`` went from 9-19 ms to 52-81 ms. A young
collection every ``SWEEP_INTERVAL`` seconds (:func:`young_sweeps`) bounds the young generation
by what 50 ms allocate; the total work is the same (each object is walked once while young).
"""

from __future__ import annotations

import gc

from twisted.application.service import Service
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall

#: containers allocated (net of those freed) before a young-generation collection
GEN0_THRESHOLD = 50_000
#: seconds between the young-generation collections :func:`young_sweeps` runs
SWEEP_INTERVAL = 0.05


def tune_gc() -> None:
    """Raise the young-generation threshold above what one batch allocates transiently."""
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)


def collect_young() -> int:
    """Collect the young generation once; returns the number of unreachable objects found."""
    return gc.collect(0)


class YoungSweeps(Service):
    """Collects the young generation every ``interval`` seconds on ``clock`` while running
    (once at start, like Twisted's TimerService, whose module costs ~15 ms of startup)."""

    def __init__(self, clock: IReactorTime, interval: float) -> None:
        """Sweep on ``clock``."""
        self.interval = interval
        self.call = LoopingCall(collect_young)
        self.call.clock = clock

    def startService(self) -> None:
        """Collect now and every interval."""
        super().startService()
        self.call.start(self.interval, now=True)

    def stopService(self) -> None:
        """Stop collecting."""
        if self.call.running:
            self.call.stop()
        super().stopService()


def young_sweeps(clock: IReactorTime, interval: float = SWEEP_INTERVAL) -> YoungSweeps:
    """A service collecting the young generation every ``interval`` seconds on ``clock``
    (see the module docstring: the threshold alone can leave it to grow without bound)."""
    return YoungSweeps(clock, interval)
