"""The cursor over a durable queue's stored backlog: paging, holds and the remembered tail.

A durable queue keeps at most a window of ready entries in memory, a prefix of its ready order;
the rest is its *stored backlog*, read back a page at a time as the window drains
(:mod:`mqhub.core.window` holds the window itself). This module owns the backlog's state: the
horizon (the last stored key in the window), how many entries are stored only, the queue's
uncommitted batches and the ready-order keys they hold back from paging, and the remembered
tail of the backlog. :class:`QueueBacklog` is the base of the queue's class chain.
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections import deque
from operator import itemgetter
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred

from mqhub.core.tail import ENTRY_COST, pop_head, ready_key, sized, stays_sorted, tail_limit, trim
from mqhub.store.batch import WriteBatch
from mqhub.store.records import Entry, EntryKey

if TYPE_CHECKING:  # pragma: no cover
    from mqhub.core.host import QueueHost

log = logging.getLogger(__name__)

#: a page is read when the window's fill falls to 1/LOW_WATER of the window (low-water mark)
LOW_WATER = 2
#: the most entries one page read asks the store for
PAGE_LIMIT = 4096
#: default byte budget of a queue's window (Broker ``window_bytes``): body bytes of the ready
#: entries it keeps in memory; past it entries stay in the store only (defect 7)
WINDOW_BYTES = 64 << 20
#: a page read while the body sizes of the stored backlog are unknown (after a restart) asks
#: for at most this many entries; later pages are sized by the largest body seen
FIRST_PAGE = 64
#: why paging waits: the last read reached the committed end (any commit of this queue may show
#: more), or an uncommitted batch holds the page (only that batch's commit helps)
WAIT_COMMIT = 1
WAIT_HOLD = 2

# Shared, immutable stand-ins for containers an idle queue never fills: each one is replaced by
# a real container of the queue's own at the first write (an idle queue costs no empty dict,
# set, deque or list). Reads (len, in, get, iteration) work on them unchanged.
NO_MAP: Any = MappingProxyType({})
NO_IDS: Any = frozenset()
NO_LIST: Any = ()
_NO_MAP = NO_MAP
_NO_IDS = NO_IDS
_NO_LIST = NO_LIST
#: an entry's id, expiry and body (column reads over a page, in C: no Python loop per entry)
_ID = itemgetter(0)
_EXPIRES = itemgetter(4)
_BODY = itemgetter(7)


class QueueBacklog:
    """The stored backlog of a queue and the paging that feeds its window.

    Reads ``broker``, ``name``, ``durable``, ``window``, ``max_size``, ``deleted`` and
    ``incarnation`` (the queue's identity and settings), the window's fill, ``_inflight`` and
    ``_claimed`` (what is out of the window); the subclasses own those and provide
    :meth:`dispatch`, :meth:`_insert`, :meth:`_insert_many` and :meth:`_effective_window`.
    """

    __slots__ = (
        "_stored_only", "_horizon", "_paging", "_unsettled", "_put_gen", "_skip", "_pend",
        "_page_cap", "_page_gone", "_page_wait", "_tail", "_may_expire",
        "_nbytes", "_body_max", "_charged")

    broker: QueueHost
    name: str
    durable: bool
    window: int
    max_size: int
    deleted: bool
    incarnation: int
    _nready: int
    _inflight: dict[int, Entry]
    _claimed: dict[int, Entry]

    def _backlog_init(self) -> None:
        """No stored backlog."""
        self._stored_only = 0                 # durable entries in the store beyond the window
        self._horizon: EntryKey | None = None   # last key in the window when paged
        self._paging = False
        self._unsettled = 0                   # marks of this queue on uncommitted batches
        self._put_gen = 0                     # bumps whenever stored-only entries are added
        self._skip: set[int] = _NO_IDS        # ids removed while a page was being read
        # id(batch) -> [marks, batch, hold, put hold, awaiting, stored-only puts]: this queue's
        # uncommitted batches; a hold is the lowest ready-order key (-priority, msg_id) the batch
        # may have left in the store only, or None; a put hold is the lowest such key among the
        # batch's own puts (seeing that entry in a page proves the batch applied), see
        # _maybe_page; *awaiting* is the list of the batch's puts that enter the window once it
        # is committed (never before: a put whose commit fails is never delivered), and the
        # last field counts its puts that went to the stored backlog instead.
        self._pend: dict[int, list[Any]] = _NO_MAP
        self._page_cap: tuple[int, int] | None = None   # holds of batches settled mid-read
        self._page_gone: list[list[int]] = _NO_LIST   # their deletes' ids on this queue
        self._page_wait = 0                   # 0, WAIT_COMMIT or WAIT_HOLD (see _maybe_page)
        # the latest entries put straight to the stored backlog (at most the byte budget's
        # worth, within the broker-wide account broker.tails; each one also counted in
        # _stored_only): when they are all that is left of the backlog, paging takes them from
        # here instead of reading them back (see _maybe_page)
        self._tail: deque[Entry] = _NO_LIST
        self._may_expire = False              # some entry with expires_at was added
        self._nbytes = 0                      # body bytes of the window's ready entries
        self._body_max = 0                    # largest body seen in the current stored backlog
        self._charged = 0                     # bytes the tail holds in broker.tails' account

    def _backlog_clear(self) -> None:
        """Forget the stored backlog (the queue was emptied, or all of it was read or lost)."""
        self._stored_only = 0
        self._horizon = None
        self._page_wait = 0
        self._tail = _NO_LIST
        self._recharge()
        self._body_max = 0            # the next backlog sizes its pages afresh

    # hooks of the subclasses
    def dispatch(self) -> None:
        """Deliver what the window holds (mqhub.core.delivery)."""

    def _insert(self, entry: Entry) -> None:
        """Insert one entry into the window (mqhub.core.window)."""
        raise NotImplementedError

    def _insert_many(self, entries: list[Entry]) -> None:
        """Insert entries into the window (mqhub.core.window)."""
        raise NotImplementedError

    def _effective_window(self) -> int:
        """The window size in effect (mqhub.core.window)."""
        raise NotImplementedError

    def _byte_budget(self) -> int:
        """The window's byte budget in effect (mqhub.core.window)."""
        raise NotImplementedError

    def _own_budget(self) -> int:
        """The window's own byte budget, the remembered tail's too (mqhub.core.window)."""
        raise NotImplementedError

    def _evict(self) -> None:
        """Drop the window's tail back to the stored backlog (mqhub.core.window)."""
        raise NotImplementedError

    def _enter(self, entries: list[Entry], uniform: bool) -> None:
        """Add entries in id order to the window (mqhub.core.window)."""
        raise NotImplementedError

    def _shrink(self) -> None:
        """Evict when a page or the tail brought the window over its byte budget."""
        if self.durable and self._nready > 1 and self._nbytes > self._byte_budget():
            self._evict()

    def _committed(self, puts: list[tuple[list[Entry], bool]]) -> None:
        """The batch holding ``puts`` (each a list of entries in id order and its uniform flag)
        was committed: they enter the window (mqhub.core.queue)."""
        raise NotImplementedError

    def maybe_page(self) -> None:
        """Read the next page of the stored backlog if the window is at its low-water mark."""
        self._maybe_page()

    def recovered(self, count: int) -> None:
        """Start-up: the store holds ``count`` entries; the window is paged from the start."""
        self._recovered(count)

    # -- settle callbacks (mqhub.core.commits.BatchWatcher) ------------------------------------

    def batch_settled(self, batch: WriteBatch, ok: bool = True) -> None:
        """A batch this queue marked was committed (``ok``) or failed."""
        self._settle(batch, ok)

    def batch_merged(self, batch: WriteBatch, into: WriteBatch) -> None:
        """A batch this queue marked was merged into ``into``."""
        self._rekey(batch, into)

    # -- stored backlog -------------------------------------------------------------------------

    def _after_horizon(self, entry: Entry) -> bool:
        """True when ``entry`` sorts after the window's last key (it belongs to the stored backlog)."""
        h = self._horizon
        if h is None:
            return self._stored_only > 0
        p = entry[1]
        return p < h[0] or (p == h[0] and entry[0] > h[1])

    # -- paging -----------------------------------------------------------------------------

    def _maybe_page(self) -> None:
        """Read the next page of the stored backlog when the window's fill is at its low-water mark.

        Uncommitted batches of this queue do not stop paging (issue 10): their entries are simply
        not visible yet. Each uncommitted batch holds the lowest ready-order key it may have left
        in the store only (a put beyond the horizon, an entry evicted or requeued past it); a
        page is cut before the lowest hold, so the horizon never moves past an entry the store
        cannot show yet. When nothing before the hold is left to read, or the last read reached
        the committed end, paging waits for a commit that can change that (see :meth:`_settle`):
        a commit callback never reads by itself otherwise. Each read asks for at most
        :data:`PAGE_LIMIT` entries and the room left in the window. When the remembered tail is
        the whole backlog, it moves into the window without a read (:meth:`_swallow_tail`).
        """
        if (self._paging or not self._stored_only or self.deleted
                or self._nready > self._effective_window() // LOW_WATER):
            return
        budget = self._byte_budget()
        if self._nready and (self._nbytes > budget // LOW_WATER
                             or self._nbytes + self._body_max > budget):
            return      # past low water, or no room for the largest body (it would be evicted)
        if self._tail_whole():
            if self._page_wait != WAIT_HOLD:
                self._swallow_tail()
            return
        if self._page_wait:
            return
        h = self._horizon
        if self._pend and h is not None:
            cap = self._cap()
            if cap is not None and cap <= (-h[0], h[1]):
                self._page_wait = WAIT_HOLD     # nothing readable before the hold
                return
        self._paging = True
        self._page_wait = 0
        self._page_cap = None
        self._page_gone = _NO_LIST
        limit = min(PAGE_LIMIT, self._effective_window() - self._nready)
        # bodies count too: ask for what fits the byte budget by the largest body seen (the
        # store reads by count; a page is evicted back down to the budget if it was bigger)
        big = self._body_max
        limit = min(limit, FIRST_PAGE if not big else (budget - self._nbytes) // big)
        d = self.broker.store.read_entries(self.name, h, max(1, limit))
        d.addCallbacks(self._paged, self._page_failed,
                       callbackArgs=(self.incarnation, self._put_gen, max(1, limit)))

    def _tail_whole(self) -> bool:
        """True when the remembered tail is the whole stored backlog (or there is none) and no
        page is being read: the window can be refilled from it, and what the window evicts
        sorts before all of it."""
        return not self._paging and len(self._tail) == self._stored_only

    def _keep_tail(self, entries: list[Entry], uniform: bool) -> None:
        """Remember ``entries`` (just made stored-only, in id order) as the newest part of the
        backlog, keeping no more than the byte budget holds when each entry counts its body, at
        the largest body seen, plus ``ENTRY_COST`` (the oldest are forgotten, not lost).

        The tail stays in ready order: entries that would break it (several priorities, or
        sorting before its last entry) are not remembered and will be read back from the store;
        sorting or filtering an out-of-order tail would cost the whole tail (up to ~322,000
        entries, a pause of tens of ms)."""
        big = max(map(len, map(_BODY, entries)))
        if big > self._body_max:
            self._body_max = big
        tail = self._tail = sized(self._tail, tail_limit(self._own_budget(), self._body_max))
        if self._tails_allow(len(tail) + len(entries)) and stays_sorted(tail, entries, uniform):
            tail.extend(entries)
            self._recharge()

    def _tails_allow(self, n: int) -> bool:
        """True when the broker-wide account of all tails (``broker.tails``)
        has room for this tail to hold ``n`` entries (beyond it, what is not remembered is
        read back from the store)."""
        return n * (self._body_max + ENTRY_COST) <= self.broker.tails.room(self._charged)

    def _recharge(self) -> None:
        """Bring the broker-wide account up to date with the tail's length."""
        held = len(self._tail) * (self._body_max + ENTRY_COST) if self._tail else 0
        self.broker.tails.used += held - self._charged
        self._charged = held

    def _tail_head(self, dropped: list[Entry]) -> None:
        """The window evicted ``dropped`` (in reverse ready order, all sorting before the stored
        backlog) while the remembered tail was the whole backlog: put them at the tail's head
        when it has room, so they are not read back; otherwise the tail is no longer the whole
        backlog and paging reads it from the store as before."""
        limit = tail_limit(self._own_budget(), self._body_max)
        n = len(self._tail) + len(dropped)
        if n <= limit and self._tails_allow(n):
            self._tail = sized(self._tail, limit)
            self._tail.extendleft(dropped)    # reversed: the tail stays in ready order
            self._recharge()

    def _swallow_tail(self) -> None:
        """The whole stored backlog is the remembered tail: move as much of it as fits into the
        window without reading it back (the rest stays the tail, and the backlog). Entries an
        uncommitted batch may hold (from the lowest hold on) stay: a put enters the window only
        once it is stored; their commit wakes paging again (WAIT_HOLD).

        The tail may hold many windows' worth: only the entries taken are touched (popped from
        its head), never the whole tail."""
        tail = self._tail
        room = min(max(1, self._effective_window() - self._nready),
                   max(1, (self._byte_budget() - self._nbytes) // (self._body_max or 1)))
        take = pop_head(tail, room, self._cap() if self._pend else None)
        self._recharge()
        if not take:
            self._page_wait = WAIT_HOLD     # the head is held by an uncommitted batch
            return
        if tail:
            last = take[-1]
            self._horizon = (last[1], last[0])
            self._stored_only = len(tail)
        else:
            self._backlog_clear()
        self._page_wait = 0
        if not self._may_expire and any(map(_EXPIRES, take)):
            self._may_expire = True
        if take[0][1] == take[-1][1]:
            self._enter(take, True)    # in ready order, one priority: appended when it can be
        else:
            self._insert_many(take)
        self._shrink()
        self.dispatch()

    def _trim_tail(self) -> None:
        """Forget remembered tail entries a page has read (those up to the horizon)."""
        h = self._horizon
        if h is None:
            self._tail = _NO_LIST
        else:
            trim(self._tail, (-h[0], h[1]))
        self._recharge()

    def _cap(self) -> tuple[int, int] | None:
        """The lowest ready-order key an uncommitted batch of this queue may have left stored-only."""
        cap = self._page_cap if self._paging else None
        for rec in self._pend.values():
            for low in (rec[2], rec[3]):
                if low is not None and (cap is None or low < cap):
                    cap = low
        return cap

    def _cap_for(self, page: list[Entry]) -> tuple[int, int] | None:
        """:meth:`_cap` for a page just read: a batch whose put hold the page shows is applied
        in the store (a batch applies whole), so only its other holds count."""
        cap = self._page_cap
        for rec in self._pend.values():
            low = rec[2]
            if low is not None and (cap is None or low < cap):
                cap = low
            put = rec[3]
            if put is not None and (cap is None or put < cap):
                # the page is in ready order: look the key up by bisection (a miss, even on a
                # page out of order, only cuts the page earlier)
                i = bisect_left(page, put, key=ready_key)
                if i == len(page) or ready_key(page[i]) != put:
                    cap = put
        return cap

    def _hold(self, batch: WriteBatch, key: tuple[int, int]) -> None:
        """``batch`` (marked on this queue) left the entry at ready-order ``key`` stored-only."""
        rec = self._pend.get(id(batch))
        if rec is None:
            self._hold_all(key)
        elif rec[3] is None or key < rec[3]:
            rec[3] = key

    def _hold_all(self, key: tuple[int, int]) -> None:
        """An entry at ready-order ``key`` became stored-only and its put may be uncommitted."""
        for rec in self._pend.values():
            if rec[2] is None or key < rec[2]:
                rec[2] = key

    def _mark(self, batch: WriteBatch) -> None:
        """``batch`` changes this queue's stored entries: track it until it is committed."""
        self._unsettled += 1
        pend = self._pend
        if pend is _NO_MAP:
            pend = self._pend = {}
        rec = pend.get(id(batch))
        if rec is None:
            pend[id(batch)] = [1, batch, None, None, None, 0]
        else:
            rec[0] += 1
        self.broker.commits.watch(batch, self)

    def _rekey(self, batch: WriteBatch, into: WriteBatch) -> None:
        """The broker merged ``batch`` (attempts and deletes only) into ``into``."""
        rec = self._pend.pop(id(batch), None)
        if rec is None:
            return
        # its holds no longer name entries of the batch they belong to: plain holds now
        low = min((k for k in (rec[2], rec[3]) if k is not None), default=None)
        other = self._pend.get(id(into))
        if other is None:
            self._pend[id(into)] = [rec[0], into, low, None, None, 0]
        else:
            other[0] += rec[0]
            if low is not None and (other[2] is None or low < other[2]):
                other[2] = low

    def _write(self, batch: WriteBatch) -> Any:
        """Commit a batch of this queue's own writes (tracked until it is committed)."""
        if batch and self.durable:
            self._mark(batch)
        return self.broker.commits.commit(batch)

    def _settle(self, batch: WriteBatch | None = None, ok: bool = True) -> None:
        """One mark of this queue on ``batch`` was committed (``ok``) or failed.

        O(1) unless paging waits for exactly this: a commit of this queue after a read that
        reached the committed end, or the commit of a batch holding the page. Once every mark
        of a batch settled, its puts that await the commit enter the window (or, when it
        failed, are dropped: a publish refused to its publisher is never delivered).
        """
        self._unsettled -= 1
        rec = self._pend.get(id(batch)) if batch is not None else None
        if rec is None:
            if not self._unsettled:
                self._pend = _NO_MAP
            return
        rec[0] -= 1
        if rec[0] > 0:
            return
        del self._pend[id(batch)]
        if rec[4] is not None or rec[5]:
            self._settle_puts(rec, ok)
        wait = self._page_wait
        if self._paging:
            # the read in progress may have started before this commit: it still counts
            for low in (rec[2], rec[3]):
                if low is not None and (self._page_cap is None or low < self._page_cap):
                    self._page_cap = low
            gone = rec[1].deleted_ids(self.name)
            if gone:
                if self._page_gone is _NO_LIST:
                    self._page_gone = []
                self._page_gone += gone
            self._page_wait = WAIT_COMMIT
        elif wait and (wait == WAIT_COMMIT or rec[2] is not None or rec[3] is not None) \
                and self._stored_only:
            self._page_wait = 0
            self._maybe_page()

    def _settle_puts(self, rec: list[Any], ok: bool) -> None:
        """The batch of ``rec`` settled: admit its awaiting puts, or forget its puts if it failed."""
        waiting: list[tuple[list[Entry], bool]] | None = rec[4]
        if ok:
            if waiting and not self.deleted:
                self._committed(waiting)
            return
        n = sum(len(p[0]) for p in waiting) if waiting else 0
        log.warning("%s: %d message(s) refused by the store are not kept", self.name,
                    n + rec[5])
        if rec[5]:
            # stored-only puts that never reached the store: uncount them, forget their tail
            self._stored_only = max(0, self._stored_only - rec[5])
            self._put_gen += 1
            if self._tail:
                gone = {e[0] for e in rec[1].puts.get(self.name, ())}
                keep = [e for e in self._tail if e[0] not in gone]
                self._tail.clear()
                self._tail.extend(keep)
                self._recharge()
            if not self._stored_only:
                self._backlog_clear()

    def _paged(self, entries: list[Entry], incarnation: int, gen: int, asked: int) -> None:
        """Append a page read from the store to the window.

        Entries of the page that are in flight, or handed to fan-out subscribers, (delivered
        before the horizon moved back past them) were never counted as stored-only; they are
        skipped and not counted. The page is cut before the lowest key an uncommitted batch may
        have left stored-only, and entries an uncommitted batch deletes (acks not yet durable)
        are dropped.
        """
        cap = self._cap_for(entries)
        gone_ids = self._page_gone
        settled_meanwhile = self._page_wait == WAIT_COMMIT
        self._paging = False
        self._page_cap = None
        self._page_gone = _NO_LIST
        self._page_wait = 0
        if self.deleted or incarnation != self.incarnation:
            return
        short = len(entries) < asked
        cut = False
        if cap is not None and entries and (-entries[-1][1], entries[-1][0]) >= cap:
            entries = [e for e in entries if (-e[1], e[0]) < cap]
            short = False
            cut = True
            if not entries:
                self._wait_or_retry(WAIT_HOLD, settled_meanwhile)
                return
        if not entries:
            if gen == self._put_gen and not self._unsettled:
                # everything is committed and nothing follows the horizon: the count was stale
                self._backlog_clear()
            elif not self._unsettled:
                self.broker.clock.callLater(0.05, self._maybe_page)
            else:
                self._wait_or_retry(WAIT_COMMIT, settled_meanwhile)
            return
        inflight = self._inflight
        claimed = self._claimed
        ids = list(map(_ID, entries))
        # the usual page shares no id with the in-flight / claimed maps: test that in C and
        # keep the page as it is; filter entry by entry only when some id is shared
        if (inflight and not inflight.keys().isdisjoint(ids)) or (
                claimed and not claimed.keys().isdisjoint(ids)):
            fresh = [e for e in entries if e[0] not in inflight and e[0] not in claimed]
        else:
            fresh = entries
        if self._skip:
            skip = self._skip
            if not skip.isdisjoint(ids):
                gone = [e for e in fresh if e[0] in skip]
                if gone:
                    fresh = [e for e in fresh if e[0] not in skip]
                    self._stored_only = max(0, self._stored_only - len(gone))
            self._skip = _NO_IDS
        if self._pend or gone_ids:
            # deleted by a batch not yet committed when the page was read: never bring it back
            dead: set[int] = set()
            for gone_run in gone_ids:
                dead.update(gone_run)
            for rec in self._pend.values():
                for gone_run in rec[1].deleted_ids(self.name):
                    dead.update(gone_run)
            if dead and not dead.isdisjoint(ids):
                fresh = [e for e in fresh if e[0] not in dead]
        last = entries[-1]
        self._horizon = (last[1], last[0])
        self.broker.ids.observe(max(ids))
        if not self._may_expire and any(map(_EXPIRES, fresh)):
            self._may_expire = True
        if fresh:
            big = max(map(len, map(_BODY, fresh)))
            if big > self._body_max:
                self._body_max = big
        # a page is in ready order (IStore.read_entries) and ``fresh`` keeps its order: a page
        # of one priority is in id order, appended as it is when it sorts after the window's
        if entries[0][1] == last[1]:
            self._enter(fresh, True)
        else:
            self._insert_many(fresh)
        self._stored_only = max(0, self._stored_only - len(fresh))
        if self._tail:
            self._trim_tail()
        if not self._stored_only:
            self._backlog_clear()
        elif cut or (short and self._unsettled):
            # everything readable was read: the next read waits for a commit that shows more
            self._wait_or_retry(WAIT_HOLD if cut else WAIT_COMMIT, settled_meanwhile)
        elif not fresh:
            # the page held only in-flight entries: continue on the next turn, not recursively
            self.broker.clock.callLater(0, self._maybe_page)
            return
        self._shrink()
        self.dispatch()

    def _wait_or_retry(self, why: int, settled_meanwhile: bool) -> None:
        """Nothing could be paged: wait for the commit ``why`` names, or read again next turn
        when one of this queue's batches was committed while the page was being read."""
        if settled_meanwhile:
            self.broker.clock.callLater(0, self._maybe_page)
        else:
            self._page_wait = why

    def _page_failed(self, failure: Any) -> None:
        """A page read failed: log it and try again later."""
        self._paging = False
        log.error("paging %s failed: %s", self.name, failure.getErrorMessage())
        self.broker.clock.callLater(1.0, self._maybe_page)

    def _recovered(self, count: int) -> None:
        """Start-up: the store holds ``count`` entries; the window will be paged from the start."""
        self._stored_only = count
        self._horizon = None
        self._page_wait = 0
        self._maybe_page()

    def load_page_after(self, d: Deferred[Any], limit: int) -> Deferred[bool] | None:
        """When ``d`` fires, read the next ``limit`` stored entries into the window whatever its
        size (draining a parking queue); fire with True when entries were read. None when there
        is no stored backlog or a read is already running."""
        if not self._stored_only or self._paging:
            return None
        self._tail = _NO_LIST         # read back from the store, never taken from memory
        self._recharge()
        self._paging = True
        after = self._horizon

        def got(page: list[Entry]) -> bool:
            self._paging = False
            if not page:
                self._stored_only = 0
                self._horizon = None
                return False
            self._horizon = (page[-1][1], page[-1][0])
            self._stored_only = max(0, self._stored_only - len(page))
            self._insert_many(page)
            if not self._stored_only:
                self._horizon = None
            return True
        return d.addCallback(lambda _: self.broker.store.read_entries(self.name, after, limit)) \
                .addCallback(got)
