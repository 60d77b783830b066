"""Queues with an expiry of their own (an mq9 mailbox's TTL): deleted when their time comes.

A durable queue's expiry is a due row ``qx/<queue>`` the scheduler hands back; a memory queue
(or any queue of a broker without a scheduler) waits in one heap served by one clock timer
armed for the earliest, since a timer per queue would cost more than an idle queue itself.
:class:`QueueExpiry` is one object the broker holds; it deletes a queue through the callable
the broker gives it, which checks the queue is still the live one of its name.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mqhub.store.batch import WriteBatch

if TYPE_CHECKING:  # pragma: no cover
    from mqhub.core.queue import Queue

log = logging.getLogger(__name__)

EXPIRY_PREFIX = b"qx/"


class QueueExpiry:
    """The expiry of every queue that has one."""

    def __init__(self, clock: Any, scheduler: Any, expired: Callable[[Queue, float], None],
                 named: Callable[[str], Queue | None]) -> None:
        """:param expired: ``expired(queue, now)`` deletes ``queue`` if it is still the live
        queue of its name and its time has come. :param named: the declared queue of a name."""
        self._clock = clock
        self._scheduler = scheduler
        self._expired = expired
        self._named = named
        self._heap: list[tuple[float, int, Queue]] = []
        self._seq = 0
        self._call: Any = None
        self._at = float("inf")
        self.started = False
        if scheduler is not None:
            scheduler.register(EXPIRY_PREFIX, self.on_due)

    def arm(self, q: Queue) -> None:
        """(Re)arm the deletion of ``q`` at its ``expires_at`` (0 = cancel)."""
        key = EXPIRY_PREFIX + q.name.encode()
        if self._scheduler is not None and q.durable:
            if q.expires_at:
                self._scheduler.call_at(q.expires_at, key, b"")
            else:
                self._scheduler.cancel(key)
        elif q.expires_at:
            self.arm_timed(q)

    def arm_timed(self, q: Queue) -> None:
        """Delete ``q`` at its ``expires_at`` from the shared heap and timer (memory queues, or
        no scheduler)."""
        self._seq += 1
        heapq.heappush(self._heap, (q.expires_at, self._seq, q))
        if q.expires_at < self._at:
            self._arm_timer(q.expires_at)

    def forget(self, name: str, batch: WriteBatch) -> None:
        """Queue ``name`` is deleted: drop its expiry row in ``batch`` (the heap forgets it
        when its time comes: it is no longer the live queue of its name)."""
        batch.delete_due(EXPIRY_PREFIX + name.encode())

    def _arm_timer(self, when: float) -> None:
        """(Re)arm the shared timer for ``when``."""
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._at = when
        self._call = self._clock.callLater(max(0.0, when - self._clock.seconds()), self._run)

    def _run(self) -> None:
        """The shared timer fired: delete every queue whose time has come, then re-arm."""
        self._call = None
        self._at = float("inf")
        now = self._clock.seconds()
        heap = self._heap
        while heap and heap[0][0] <= now:
            q = heapq.heappop(heap)[2]
            try:
                self._expired(q, now)
            except Exception:
                log.exception("expiring queue %r failed", q.name)
        if heap:
            self._arm_timer(heap[0][0])

    def on_due(self, rows: list[tuple[float, bytes, bytes]], batch: WriteBatch,
               now: float) -> None:
        """Scheduler handler for ``qx/`` rows: delete queues whose own TTL ran out."""
        if not self.started:
            for _, key, payload in rows:
                batch.put_due(now + 1.0, key, payload)
            return
        for _, key, _ in rows:
            q = self._named(key[len(EXPIRY_PREFIX):].decode("utf-8", "replace"))
            if q is not None:
                self._expired(q, now)

    def stop(self) -> None:
        """Cancel the shared timer."""
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None
        self._at = float("inf")
