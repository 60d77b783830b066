"""WriteBatch: one group of store writes, applied whole or not at all.

The core fills one batch per read (or per reactor turn) and hands it to
``IMessageStore.commit``; the store merges every batch of a turn into one transaction.
Operations are applied in this order: queue purges, entry puts, attempt updates, entry
deletes, due puts, due deletes, meta puts, meta deletes. This module imports no Twisted.
"""

from __future__ import annotations

from collections.abc import Iterable

from mqhub.store.records import Entry, EntryKey


class WriteBatch:
    """A group of writes; plain lists keyed by queue so a commit costs one pass."""

    __slots__ = ("purges", "puts", "attempts", "deletes", "due_puts", "due_deletes",
                 "meta_puts", "meta_deletes", "archive", "runs")

    def __init__(self) -> None:
        """Start an empty batch."""
        self.purges: list[str] = []
        self.puts: dict[str, list[Entry]] = {}
        self.attempts: dict[str, list[tuple[int, int, int]]] = {}
        self.deletes: dict[str, list[EntryKey]] = {}
        self.due_puts: list[tuple[float, bytes, bytes]] = []
        self.due_deletes: list[bytes] = []
        self.meta_puts: list[tuple[str, bytes]] = []
        self.meta_deletes: list[str] = []
        self.archive: set[str] = set()
        #: queues whose puts in this batch are one publish run (see :meth:`put_entries`)
        self.runs: set[str] = set()

    def put_entries(self, queue: str, entries: Iterable[Entry], *, archive: bool = False,
                    run: bool = False) -> None:
        """Store (or overwrite) ``entries`` on ``queue``.

        ``archive=True`` marks this batch's puts on ``queue`` as archive tier: the durable
        store keeps their bodies in segment files whatever their size. ``run=True`` promises
        that every entry has the first one's fields except its id and body (one
        ``Broker.publish_batch`` run), so the store need not compare them entry by entry; the
        promise holds for the queue only while this is its only put in the batch.
        """
        got = self.puts.get(queue)
        if got is None:
            self.puts[queue] = list(entries)
            if run:
                self.runs.add(queue)
        else:
            got.extend(entries)
            self.runs.discard(queue)
        if archive:
            self.archive.add(queue)

    def set_attempts(self, queue: str, items: Iterable[tuple[int, int, int]]) -> None:
        """Record ``(priority, msg_id, attempts)`` for existing entries (missing ones are ignored)."""
        self.attempts.setdefault(queue, []).extend(items)

    def delete_entries(self, queue: str, keys: Iterable[EntryKey]) -> None:
        """Remove the entries at ``(priority, msg_id)`` keys (missing ones are ignored)."""
        self.deletes.setdefault(queue, []).extend(keys)

    def purge_queue(self, queue: str) -> None:
        """Remove every entry of ``queue`` (applied before this batch's puts)."""
        self.purges.append(queue)

    def put_due(self, when: float, key: bytes, payload: bytes) -> None:
        """Store a scheduler row; a row with the same ``key`` is replaced."""
        self.due_puts.append((when, key, payload))

    def delete_due(self, key: bytes) -> None:
        """Remove the scheduler row ``key`` (missing is ignored)."""
        self.due_deletes.append(key)

    def put_meta(self, key: str, value: bytes) -> None:
        """Store metadata ``value`` under ``key``."""
        self.meta_puts.append((key, value))

    def delete_meta(self, key: str) -> None:
        """Remove metadata ``key`` (missing is ignored)."""
        self.meta_deletes.append(key)

    def __bool__(self) -> bool:
        """True when the batch holds at least one write."""
        return bool(self.purges or self.puts or self.attempts or self.deletes or self.due_puts
                    or self.due_deletes or self.meta_puts or self.meta_deletes)

    def __len__(self) -> int:
        """Number of individual writes in the batch (for stats)."""
        return (len(self.purges) + sum(map(len, self.puts.values()))
                + sum(map(len, self.attempts.values())) + sum(map(len, self.deletes.values()))
                + len(self.due_puts) + len(self.due_deletes) + len(self.meta_puts)
                + len(self.meta_deletes))
