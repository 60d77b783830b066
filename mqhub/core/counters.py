"""Per-protocol message counters the broker keeps at batch granularity (admin, /metrics).

The core calls these once per publish batch, per delivery batch, per ack call and per
dead-letter batch, never once per message. Protocols whose own fast path moves messages
without the core (NATS core PUB/MSG) register a *source* that reports their published and
delivered figures; the core then counts only their acks (no message is counted twice).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from zope.interface import implementer

from mqhub.interfaces import ICounters

#: Keys of a source's report.
FIELDS = ("published", "delivered", "acked")


@implementer(ICounters)
class Counters:
    """Monotonic totals: published/delivered/acked per protocol, dead letters per reason,
    refused-and-retried messages per kind."""

    __slots__ = ("published", "delivered", "acked", "dead", "retried", "sources")

    def __init__(self) -> None:
        """Start every total at zero."""
        self.published: defaultdict[str, int] = defaultdict(int)
        self.delivered: defaultdict[str, int] = defaultdict(int)
        self.acked: defaultdict[str, int] = defaultdict(int)
        self.dead: defaultdict[str, int] = defaultdict(int)
        #: messages whose store commit was refused (a full disk) and that the core kept and
        #: tries again, per kind: "park" (a parked move), "delay" (a timed delay)
        self.retried: defaultdict[str, int] = defaultdict(int)
        #: protocol -> callable returning {"published": n, "delivered": n} for traffic the
        #: protocol moves without the core; added to the core's own figures.
        self.sources: dict[str, Callable[[], dict[str, int]]] = {}

    def publish(self, origin: str, n: int) -> None:
        """``n`` messages entered the core from protocol ``origin`` (one publish batch)."""
        if origin in self.sources:
            return  # counted by the protocol itself
        self.published[origin] += n

    def deliver(self, target: Any, n: int) -> None:
        """``n`` messages were handed to ``target`` (a queue consumer's or a live subscriber's batch)."""
        name = getattr(target, "protocol_name", "")
        if name not in self.sources:  # else counted by the protocol itself
            self.delivered[name] += n

    def ack(self, target: Any, n: int) -> None:
        """``n`` messages were acknowledged by a consumer whose target is ``target``."""
        self.acked[getattr(target, "protocol_name", "")] += n

    def dead_lettered(self, reason: str, n: int) -> None:
        """``n`` messages went to dead letters for ``reason``."""
        self.dead[reason] += n

    def retry(self, kind: str, n: int) -> None:
        """``n`` messages of ``kind`` were refused by the store and will be tried again."""
        self.retried[kind] += n

    def register_source(self, protocol: str, report: Callable[[], dict[str, int]]) -> None:
        """Add ``report()``'s figures to ``protocol``'s totals (natively moved traffic)."""
        self.sources[protocol] = report

    def snapshot(self) -> dict[str, dict[str, int]]:
        """``{protocol: {"published", "delivered", "acked"}}`` with every source added in."""
        out: dict[str, dict[str, int]] = {}
        for field, totals in (("published", self.published), ("delivered", self.delivered),
                              ("acked", self.acked)):
            for name, n in totals.items():
                out.setdefault(name or "unknown", dict.fromkeys(FIELDS, 0))[field] += n
        for name, report in self.sources.items():
            row = out.setdefault(name, dict.fromkeys(FIELDS, 0))
            for field, n in report().items():
                if field in row:
                    row[field] += n
        return out
