"""The ready window: the ready entries a queue holds in memory, per priority, in ready order.

A durable queue keeps at most a window of its ready order in memory (a prefix of it: the rest
is its stored backlog, :mod:`mqhub.core.backlog`); a memory queue keeps everything here. The
window counts its entries and the bytes of their bodies, and charges those bytes to the
broker-wide account of all durable windows (``broker.windows``) once per batch-level change.
It knows nothing of the store, the queue's settings or its consumers: the queue says what goes
in, asks for what comes out, and is handed back what an eviction took.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections import deque
from itertools import repeat

from mqhub.core.account import MemoryAccount
from mqhub.core.empty import NO_IDS, NO_LIST, NO_MAP
from mqhub.records import BODY, EXPIRES_AT, MSG_ID, PRIORITY, get_body, get_key, get_msg_id
from mqhub.store.records import Entry, EntryKey

#: default body bytes all durable queues' windows may hold together (Broker ``windows_bytes``,
#: the account ``broker.windows``): four full windows of the default ``window_bytes``, as much
#: as all remembered tails together (``TAILS_BYTES``); past it a window's byte budget shrinks
#: to what is left and the rest of its backlog stays in the store
WINDOWS_BYTES = 256 << 20
#: the least byte budget a window keeps when the broker-wide account is full (or its own
#: ``window_bytes`` when that is smaller): a page of small bodies (4096 of 16 B) still fits,
#: and a window always keeps at least one entry, however big, so every queue keeps moving
WINDOW_FLOOR = 64 << 10

_POPLEFT = deque.popleft


class ReadyWindow:
    """Ready entries per priority (deques in msg_id order), their count and body bytes.

    :ivar count: entries in the window.
    :ivar nbytes: body bytes of those entries (charged to the account, if any).
    :ivar volatile: ids of ``persist=False`` entries of a durable queue (never evicted: the
        store does not have them).
    :ivar prios: the priorities that have a deque, highest first.
    """

    __slots__ = ("_ready", "prios", "count", "nbytes", "volatile", "_account")

    def __init__(self, account: MemoryAccount | None) -> None:
        """Empty; ``account``: where the body bytes are charged (None: nowhere, memory queues)."""
        self._ready: dict[int, deque[Entry]] = NO_MAP
        self.prios: list[int] = NO_LIST
        self.count = 0
        self.nbytes = 0
        self.volatile: set[int] = NO_IDS
        self._account = account

    # -- the byte charge -----------------------------------------------------------------------

    def charge(self, delta: int) -> None:
        """The body bytes changed by ``delta``: count it, and charge it to the account. The one
        place both change, once per batch-level change (never per entry), so they cannot drift
        apart."""
        self.nbytes += delta
        if self._account is not None:
            self._account.used += delta

    def _charge_in(self, entries: list[Entry]) -> None:
        """``entries`` entered the window: charge their body bytes."""
        self.charge(sum(map(len, map(get_body, entries))))

    def _charge_out(self, entries: list[Entry]) -> None:
        """``entries`` left the window: give their body bytes back."""
        self.charge(-sum(map(len, map(get_body, entries))))

    # -- adding --------------------------------------------------------------------------------

    def _deque(self, priority: int) -> deque[Entry]:
        """The deque of ``priority`` (created on demand)."""
        d = self._ready.get(priority)
        if d is None:
            if self._ready is NO_MAP:
                self._ready = {}
                self.prios = []
            d = self._ready[priority] = deque()
            self.prios.append(priority)
            self.prios.sort(reverse=True)
        return d

    def mark_volatile(self, entries: list[Entry]) -> None:
        """``entries`` (about to enter) are not in the store: never evict them."""
        if self.volatile is NO_IDS:
            self.volatile = set()
        self.volatile.update(map(get_msg_id, entries))

    def enter(self, entries: list[Entry], uniform: bool) -> None:
        """Add ``entries`` (in id order; ``uniform``: one priority): appended when they sort
        after the window's entries of their priority, else merged in."""
        if not entries:
            return
        p = entries[0][PRIORITY]
        d = self._deque(p)
        last = d[-1][MSG_ID] if d else -1
        if entries[0][MSG_ID] > last and (uniform or all(e[PRIORITY] == p for e in entries)):
            d.extend(entries)
            self.count += len(entries)
            self._charge_in(entries)
        else:
            self.insert(entries)

    def _place(self, entry: Entry) -> None:
        """Put one entry at its place in its priority's deque and count it (not its bytes)."""
        d = self._deque(entry[PRIORITY])
        mid = entry[MSG_ID]
        if not d or d[-1][MSG_ID] < mid:
            d.append(entry)
        else:
            ids = list(map(get_msg_id, d))
            d.insert(bisect_left(ids, mid), entry)
        self.count += 1

    def insert(self, entries: list[Entry]) -> None:
        """Insert entries (any order) at their places: one merge per priority, not one search
        per entry."""
        if not entries:
            return
        self._charge_in(entries)
        if len(entries) < 8:
            for e in entries:
                self._place(e)
            return
        by_prio: dict[int, list[Entry]] = {}
        for e in entries:
            by_prio.setdefault(e[PRIORITY], []).append(e)
        for p, group in by_prio.items():
            group.sort()
            d = self._deque(p)
            if not d or d[-1][MSG_ID] < group[0][MSG_ID]:
                d.extend(group)
            else:
                merged = deque(heapq.merge(d, group))
                d.clear()
                d.extend(merged)
            self.count += len(group)

    # -- taking --------------------------------------------------------------------------------

    def _forget(self, out: list[Entry]) -> list[Entry]:
        """``out`` left the window: uncount and uncharge them, forget their volatile ids."""
        self.count -= len(out)
        self._charge_out(out)
        if self.volatile and out:
            self.volatile.difference_update(map(get_msg_id, out))
        return out

    def pop(self, n: int) -> list[Entry]:
        """Remove and return up to ``n`` entries in ready order."""
        out: list[Entry] = []
        for p in self.prios:
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
        return self._forget(out)

    def pop_oldest(self, n: int) -> list[Entry]:
        """Remove the ``n`` oldest entries of the lowest priorities (overflow victims)."""
        out: list[Entry] = []
        for p in sorted(self.prios):
            d = self._ready[p]
            while d and len(out) < n:
                out.append(d.popleft())
            if len(out) >= n:
                break
        return self._forget(out)

    def remove(self, wanted: set[int]) -> list[Entry]:
        """Remove the entries whose ids are in ``wanted``; return them (uncounted, uncharged;
        volatile ids stay for the caller to check)."""
        removed: list[Entry] = []
        for p in self.prios:
            d = self._ready[p]
            if not d:
                continue
            hit = [e for e in d if e[MSG_ID] in wanted]
            if hit:
                removed.extend(hit)
                keep = [e for e in d if e[MSG_ID] not in wanted]
                d.clear()
                d.extend(keep)
                if len(removed) == len(wanted):
                    break
        if removed:
            self.count -= len(removed)
            self._charge_out(removed)
        return removed

    def sweep(self, now: float, ttl_cut: int, budget: int) -> tuple[int, list[Entry]]:
        """Take out the entries past their expiry or (ids below ``ttl_cut``) the queue TTL,
        scanning at most ``budget``; return how many were scanned and the expired ones."""
        scanned = 0
        expired: list[Entry] = []
        for p in self.prios:
            d = self._ready[p]
            if not d:
                continue
            if len(d) > budget - scanned:
                # big window: only the head (oldest) can be past the queue TTL cheaply
                while d and scanned < budget and (
                        d[0][MSG_ID] < ttl_cut or (d[0][EXPIRES_AT] and d[0][EXPIRES_AT] <= now)):
                    expired.append(d.popleft())
                    scanned += 1
                scanned = budget
                break
            keep = []
            for e in d:
                x = e[EXPIRES_AT]
                if (x and x <= now) or e[MSG_ID] < ttl_cut:
                    expired.append(e)
                else:
                    keep.append(e)
            scanned += len(d)
            if len(keep) != len(d):
                d.clear()
                d.extend(keep)
        if expired:
            self.count -= len(expired)
            self._charge_out(expired)
        return scanned, expired

    def peek(self, limit: int) -> list[Entry]:
        """Up to ``limit`` entries in ready order, left in place."""
        out: list[Entry] = []
        for p in self.prios:
            for e in self._ready[p]:
                if len(out) >= limit:
                    return out
                out.append(e)
        return out

    def evict(self, excess: int, over: int) -> tuple[list[Entry], EntryKey | None]:
        """Drop the window's tail: at least ``excess`` entries, and entries until ``over``
        bytes are gone (keeping one entry at least); volatile entries are never dropped.

        Returns the dropped entries, last in ready order first (the last one returned sorts
        first), and the new horizon: the ``(priority, msg_id)`` of the last stored entry the
        window keeps (None when it keeps none).
        """
        volatile = self.volatile
        dropped: list[Entry] = []
        freed = 0
        for p in sorted(self.prios):
            d = self._ready[p]
            kept: list[Entry] = []
            while d and (excess > 0 or (over > 0 and self.count > 1)):
                e = d.pop()
                if e[MSG_ID] in volatile:
                    kept.append(e)
                    continue
                excess -= 1
                size = len(e[BODY])
                over -= size
                freed += size
                self.count -= 1
                dropped.append(e)
            if kept:
                d.extend(reversed(kept))
            if excess <= 0 and (over <= 0 or self.count <= 1):
                break
        if freed:
            self.charge(-freed)
        return dropped, self._last_stored()

    def _last_stored(self) -> EntryKey | None:
        """``(priority, msg_id)`` of the last entry in ready order that the store has."""
        volatile = self.volatile
        for p in sorted(self.prios):
            for e in reversed(self._ready[p]):
                if e[MSG_ID] not in volatile:
                    return get_key(e)
        return None

    def clear(self) -> None:
        """Forget every entry (the queue was emptied)."""
        for d in self._ready.values():
            d.clear()
        self.count = 0
        self.charge(-self.nbytes)
        self.volatile = NO_IDS
