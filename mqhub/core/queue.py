"""The Queue: the one work-queue primitive every protocol uses (its Consumer is in consumer.py).

Ready entries are kept per priority in deques (a bounded window that is a prefix of the ready
order); the rest of a durable queue's backlog stays in the store and is paged in as the window
drains. In-flight entries sit in one dict keyed by msg_id with their consumer and deadline;
deadlines are tracked per delivered batch in a heap, so one timer per queue serves them all.
Every operation takes and returns lists (batch-oriented); no per-message Deferred is made.
"""

from __future__ import annotations

import heapq
import logging
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from mqhub.core import fanout
from mqhub.core.consumer import Consumer
from mqhub.core.deadletter import (
    REASON_EXPIRED,
    REASON_MAX_ATTEMPTS,
    REASON_OVERFLOW,
    REASON_REJECTED,
    dlq_name,
    to_dead,
)
from mqhub.core.ids import first_id_at
from mqhub.core.message import TIER_DURABLE, TIER_MEMORY
from mqhub.errors import InvalidName, NoSuchQueue
from mqhub.store.batch import WriteBatch
from mqhub.store.records import Entry, EntryKey

if TYPE_CHECKING:  # pragma: no cover
    from mqhub.core.broker import Broker

log = logging.getLogger(__name__)

__all__ = ["Consumer", "Queue", "MAX_ATTEMPTS_HEADER", "OVERFLOW_POLICIES", "MODES",
           "NOT_IN_FLIGHT", "NOT_OWNER"]

#: failure reasons of ack/requeue/touch/reject (see Queue.failure_reasons)
NOT_IN_FLIGHT = "not_in_flight"
NOT_OWNER = "not_owner"

#: Header a message may carry to override its queue's ``max_attempts``.
MAX_ATTEMPTS_HEADER = "mqhub-max-attempts"
OVERFLOW_POLICIES = ("drop_oldest", "reject", "dead_letter")
MODES = ("competing", "fanout")
INF = float("inf")
_MEM_DEAD_LIMIT = 10_000

# Shared, immutable stand-ins for containers an idle queue never fills: each one is replaced by
# a real container of the queue's own at the first write (an idle queue costs no empty dict,
# set, deque or list). Reads (len, in, get, iteration) work on them unchanged.
_NO_MAP: Any = MappingProxyType({})
_NO_IDS: Any = frozenset()
_NO_LIST: Any = ()


class Queue:
    """Ready entries ordered by (priority desc, msg_id asc), in-flight entries with deadlines.

    Slotted, and its containers are made on first use: an idle queue is one small object
    (see docs/core-api.md, "Memory").
    """

    __slots__ = (
        "broker", "name", "tier", "durable", "max_size", "overflow", "ttl", "max_attempts",
        "msg_timeout", "expires_at", "auto_delete", "expire_to_dead_letters", "window",
        "window_setting", "mode", "_parent", "_subs", "_claimed", "_refs", "_open", "_fan_seq",
        "incarnation", "paused", "deleted", "consumers", "_ready", "_prios", "_nready",
        "_stored_only", "_horizon", "_paging", "_unsettled", "_put_gen", "_volatile", "_skip",
        "_inflight", "_owner", "_may_expire", "_deadlines", "_heap_ids", "_dseq", "_timer",
        "_timer_at", "_rr", "_dispatching", "_again", "deferred", "message_count",
        "requeue_count", "timeout_count", "expired_count", "dropped_count", "dead_letter_count",
        "_mem_dead")

    def __init__(self, broker: Broker, name: str, *, tier: str = TIER_DURABLE,
                 max_size: int = 0, overflow: str = "drop_oldest", ttl: float = 0.0,
                 max_attempts: int = 0, msg_timeout: float = 60.0, expires_at: float = 0.0,
                 auto_delete: bool = False, expire_to_dead_letters: bool = False,
                 window: int = 10_000, incarnation: int = 0, mode: str = "competing",
                 window_setting: int = 0) -> None:
        """Made by :meth:`Broker.declare_queue` (see docs/core-api.md for the settings)."""
        if tier not in (TIER_DURABLE, TIER_MEMORY):
            raise InvalidName(f"unknown tier {tier!r}")
        if mode not in MODES:
            raise InvalidName(f"unknown delivery mode {mode!r}")
        if overflow not in OVERFLOW_POLICIES:
            raise InvalidName(f"unknown overflow policy {overflow!r}")
        self.broker = broker
        self.name = name
        self.tier = tier
        self.durable = tier == TIER_DURABLE
        self.max_size = int(max_size)
        self.overflow = overflow
        self.ttl = float(ttl)
        self.max_attempts = int(max_attempts)
        self.msg_timeout = float(msg_timeout)
        self.expires_at = float(expires_at)
        self.auto_delete = bool(auto_delete)
        self.expire_to_dead_letters = bool(expire_to_dead_letters)
        self.window = max(1, int(window))
        #: the queue's own window size (0 = the broker's); ``window`` is the one in effect
        self.window_setting = max(0, int(window_setting))
        self.mode = mode
        # fan-out: one private memory sub-queue per consumer gets a copy of every message; the
        # parent keeps the stored entry until every sub-queue that got it is done with it
        self._parent: Queue | None = None
        self._subs: list[Queue] = _NO_LIST
        self._claimed: dict[int, Entry] = _NO_MAP
        self._refs: dict[int, int] = _NO_MAP
        self._open: set[int] = _NO_IDS        # (sub-queue) ids received and not yet done
        self._fan_seq = 0
        self.incarnation = incarnation
        self.paused = False
        self.deleted = False
        self.consumers: list[Consumer] = _NO_LIST
        # ready window
        self._ready: dict[int, deque[Entry]] = _NO_MAP
        self._prios: list[int] = _NO_LIST     # priorities with a deque, descending
        self._nready = 0
        self._stored_only = 0                 # durable entries in the store beyond the window
        self._horizon: EntryKey | None = None   # last key in the window when paged
        self._paging = False
        self._unsettled = 0                   # this queue's put batches not yet committed
        self._put_gen = 0                     # bumps whenever stored-only entries are added
        self._volatile: set[int] = _NO_IDS    # ids of persist=False entries in a durable queue
        self._skip: set[int] = _NO_IDS        # ids removed while a page was being read
        # in flight
        self._inflight: dict[int, Entry] = _NO_MAP
        # msg_id -> (consumer, deadline); one tuple shared by every message of a delivered batch
        self._owner: dict[int, tuple[Consumer, float]] = _NO_MAP
        self._may_expire = False              # some entry with expires_at was added
        self._deadlines: list[tuple[float, int, list[int]]] = _NO_LIST
        self._heap_ids = 0                    # ids held by _deadlines (acked ones included)
        self._dseq = 0
        self._timer: Any = None
        self._timer_at = INF
        self._rr = 0
        self._dispatching = False
        self._again = False
        # counters
        self.deferred = 0
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.expired_count = 0
        self.dropped_count = 0
        self.dead_letter_count = 0
        self._mem_dead: deque[Entry] = _NO_LIST   # memory-tier dead letters (newest kept)

    # -- settings ------------------------------------------------------------------------------

    def settings(self) -> dict[str, Any]:
        """The persisted settings of this queue."""
        return {"tier": self.tier, "max_size": self.max_size, "overflow": self.overflow,
                "ttl": self.ttl, "max_attempts": self.max_attempts,
                "msg_timeout": self.msg_timeout, "expires_at": self.expires_at,
                "auto_delete": self.auto_delete,
                "expire_to_dead_letters": self.expire_to_dead_letters,
                "incarnation": self.incarnation, "mode": self.mode,
                "window": self.window_setting}

    def configure(self, **settings: Any) -> None:
        """Change settings (tier cannot change); persisted for durable queues."""
        for key, value in settings.items():
            if key not in ("max_size", "overflow", "ttl", "max_attempts", "msg_timeout",
                           "expires_at", "auto_delete", "expire_to_dead_letters", "window"):
                raise InvalidName(f"cannot configure {key!r}")
            if key == "overflow" and value not in OVERFLOW_POLICIES:
                raise InvalidName(f"unknown overflow policy {value!r}")
            if key == "window":
                self.window_setting = max(0, int(value))
                self.window = max(1, self.window_setting or self.broker.window)
                continue
            setattr(self, key, value)
        self.broker._queue_changed(self)
        if "window" in settings and self.durable:
            if self._nready > self._effective_window():
                self._evict()
            else:
                self._maybe_page()
        if "expires_at" in settings:
            self.broker._schedule_expiry(self)

    # -- counts --------------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Ready messages (in memory plus stored backlog), not counting in flight or deferred."""
        return self._nready + self._stored_only

    @property
    def in_flight(self) -> int:
        """Messages delivered and not yet acked (over every subscriber in fan-out mode)."""
        if self._subs:
            return len(self._inflight) + sum(len(sub._inflight) for sub in self._subs)
        return len(self._inflight)

    def stats(self) -> dict[str, Any]:
        """Counters in the shape the admin surfaces and NSQ /stats use."""
        return {"name": self.name, "tier": self.tier, "depth": self.depth,
                "in_memory": self._nready, "in_flight": len(self._inflight),
                "deferred": self.deferred, "message_count": self.message_count,
                "requeue_count": self.requeue_count, "timeout_count": self.timeout_count,
                "expired_count": self.expired_count, "dropped_count": self.dropped_count,
                "dead_letter_count": self.dead_letter_count,
                "consumers": len(self.consumers) + sum(len(s.consumers) for s in self._subs),
                "paused": self.paused, "mode": self.mode}

    # -- window helpers ------------------------------------------------------------------------

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

    def _insert(self, entry: Entry) -> None:
        """Insert one entry at its place by msg_id within its priority (cold path: requeue)."""
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
        if len(entries) < 8:
            for e in entries:
                self._insert(e)
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
            else:
                back.append(e)
        self._insert_many(back)

    def _after_horizon(self, entry: Entry) -> bool:
        """True when ``entry`` sorts after the window's last key (it belongs to the stored backlog)."""
        h = self._horizon
        if h is None:
            return self._stored_only > 0
        p = entry[1]
        return p < h[0] or (p == h[0] and entry[0] > h[1])

    def _put(self, entries: list[Entry], batch: WriteBatch | None, persist: bool,
             now: float, uniform: bool = False) -> None:
        """Add ``entries`` (in id order) to the queue; store writes go into ``batch``.

        ``uniform`` promises every entry has the same priority and expiry (a publish batch).
        """
        n = len(entries)
        self.message_count += n
        stored = self.durable and persist
        if stored and batch is not None:
            batch.put_entries(self.name, entries)
            self._mark(batch)
        if stored and self._stored_only:
            if uniform:
                # one priority and fresh (largest) ids: the first entry decides for the batch
                keep = [] if self._after_horizon(entries[0]) else entries
            else:
                keep = [e for e in entries if not self._after_horizon(e)]
            self._stored_only += n - len(keep)
            self._put_gen += 1
            entries = keep
        elif not stored and self.durable:
            if self._volatile is _NO_IDS:
                self._volatile = set()
            self._volatile.update([e[0] for e in entries])
        if entries:
            if not self._may_expire and (entries[0][4] if uniform
                                         else any(e[4] for e in entries)):
                self._may_expire = True
            p = entries[0][1]
            d = self._deque(p)
            last = d[-1][0] if d else -1
            if entries[0][0] > last and (uniform or all(
                    e[1] == p for e in entries)):
                d.extend(entries)
                self._nready += len(entries)
            else:
                self._insert_many(entries)
        if self.max_size and self.depth > self.max_size:
            self._overflow(self.depth - self.max_size, batch, now)
        if self.durable and self._nready > self._effective_window():
            self._evict()
        self.dispatch()

    def _effective_window(self) -> int:
        """Window size; a bounded queue keeps its whole content in memory."""
        return max(self.window, self.max_size) if self.max_size else self.window

    def _evict(self) -> None:
        """Drop the tail of the window to the stored backlog, keeping the window a prefix.

        Entries that are not in the store (``persist=False``) are never evicted.
        """
        excess = self._nready - self._effective_window()
        volatile = self._volatile
        for p in sorted(self._prios):
            d = self._ready[p]
            kept: list[Entry] = []
            while d and excess > 0:
                e = d.pop()
                if e[0] in volatile:
                    kept.append(e)
                    continue
                excess -= 1
                self._nready -= 1
                self._stored_only += 1
                self._put_gen += 1
            if kept:
                d.extend(reversed(kept))
            if excess <= 0:
                break
        for p in sorted(self._prios):
            d = self._ready[p]
            for e in reversed(d):
                if e[0] not in volatile:
                    self._horizon = (p, e[0])
                    return
        self._horizon = None

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
                pop = d.popleft
                out.extend([pop() for _ in range(k)])
            if len(out) >= n:
                break
        self._nready -= len(out)
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
        return out

    def _overflow(self, excess: int, batch: WriteBatch | None, now: float) -> None:
        """Apply the overflow policy to ``excess`` entries beyond ``max_size``."""
        victims = self._pop_oldest(excess)
        if not victims:
            return
        if self._volatile:
            self._volatile.difference_update([e[0] for e in victims])
        if self.overflow == "dead_letter":
            self._dead(victims, REASON_OVERFLOW, "queue full", batch, now)
        else:
            self.dropped_count += len(victims)
            if self.durable and batch is not None:
                batch.delete_entries(self.name, [(e[1], e[0]) for e in victims])
                self._mark(batch)

    def room(self) -> int:
        """How many more messages fit before ``max_size`` (a large number when unbounded)."""
        if not self.max_size:
            return 1 << 62
        return self.max_size - self.depth

    def _ttl_cut(self, now: float) -> int:
        """Ids below this are older than the queue TTL (0 when the queue has no TTL)."""
        if not self.ttl:
            return 0
        return first_id_at(now - self.ttl)

    def _drop_expired(self, entries: list[Entry], now: float, ttl_cut: int) -> list[Entry]:
        """Expire the entries of ``entries`` past their deadline or the queue TTL; return the rest."""
        live = [e for e in entries if not ((e[4] and e[4] <= now) or e[0] < ttl_cut)]
        if len(live) != len(entries):
            self._expire([e for e in entries if (e[4] and e[4] <= now) or e[0] < ttl_cut], now)
        return live

    # -- paging --------------------------------------------------------------------------------

    def _maybe_page(self) -> None:
        """Read the next page of the stored backlog when the window runs low.

        No page is read while one of this queue's put batches is uncommitted: the store could
        not show those entries yet, and the horizon must never move past an unread entry.
        """
        if (self._paging or not self._stored_only or self.deleted or self._unsettled
                or self._nready > self._effective_window() // 2):
            return
        self._paging = True
        limit = self._effective_window() - self._nready
        d = self.broker.store.read_entries(self.name, self._horizon, max(1, limit))
        d.addCallbacks(self._paged, self._page_failed,
                       callbackArgs=(self.incarnation, self._put_gen))

    def _mark(self, batch: WriteBatch) -> None:
        """``batch`` changes this queue's stored entries: no paging until it is committed."""
        self._unsettled += 1
        self.broker._unsettled_add(batch, self)

    def _write(self, batch: WriteBatch) -> Any:
        """Commit a batch of this queue's own writes (marking it unsettled until then)."""
        if batch and self.durable:
            self._mark(batch)
        return self.broker._commit(batch)

    def _settle(self) -> None:
        """One of this queue's put batches was committed (or failed)."""
        self._unsettled -= 1
        if not self._unsettled and self._stored_only:
            self.dispatch()

    def _paged(self, entries: list[Entry], incarnation: int, gen: int) -> None:
        """Append a page read from the store to the window.

        Entries of the page that are in flight, or handed to fan-out subscribers, (delivered
        before the horizon moved back past them) were never counted as stored-only; they are
        skipped and not counted.
        """
        self._paging = False
        if self.deleted or incarnation != self.incarnation:
            return
        if not entries:
            if gen == self._put_gen and not self._unsettled:
                # everything is committed and nothing follows the horizon: the count was stale
                self._stored_only = 0
                self._horizon = None
            elif not self._unsettled:
                self.broker.clock.callLater(0.05, self._maybe_page)
            return
        inflight = self._inflight
        claimed = self._claimed
        fresh = [e for e in entries if e[0] not in inflight and e[0] not in claimed]
        if self._skip:
            skip = self._skip
            gone = [e for e in fresh if e[0] in skip]
            if gone:
                fresh = [e for e in fresh if e[0] not in skip]
                self._stored_only = max(0, self._stored_only - len(gone))
            self._skip = _NO_IDS
        last = entries[-1]
        self._horizon = (last[1], last[0])
        self.broker.ids.observe(max(e[0] for e in entries))
        if not self._may_expire and any(e[4] for e in fresh):
            self._may_expire = True
        self._insert_many(fresh)
        self._stored_only = max(0, self._stored_only - len(fresh))
        if not self._stored_only:
            self._horizon = None
        if self._stored_only and not fresh:
            # the page held only in-flight entries: continue on the next turn, not recursively
            self.broker.clock.callLater(0, self._maybe_page)
            return
        self.dispatch()

    def _page_failed(self, failure: Any) -> None:
        """A page read failed: log it and try again later."""
        self._paging = False
        log.error("paging %s failed: %s", self.name, failure.getErrorMessage())
        self.broker.clock.callLater(1.0, self._maybe_page)

    def _recovered(self, count: int) -> None:
        """Start-up: the store holds ``count`` entries; the window will be paged from the start."""
        self._stored_only = count
        self._horizon = None
        self._maybe_page()

    # -- consumers -----------------------------------------------------------------------------

    def attach(self, target: Any, *, ready: int = 0, credit: int = 0,
               timeout: float | None = None, tag: Any = None) -> Consumer:
        """Attach a consumer; ``target.deliver_batch(consumer, queue_name, entries)`` receives."""
        if self.deleted:
            raise NoSuchQueue(self.name)
        if self.mode == "fanout" and self._parent is None:
            return fanout.attach(self, target, ready, credit, timeout, tag)
        c = Consumer(self, target, int(ready or 0), int(credit or 0),
                     self.msg_timeout if timeout is None else float(timeout), tag)
        if self.consumers is _NO_LIST:
            self.consumers = []
        self.consumers.append(c)
        self.dispatch()
        return c

    def detach(self, consumer: Consumer, requeue: bool = True) -> None:
        """Detach ``consumer``; its in-flight messages return to ready (attempts kept)."""
        if consumer.queue is not self:
            consumer.queue.detach(consumer, requeue)
            return
        if not consumer.attached:
            return
        consumer.attached = False
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        if self._parent is not None:
            fanout.release(self._parent, self)
            return
        mine = [mid for mid, rec in self._owner.items() if rec[0] is consumer]
        if mine and requeue:
            self._requeue_ids(consumer, mine, 0.0, None, count=False)
        if self.auto_delete and not self.consumers and not self.deleted:
            self.broker.delete_queue(self.name)
        else:
            self.dispatch()

    # -- dispatch ------------------------------------------------------------------------------

    def dispatch(self) -> None:
        """Deliver ready entries to consumers with room, round robin, one batch per consumer.

        Re-entrant calls (an adapter acking inside ``deliver_batch``) are folded into one more
        round of the running dispatch.
        """
        if self._dispatching:
            self._again = True
            return
        if self.paused or self.deleted:
            return
        if self._subs:
            fanout.dispatch(self)
            return
        self._dispatching = True
        try:
            self._again = True
            while self._again:
                self._again = False
                if not self._nready:
                    self._maybe_page()
                    if not self._nready:
                        break
                if not self.consumers or self.paused or self.deleted:
                    break
                self._dispatch_round()
        finally:
            self._dispatching = False
        if self._stored_only:
            self._maybe_page()

    def _dispatch_round(self) -> None:
        """One round over the consumers: each with room gets one batch."""
        consumers = list(self.consumers)
        now = self.broker.clock.seconds()
        ttl_cut = self._ttl_cut(now)
        ncons = len(consumers)
        start = self._rr % ncons
        self._rr += 1
        record = self.max_attempts > 0 and self.durable
        for k in range(ncons):
            if not self._nready:
                break
            c = consumers[(start + k) % ncons]
            if not c.attached:
                continue
            avail = c.available()
            if avail <= 0:
                continue
            taken = self._pop_ready(avail)
            if self._may_expire or ttl_cut:
                n = len(taken)
                taken = self._drop_expired(taken, now, ttl_cut)
                if len(taken) != n:
                    self._again = True
                if not taken:
                    continue
            out = [(a, b, n + 1, d, x, f, g, h, i) for a, b, n, d, x, f, g, h, i in taken]
            self.broker.journal.delivered(self, out)
            deadline = now + c.timeout
            ids = [e[0] for e in out]
            if self._inflight is _NO_MAP:
                self._inflight = {}
                self._owner = {}
            self._inflight.update(zip(ids, out, strict=False))
            self._owner.update(dict.fromkeys(ids, (c, deadline)))
            n = len(out)
            c.in_flight += n
            if c.credit > 0:
                c.credit -= n
            self._push_deadline(deadline, ids)
            if record:
                b = WriteBatch()
                b.set_attempts(self.name, [(e[1], e[0], e[2]) for e in out])
                self.broker._commit(b)
            try:
                c.target.deliver_batch(c, self.name, out)
            except Exception:
                log.exception("deliver_batch of %r failed", c.target)

    def _push_deadline(self, deadline: float, ids: list[int]) -> None:
        """Track ``ids`` expiring at ``deadline`` and arm the queue timer if it is the earliest."""
        self._dseq += 1
        if self._deadlines is _NO_LIST:
            self._deadlines = []
        heapq.heappush(self._deadlines, (deadline, self._dseq, ids))
        self._heap_ids += len(ids)
        if self._heap_ids > 4 * len(self._owner) + 4096:
            self._compact_deadlines()
        if deadline < self._timer_at:
            self._arm(deadline)

    def _compact_deadlines(self) -> None:
        """Rebuild the deadline heap from what is still in flight (acked ids leave it here)."""
        groups: dict[tuple[Consumer, float], list[int]] = {}
        for mid, rec in self._owner.items():
            groups.setdefault(rec, []).append(mid)
        heap = []
        for rec, ids in groups.items():
            self._dseq += 1
            heap.append((rec[1], self._dseq, ids))
        heapq.heapify(heap)
        self._deadlines = heap
        self._heap_ids = len(self._owner)

    def _arm(self, when: float) -> None:
        """Arm the single in-flight timer for ``when``."""
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        clock = self.broker.clock
        self._timer_at = when
        self._timer = clock.callLater(max(0.0, when - clock.seconds()), self._on_timer)

    def _on_timer(self) -> None:
        """Time out every in-flight message whose deadline has passed, then re-arm."""
        self._timer = None
        self._timer_at = INF
        now = self.broker.clock.seconds()
        heap = self._deadlines
        expired: dict[Consumer, list[int]] = {}
        owner = self._owner
        while heap and heap[0][0] <= now:
            _, _, ids = heapq.heappop(heap)
            self._heap_ids -= len(ids)
            for mid in ids:
                rec = owner.get(mid)
                if rec is not None and rec[1] <= now:
                    expired.setdefault(rec[0], []).append(mid)
        for consumer, ids in expired.items():
            self.timeout_count += len(ids)
            self._requeue_ids(consumer, ids, 0.0, "timeout", count=False)
        if heap and not self.deleted:
            self._arm(heap[0][0])

    # -- message operations ---------------------------------------------------------------------

    def _take(self, consumer: Consumer, msg_ids: Iterable[int]) -> tuple[list[Entry], list[int]]:
        """Pop the in-flight records of ``msg_ids`` held by ``consumer``; return (entries, failed)."""
        ids = msg_ids if isinstance(msg_ids, list) else list(msg_ids)
        owner = self._owner
        recs = set(map(owner.get, ids))
        if len(recs) == 1 and len(set(ids)) == len(ids):
            rec = recs.pop()
            if rec is not None and rec[0] is consumer:
                got = list(map(self._inflight.pop, ids))
                for mid in ids:
                    del owner[mid]
                consumer.in_flight -= len(got)
                return got, []
        inflight = self._inflight
        got = []
        failed: list[int] = []
        for mid in ids:
            rec = owner.get(mid)
            if rec is None or rec[0] is not consumer:
                failed.append(mid)
                continue
            del owner[mid]
            got.append(inflight.pop(mid))
        consumer.in_flight -= len(got)
        return got, failed

    def owner_of(self, msg_id: int) -> Consumer | None:
        """The consumer holding ``msg_id`` in flight on this queue (or its fan-out subscribers)."""
        rec = self._owner.get(msg_id)
        if rec is not None:
            return rec[0]
        for sub in self._subs:
            rec = sub._owner.get(msg_id)
            if rec is not None:
                return rec[0]
        return None

    def failure_reasons(self, consumer: Consumer,
                        msg_ids: Iterable[int]) -> list[tuple[int, str]]:
        """Why ``consumer`` cannot ack/requeue/touch/reject each id: ``(msg_id, reason)``.

        ``NOT_OWNER`` ("not_owner"): the message is in flight on another consumer;
        ``NOT_IN_FLIGHT`` ("not_in_flight"): unknown, ready, deferred or already finished.
        Meant for the ids an operation returned as failed (NSQ ``E_FIN_FAILED`` texts); an id
        that ``consumer`` does hold is reported as ``"ok"``.
        """
        owner = consumer.queue._owner
        out: list[tuple[int, str]] = []
        for mid in msg_ids:
            rec = owner.get(mid)
            if rec is None:
                out.append((mid, NOT_IN_FLIGHT))
            elif rec[0] is consumer:
                out.append((mid, "ok"))
            else:
                out.append((mid, NOT_OWNER))
        return out

    def ack(self, consumer: Consumer, msg_ids: Iterable[int]) -> list[int]:
        """Acknowledge (NSQ FIN); return the ids that were not in flight on ``consumer``."""
        if consumer.queue is not self:
            return consumer.queue.ack(consumer, msg_ids)
        got, failed = self._take(consumer, msg_ids)
        if got and self._parent is not None:
            fanout.done(self._parent, self, got)
        if got and self.durable:
            b = WriteBatch()
            b.delete_entries(self.name, [(e[1], e[0]) for e in got])
            self._write(b)
        if got:
            self.broker.journal.acked(self, got)
            self.dispatch()
        return failed

    def touch(self, consumer: Consumer, msg_ids: Iterable[int],
              extend: float | None = None) -> list[int]:
        """Reset the deadline of in-flight messages to now + ``extend`` (default: consumer timeout)."""
        if consumer.queue is not self:
            return consumer.queue.touch(consumer, msg_ids, extend)
        now = self.broker.clock.seconds()
        deadline = now + (consumer.timeout if extend is None else float(extend))
        failed: list[int] = []
        touched: list[int] = []
        rec = (consumer, deadline)
        owner = self._owner
        for mid in msg_ids:
            old = owner.get(mid)
            if old is None or old[0] is not consumer:
                failed.append(mid)
            else:
                owner[mid] = rec
                touched.append(mid)
        if touched:
            self._push_deadline(deadline, touched)
        return failed

    def requeue(self, consumer: Consumer, msg_ids: Iterable[int], delay: float = 0.0,
                error: str | None = None) -> list[int]:
        """Return in-flight messages to ready (or deferred by ``delay`` seconds); dead-letter at max attempts."""
        if consumer.queue is not self:
            return consumer.queue.requeue(consumer, msg_ids, delay, error)
        return self._requeue_ids(consumer, msg_ids, delay, error, count=True)

    def _requeue_ids(self, consumer: Consumer, msg_ids: Iterable[int], delay: float,
                     error: str | None, count: bool) -> list[int]:
        """Shared by requeue, timeouts and detach."""
        got, failed = self._take(consumer, msg_ids)
        if not got:
            return failed
        if count:
            self.requeue_count += len(got)
        now = self.broker.clock.seconds()
        b = WriteBatch()
        dead: list[Entry] = []
        back: list[Entry] = []
        for e in got:
            limit = self.max_attempts
            h = e[6]
            if h and MAX_ATTEMPTS_HEADER in h:
                try:
                    limit = int(h[MAX_ATTEMPTS_HEADER])
                except (TypeError, ValueError):
                    pass
            if limit > 0 and e[2] >= limit:
                dead.append(e)
            else:
                back.append(e)
        if dead:
            self._dead(dead, REASON_MAX_ATTEMPTS, error, b, now)
        if back:
            self.broker.journal.requeued(self, back, error)
            if self.durable:
                b.set_attempts(self.name, [(e[1], e[0], e[2]) for e in back])
            if delay and delay > 0:
                if self.durable:
                    b.delete_entries(self.name, [(e[1], e[0]) for e in back])
                self.broker._defer(self, back, now + delay, b)
            else:
                self._return(back)
        if b:
            self._write(b)
        self.dispatch()
        return failed

    def reject(self, consumer: Consumer, msg_ids: Iterable[int], reason: str = REASON_REJECTED,
               error: str | None = None) -> list[int]:
        """Dead-letter in-flight messages now with ``reason``; return ids not in flight."""
        if consumer.queue is not self:
            return consumer.queue.reject(consumer, msg_ids, reason, error)
        got, failed = self._take(consumer, msg_ids)
        if got:
            b = WriteBatch()
            self._dead(got, reason, error, b, self.broker.clock.seconds())
            self._write(b)
            self.dispatch()
        return failed

    def _dead(self, entries: list[Entry], reason: str, error: str | None,
              batch: WriteBatch | None, now: float) -> None:
        """Move ``entries`` (already out of the window/in-flight) to this queue's dead letters."""
        self.broker.journal.dead_lettered(self, entries, reason)
        if self._parent is not None:
            fanout.dead(self._parent, self, entries, reason, error, now)
            return
        self.dead_letter_count += len(entries)
        dead = [to_dead(e, self.name, reason, error, now) for e in entries]
        if self.durable and batch is not None:
            batch.delete_entries(self.name, [(e[1], e[0]) for e in entries])
            batch.put_entries(dlq_name(self.name), dead)
            self._mark(batch)
        else:
            self._keep_mem_dead(dead)

    def _keep_mem_dead(self, dead: list[Entry], replace: bool = False) -> None:
        """Add (or with ``replace``, set) this memory queue's dead letters; the newest are kept."""
        if replace or self._mem_dead is _NO_LIST:
            self._mem_dead = deque(self._mem_dead if not replace else (), maxlen=_MEM_DEAD_LIMIT)
        self._mem_dead.extend(dead)

    def _expire(self, entries: list[Entry], now: float) -> None:
        """Count and drop (or dead-letter) expired entries taken from the window."""
        self.broker.journal.expired(self, entries)
        if self._parent is not None and not self.expire_to_dead_letters:
            self.expired_count += len(entries)
            fanout.done(self._parent, self, entries)
            return
        if self._volatile:
            self._volatile.difference_update([e[0] for e in entries])
        self.expired_count += len(entries)
        b = WriteBatch()
        if self.expire_to_dead_letters:
            self._dead(entries, REASON_EXPIRED, "expired", b, now)
        elif self.durable:
            b.delete_entries(self.name, [(e[1], e[0]) for e in entries])
        if b:
            self._write(b)

    def sweep(self, now: float, budget: int) -> int:
        """Drop expired ready entries from the window, scanning at most ``budget``; return the scan count."""
        ttl_cut = self._ttl_cut(now)
        scanned = 0
        expired: list[Entry] = []
        for p in self._prios:
            d = self._ready[p]
            if not d:
                continue
            if len(d) > budget - scanned:
                # big window: only the head (oldest) can be past the queue TTL cheaply
                while d and scanned < budget and (
                        d[0][0] < ttl_cut or (d[0][4] and d[0][4] <= now)):
                    expired.append(d.popleft())
                    scanned += 1
                scanned = budget
                break
            keep = []
            for e in d:
                x = e[4]
                if (x and x <= now) or e[0] < ttl_cut:
                    expired.append(e)
                else:
                    keep.append(e)
            scanned += len(d)
            if len(keep) != len(d):
                d.clear()
                d.extend(keep)
        if expired:
            self._nready -= len(expired)
            self._expire(expired, now)
        return scanned

    # -- removal by id -------------------------------------------------------------------------

    def remove(self, msg_ids: Iterable[int]) -> list[int]:
        """Remove ready (not in-flight) entries by id, with their store entries.

        Returns the ids that were not removed: unknown, in flight, deferred, or in the stored
        backlog beyond the in-memory window (only the window, at least ``window`` entries, is
        searched). One scan of the window and one store commit per call.
        """
        ids = msg_ids if isinstance(msg_ids, list) else list(msg_ids)
        wanted = set(ids)
        if self._paging and self._stored_only:
            # a page being read may still hold them: make sure it does not bring them back
            if self._skip is _NO_IDS:
                self._skip = set()
            self._skip.update(wanted)
        removed: list[Entry] = []
        for p in self._prios:
            d = self._ready[p]
            if not d:
                continue
            hit = [e for e in d if e[0] in wanted]
            if hit:
                removed.extend(hit)
                keep = [e for e in d if e[0] not in wanted]
                d.clear()
                d.extend(keep)
                if len(removed) == len(wanted):
                    break
        if not removed:
            return ids
        self._nready -= len(removed)
        gone = {e[0] for e in removed}
        stored = [e for e in removed if e[0] not in self._volatile]
        if self._volatile:
            self._volatile.difference_update(gone)
        if stored and self.durable:
            b = WriteBatch()
            b.delete_entries(self.name, [(e[1], e[0]) for e in stored])
            self._write(b)
        if self._parent is not None:
            fanout.done(self._parent, self, removed)
        self._maybe_page()
        return [mid for mid in ids if mid not in gone]

    # -- pull (mq9 QUERY) ----------------------------------------------------------------------

    def peek(self, limit: int) -> list[Entry]:
        """Return up to ``limit`` ready entries in order without changing anything."""
        if self._nready < limit:
            self._maybe_page()
        out: list[Entry] = []
        for p in self._prios:
            for e in self._ready[p]:
                if len(out) >= limit:
                    return out
                out.append(e)
        return out

    def take(self, limit: int) -> list[Entry]:
        """Remove and return up to ``limit`` ready entries (read and marked consumed)."""
        now = self.broker.clock.seconds()
        taken = self._pop_ready(limit)
        out = self._drop_expired(taken, now, self._ttl_cut(now))
        self.broker.journal.taken(self, out)
        if out and self.durable:
            b = WriteBatch()
            b.delete_entries(self.name, [(e[1], e[0]) for e in out])
            self._write(b)
        self._maybe_page()
        return out

    # -- admin ---------------------------------------------------------------------------------

    def pause(self) -> None:
        """Stop delivering to consumers (messages keep arriving)."""
        self.paused = True

    def unpause(self) -> None:
        """Resume delivering."""
        self.paused = False
        self.dispatch()

    def empty(self) -> Any:
        """Drop every ready, stored, in-flight and deferred message; fire when stored."""
        self._clear()
        self.incarnation = self.broker.ids.next_id()
        b = WriteBatch()
        if self.durable:
            b.purge_queue(self.name)
        self.broker._queue_changed(self, b)
        return self._write(b)

    def _clear(self) -> None:
        """Forget all messages in memory and every consumer's in-flight count."""
        for sub in self._subs:
            sub._clear()
            sub._open = set() if sub._open is not _NO_IDS else _NO_IDS
            sub.incarnation += 1
        if self._claimed:
            self._claimed.clear()
        if self._refs:
            self._refs.clear()
        for d in self._ready.values():
            d.clear()
        self._nready = 0
        self._stored_only = 0
        self._horizon = None
        self._volatile = _NO_IDS
        if self._inflight:
            self._inflight.clear()
            self._owner.clear()
        self._deadlines = _NO_LIST
        self._heap_ids = 0
        self.deferred = 0
        for c in self.consumers:
            c.in_flight = 0
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        self._timer_at = INF

    def _close(self) -> None:
        """The queue is deleted: drop everything, detach consumers silently."""
        self.deleted = True
        self._clear()
        for c in self.consumers:
            c.attached = False
        self.consumers = _NO_LIST
        for sub in self._subs:
            sub._close()
        self._subs = _NO_LIST

    def __repr__(self) -> str:
        """Readable form."""
        return f"<Queue {self.name} {self.tier} depth={self.depth} in_flight={len(self._inflight)}>"
