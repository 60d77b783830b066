"""In-memory mirrors of an LMDB store index, and the changes one write transaction makes to them.

The store keeps queue ids, entry counts and segment counters in memory (loaded on open) so
reads and stats need no transaction; a write transaction records its changes in a
:class:`TxnChanges` and :meth:`IndexState.apply` publishes them once the transaction committed.
This module imports neither Twisted nor LMDB.
"""

from __future__ import annotations

import threading
from typing import Any


class TxnChanges:
    """Changes one write transaction makes to the mirrors (applied after commit), plus the
    rows :class:`mqhub.store.row_writer.RowWriter` gathers while applying a batch."""

    __slots__ = ("txn", "qids", "counts", "seg_delta", "seg_end", "next_qid", "plain",
                 "plain_q", "ready_new", "removed")

    def __init__(self, txn: Any, next_qid: int) -> None:
        """Start tracking changes of ``txn``."""
        self.txn = txn
        self.qids: dict[str, int] = {}
        self.counts: dict[str, int] = {}
        self.seg_delta: dict[int, int] = {}
        self.seg_end: dict[int, int] = {}
        self.next_qid = next_qid
        #: plain ``entries`` rows gathered for one batch, and ``{qid bytes: queue}`` they go to
        self.plain: list[tuple[bytes, bytes]] = []
        self.plain_q: dict[bytes, str] = {}
        #: new entries whose ``ready`` groups are still to be written: ``{qid|pbyte: [msg_id]}``
        self.ready_new: dict[bytes, list[int]] = {}
        #: reported purges: ``(queue, journal event, reason, msg_ids)`` (WriteBatch.purge_queue)
        self.removed: list[tuple[str, int, str, list[int]]] = []


class IndexState:
    """Queue ids and counts, the next queue id, and per-segment live counts and ends.

    ``lock`` guards the mirrors between the writer thread (which applies changes) and readers
    in the reactor thread that walk them (expiry names, stats).
    """

    def __init__(self) -> None:
        """Start empty (the store fills it from the index on open)."""
        self.qids: dict[str, int] = {}
        self.counts: dict[str, int] = {}
        self.next_qid = 1
        self.seg_live: dict[int, int] = {}
        self.seg_end: dict[int, int] = {}
        #: segments nothing references any more, deleted once no snapshot holds the lock
        self.unlink_pending: set[int] = set()
        self.lock = threading.Lock()

    def names_by_qid(self) -> dict[int, str]:
        """Return ``{qid: queue name}``."""
        with self.lock:
            return {qid: name for name, qid in self.qids.items()}

    def apply(self, t: TxnChanges, active_segment: int) -> None:
        """Publish a committed transaction's changes (counts, queue ids, segment counters);
        segments left without live messages (other than ``active_segment``) become pending
        unlinks."""
        with self.lock:
            self.next_qid = t.next_qid
            for name, qid in t.qids.items():
                self.qids[name] = qid
            for name, count in t.counts.items():
                if count:
                    self.counts[name] = count
                else:
                    self.counts.pop(name, None)
                    self.qids.pop(name, None)
            if t.seg_delta or t.seg_end:
                for seg, delta in t.seg_delta.items():
                    self.seg_live[seg] = self.seg_live.get(seg, 0) + delta
                self.seg_end.update(t.seg_end)
                for seg, live in list(self.seg_live.items()):
                    if live <= 0 and seg != active_segment:
                        del self.seg_live[seg]
                        self.seg_end.pop(seg, None)
                        self.unlink_pending.add(seg)
