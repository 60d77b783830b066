"""The readable dead-letter queue: ``<queue>.dlq`` served from the core's dead letters.

Decision (docs/protocols/vibemq.md "Dead-letter queue"): the core keeps a queue's dead letters
in its hidden list (``~dlq/<queue>``), which the hub's dead-letter operations
(``broker.dead_letters``, ``replay_dead_letters``, ``purge_dead_letters``) list, replay and
purge. Rather than a second copy in another core queue (two copies that could disagree after a
replay or purge), the VibeMQ name ``deadLetterQueueName`` (default ``<queue>.dlq``) is a *view*
of that one list: Subscribe delivers its dead letters (competing among the view's subscribers),
Ack purges the acked one, and a replay or purge by the tools is seen at once. New dead letters
are noticed by watching ``queue.dead_letter_count`` on the clock while someone subscribes.
"""

from __future__ import annotations

from typing import Any, Protocol

from twisted.logger import Logger
from twisted.python.failure import Failure

from mqhub.records import DeadLetter

log = Logger(namespace="mqhub.vibemq")

#: dead letters read per refill
PAGE = 500


class DlqSubscriber(Protocol):
    """What the view needs of a connection."""

    def deliver_dead(self, view: DeadLetterView, dead: list[DeadLetter]) -> None:
        """Send these dead letters as Deliver frames of the view's name."""


class DeadLetterView:
    """The subscribers and in-flight dead letters of one queue's DLQ name."""

    def __init__(self, broker: Any, clock: Any, source: str, name: str,
                 poll: float = 0.5) -> None:
        """:param source: the queue whose dead letters this serves; ``name`` the DLQ name."""
        self.broker = broker
        self.clock = clock
        self.source = source
        self.name = name
        self.poll = poll
        self.subscribers: list[DlqSubscriber] = []
        self.in_flight: dict[int, DlqSubscriber] = {}
        self._rr = 0
        self._seen = -1
        self._reading = False
        self._timer: Any = None

    def subscribe(self, sub: DlqSubscriber) -> None:
        """Add a subscriber and deliver what is waiting."""
        if sub not in self.subscribers:
            self.subscribers.append(sub)
        self._seen = -1
        self.refill()

    def unsubscribe(self, sub: DlqSubscriber) -> None:
        """Remove a subscriber; its unacked dead letters become available again."""
        if sub in self.subscribers:
            self.subscribers.remove(sub)
        for mid in [m for m, s in self.in_flight.items() if s is sub]:
            del self.in_flight[mid]
        self._seen = -1
        if self.subscribers:
            self.refill()
        elif self._timer is not None and self._timer.active():
            self._timer.cancel()
            self._timer = None

    def ack(self, sub: DlqSubscriber, msg_ids: list[int]) -> list[int]:
        """Purge the dead letters ``sub`` acked; return the ids it did not hold."""
        mine = [m for m in msg_ids if self.in_flight.get(m) is sub]
        for m in mine:
            del self.in_flight[m]
        if mine and self.broker.queue(self.source) is not None:
            self.broker.purge_dead_letters(self.source, mine)
        held = set(mine)
        return [m for m in msg_ids if m not in held]

    def refill(self) -> None:
        """Read the dead letters and deliver the ones nobody holds (then keep watching)."""
        if self._timer is None or not self._timer.active():
            self._timer = self.clock.callLater(self.poll, self._tick)
        q = self.broker.queue(self.source)
        if q is None or self._reading or not self.subscribers:
            return
        count = q.dead_letter_count
        if count == self._seen and len(self.in_flight) >= min(count, PAGE):
            return
        self._seen = count
        self._reading = True
        d = self.broker.dead_letters(self.source, limit=PAGE + len(self.in_flight))
        d.addCallback(self._got)
        d.addBoth(self._done)

    def _done(self, result: Any) -> None:
        """Reading finished; log a failure here, since returning None consumes it."""
        self._reading = False
        if isinstance(result, Failure):
            log.failure("vibemq: reading the dead letters of {queue} failed", result,
                        queue=self.source)

    def _got(self, dead: list[DeadLetter]) -> None:
        """Share the dead letters nobody holds round robin among the subscribers."""
        fresh = [d for d in dead if d.msg_id not in self.in_flight]
        if not fresh or not self.subscribers:
            return
        n = len(self.subscribers)
        groups: list[list[DeadLetter]] = [[] for _ in range(n)]
        for i, d in enumerate(fresh):
            groups[(self._rr + i) % n].append(d)
        self._rr += len(fresh)
        for sub, group in zip(list(self.subscribers), groups, strict=True):
            if group:
                for d in group:
                    self.in_flight[d.msg_id] = sub
                sub.deliver_dead(self, group)

    def _tick(self) -> None:
        """Periodic check while anyone subscribes."""
        self._timer = None
        if self.subscribers:
            self.refill()
