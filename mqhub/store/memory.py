"""MemoryStore: the reference IMessageStore, kept in dicts; for unit tests and memory-class hubs.

It defines the behaviour the conformance suite checks, so it favours clarity over speed.
By default a commit applies at once and returns a fired Deferred; given a ``clock`` it
groups every batch of one turn and applies them on the next ``callLater(0)``, like the
LMDB store's group commit, so tests can observe "not yet confirmed".
"""

from __future__ import annotations

import bisect
from typing import Any

from twisted.internet.defer import Deferred, fail, succeed
from zope.interface import implementer

from mqhub.errors import StoreClosed, StoreError
from mqhub.interfaces import IMessageStore
from mqhub.store.batch import WriteBatch
from mqhub.store.records import (
    ATTEMPTS,
    EXPIRES_AT,
    MAX_PRIORITY,
    MIN_PRIORITY,
    PRIORITY,
    Entry,
    EntryKey,
    entry_key,
    ready_order,
)


@implementer(IMessageStore)
class MemoryStore:
    """An IMessageStore in memory; nothing survives the process."""

    def __init__(self, clock: Any = None, durability: str = "none") -> None:
        """:param clock: an IReactorTime for grouped commits, or None to commit immediately."""
        self.durability = durability
        self._clock = clock
        self._queues: dict[str, dict[tuple[int, int], Entry]] = {}
        self._order: dict[str, list[tuple[int, int]]] = {}
        self._due: dict[bytes, tuple[float, bytes]] = {}
        self._meta: dict[str, bytes] = {}
        self._pending: list[tuple[WriteBatch, Deferred[None]]] = []
        self._flush_call: Any = None
        self._open = False
        self.commits = 0

    # lifecycle -----------------------------------------------------------------------------

    def open(self) -> None:
        """Mark the store open (nothing to recover in memory)."""
        self._open = True

    @property
    def is_open(self) -> bool:
        """Whether the store is open (admin /healthz)."""
        return self._open

    def close(self) -> Deferred[None]:
        """Apply pending groups and close."""
        self._flush()
        self._open = False
        return succeed(None)

    # writes --------------------------------------------------------------------------------

    def commit(self, batch: WriteBatch) -> Deferred[None]:
        """Apply ``batch`` now, or with the turn's group when a clock was given."""
        if not self._open:
            return fail(StoreClosed("store is closed"))
        for entries in batch.puts.values():
            for entry in entries:
                p = entry[PRIORITY]
                if not isinstance(p, int) or not MIN_PRIORITY <= p <= MAX_PRIORITY:
                    return fail(StoreError(f"priority {p!r} is outside 0..9"))
        if self._clock is None:
            self._apply(batch)
            self.commits += 1
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._pending.append((batch, d))
        if self._flush_call is None:
            self._flush_call = self._clock.callLater(0, self._flush)
        return d

    def _flush(self) -> None:
        """Apply every pending batch as one group and fire their Deferreds."""
        self._flush_call = None
        pending, self._pending = self._pending, []
        if not pending:
            return
        for batch, _ in pending:
            self._apply(batch)
        self.commits += 1
        for _, d in pending:
            d.callback(None)

    def _apply(self, batch: WriteBatch) -> None:
        """Apply one batch's operations in the documented order."""
        for queue in batch.purges:
            self._queues.pop(queue, None)
            self._order.pop(queue, None)
        for queue, entries in batch.puts.items():
            if not entries:
                continue
            q = self._queues.setdefault(queue, {})
            order = self._order.setdefault(queue, [])
            for entry in entries:
                key = entry_key(entry)
                if key not in q:
                    bisect.insort(order, ready_order(key))
                q[key] = entry
        for queue, items in batch.attempts.items():
            q = self._queues.get(queue, {})
            for priority, msg_id, attempts in items:
                key = (priority, msg_id)
                old = q.get(key)
                if old is not None:
                    q[key] = old[:ATTEMPTS] + (attempts,) + old[ATTEMPTS + 1:]  # type: ignore[assignment]
        for queue, runs in batch.deletes.items():
            if queue not in self._queues:
                continue
            q, order = self._queues[queue], self._order[queue]
            for priority, ids in runs:
                for msg_id in ids:
                    if q.pop((priority, msg_id), None) is not None:
                        del order[bisect.bisect_left(order, (-priority, msg_id))]
            if not q:
                del self._queues[queue]
                del self._order[queue]
        for when, due_key, payload in batch.due_puts:
            self._due[due_key] = (when, payload)
        for due_key in batch.due_deletes:
            self._due.pop(due_key, None)
        for mkey, value in batch.meta_puts:
            self._meta[mkey] = value
        for mkey in batch.meta_deletes:
            self._meta.pop(mkey, None)

    # reads ---------------------------------------------------------------------------------

    def read_entries(self, queue: str, after: EntryKey | None, limit: int) -> Deferred[list[Entry]]:
        """Fire with up to ``limit`` entries after ``after`` in ready order."""
        q = self._queues.get(queue)
        if not q:
            return succeed([])
        order = self._order[queue]
        start = 0 if after is None else bisect.bisect_right(order, ready_order(after))
        keys = order[start:start + limit]
        return succeed([q[(-p, i)] for p, i in keys])

    def count_entries(self, queue: str) -> Deferred[int]:
        """Fire with the number of entries on ``queue``."""
        return succeed(len(self._queues.get(queue, ())))

    def queue_names(self) -> Deferred[list[str]]:
        """Fire with the sorted names of queues holding entries."""
        return succeed(sorted(self._queues))

    def read_due(self, until: float, limit: int) -> Deferred[list[tuple[float, bytes, bytes]]]:
        """Fire with due rows whose time is at or before ``until``, earliest first."""
        rows = sorted((when, key, payload) for key, (when, payload) in self._due.items()
                      if when <= until)
        return succeed(rows[:limit])

    def next_due(self) -> Deferred[float | None]:
        """Fire with the earliest due time, or None."""
        return succeed(min((w for w, _ in self._due.values()), default=None))

    def read_expired(self, until: float, limit: int) -> Deferred[list[tuple[str, EntryKey, float]]]:
        """Fire with up to ``limit`` ``(queue, (priority, msg_id), expires_at)`` expiring by ``until``.

        The TTL sweep's index; entries without expiry never appear; ties in any order.
        """
        rows = sorted((e[EXPIRES_AT], name, key) for name, q in self._queues.items()
                      for key, e in q.items() if 0 < e[EXPIRES_AT] <= until)
        return succeed([(name, key, when) for when, name, key in rows[:limit]])

    def get_meta(self, key: str) -> Deferred[bytes | None]:
        """Fire with the value under ``key`` or None."""
        return succeed(self._meta.get(key))

    def scan_meta(self, prefix: str) -> Deferred[list[tuple[str, bytes]]]:
        """Fire with the ``(key, value)`` pairs under ``prefix`` in key order."""
        return succeed(sorted((k, v) for k, v in self._meta.items() if k.startswith(prefix)))

    def stats(self) -> dict[str, Any]:
        """Return simple counters."""
        return {
            "kind": "memory",
            "queues": len(self._queues),
            "entries": sum(len(q) for q in self._queues.values()),
            "due": len(self._due),
            "meta": len(self._meta),
            "commits": self.commits,
        }
