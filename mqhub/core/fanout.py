"""Fan-out delivery: every consumer of a queue gets its own copy of every message.

The fan-out strategy of a queue (the other is competing delivery, :mod:`mqhub.core.delivery`).
:class:`Fanout` owns one private memory sub-queue per consumer and hands each of them a copy of
every ready message; the queue keeps the stored entry until every sub-queue that received a
copy is done with it (acked, expired or dead-lettered). Messages published while nobody is
attached wait in the queue and go to the next subscriber; the last subscriber leaving returns
its unfinished copies to the queue's backlog.

A sub-queue reports to its :class:`FanoutLink` (which holds the ids it received and has not
finished); the Fanout reaches its queue only through the callbacks the queue wired when it made
it (delete stored copies, record dead letters, take returned copies, the last one left).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from mqhub.core.consumer import Consumer
from mqhub.core.empty import NO_LIST, NO_MAP
from mqhub.records import MSG_ID, get_msg_id
from mqhub.store.batch import WriteBatch
from mqhub.store.records import Entry, entry_order


class Subscriber(Protocol):
    """A fan-out sub-queue, as the Fanout uses it (a memory :class:`mqhub.core.queue.Queue`)."""

    incarnation: int

    @property
    def consumers(self) -> Sequence[Consumer]:
        """Its one consumer (none once closed)."""

    @property
    def in_flight(self) -> int:
        """Copies delivered and not finished."""

    def attach(self, target: Any, *, ready: int = 0, credit: int = 0,
               timeout: float | None = None, tag: Any = None) -> Consumer:
        """Attach the subscriber's consumer."""

    def put(self, entries: list[Entry], batch: WriteBatch | None, persist: bool,
            now: float, uniform: bool = False, run: bool = False) -> None:
        """Take copies."""

    def owner_of(self, msg_id: int) -> Consumer | None:
        """The consumer holding ``msg_id`` in flight."""

    def reset(self) -> None:
        """Forget every message it holds."""

    def close(self) -> None:
        """It is gone: drop everything."""


class FanoutLink:
    """What one sub-queue reports to its Fanout, and the ids it received and has not finished."""

    __slots__ = ("_fanout", "sub", "open")

    def __init__(self, fanout: Fanout) -> None:
        """A link to ``fanout``; its sub-queue is set once made."""
        self._fanout = fanout
        self.sub: Subscriber | None = None
        self.open: set[int] = set()

    def done(self, entries: list[Entry]) -> None:
        """The sub-queue is finished with ``entries`` (acked, expired or removed)."""
        self._fanout.done(self, entries)

    def dead(self, entries: list[Entry], reason: str, error: str | None, now: float) -> None:
        """The sub-queue's copies of ``entries`` died."""
        self._fanout.dead(self, entries, reason, error, now)

    def release(self) -> None:
        """The sub-queue's consumer left."""
        self._fanout.release(self)


class Fanout:
    """The subscriber sub-queues of one fan-out queue and the copies they hold.

    :ivar claimed: msg_id -> the queue's entry, for every message handed out and not yet
        finished by every sub-queue that got it.
    """

    __slots__ = ("_make", "_finished", "_dead", "_returned", "_left", "links", "claimed",
                 "_refs", "_seq")

    def __init__(self, make: Callable[[int, FanoutLink], Subscriber],
                 finished: Callable[[list[Entry]], None],
                 dead: Callable[[list[Entry], str, str | None, float], None],
                 returned: Callable[[list[Entry]], None],
                 left: Callable[[], None]) -> None:
        """Wired by the queue: ``make(seq, link)`` builds a sub-queue; ``finished(entries)``
        deletes the stored copies every subscriber is done with; ``dead(...)`` records a
        subscriber's dead copies in the queue's dead letters; ``returned(entries)`` takes back
        the copies of the last subscriber to leave; ``left()`` tells that the last one left."""
        self._make = make
        self._finished = finished
        self._dead = dead
        self._returned = returned
        self._left = left
        self.links: list[FanoutLink] = NO_LIST
        self.claimed: dict[int, Entry] = NO_MAP
        self._refs: dict[int, int] = NO_MAP
        self._seq = 0

    @property
    def subs(self) -> list[Subscriber]:
        """The sub-queues, one per consumer."""
        return [link.sub for link in self.links if link.sub is not None]

    def attach(self, target: Any, ready: int, credit: int, timeout: float | None,
               tag: Any) -> Consumer:
        """A private memory sub-queue for a new consumer, and the consumer on it."""
        self._seq += 1
        link = FanoutLink(self)
        sub = link.sub = self._make(self._seq, link)
        if not self.links:
            self.links = []
            if not self.claimed:
                self.claimed = {}
                self._refs = {}
        self.links.append(link)
        return sub.attach(target, ready=ready, credit=credit, timeout=timeout, tag=tag)

    def spread(self, entries: list[Entry], now: float) -> None:
        """Hand every sub-queue a copy of ``entries`` (refcounted here)."""
        links = list(self.links)
        ids = list(map(get_msg_id, entries))
        self.claimed.update(zip(ids, entries, strict=False))
        self._refs.update(dict.fromkeys(ids, len(links)))
        for link in links:
            link.open.update(ids)
            assert link.sub is not None
            link.sub.put(list(entries), None, False, now)

    def done(self, link: FanoutLink, entries: list[Entry]) -> None:
        """``link``'s sub-queue is finished with ``entries``: release the copies."""
        finished: list[Entry] = []
        for e in entries:
            mid = e[MSG_ID]
            if mid not in link.open:
                continue
            link.open.discard(mid)
            orig = self._drop_copy(mid)
            if orig is not None:
                finished.append(orig)
        if finished:
            self._finished(finished)

    def _drop_copy(self, mid: int) -> Entry | None:
        """One copy of ``mid`` is finished: the queue's entry when it was the last copy."""
        refs = self._refs
        left = refs.get(mid, 1) - 1
        if left > 0:
            refs[mid] = left
            return None
        refs.pop(mid, None)
        return self.claimed.pop(mid, None)

    def dead(self, link: FanoutLink, entries: list[Entry], reason: str, error: str | None,
             now: float) -> None:
        """A subscriber's copies died: record them in the queue's dead letters, release them."""
        self._dead(entries, reason, error, now)
        self.done(link, entries)

    def release(self, link: FanoutLink) -> None:
        """A subscriber left: drop its copies; if it was the last, unfinished messages return."""
        if link in self.links:
            self.links.remove(link)
        back: list[Entry] = []
        finished: list[Entry] = []
        for mid in link.open:
            orig = self._drop_copy(mid)
            if orig is not None:
                (finished if self.links else back).append(orig)
        if finished:
            self._finished(finished)
        link.open = set()
        if link.sub is not None:
            link.sub.close()
        if back:
            back.sort(key=entry_order)
            self._returned(back)
        if not self.links:
            self._left()

    def clear(self) -> None:
        """The queue was emptied: so are the sub-queues and the copies they hold."""
        for link in self.links:
            if link.sub is not None:
                link.sub.reset()
                link.sub.incarnation += 1
            link.open = set()
        if self.claimed:
            self.claimed.clear()
        if self._refs:
            self._refs.clear()

    def close(self) -> None:
        """The queue is deleted: so are the sub-queues."""
        links, self.links = self.links, NO_LIST
        for link in links:
            if link.sub is not None:
                link.sub.close()

    def consumer_count(self) -> int:
        """Consumers attached (one per sub-queue)."""
        return sum(len(link.sub.consumers) for link in self.links if link.sub is not None)

    def in_flight(self) -> int:
        """Copies in flight over every sub-queue."""
        return sum(link.sub.in_flight for link in self.links if link.sub is not None)

    def owner_of(self, msg_id: int) -> Consumer | None:
        """The consumer holding a copy of ``msg_id`` in flight."""
        for link in self.links:
            if link.sub is not None:
                c = link.sub.owner_of(msg_id)
                if c is not None:
                    return c
        return None
