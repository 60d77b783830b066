"""Competing delivery: a queue's consumers, each ready message to one of them.

The default delivery strategy of a queue (the other is fan-out, :mod:`mqhub.core.fanout`). It
keeps the queue's consumers and decides the order of a dispatch round: every consumer with room
gets one batch per round, and each round starts one consumer further (round robin), so a
consumer attached first is not always served first. Moving the entries (out of the window, into
flight, to the consumer's target) is the queue's.
"""

from __future__ import annotations

from mqhub.core.consumer import Consumer
from mqhub.core.empty import NO_LIST


class Competing:
    """The consumers of one queue, served round robin.

    :ivar consumers: attached consumers, in attach order.
    """

    __slots__ = ("consumers", "_start")

    def __init__(self) -> None:
        """No consumer yet."""
        self.consumers: list[Consumer] = NO_LIST
        self._start = 0

    def add(self, consumer: Consumer) -> None:
        """Serve ``consumer`` from the next round on."""
        if self.consumers is NO_LIST:
            self.consumers = []
        self.consumers.append(consumer)

    def remove(self, consumer: Consumer) -> None:
        """Stop serving ``consumer``."""
        if consumer in self.consumers:
            self.consumers.remove(consumer)

    def turn(self) -> list[Consumer]:
        """The consumers in this round's order (one further than the last round's)."""
        consumers = self.consumers
        n = len(consumers)
        start = self._start % n
        self._start += 1
        return consumers[start:] + consumers[:start] if start else list(consumers)

    def consumer_count(self) -> int:
        """Consumers attached."""
        return len(self.consumers)

    def drop_all(self) -> list[Consumer]:
        """Forget every consumer (the queue was deleted); return them."""
        gone, self.consumers = self.consumers, NO_LIST
        return list(gone)
