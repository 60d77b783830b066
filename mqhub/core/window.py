"""The queue's ready window: per-priority deques holding a prefix of its ready order.

Ready entries are kept per priority in deques, ordered by msg_id; a durable queue keeps at most
``window`` of them in memory and the rest is its stored backlog (:mod:`mqhub.core.backlog`).
This module adds entries (admitting them to the window or past its horizon to the backlog),
evicts its tail to the backlog when it overflows, and pops entries in ready order.
:class:`QueueWindow` sits on :class:`mqhub.core.backlog.QueueBacklog` in the queue's class chain.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections import deque
from itertools import repeat
from operator import itemgetter

from mqhub.core.backlog import NO_IDS, NO_LIST, NO_MAP, WAIT_COMMIT, QueueBacklog
from mqhub.core.tail import ready_key
from mqhub.store.batch import WriteBatch
from mqhub.store.records import Entry

_NO_MAP = NO_MAP
_NO_IDS = NO_IDS
_NO_LIST = NO_LIST
_POPLEFT = deque.popleft
_BODY = itemgetter(7)

#: default body bytes all durable queues' windows may hold together (Broker ``windows_bytes``,
#: the account ``broker.windows``): four full windows of the default ``window_bytes``, as much
#: as all remembered tails together (``TAILS_BYTES``); past it a window's byte budget shrinks
#: to what is left and the rest of its backlog stays in the store
WINDOWS_BYTES = 256 << 20
#: the least byte budget a window keeps when the broker-wide account is full (or its own
#: ``window_bytes`` when that is smaller): a page of small bodies (4096 of 16 B) still fits,
#: and a window always keeps at least one entry, however big, so every queue keeps moving
WINDOW_FLOOR = 64 << 10


class QueueWindow(QueueBacklog):
    """Ready window of a queue (see the module docstring)."""

    __slots__ = ("_ready", "_prios", "_nready", "_volatile")

    def _window_init(self) -> None:
        """Empty window, no stored backlog."""
        self._backlog_init()
        self._ready: dict[int, deque[Entry]] = _NO_MAP
        self._prios: list[int] = _NO_LIST     # priorities with a deque, descending
        self._nready = 0
        self._volatile: set[int] = _NO_IDS    # ids of persist=False entries in a durable queue

    def _window_clear(self) -> None:
        """Forget every ready entry and the stored backlog (the queue was emptied)."""
        for d in self._ready.values():
            d.clear()
        self._nready = 0
        self._held(-self._nbytes)
        self._volatile = _NO_IDS
        for rec in self._pend.values():
            rec[4] = None
            rec[5] = 0
        self._backlog_clear()

    @property
    def in_memory(self) -> int:
        """Ready entries in the window (the rest of :attr:`depth` is the stored backlog)."""
        return self._nready

    @property
    def awaiting_commit(self) -> int:
        """Stored puts waiting for their batch's commit before they enter the window (counted
        in :attr:`depth`, not yet deliverable)."""
        return self._awaiting()

    @property
    def may_expire(self) -> bool:
        """True once an entry with its own expiry was added."""
        return self._may_expire

    def pop_ready(self, n: int) -> list[Entry]:
        """Remove and return up to ``n`` ready entries of the window in ready order."""
        return self._pop_ready(n)

    def insert_ready(self, entries: list[Entry]) -> None:
        """Put entries back into the window at their places (fan-out copies returning)."""
        self._insert_many(entries)

    # -- window -----------------------------------------------------------------------------

    def _admit(self, entries: list[Entry], batch: WriteBatch | None, stored: bool,
               uniform: bool, run: bool = False) -> None:
        """Add ``entries`` (in id order) to the window or, past its horizon, to the stored
        backlog; their store writes (when ``stored``) go into ``batch``.

        ``uniform`` promises every entry has the same priority and expiry (a publish batch),
        ``run`` every field but the id and body (passed on to the store's batch).
        Stored entries put through an uncommitted ``batch`` enter the window only once it is
        committed (:meth:`_await_commit`): none is delivered before its put is stored.
        """
        n = len(entries)
        awaiting = stored and batch is not None
        if not self._may_expire and entries and (entries[0][4] if uniform
                                                 else any(e[4] for e in entries)):
            self._may_expire = True
        if stored and batch is not None:
            batch.put_entries(self.name, entries, run=run)
            self._mark(batch)
        if stored and self._stored_only:
            if uniform:
                # one priority and fresh (largest) ids: the first entry decides for the batch
                keep = [] if self._after_horizon(entries[0]) else entries
                key = None if keep else (-entries[0][1], entries[0][0])
            else:
                keep = [e for e in entries if not self._after_horizon(e)]
                key = min(((-e[1], e[0]) for e in entries if self._after_horizon(e)),
                          default=None)
            if key is not None:
                if batch is not None:
                    self._hold(batch, key)
                else:
                    self._hold_all(key)
                self._keep_tail(entries if not keep else
                                [e for e in entries if self._after_horizon(e)], uniform)
            self._stored_only += n - len(keep)
            self._put_gen += 1
            if awaiting and batch is not None:
                self._await_commit(batch, keep, n - len(keep), uniform)
                return
            entries = keep
        elif not stored and self.durable:
            if self._volatile is _NO_IDS:
                self._volatile = set()
            self._volatile.update([e[0] for e in entries])
        if entries:
            if awaiting and batch is not None:
                self._await_commit(batch, entries, 0, uniform)
                return
            self._enter(entries, uniform)

    def _enter(self, entries: list[Entry], uniform: bool) -> None:
        """Add ``entries`` (in id order) to the ready deques."""
        if entries:
            p = entries[0][1]
            d = self._deque(p)
            last = d[-1][0] if d else -1
            if entries[0][0] > last and (uniform or all(
                    e[1] == p for e in entries)):
                d.extend(entries)
                self._nready += len(entries)
                self._held_more(entries)
            else:
                self._insert_many(entries)

    def _await_commit(self, batch: WriteBatch, entries: list[Entry], stored_only: int,
                      uniform: bool) -> None:
        """``entries`` (puts of the uncommitted ``batch``, marked on this queue, in id order)
        wait for its commit before they enter the window; ``stored_only`` more of its puts went
        to the stored backlog."""
        rec = self._pend[id(batch)]
        if entries:
            if rec[4] is None:
                rec[4] = [(entries, uniform)]
            else:
                rec[4].append((entries, uniform))
        rec[5] += stored_only

    def _awaiting(self) -> int:
        """Puts of this queue's uncommitted batches that wait to enter the window."""
        if not self._pend:
            return 0
        return sum([len(p[0]) for rec in self._pend.values() if rec[4] for p in rec[4]])

    def _take_awaiting(self, wanted: set[int]) -> list[tuple[WriteBatch, list[Entry]]]:
        """Take the puts awaiting their commit whose ids are in ``wanted`` out of their batches'
        records (they will not enter the window); return each batch with the entries taken."""
        out: list[tuple[WriteBatch, list[Entry]]] = []
        for rec in self._pend.values():
            puts = rec[4]
            if not puts:
                continue
            taken: list[Entry] = []
            kept: list[tuple[list[Entry], bool]] = []
            for entries, uniform in puts:
                hit = [e for e in entries if e[0] in wanted]
                if not hit:
                    kept.append((entries, uniform))
                    continue
                taken.extend(hit)
                rest = [e for e in entries if e[0] not in wanted]   # a new list: it is shared
                if rest:
                    kept.append((rest, uniform))
            if taken:
                rec[4] = kept or None
                out.append((rec[1], taken))
        return out

    def _awaiting_past_horizon(self) -> None:
        """The horizon moved back (eviction): awaiting puts that now sort after it belong to
        the stored backlog, held back from paging until their batch is committed. While the
        remembered tail is the whole backlog they join it (held like any uncommitted put)."""
        whole = self._tail_whole()
        for rec in self._pend.values():
            puts = rec[4]
            if not puts:
                continue
            kept = []
            for entries, uniform in puts:
                past = [e for e in entries if self._after_horizon(e)]
                if not past:
                    kept.append((entries, uniform))
                    continue
                low = min(ready_key(e) for e in past)
                if rec[3] is None or low < rec[3]:
                    rec[3] = low
                rec[5] += len(past)
                if whole:
                    self._keep_tail(past, uniform)
                self._stored_only += len(past)
                self._put_gen += 1
                if len(past) < len(entries):
                    ids = {e[0] for e in past}
                    kept.append(([e for e in entries if e[0] not in ids], uniform))
            rec[4] = kept or None

    def _deque(self, priority: int) -> deque[Entry]:
        """The ready deque of ``priority`` (created on demand)."""
        d = self._ready.get(priority)
        if d is None:
            if self._ready is _NO_MAP:
                self._ready = {}
                self._prios = []
            d = self._ready[priority] = deque()
            self._prios.append(priority)
            self._prios.sort(reverse=True)
        return d

    def _held(self, delta: int) -> None:
        """The window's body bytes changed by ``delta``: count it, and for a durable queue charge
        it to the broker-wide account of all windows (``broker.windows``). The one place both
        change, once per batch-level change (never per entry), so they cannot drift apart."""
        self._nbytes += delta
        if self.durable:
            self.broker.windows.used += delta

    def _held_more(self, entries: list[Entry]) -> None:
        """``entries`` entered the window: :meth:`_held` their body bytes."""
        self._held(sum(map(len, map(_BODY, entries))))

    def _held_less(self, entries: list[Entry]) -> None:
        """``entries`` left the window: :meth:`_held` minus their body bytes."""
        self._held(-sum(map(len, map(_BODY, entries))))

    def _insert(self, entry: Entry) -> None:
        """Insert one entry at its place by msg_id within its priority (cold path: requeue)."""
        self._place(entry)
        self._held(len(entry[7]))

    def _place(self, entry: Entry) -> None:
        """Put one entry at its place in its priority's deque and count it (not its bytes)."""
        d = self._deque(entry[1])
        mid = entry[0]
        if not d or d[-1][0] < mid:
            d.append(entry)
        else:
            ids = [e[0] for e in d]
            d.insert(bisect_left(ids, mid), entry)
        self._nready += 1

    def _insert_many(self, entries: list[Entry]) -> None:
        """Insert entries at their places: one merge per priority, not one search per entry."""
        if not entries:
            return
        self._held_more(entries)
        if len(entries) < 8:
            for e in entries:
                self._place(e)
            return
        by_prio: dict[int, list[Entry]] = {}
        for e in entries:
            by_prio.setdefault(e[1], []).append(e)
        for p, group in by_prio.items():
            group.sort()
            d = self._deque(p)
            if not d or d[-1][0] < group[0][0]:
                d.extend(group)
            else:
                merged = deque(heapq.merge(d, group))
                d.clear()
                d.extend(merged)
            self._nready += len(group)

    def _return(self, entries: list[Entry]) -> None:
        """Put entries that are already stored back to ready (requeue, timeout, detach).

        One that now sorts after the window's horizon stays in the store only and is paged in
        again in order, so the window remains a prefix and nothing is read twice.
        """
        back: list[Entry] = []
        for e in entries:
            if self._stored_only and self.durable and e[0] not in self._volatile \
                    and self._after_horizon(e):
                self._stored_only += 1
                self._put_gen += 1
                if self._page_wait == WAIT_COMMIT:
                    self._page_wait = 0
                if self._pend:
                    self._hold_all((-e[1], e[0]))
            else:
                back.append(e)
        self._insert_many(back)

    def _effective_window(self) -> int:
        """Window size; a bounded queue keeps its whole content in memory."""
        return max(self.window, self.max_size) if self.max_size else self.window

    def _own_budget(self) -> int:
        """Body bytes the window may hold by its own setting (the broker's ``window_bytes``; a
        bounded queue keeps its whole content in memory). The remembered tail is sized by it,
        never by the shrunk budget: the tails have their own broker-wide account."""
        return self.broker.window_bytes if not self.max_size else 1 << 62

    def _byte_budget(self) -> int:
        """Body bytes the window may hold now: its own budget, shrunk to what the broker-wide
        account of all windows has left (its own charge included), never below the account's
        floor (:data:`WINDOW_FLOOR`, or the own budget when smaller). A bounded queue keeps its
        rule: its charge counts in the account, its window is not shrunk by it."""
        own = self._own_budget()
        if self.max_size:
            return own
        windows = self.broker.windows
        room = windows.room(self._nbytes)
        if room >= own:
            return own
        return max(room, min(windows.floor, own))

    def over_window(self) -> bool:
        """True when the window holds more entries, or more body bytes, than it may."""
        return self._nready > self._effective_window() or (
            self._nready > 1 and self._nbytes > self._byte_budget())

    @property
    def window_bytes_held(self) -> int:
        """Body bytes of the ready entries in the window."""
        return self._nbytes

    def _evict(self) -> None:
        """Drop the tail of the window to the stored backlog, keeping the window a prefix.

        Entries that are not in the store (``persist=False``) are never evicted.
        """
        excess = self._nready - self._effective_window()
        over = self._nbytes - self._byte_budget()
        volatile = self._volatile
        low: Entry | None = None
        # the remembered tail is the whole stored backlog (or there is none): what is evicted
        # sorts before all of it, so it can join the tail's head and the tail stays the backlog
        whole = self._tail_whole()
        dropped: list[Entry] = []
        freed = 0
        for p in sorted(self._prios):
            d = self._ready[p]
            kept: list[Entry] = []
            while d and (excess > 0 or (over > 0 and self._nready > 1)):
                e = d.pop()
                if e[0] in volatile:
                    kept.append(e)
                    continue
                excess -= 1
                size = len(e[7])
                over -= size
                freed += size
                if size > self._body_max:
                    self._body_max = size
                self._nready -= 1
                self._stored_only += 1
                self._put_gen += 1
                low = e
                dropped.append(e)
            if kept:
                d.extend(reversed(kept))
            if excess <= 0 and (over <= 0 or self._nready <= 1):
                break
        if freed:
            self._held(-freed)
        if dropped and whole:
            self._tail_head(dropped)
        if low is not None:
            # the horizon moves back: what was dropped can be read again (the last one dropped
            # sorts first; its put may still be uncommitted)
            if self._page_wait == WAIT_COMMIT:
                self._page_wait = 0
            if self._pend:
                self._hold_all((-low[1], low[0]))
        self._horizon = None
        for p in sorted(self._prios):
            d = self._ready[p]
            for e in reversed(d):
                if e[0] not in volatile:
                    self._horizon = (p, e[0])
                    break
            if self._horizon is not None:
                break
        if self._pend:
            self._awaiting_past_horizon()

    def _pop_ready(self, n: int) -> list[Entry]:
        """Remove and return up to ``n`` ready entries in ready order."""
        out: list[Entry] = []
        for p in self._prios:
            d = self._ready[p]
            if not d:
                continue
            k = n - len(out)
            if len(d) <= k:
                out.extend(d)
                d.clear()
            else:
                out.extend(map(_POPLEFT, repeat(d, k)))
            if len(out) >= n:
                break
        self._nready -= len(out)
        self._held_less(out)
        if self._volatile and out:
            self._volatile.difference_update([e[0] for e in out])
        return out

    def _pop_oldest(self, n: int) -> list[Entry]:
        """Remove the ``n`` oldest entries of the lowest priorities (overflow victims)."""
        out: list[Entry] = []
        for p in sorted(self._prios):
            d = self._ready[p]
            while d and len(out) < n:
                out.append(d.popleft())
            if len(out) >= n:
                break
        self._nready -= len(out)
        self._held_less(out)
        if self._volatile and out:
            self._volatile.difference_update([e[0] for e in out])
        return out
