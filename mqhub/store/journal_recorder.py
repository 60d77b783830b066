"""The flow journal's recorder: batch-level calls from the core, columnar chunks for the store.

The broker holds one recorder as ``broker.journal`` (a :class:`NullRecorder` when the journal
is off). Each call describes one *batch* (one publish, one delivery round, one FIN/REQ/reject
call...). The batches of the hot path (a ``publish_batch``, a delivery round, an ack whose ids
the core passes) are packed into columns at once, with a few C-level passes over entries
that are still in the CPU cache; the others cost O(1): the recorder keeps a reference to the
batch's entry list and turns it into columns only when the store's group commit asks for
the chunk (:meth:`JournalRecorder.take_chunk`, called inside the write transaction, in the
writer thread, where reading every entry back from memory cost about three times as much:
benchmarks/results/nsq.md). Memory-tier traffic
(NATS core, mq9 notify, memory queues, live subscribers) is only counted, per address and
second, never per message.

No Twisted import: the clock is any object with ``seconds()``.
"""

from __future__ import annotations

import threading
from itertools import groupby
from operator import itemgetter
from typing import Any

from mqhub.store.batch import WriteBatch
from mqhub.store.journal_format import (
    ACKED,
    COUNTER_DELIVERED,
    COUNTER_PUBLISHED,
    DEAD_LETTERED,
    DELIVERED,
    EXPIRED,
    PUBLISHED,
    PURGED,
    REQUEUED,
    ChunkBuilder,
    column,
    repeated,
)

_ID = itemgetter(0)
_PRIO = itemgetter(1)
_ATT = itemgetter(2)
_BODY = itemgetter(7)
_ORIGIN = itemgetter(8)
#: pending batches kept at most while no commit drains them (then the oldest are dropped)
MAX_PENDING = 200_000


_WITH_ATTEMPT = frozenset((DELIVERED, REQUEUED, DEAD_LETTERED))


def _add_published(chunk: ChunkBuilder, ts: int, queues: tuple[str, ...], entries: list[Any],
                   address: str) -> None:
    """Add the runs of one publish: one per durable queue (and per origin, if they differ)."""
    origins = list(map(_ORIGIN, entries))
    if origins.count(origins[0]) == len(origins):  # C-speed check
        groups = [(origins[0], entries)]
    else:
        groups = [(o, list(g)) for o, g in groupby(entries, _ORIGIN)]
    for origin, g in groups:
        ids = list(map(_ID, g))
        sizes = list(map(len, map(_BODY, g)))
        prios = list(map(_PRIO, g))
        for name in queues:
            chunk.add_run(PUBLISHED, ts, name, address, origin or "", "", ids, sizes, prios)


def _attempts(entries: list[Any]) -> Any:
    """The attempt column of ``entries``: packed at once when they share one count."""
    atts = list(map(_ATT, entries))
    if atts.count(atts[0]) == len(atts):  # C-level check
        return repeated("attempt", atts[0], len(atts))
    return column("attempt", atts)


class NullRecorder:
    """The journal switched off: every call does nothing."""

    enabled = False

    def published(self, address: str, entries: list[Any], queues: Any, persist: bool,
                  route: Any, uniform: bool = False) -> None:
        """Ignore a publish."""

    def delivered(self, queue: Any, entries: list[Any], ids: list[int] | None = None) -> None:
        """Ignore a delivery round."""

    def acked(self, queue: Any, entries: list[Any], ids: list[int] | None = None) -> None:
        """Ignore acks."""

    def requeued(self, queue: Any, entries: list[Any], reason: str | None) -> None:
        """Ignore requeues."""

    def dead_lettered(self, queue: Any, entries: list[Any], reason: str) -> None:
        """Ignore dead letters."""

    def expired(self, queue: Any, entries: list[Any], reason: str = "") -> None:
        """Ignore expiries."""

    def purge_report(self, queue: Any, reason: str,
                     expired: bool = False) -> tuple[int, str] | None:
        """Nothing to report (see :meth:`JournalRecorder.purge_report`)."""
        return None

    def taken(self, queue: Any, entries: list[Any]) -> None:
        """Ignore pulled (read-and-consumed) entries."""

    def traffic(self, address: str, origin: str, messages: int, nbytes: int) -> None:
        """Ignore an adapter's own traffic count."""


NULL_RECORDER = NullRecorder()


class JournalRecorder(NullRecorder):
    """Collects batch references and memory-tier counters until the next group commit.

    :ivar dropped_batches: batches dropped because no commit drained them (store stuck).
    """

    enabled = True

    def __init__(self, clock: Any, *, flush_interval: float = 1.0) -> None:
        """:param clock: has ``seconds()`` (and ``callLater`` for :meth:`start`)."""
        self.clock = clock
        self.flush_interval = flush_interval
        self._lock = threading.Lock()
        # (event, time, queue(s), entries or None when ``cols`` is set, reason, cols)
        self._pending: list[tuple[int, float, Any, Any, str, Any]] = []
        self._counters: dict[tuple[int, str, str, int], list[int]] = {}
        self._store: Any = None
        self._call: Any = None
        self._took = False
        #: rows recorded since the last chunk, and whether the next commit must take a chunk
        self.rows = 0
        self.force = False
        #: a durable publish waits: the commit that stores it must carry its record (a
        #: confirmed message always has its ``published`` event, kill -9 included)
        self.published_waiting = False
        self.dropped_batches = 0
        self.chunks = 0

    # -- batch-level calls from the core (reactor thread) -------------------------------------

    def _add(self, event: int, queues: Any, entries: list[Any] | None, extra: str,
             cols: tuple[Any, ...] | None = None, n: int = 0) -> None:
        """Remember one batch: a reference to its entries (columns built at the commit), or
        its ``cols`` (ids, sizes, priorities, attempts, origin) packed already.

        ``extra`` is the reason (the address for a publish).
        """
        item = (event, self.clock.seconds(), queues, entries, extra, cols)
        with self._lock:
            if len(self._pending) >= MAX_PENDING:
                self.dropped_batches += 1  # the store is stuck: keep what is queued, drop this
                return
            self._pending.append(item)
            self.rows += n or len(entries or ())

    def _count(self, address: str, origin: str, kind: int, messages: int, nbytes: int) -> None:
        """Add to the memory-tier counter of ``address`` for the current second."""
        key = (int(self.clock.seconds()), address, origin, kind)
        with self._lock:
            c = self._counters.get(key)
            if c is None:
                self._counters[key] = [messages, nbytes]
            else:
                c[0] += messages
                c[1] += nbytes

    def published(self, address: str, entries: list[Any], queues: Any, persist: bool,
                  route: Any, uniform: bool = False) -> None:
        """A publish of ``entries`` to ``address`` reaching ``queues`` and ``route``'s live targets.

        ``uniform``: every entry has the first one's origin and priority (``publish_batch``).
        """
        if not entries:
            return
        durable = tuple(q.name for q in queues if q.durable) if persist else ()
        live = len(route.targets) + len(route.groups)
        if durable:
            self.published_waiting = True
            if uniform:
                # one origin and priority: pack the columns now, while the new entries are
                # in the cache (the writer would read each one back from memory)
                first = entries[0]
                n = len(entries)
                self._add(PUBLISHED, durable, None, address, (
                    column("msg_id", list(map(_ID, entries))),
                    column("size", list(map(len, map(_BODY, entries)))),
                    bytes((first[1],)) * n, None, first[8]), n)
            else:
                self._add(PUBLISHED, durable, entries, address)
        if durable and not live:
            return
        n = len(entries)
        nbytes = sum(map(len, map(_BODY, entries)))
        origin = entries[0][8]
        if not durable:
            self._count(address, origin, COUNTER_PUBLISHED, n, nbytes)
        if live:
            self._count(address, origin, COUNTER_DELIVERED, n * live, nbytes * live)

    def delivered(self, queue: Any, entries: list[Any], ids: list[int] | None = None) -> None:
        """One delivery round of ``queue`` (attempts already count this delivery).

        ``ids``: the entries' message ids, in order, when the caller has them: the columns
        are then packed now, while the entries are in the cache.
        """
        if queue.durable:
            if ids is None:
                self._add(DELIVERED, queue.name, entries, "")
            else:
                self._add(DELIVERED, queue.name, None, "",
                          (column("msg_id", ids), None, None, _attempts(entries), ""), len(ids))
        elif entries:
            first = entries[0]
            self._count(first[5], first[8], COUNTER_DELIVERED, len(entries),
                        sum(map(len, map(_BODY, entries))))

    def acked(self, queue: Any, entries: list[Any], ids: list[int] | None = None) -> None:
        """Entries acknowledged (finished) on ``queue``; ``ids`` as for :meth:`delivered`
        (copied here: the caller may reuse its list)."""
        if queue.durable:
            if ids is None:
                self._add(ACKED, queue.name, entries, "")
            else:
                self._add(ACKED, queue.name, None, "",
                          (column("msg_id", ids), None, None, None, ""), len(ids))

    def requeued(self, queue: Any, entries: list[Any], reason: str | None) -> None:
        """Entries returned to ``queue`` (REQ, timeout, detach)."""
        if queue.durable:
            self._add(REQUEUED, queue.name, entries, reason or "")

    def dead_lettered(self, queue: Any, entries: list[Any], reason: str) -> None:
        """Entries moved to ``queue``'s dead letters with ``reason``."""
        if queue.durable:
            self._add(DEAD_LETTERED, queue.name, entries, reason or "")

    def expired(self, queue: Any, entries: list[Any], reason: str = "") -> None:
        """Entries of ``queue`` that expired before delivery (``reason``: ``ttl``, their own
        time ran out)."""
        if queue.durable:
            self._add(EXPIRED, queue.name, entries, reason)

    def purge_report(self, queue: Any, reason: str,
                     expired: bool = False) -> tuple[int, str] | None:
        """What the store reports of a purge of durable ``queue``'s entries (the argument of
        ``WriteBatch.purge_queue``): each entry it removes becomes a ``purged`` event (or
        ``expired``, when the queue itself expired) with ``reason``, in the purge's own
        transaction. None for a memory-tier queue (its traffic is only counted)."""
        if not queue.durable:
            return None
        return (EXPIRED if expired else PURGED, reason)

    def taken(self, queue: Any, entries: list[Any]) -> None:
        """Entries pulled and consumed at once (mq9 QUERY): a delivery and an ack."""
        if queue.durable and entries:
            out = [(e[0], e[1], e[2] + 1, *e[3:]) for e in entries]
            self._add(DELIVERED, queue.name, out, "")
            self._add(ACKED, queue.name, out, "")

    def traffic(self, address: str, origin: str, messages: int, nbytes: int) -> None:
        """An adapter's own count of messages it routed without the core (NATS core PUBs)."""
        self._count(address, origin, COUNTER_PUBLISHED, messages, nbytes)

    # -- the store side (writer thread or reactor) --------------------------------------------

    def pending(self) -> bool:
        """True when something waits for the next commit."""
        return bool(self._pending or self._counters)

    def take_chunk(self) -> bytes | None:
        """Swap out everything recorded so far and return it as one encoded chunk (or None)."""
        with self._lock:
            pending, self._pending = self._pending, []
            counters, self._counters = self._counters, {}
            self.rows = 0
            self.force = False
            self.published_waiting = False
        self._took = True
        if not pending and not counters:
            return None
        chunk = ChunkBuilder()
        for event, now, queues, entries, extra, cols in pending:
            ts = int(now * 1_000_000)
            if cols is not None:
                ids, sizes, prios, atts, origin = cols
                if event == PUBLISHED:
                    for name in queues:
                        chunk.add_run(event, ts, name, extra, origin or "", "", ids, sizes, prios)
                else:
                    chunk.add_run(event, ts, queues, "", "", extra, ids, None, None, atts)
            elif event == PUBLISHED:
                _add_published(chunk, ts, queues, entries, extra)
            else:
                # other events carry the message id, queue, attempt and reason; address and
                # origin come from the message's published row (readers join on msg_id)
                chunk.add_run(event, ts, queues, "", "", extra, list(map(_ID, entries)), None,
                              None, _attempts(entries) if event in _WITH_ATTEMPT else None)
        for (second, address, origin, kind), (messages, nbytes) in counters.items():
            chunk.add_counter(second, address, origin or "", kind, messages, nbytes)
        self.chunks += 1
        return chunk.encode()

    # -- idle flushing (reactor) --------------------------------------------------------------

    def start(self, store: Any) -> None:
        """Commit an empty batch every ``flush_interval`` while records wait and no commit ran."""
        self._store = store
        self._call = self.clock.callLater(self.flush_interval, self._tick)

    def _tick(self) -> None:
        """Flush records that no group commit carried since the last tick."""
        self._call = self.clock.callLater(self.flush_interval, self._tick)
        if not self._took and self.pending():
            self.force = True
            self.flush()
        self._took = False

    def flush(self) -> Any:
        """Ask the store for a group commit that carries what is pending; return its Deferred."""
        if self._store is None:
            return None
        d = self._store.commit(WriteBatch())
        d.addErrback(lambda _: None)  # a failed flush keeps its records for the next commit
        return d

    def stop(self) -> Any:
        """Stop the timer and flush what is left; return the flush's Deferred (or None)."""
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None
        self.force = True
        return self.flush() if self.pending() else None
