"""WriteBatch: one group of store writes, applied whole or not at all.

The core fills one batch per read (or per reactor turn) and hands it to
``IMessageStore.commit``; the store merges every batch of a turn into one transaction.
Operations are applied in this order: queue purges, entry puts, attempt updates, entry
deletes, due puts, due deletes, meta puts, meta deletes. This module imports no Twisted.

A purge may ask the store to *report* what it removes: the durable store then hands the ids
of the entries it deletes to the flow journal in the same transaction (issue 27: nothing
leaves silently).

Entry deletes are held by columns: per queue a list of *runs* ``(priority, ids)``, one tuple
per call, not one ``(priority, msg_id)`` key per message (an NSQ FIN of 1,000 ids is one run).
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import itemgetter

from mqhub.store.records import Entry, EntryKey

#: ``(priority, msg_ids)``: entries of one priority deleted from a queue
DeleteRun = tuple[int, list[int]]

_KEY0 = itemgetter(0)
_KEY1 = itemgetter(1)
#: the reports of a batch without reported purges (shared, never written to)
_NO_REPORTS: dict[str, tuple[int, str]] = {}


class WriteBatch:
    """A group of writes; plain lists keyed by queue so a commit costs one pass."""

    __slots__ = ("purges", "puts", "attempts", "deletes", "due_puts", "due_deletes",
                 "meta_puts", "meta_deletes", "archive", "publish_runs", "purge_reports")

    def __init__(self) -> None:
        """Start an empty batch."""
        self.purges: list[str] = []
        self.puts: dict[str, list[Entry]] = {}
        self.attempts: dict[str, list[tuple[int, int, int]]] = {}
        self.deletes: dict[str, list[DeleteRun]] = {}
        self.due_puts: list[tuple[float, bytes, bytes]] = []
        self.due_deletes: list[bytes] = []
        self.meta_puts: list[tuple[str, bytes]] = []
        self.meta_deletes: list[str] = []
        self.archive: set[str] = set()
        #: queues whose puts in this batch are one publish run (see :meth:`put_entries`)
        self.publish_runs: set[str] = set()
        #: purged queue -> (journal event code, reason) its removed entries are reported as
        self.purge_reports = _NO_REPORTS

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
                self.publish_runs.add(queue)
        else:
            got.extend(entries)
            self.publish_runs.discard(queue)
        if archive:
            self.archive.add(queue)

    def set_attempts(self, queue: str, items: Iterable[tuple[int, int, int]]) -> None:
        """Record ``(priority, msg_id, attempts)`` for existing entries (missing ones are ignored)."""
        self.attempts.setdefault(queue, []).extend(items)

    def delete_entries(self, queue: str, keys: Iterable[EntryKey]) -> None:
        """Remove the entries at ``(priority, msg_id)`` keys (missing ones are ignored).

        The keys are stored as one run per priority (:meth:`delete_ids`).
        """
        runs = self.deletes.setdefault(queue, [])
        keys = keys if isinstance(keys, list) else list(keys)
        if not keys:
            return
        prios = list(map(_KEY0, keys))
        p0 = prios[0]
        if prios.count(p0) == len(prios):  # one priority: C-level passes only
            runs.append((p0, list(map(_KEY1, keys))))
            return
        by_prio: dict[int, list[int]] = {}
        for priority, msg_id in keys:
            got = by_prio.get(priority)
            if got is None:
                by_prio[priority] = [msg_id]
            else:
                got.append(msg_id)
        runs.extend(by_prio.items())

    def delete_ids(self, queue: str, priority: int, ids: list[int]) -> None:
        """Remove the entries ``ids`` of ``priority`` on ``queue`` (missing ones are ignored).

        The batch keeps ``ids`` itself, not a copy: the caller must not change the list
        afterwards. No object per id is made (the FIN path).
        """
        runs = self.deletes.get(queue)
        if runs is None:
            self.deletes[queue] = [(priority, ids)]
        else:
            runs.append((priority, ids))

    def delete_runs(self, queue: str, runs: Iterable[DeleteRun]) -> None:
        """Add the ``(priority, ids)`` runs of another batch's :attr:`deletes` (merging)."""
        self.deletes.setdefault(queue, []).extend(runs)

    def deleted_ids(self, queue: str) -> list[list[int]]:
        """The id lists of every delete run of ``queue`` (priorities left out)."""
        return list(map(_KEY1, self.deletes.get(queue, ())))

    def purge_queue(self, queue: str, report: tuple[int, str] | None = None) -> None:
        """Remove every entry of ``queue`` (applied before this batch's puts).

        ``report``: ``(event, reason)``: the store journals each entry it removes as that
        flow-journal event (:mod:`mqhub.store.journal_format`) with ``reason``.
        """
        self.purges.append(queue)
        if report is not None:
            if self.purge_reports is _NO_REPORTS:
                self.purge_reports = {}
            self.purge_reports[queue] = report

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
                + sum(map(len, self.attempts.values()))
                + sum(len(run[1]) for runs in self.deletes.values() for run in runs)
                + len(self.due_puts) + len(self.due_deletes) + len(self.meta_puts)
                + len(self.meta_deletes))
