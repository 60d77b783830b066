"""The backlog cursor of a durable queue: what the store holds beyond its window, and paging.

A durable queue keeps at most a window of ready entries in memory, a prefix of its ready order
(:mod:`mqhub.core.window`); the rest is its *stored backlog*, read back a page at a time as the
window drains. :class:`Backlog` owns the backlog's state: the horizon (the last stored key in
the window), how many entries are stored only, the remembered tail, the paging requests, and
one :class:`PendingBatch` per uncommitted write batch of the queue with the ready-order keys it
*holds* back from paging (a hold: the lowest key a batch may have left in the store only, which
a page must not pass until the batch is stored) and the puts that await its commit.

The cursor never calls the queue: the queue asks (``admit``, ``read``, ``page``, ``settle``
...) and acts on what comes back (entries to put in its window, a read to wait for, whether to
page again).
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections import deque
from typing import TYPE_CHECKING, NamedTuple

from mqhub.core.account import MemoryAccount
from mqhub.core.empty import NO_IDS, NO_LIST, NO_MAP
from mqhub.core.ids import IdGenerator
from mqhub.core.tail import ENTRY_COST, pop_head, ready_key, sized, stays_sorted, tail_limit, trim
from mqhub.interfaces import IMessageStore
from mqhub.records import MSG_ID, PRIORITY, get_body, get_key, get_msg_id
from mqhub.store.batch import WriteBatch
from mqhub.store.records import Entry, EntryKey

if TYPE_CHECKING:  # pragma: no cover
    from twisted.internet.defer import Deferred

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



class PendingBatch:
    """One uncommitted write batch that changes a queue's stored entries.

    :ivar marks: how many times the queue marked it (each settles once).
    :ivar hold: the lowest ready-order key ``(-priority, msg_id)`` the batch may have left in
        the store only (an entry evicted or requeued past the horizon meanwhile), or None.
    :ivar put_hold: the lowest such key among the batch's own puts: seeing that entry in a page
        proves the batch applied (a batch applies whole), so it stops holding that page.
    :ivar awaiting: the batch's puts that enter the window once it is committed (never before:
        a put whose commit fails is never delivered), each ``(entries, uniform)``, or None.
    :ivar stored_only: the batch's puts that went to the stored backlog instead.
    """

    __slots__ = ("marks", "batch", "hold", "put_hold", "awaiting", "stored_only")

    def __init__(self, batch: WriteBatch, marks: int = 1, hold: EntryKey | None = None) -> None:
        """A batch marked ``marks`` times, holding ``hold`` (None: nothing yet)."""
        self.marks = marks
        self.batch = batch
        self.hold = hold
        self.put_hold: EntryKey | None = None
        self.awaiting: list[tuple[list[Entry], bool]] | None = None
        self.stored_only = 0

    def lowest(self) -> EntryKey | None:
        """The lower of the batch's two holds."""
        if self.hold is None:
            return self.put_hold
        if self.put_hold is None or self.hold < self.put_hold:
            return self.hold
        return self.put_hold


class PageRead(NamedTuple):
    """A page read the cursor started: the store's answer, and what to give :meth:`Backlog.page`."""

    read: Deferred[list[Entry]]
    put_gen: int
    asked: int


class PageResult(NamedTuple):
    """What a page brings the queue: ``fresh`` entries for its window (in ready order);
    ``again``: read again after that many seconds (None: no); ``settle``: bring the window back
    to its budget and dispatch (False when nothing changed)."""

    fresh: list[Entry]
    again: float | None
    settle: bool


_NOTHING = PageResult(NO_LIST, None, False)


class Backlog:
    """The stored backlog of one durable queue and the paging that feeds its window.

    :ivar stored_only: durable entries in the store beyond the window.
    :ivar horizon: ``(priority, msg_id)`` of the last stored entry in the window when the
        backlog is not empty (None: before the first entry).
    :ivar paging: a page read is in progress.
    :ivar page_wait: 0, WAIT_COMMIT or WAIT_HOLD (see :meth:`read`).
    :ivar body_max: the largest body seen in the current stored backlog (sizes pages and the
        remembered tail).
    """

    __slots__ = (
        "name", "_store", "_ids", "_tails", "stored_only", "horizon", "paging", "_unsettled",
        "put_gen", "_skip", "_pending", "_page_cap", "_page_gone", "page_wait", "_tail",
        "body_max", "_charged")

    def __init__(self, name: str, store: IMessageStore, ids: IdGenerator,
                 tails: MemoryAccount) -> None:
        """The backlog of queue ``name`` in ``store``; its remembered tail is charged to
        ``tails`` (the broker-wide account); ids read back are shown to ``ids``."""
        self.name = name
        self._store = store
        self._ids = ids
        self._tails = tails
        self.stored_only = 0
        self.horizon: EntryKey | None = None
        self.paging = False
        self._unsettled = 0                   # marks of the queue on uncommitted batches
        self.put_gen = 0                      # bumps whenever stored-only entries are added
        self._skip: set[int] = NO_IDS         # ids removed while a page was being read
        self._pending: dict[int, PendingBatch] = NO_MAP    # id(batch) -> its record
        self._page_cap: EntryKey | None = None       # holds of batches settled mid-read
        self._page_gone: list[list[int]] = NO_LIST    # their deletes' ids on this queue
        self.page_wait = 0
        # the latest entries put straight to the stored backlog (at most the byte budget's
        # worth, within the broker-wide account; each one also counted in stored_only): when
        # they are all that is left of the backlog, the window is refilled from here instead
        # of reading them back
        self._tail: deque[Entry] = NO_LIST
        self.body_max = 0
        self._charged = 0                     # bytes the tail holds in the tails account

    # -- state ---------------------------------------------------------------------------------

    def clear(self) -> None:
        """Forget the stored backlog (the queue was emptied, or all of it was read or lost)."""
        self.stored_only = 0
        self.horizon = None
        self.page_wait = 0
        self._tail = NO_LIST
        self._recharge()
        self.body_max = 0            # the next backlog sizes its pages afresh

    def forget_all(self) -> None:
        """The queue was emptied: no put awaits a commit any more, no backlog is left."""
        for rec in self._pending.values():
            rec.awaiting = None
            rec.stored_only = 0
        self.clear()

    def after_horizon(self, entry: Entry) -> bool:
        """True when ``entry`` sorts after the window's last stored key (it belongs here)."""
        h = self.horizon
        if h is None:
            return self.stored_only > 0
        p = entry[PRIORITY]
        priority, msg_id = h
        return p < priority or (p == priority and entry[MSG_ID] > msg_id)

    def awaiting(self) -> int:
        """Puts of uncommitted batches that wait to enter the window."""
        if not self._pending:
            return 0
        return sum([len(entries) for rec in self._pending.values() if rec.awaiting
                    for entries, _ in rec.awaiting])

    @property
    def pending(self) -> bool:
        """True while an uncommitted batch of the queue is tracked."""
        return bool(self._pending)

    def deleted_by_pending(self) -> set[int]:
        """Ids this queue's uncommitted batches delete."""
        dead: set[int] = set()
        for rec in self._pending.values():
            for run in rec.batch.deleted_ids(self.name):
                dead.update(run)
        return dead

    # -- uncommitted batches -------------------------------------------------------------------

    def mark(self, batch: WriteBatch) -> None:
        """``batch`` changes the queue's stored entries: track it until it settles (the queue
        registers itself as the batch's watcher for each mark)."""
        self._unsettled += 1
        pend = self._pending
        if pend is NO_MAP:
            pend = self._pending = {}
        rec = pend.get(id(batch))
        if rec is None:
            pend[id(batch)] = PendingBatch(batch)
        else:
            rec.marks += 1

    def rekey(self, batch: WriteBatch, into: WriteBatch) -> None:
        """``batch`` (attempts and deletes only) was merged into ``into``."""
        rec = self._pending.pop(id(batch), None)
        if rec is None:
            return
        # its holds no longer name entries of the batch they belong to: plain holds now
        low = rec.lowest()
        other = self._pending.get(id(into))
        if other is None:
            self._pending[id(into)] = PendingBatch(into, rec.marks, low)
        else:
            other.marks += rec.marks
            if low is not None and (other.hold is None or low < other.hold):
                other.hold = low

    def settle(self, batch: WriteBatch) -> PendingBatch | None:
        """One mark on ``batch`` settled: the batch's record once its last mark did, else None
        (its puts are then the queue's to admit or forget; see :meth:`settled`)."""
        self._unsettled -= 1
        rec = self._pending.get(id(batch))
        if rec is None:
            if not self._unsettled:
                self._pending = NO_MAP
            return None
        rec.marks -= 1
        if rec.marks > 0:
            return None
        del self._pending[id(batch)]
        return rec

    def settled(self, rec: PendingBatch) -> bool:
        """After the queue handled ``rec``'s puts: note what the settled batch means for paging;
        True when the queue should page now."""
        if self.paging:
            # the read in progress may have started before this commit: it still counts
            for low in (rec.hold, rec.put_hold):
                if low is not None and (self._page_cap is None or low < self._page_cap):
                    self._page_cap = low
            gone = rec.batch.deleted_ids(self.name)
            if gone:
                if self._page_gone is NO_LIST:
                    self._page_gone = []
                self._page_gone += gone
            self.page_wait = WAIT_COMMIT
            return False
        wait = self.page_wait
        if (wait and self.stored_only
                and (wait == WAIT_COMMIT or rec.hold is not None or rec.put_hold is not None)):
            self.page_wait = 0
            return True
        return False

    def refused(self, rec: PendingBatch) -> None:
        """``rec``'s batch was refused by the store: its puts are not kept."""
        n = sum(len(entries) for entries, _ in rec.awaiting) if rec.awaiting else 0
        log.warning("%s: %d message(s) refused by the store are not kept", self.name,
                    n + rec.stored_only)
        if rec.stored_only:
            # stored-only puts that never reached the store: uncount them, forget their tail
            self.stored_only = max(0, self.stored_only - rec.stored_only)
            self.put_gen += 1
            if self._tail:
                gone = {e[MSG_ID] for e in rec.batch.puts.get(self.name, ())}
                keep = [e for e in self._tail if e[MSG_ID] not in gone]
                self._tail.clear()
                self._tail.extend(keep)
                self._recharge()
            if not self.stored_only:
                self.clear()

    def _hold(self, batch: WriteBatch, key: EntryKey) -> None:
        """``batch`` (marked) left the entry at ready-order ``key`` stored-only."""
        rec = self._pending.get(id(batch))
        if rec is None:
            self.hold_all(key)
        elif rec.put_hold is None or key < rec.put_hold:
            rec.put_hold = key

    def hold_all(self, key: EntryKey) -> None:
        """An entry at ready-order ``key`` became stored-only and its put may be uncommitted."""
        for rec in self._pending.values():
            if rec.hold is None or key < rec.hold:
                rec.hold = key

    def _cap(self) -> EntryKey | None:
        """The lowest ready-order key an uncommitted batch may have left stored-only."""
        cap = self._page_cap if self.paging else None
        for rec in self._pending.values():
            for low in (rec.hold, rec.put_hold):
                if low is not None and (cap is None or low < cap):
                    cap = low
        return cap

    def _cap_for(self, page: list[Entry]) -> EntryKey | None:
        """:meth:`_cap` for a page just read: a batch whose put hold the page shows is applied
        in the store (a batch applies whole), so only its other holds count."""
        cap = self._page_cap
        for rec in self._pending.values():
            low = rec.hold
            if low is not None and (cap is None or low < cap):
                cap = low
            put = rec.put_hold
            if put is not None and (cap is None or put < cap):
                # the page is in ready order: look the key up by bisection (a miss, even on a
                # page out of order, only cuts the page earlier)
                i = bisect_left(page, put, key=ready_key)
                if i == len(page) or ready_key(page[i]) != put:
                    cap = put
        return cap

    # -- puts ----------------------------------------------------------------------------------

    def admit(self, entries: list[Entry], batch: WriteBatch | None, uniform: bool,
              tail_budget: int) -> list[Entry]:
        """Stored puts ``entries`` (in id order) arrive while the backlog is not empty: those
        that sort after the horizon join the backlog (held by ``batch`` until it is stored,
        remembered in the tail within ``tail_budget`` bytes); return the others, which belong
        in the window."""
        n = len(entries)
        if uniform:
            # one priority and fresh (largest) ids: the first entry decides for the batch
            keep = [] if self.after_horizon(entries[0]) else entries
            key = None if keep else ready_key(entries[0])
        else:
            keep = [e for e in entries if not self.after_horizon(e)]
            key = min((ready_key(e) for e in entries if self.after_horizon(e)), default=None)
        if key is not None:
            if batch is not None:
                self._hold(batch, key)
            else:
                self.hold_all(key)
            self._keep_tail(entries if not keep else
                            [e for e in entries if self.after_horizon(e)], uniform, tail_budget)
        self.stored_only += n - len(keep)
        self.put_gen += 1
        return keep

    def await_commit(self, batch: WriteBatch, entries: list[Entry], stored_only: int,
                     uniform: bool) -> None:
        """``entries`` (puts of the uncommitted, marked ``batch``, in id order) wait for its
        commit before they enter the window; ``stored_only`` more of its puts went here."""
        rec = self._pending[id(batch)]
        if entries:
            if rec.awaiting is None:
                rec.awaiting = [(entries, uniform)]
            else:
                rec.awaiting.append((entries, uniform))
        rec.stored_only += stored_only

    def take_awaiting(self, wanted: set[int]) -> list[tuple[WriteBatch, list[Entry]]]:
        """Take the puts awaiting their commit whose ids are in ``wanted`` out of their records
        (they will not enter the window); return each batch with the entries taken."""
        out: list[tuple[WriteBatch, list[Entry]]] = []
        for rec in self._pending.values():
            puts = rec.awaiting
            if not puts:
                continue
            taken: list[Entry] = []
            kept: list[tuple[list[Entry], bool]] = []
            for entries, uniform in puts:
                hit = [e for e in entries if e[MSG_ID] in wanted]
                if not hit:
                    kept.append((entries, uniform))
                    continue
                taken.extend(hit)
                rest = [e for e in entries if e[MSG_ID] not in wanted]   # a new list: it is shared
                if rest:
                    kept.append((rest, uniform))
            if taken:
                rec.awaiting = kept or None
                out.append((rec.batch, taken))
        return out

    def returns(self, entries: list[Entry], volatile: set[int]) -> list[Entry]:
        """Entries already stored come back to ready (requeue, timeout, detach): those that now
        sort after the horizon stay in the store only (paged in again in order, so the window
        remains a prefix and nothing is read twice); return the others, for the window."""
        back: list[Entry] = []
        for e in entries:
            if self.stored_only and e[MSG_ID] not in volatile and self.after_horizon(e):
                self.stored_only += 1
                self.put_gen += 1
                if self.page_wait == WAIT_COMMIT:
                    self.page_wait = 0
                if self._pending:
                    self.hold_all(ready_key(e))
            else:
                back.append(e)
        return back

    def evicted(self, dropped: list[Entry], horizon: EntryKey | None, whole: bool,
                tail_budget: int) -> None:
        """The window dropped ``dropped`` (last in ready order first) to the backlog and now
        ends at ``horizon``; ``whole``: the remembered tail was the whole backlog before."""
        if dropped:
            big = max(map(len, map(get_body, dropped)))
            if big > self.body_max:
                self.body_max = big
            self.stored_only += len(dropped)
            self.put_gen += len(dropped)
            if whole:
                self._tail_head(dropped, tail_budget)
            # the horizon moves back: what was dropped can be read again (the last one dropped
            # sorts first; its put may still be uncommitted)
            low = dropped[-1]
            if self.page_wait == WAIT_COMMIT:
                self.page_wait = 0
            if self._pending:
                self.hold_all(ready_key(low))
        self.horizon = horizon
        if self._pending:
            self._awaiting_past_horizon(tail_budget)

    def _awaiting_past_horizon(self, tail_budget: int) -> None:
        """The horizon moved back (eviction): awaiting puts that now sort after it belong to
        the stored backlog, held back from paging until their batch is committed. While the
        remembered tail is the whole backlog they join it (held like any uncommitted put)."""
        whole = self.tail_whole()
        for rec in self._pending.values():
            puts = rec.awaiting
            if not puts:
                continue
            kept = []
            for entries, uniform in puts:
                past = [e for e in entries if self.after_horizon(e)]
                if not past:
                    kept.append((entries, uniform))
                    continue
                low = min(ready_key(e) for e in past)
                if rec.put_hold is None or low < rec.put_hold:
                    rec.put_hold = low
                rec.stored_only += len(past)
                if whole:
                    self._keep_tail(past, uniform, tail_budget)
                self.stored_only += len(past)
                self.put_gen += 1
                if len(past) < len(entries):
                    ids = set(map(get_msg_id, past))
                    kept.append(([e for e in entries if e[MSG_ID] not in ids], uniform))
            rec.awaiting = kept or None

    # -- the remembered tail -------------------------------------------------------------------

    def tail_whole(self) -> bool:
        """True when the remembered tail is the whole stored backlog (or there is none) and no
        page is being read: the window can be refilled from it, and what the window evicts
        sorts before all of it."""
        return not self.paging and len(self._tail) == self.stored_only

    def _keep_tail(self, entries: list[Entry], uniform: bool, budget: int) -> None:
        """Remember ``entries`` (just made stored-only, in id order) as the newest part of the
        backlog, keeping no more than ``budget`` bytes when each entry counts its body, at the
        largest body seen, plus ``ENTRY_COST`` (the oldest are forgotten, not lost).

        The tail stays in ready order: entries that would break it (several priorities, or
        sorting before its last entry) are not remembered and will be read back from the store;
        sorting or filtering an out-of-order tail would cost the whole tail (up to ~322,000
        entries, a pause of tens of ms)."""
        big = max(map(len, map(get_body, entries)))
        if big > self.body_max:
            self.body_max = big
        tail = self._tail = sized(self._tail, tail_limit(budget, self.body_max))
        if self._tails_allow(len(tail) + len(entries)) and stays_sorted(tail, entries, uniform):
            tail.extend(entries)
            self._recharge()

    def _tails_allow(self, n: int) -> bool:
        """True when the broker-wide account of all tails has room for this tail to hold ``n``
        entries (beyond it, what is not remembered is read back from the store)."""
        return n * (self.body_max + ENTRY_COST) <= self._tails.room(self._charged)

    def _recharge(self) -> None:
        """Bring the broker-wide account of tails up to date with the tail's length."""
        charge = len(self._tail) * (self.body_max + ENTRY_COST) if self._tail else 0
        self._tails.used += charge - self._charged
        self._charged = charge

    def _tail_head(self, dropped: list[Entry], budget: int) -> None:
        """The window evicted ``dropped`` (in reverse ready order, all sorting before the
        stored backlog) while the tail was the whole backlog: put them at the tail's head when
        it has room, so they are not read back; otherwise the tail is no longer the whole
        backlog and paging reads it from the store as before."""
        limit = tail_limit(budget, self.body_max)
        n = len(self._tail) + len(dropped)
        if n <= limit and self._tails_allow(n):
            self._tail = sized(self._tail, limit)
            self._tail.extendleft(dropped)    # reversed: the tail stays in ready order
            self._recharge()

    def take_tail(self, room: int) -> list[Entry]:
        """The whole stored backlog is the remembered tail: take up to ``room`` entries off its
        head for the window (the rest stays the tail, and the backlog). Entries an uncommitted
        batch may hold (from the lowest hold on) stay: a put enters the window only once it is
        stored; their commit wakes paging again (WAIT_HOLD). Only the entries taken are
        touched, never the whole tail."""
        tail = self._tail
        take = pop_head(tail, room, self._cap() if self._pending else None)
        self._recharge()
        if not take:
            self.page_wait = WAIT_HOLD     # the head is held by an uncommitted batch
            return take
        if tail:
            last = take[-1]
            self.horizon = get_key(last)
            self.stored_only = len(tail)
        else:
            self.clear()
        self.page_wait = 0
        return take

    def _trim_tail(self) -> None:
        """Forget remembered tail entries a page has read (those up to the horizon)."""
        h = self.horizon
        if h is None:
            self._tail = NO_LIST
        else:
            trim(self._tail, (-h[0], h[1]))
        self._recharge()

    # -- paging --------------------------------------------------------------------------------

    def read(self, room: int, byte_room: int) -> PageRead | None:
        """Start reading the next page for a window with room for ``room`` entries and
        ``byte_room`` body bytes, unless paging must wait (None).

        Uncommitted batches do not stop paging (issue 10): their entries are simply not visible
        yet. Each holds the lowest ready-order key it may have left in the store only; a page is
        cut before the lowest hold, so the horizon never moves past an entry the store cannot
        show yet. When nothing before the hold is left to read, or the last read reached the
        committed end, paging waits for a commit that can change that (:meth:`settled`).
        """
        if self.page_wait:
            return None
        h = self.horizon
        if self._pending and h is not None:
            cap = self._cap()
            if cap is not None and cap <= (-h[0], h[1]):
                self.page_wait = WAIT_HOLD     # nothing readable before the hold
                return None
        self.paging = True
        self.page_wait = 0
        self._page_cap = None
        self._page_gone = NO_LIST
        limit = min(PAGE_LIMIT, room)
        # bodies count too: ask for what fits the byte budget by the largest body seen (the
        # store reads by count; a page is evicted back down to the budget if it was bigger)
        big = self.body_max
        limit = max(1, min(limit, FIRST_PAGE if not big else byte_room // big))
        return PageRead(self._store.read_entries(self.name, h, limit), self.put_gen, limit)

    def page(self, entries: list[Entry], gen: int, asked: int, current: bool,
             inflight: dict[int, Entry], claimed: dict[int, Entry]) -> PageResult:
        """A page read from the store: what of it enters the window, and what next.

        ``current``: the queue is still the one the read was for (not deleted nor emptied).
        Entries in flight or handed to fan-out subscribers (``inflight``, ``claimed``:
        delivered before the horizon moved back past them) were never counted as stored-only:
        they are skipped. The page is cut before the lowest key an uncommitted batch may have
        left stored-only, and entries an uncommitted batch deletes (acks not yet durable) are
        dropped.
        """
        cap = self._cap_for(entries)
        gone_ids = self._page_gone
        settled_meanwhile = self.page_wait == WAIT_COMMIT
        self.paging = False
        self._page_cap = None
        self._page_gone = NO_LIST
        self.page_wait = 0
        if not current:
            return _NOTHING
        short = len(entries) < asked
        cut = False
        if cap is not None and entries and ready_key(entries[-1]) >= cap:
            entries = [e for e in entries if ready_key(e) < cap]
            short = False
            cut = True
            if not entries:
                return PageResult(NO_LIST, self._wait_or_retry(WAIT_HOLD, settled_meanwhile),
                                  False)
        if not entries:
            if gen == self.put_gen and not self._unsettled:
                # everything is committed and nothing follows the horizon: the count was stale
                self.clear()
                return _NOTHING
            if not self._unsettled:
                return PageResult(NO_LIST, 0.05, False)
            return PageResult(NO_LIST, self._wait_or_retry(WAIT_COMMIT, settled_meanwhile),
                              False)
        ids = list(map(get_msg_id, entries))
        # the usual page shares no id with the in-flight / claimed maps: test that in C and
        # keep the page as it is; filter entry by entry only when some id is shared
        if (inflight and not inflight.keys().isdisjoint(ids)) or (
                claimed and not claimed.keys().isdisjoint(ids)):
            fresh = [e for e in entries if e[MSG_ID] not in inflight and e[MSG_ID] not in claimed]
        else:
            fresh = entries
        if self._skip:
            skip = self._skip
            if not skip.isdisjoint(ids):
                gone = [e for e in fresh if e[MSG_ID] in skip]
                if gone:
                    fresh = [e for e in fresh if e[MSG_ID] not in skip]
                    self.stored_only = max(0, self.stored_only - len(gone))
            self._skip = NO_IDS
        if self._pending or gone_ids:
            # deleted by a batch not yet committed when the page was read: never bring it back
            dead = self.deleted_by_pending()
            for gone_run in gone_ids:
                dead.update(gone_run)
            if dead and not dead.isdisjoint(ids):
                fresh = [e for e in fresh if e[MSG_ID] not in dead]
        last = entries[-1]
        self.horizon = get_key(last)
        self._ids.observe(max(ids))
        if fresh:
            big = max(map(len, map(get_body, fresh)))
            if big > self.body_max:
                self.body_max = big
        self.stored_only = max(0, self.stored_only - len(fresh))
        if self._tail:
            self._trim_tail()
        again = None
        if not self.stored_only:
            self.clear()
        elif cut or (short and self._unsettled):
            # everything readable was read: the next read waits for a commit that shows more
            again = self._wait_or_retry(WAIT_HOLD if cut else WAIT_COMMIT, settled_meanwhile)
        elif not fresh:
            # the page had only in-flight entries: continue on the next turn, not recursively
            return PageResult(fresh, 0.0, False)
        return PageResult(fresh, again, True)

    def _wait_or_retry(self, why: int, settled_meanwhile: bool) -> float | None:
        """Nothing more could be paged: wait for the commit ``why`` names (None), or read again
        next turn (0.0) when one of the queue's batches was committed while the page was read."""
        if settled_meanwhile:
            return 0.0
        self.page_wait = why
        return None

    def read_failed(self) -> None:
        """The page read failed (the queue logs it and tries again later)."""
        self.paging = False

    def skip_ids(self, wanted: set[int]) -> None:
        """Ids removed while a page may be read: make sure the page does not bring them back."""
        if self.paging and self.stored_only:
            if self._skip is NO_IDS:
                self._skip = set()
            self._skip.update(wanted)

    def recovered(self, count: int) -> None:
        """Start-up: the store holds ``count`` entries; the window is paged from the start."""
        self.stored_only = count
        self.horizon = None
        self.page_wait = 0

    def read_all_after(self, d: Deferred[object], limit: int) -> Deferred[list[Entry]] | None:
        """When ``d`` fires, read the next ``limit`` stored entries whatever the window's size
        (draining a parking queue); give them to :meth:`loaded`. None when there is no stored
        backlog or a read is already running."""
        if not self.stored_only or self.paging:
            return None
        self._tail = NO_LIST         # read back from the store, never taken from memory
        self._recharge()
        self.paging = True
        after = self.horizon
        return d.addCallback(lambda _: self._store.read_entries(self.name, after, limit))

    def loaded(self, page: list[Entry]) -> bool:
        """A page of :meth:`read_all_after` arrived (the queue puts it in its window)."""
        self.paging = False
        if not page:
            self.stored_only = 0
            self.horizon = None
            return False
        self.horizon = get_key(page[-1])
        self.stored_only = max(0, self.stored_only - len(page))
        if not self.stored_only:
            self.horizon = None
        return True
