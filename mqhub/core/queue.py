"""The Queue: the one work-queue primitive every protocol uses, as an owner of parts.

A :class:`Queue` keeps its settings and counters and holds four parts; calls go from the queue
to a part and come back as return values:

- ``ready`` — the ready window (:class:`mqhub.core.window.ReadyWindow`): the ready entries held
  in memory, in ready order, with their byte charge;
- ``backlog`` — the backlog cursor over the store (:class:`mqhub.core.backlog.Backlog`, durable
  queues only): the entries stored beyond the window, paging, the uncommitted batches;
- ``inflight`` — in-flight tracking (:class:`mqhub.core.inflight.InFlight`, made at the first
  delivery): owners, deadlines and the one timer, which calls back the queue when they expire;
- ``delivery`` — the delivery strategy: :class:`mqhub.core.delivery.Competing` (each message to
  one consumer) or :class:`mqhub.core.fanout.Fanout` (a sub-queue per consumer, each a copy).

What a queue asks of its broker (defer entries, delete it when unused, re-arm its expiry) are
the callbacks of its :class:`QueueContext`, a frozen, typed object the broker makes once. The
queue moves entries between its parts: put (admit to the window or the backlog, overflow), the
dispatch loop, ack/requeue/touch/reject, dead letters, expiry, removal, pull and admin. Its
Consumer is in :mod:`mqhub.core.consumer`.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, cast

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from zope.interface import implementer

from mqhub.core.account import MemoryAccount
from mqhub.core.backlog import LOW_WATER, WAIT_HOLD, Backlog, PendingBatch
from mqhub.core.commits import Commits
from mqhub.core.consumer import Consumer
from mqhub.core.counters import Counters
from mqhub.core.deadletter import dlq_name, to_dead
from mqhub.core.delivery import Competing
from mqhub.core.empty import NO_LIST, NO_MAP
from mqhub.core.fanout import Fanout, FanoutLink
from mqhub.core.ids import IdGenerator, first_id_at
from mqhub.core.inflight import Expired, InFlight
from mqhub.core.window import ReadyWindow
from mqhub.errors import InvalidName, NoSuchQueue
from mqhub.interfaces import IConsumer, IMessageStore, IQueue
from mqhub.records import (
    ATTEMPTS,
    EXPIRES_AT,
    HEADERS,
    MAX_ATTEMPTS_HEADER,
    MODES,
    MSG_ID,
    NOT_IN_FLIGHT,
    NOT_OWNER,
    OVERFLOW_POLICIES,
    PRIORITY,
    REASON_EXPIRED,
    REASON_MAX_ATTEMPTS,
    REASON_OVERFLOW,
    REASON_REJECTED,
    TIER_DURABLE,
    TIER_MEMORY,
    get_key,
    get_msg_id,
)
from mqhub.store.batch import WriteBatch
from mqhub.store.journal_recorder import NullRecorder
from mqhub.store.records import Entry

log = logging.getLogger(__name__)
#: an entry's ``(priority, msg_id, attempts)``, what ``WriteBatch.set_attempts`` takes
_KEY_ATTEMPTS = itemgetter(PRIORITY, MSG_ID, ATTEMPTS)

__all__ = ["Consumer", "Queue", "QueueContext", "MAX_ATTEMPTS_HEADER", "OVERFLOW_POLICIES",
           "MODES", "NOT_IN_FLIGHT", "NOT_OWNER", "SETTINGS_PREFIX"]

#: store meta key prefix of a durable queue's settings (``q/<name>``, JSON; read on recovery)
SETTINGS_PREFIX = "q/"
_MEM_DEAD_LIMIT = 10_000


@dataclass(frozen=True, slots=True)
class QueueContext:
    """What a queue may use of the broker that owns it: fixed at construction, one per broker.

    ``defer``, ``unused`` and ``expiry_changed`` are what a queue asks of its broker: hold
    entries until a time (a requeue with a delay), delete the queue (an ``auto_delete`` queue
    lost its last consumer), re-arm the queue's own expiry (``configure(expires_at=...)``).
    """

    clock: IReactorTime
    store: IMessageStore
    ids: IdGenerator
    commits: Commits
    counters: Counters
    journal: NullRecorder    # the flow journal's recorder (batch-level calls)
    tails: MemoryAccount     # memory of all remembered tails (mqhub.core.tail)
    windows: MemoryAccount   # body bytes of all durable windows
    window: int              # the broker's window: ready entries a queue keeps in memory
    window_bytes: int        # the broker's byte budget of one window
    defer: Callable[[Queue, list[Entry], float, WriteBatch], None]
    unused: Callable[[Queue], None]
    expiry_changed: Callable[[Queue], None]


@implementer(IQueue)
class Queue:
    """Ready entries ordered by (priority desc, msg_id asc), in-flight entries with deadlines.

    Slotted; its parts and containers are made on first use where an idle queue does not need
    them: an idle queue is one small object (see docs/core-api.md, "Memory").
    """

    __slots__ = (
        "ctx", "name", "tier", "durable", "max_size", "overflow", "ttl", "max_attempts",
        "msg_timeout", "expires_at", "auto_delete", "expire_to_dead_letters", "window",
        "window_setting", "mode", "incarnation", "paused", "deleted", "deferred",
        "message_count", "expired_count", "dropped_count", "requeue_count", "timeout_count",
        "dead_letter_count", "may_expire", "ready", "backlog", "inflight", "delivery", "link",
        "_mem_dead", "_dispatching", "_again")

    def __init__(self, ctx: QueueContext, name: str, *, tier: str = TIER_DURABLE,
                 max_size: int = 0, overflow: str = "drop_oldest", ttl: float = 0.0,
                 max_attempts: int = 0, msg_timeout: float = 60.0, expires_at: float = 0.0,
                 auto_delete: bool = False, expire_to_dead_letters: bool = False,
                 window: int = 10_000, incarnation: int = 0, mode: str = "competing",
                 window_setting: int = 0, link: FanoutLink | None = None) -> None:
        """Made by :meth:`Broker.declare_queue` (see docs/core-api.md for the settings), or by
        a fan-out queue for one subscriber (``link``: how it reports to that queue)."""
        if tier not in (TIER_DURABLE, TIER_MEMORY):
            raise InvalidName(f"unknown tier {tier!r}")
        if mode not in MODES:
            raise InvalidName(f"unknown delivery mode {mode!r}")
        if overflow not in OVERFLOW_POLICIES:
            raise InvalidName(f"unknown overflow policy {overflow!r}")
        self.ctx = ctx
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
        self.incarnation = incarnation
        self.paused = False
        self.deleted = False
        self.deferred = 0
        self.message_count = 0
        self.expired_count = 0
        self.dropped_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.dead_letter_count = 0
        #: True once an entry with its own expiry was added
        self.may_expire = False
        self.ready = ReadyWindow(ctx.windows if self.durable else None)
        self.backlog: Backlog | None = (
            Backlog(name, ctx.store, ctx.ids, ctx.tails) if self.durable else None)
        self.inflight: InFlight | None = None
        self.delivery: Competing | Fanout = Competing() if mode != "fanout" or link else Fanout(
            self._new_subscriber, self._finished, self._fan_dead, self._returned, self._left)
        self.link = link
        self._mem_dead: deque[Entry] = NO_LIST   # memory-tier dead letters (newest kept)
        self._dispatching = False
        self._again = False

    # -- settings ---------------------------------------------------------------------------

    def settings(self) -> dict[str, Any]:
        """The persisted settings of this queue."""
        return {"tier": self.tier, "max_size": self.max_size, "overflow": self.overflow,
                "ttl": self.ttl, "max_attempts": self.max_attempts,
                "msg_timeout": self.msg_timeout, "expires_at": self.expires_at,
                "auto_delete": self.auto_delete,
                "expire_to_dead_letters": self.expire_to_dead_letters,
                "incarnation": self.incarnation, "mode": self.mode,
                "window": self.window_setting}

    def save_settings(self, batch: WriteBatch | None = None) -> None:
        """Persist a durable queue's settings (into ``batch``, or in a commit of their own)."""
        if not self.durable or self.name.startswith("~") or self.deleted:
            return
        b = batch if batch is not None else WriteBatch()
        b.put_meta(SETTINGS_PREFIX + self.name, json.dumps(self.settings()).encode())
        if batch is None:
            self.ctx.commits.commit(b)

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
                self.window = max(1, self.window_setting or self.ctx.window)
                continue
            setattr(self, key, value)
        self.save_settings()
        if "window" in settings and self.durable:
            if self.over_window():
                self._evict()
            else:
                self._maybe_page()
        if "expires_at" in settings:
            self.ctx.expiry_changed(self)

    # -- counts -----------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Ready messages (in memory plus stored backlog, and puts awaiting their commit), not
        counting in flight or deferred."""
        b = self.backlog
        if b is None:
            return self.ready.count
        return self.ready.count + b.stored_only + b.awaiting()

    @property
    def deliverable(self) -> int:
        """Ready messages a consumer's credit can be spent on: :attr:`depth` without the puts
        still awaiting their commit (they are delivered once stored)."""
        b = self.backlog
        return self.ready.count + (b.stored_only if b is not None else 0)

    @property
    def in_memory(self) -> int:
        """Ready entries in the window (the rest of :attr:`depth` is the stored backlog)."""
        return self.ready.count

    @property
    def awaiting_commit(self) -> int:
        """Stored puts waiting for their batch's commit before they enter the window (counted
        in :attr:`depth`, not yet deliverable)."""
        return self.backlog.awaiting() if self.backlog is not None else 0

    @property
    def window_bytes_held(self) -> int:
        """Body bytes of the ready entries in the window."""
        return self.ready.nbytes

    @property
    def in_flight(self) -> int:
        """Messages delivered and not yet acked (over every subscriber in fan-out mode)."""
        own = len(self.inflight) if self.inflight is not None else 0
        if type(self.delivery) is Fanout:
            return own + self.delivery.in_flight()
        return own

    @property
    def in_flight_by_id(self) -> Mapping[int, Entry]:
        """The entries in flight on this queue's own consumers, by msg_id (read only)."""
        return self.inflight.entries if self.inflight is not None else NO_MAP

    @property
    def consumers(self) -> list[Consumer]:
        """The consumers attached to this queue itself (a fan-out queue's sit on its
        subscribers' sub-queues)."""
        d = self.delivery
        return d.consumers if type(d) is Competing else NO_LIST

    def stats(self) -> dict[str, Any]:
        """Counters in the shape the admin surfaces and NSQ /stats use."""
        return {"name": self.name, "tier": self.tier, "depth": self.depth,
                "in_memory": self.ready.count, "in_flight": self.in_flight,
                "deferred": self.deferred, "message_count": self.message_count,
                "requeue_count": self.requeue_count, "timeout_count": self.timeout_count,
                "expired_count": self.expired_count, "dropped_count": self.dropped_count,
                "dead_letter_count": self.dead_letter_count,
                "consumers": self.delivery.consumer_count(),
                "paused": self.paused, "mode": self.mode}

    @property
    def needs_sweep(self) -> bool:
        """True when the window holds entries the TTL sweep may have to drop."""
        return bool(self.ready.count and (self.ttl or self.may_expire))

    def room(self) -> int:
        """How many more messages fit before ``max_size`` (a large number when unbounded)."""
        if not self.max_size:
            return 1 << 62
        return self.max_size - self.depth

    # -- the window's size ------------------------------------------------------------------

    def _effective_window(self) -> int:
        """Window size; a bounded queue keeps its whole content in memory."""
        return max(self.window, self.max_size) if self.max_size else self.window

    def _own_budget(self) -> int:
        """Body bytes the window may hold by its own setting (the broker's ``window_bytes``; a
        bounded queue keeps its whole content in memory). The remembered tail is sized by it,
        never by the shrunk budget: the tails have their own broker-wide account."""
        return self.ctx.window_bytes if not self.max_size else 1 << 62

    def _byte_budget(self) -> int:
        """Body bytes the window may hold now: its own budget, shrunk to what the broker-wide
        account of all windows has left (its own charge included), never below the account's
        floor (``WINDOW_FLOOR``, or the own budget when smaller). A bounded queue keeps its
        rule: its charge counts in the account, its window is not shrunk by it."""
        own = self._own_budget()
        if self.max_size:
            return own
        windows = self.ctx.windows
        room = windows.room(self.ready.nbytes)
        if room >= own:
            return own
        return max(room, min(windows.floor, own))

    def over_window(self) -> bool:
        """True when the window holds more entries, or more body bytes, than it may."""
        ready = self.ready
        return ready.count > self._effective_window() or (
            ready.count > 1 and ready.nbytes > self._byte_budget())

    def _evict(self) -> None:
        """Drop the tail of the window to the stored backlog, keeping the window a prefix
        (entries not in the store, ``persist=False``, are never evicted)."""
        b = self.backlog
        assert b is not None
        ready = self.ready
        whole = b.tail_whole()
        dropped, horizon = ready.evict(ready.count - self._effective_window(),
                                       ready.nbytes - self._byte_budget())
        b.evicted(dropped, horizon, whole, self._own_budget())

    def _shrink(self) -> None:
        """Evict when a page or the tail brought the window over its byte budget."""
        ready = self.ready
        if self.durable and ready.count > 1 and ready.nbytes > self._byte_budget():
            self._evict()

    # -- puts ----------------------------------------------------------------------------------

    def put(self, entries: list[Entry], batch: WriteBatch | None, persist: bool,
            now: float, uniform: bool = False, run: bool = False) -> None:
        """Add ``entries`` (in id order) to the queue; store writes go into ``batch``.

        ``uniform`` promises every entry has the same priority and expiry (a publish batch);
        ``run`` that every field but the id and body is shared (a publish batch without
        per-entry headers: the store need not compare the entries, ``WriteBatch.put_entries``).
        Applies the overflow policy, keeps the window within its size and dispatches. Puts
        awaiting their commit count for the overflow once committed (:meth:`_committed`): a
        refused batch never costs the queue its oldest messages.
        """
        self.message_count += len(entries)
        self._admit(entries, batch, self.durable and persist, uniform, run)
        if self.max_size and self.deliverable > self.max_size:
            self._overflow(self.deliverable - self.max_size, batch, now)
        if self.durable and self.over_window():
            self._evict()
        self.dispatch()

    def _admit(self, entries: list[Entry], batch: WriteBatch | None, stored: bool,
               uniform: bool, run: bool = False) -> None:
        """Add ``entries`` (in id order) to the window or, past its horizon, to the stored
        backlog; their store writes (when ``stored``) go into ``batch``.

        Stored entries put through an uncommitted ``batch`` enter the window only once it is
        committed (the backlog keeps them meanwhile): none is delivered before its put is stored.
        """
        n = len(entries)
        if not self.may_expire and entries and (entries[0][EXPIRES_AT] if uniform
                                                else any(e[EXPIRES_AT] for e in entries)):
            self.may_expire = True
        b = self.backlog
        if stored and batch is not None:
            batch.put_entries(self.name, entries, run=run)
            self._mark(batch)
        if stored and b is not None and b.stored_only:
            keep = b.admit(entries, batch, uniform, self._own_budget())
            if batch is not None:
                b.await_commit(batch, keep, n - len(keep), uniform)
                return
            entries = keep
        elif not stored and self.durable:
            self.ready.mark_volatile(entries)
        if entries:
            if stored and batch is not None and b is not None:
                b.await_commit(batch, entries, 0, uniform)
                return
            self.ready.enter(entries, uniform)

    def _committed(self, puts: list[tuple[list[Entry], bool]]) -> None:
        """The batch holding ``puts`` was committed: they enter the window, the overflow policy
        and the window size apply to them, and they are dispatched."""
        for entries, uniform in puts:
            self.ready.enter(entries, uniform)
        if self.max_size and self.deliverable > self.max_size:
            b = WriteBatch()
            self._overflow(self.deliverable - self.max_size, b, self.ctx.clock.seconds())
            self._write(b)
        if self.over_window():
            self._evict()
        self.dispatch()

    def _overflow(self, excess: int, batch: WriteBatch | None, now: float) -> None:
        """Apply the overflow policy to ``excess`` entries beyond ``max_size``."""
        victims = self.ready.pop_oldest(excess)
        if not victims:
            return
        if self.overflow == "dead_letter":
            self._dead(victims, REASON_OVERFLOW, "queue full", batch, now)
        else:
            self.dropped_count += len(victims)
            if self.durable and batch is not None:
                batch.delete_entries(self.name, list(map(get_key, victims)))
                self._mark(batch)

    def insert_ready(self, entries: list[Entry]) -> None:
        """Put entries back into the window at their places (a refused parked move)."""
        self.ready.insert(entries)

    def pop_ready(self, n: int) -> list[Entry]:
        """Remove and return up to ``n`` ready entries of the window in ready order."""
        return self.ready.pop(n)

    def _return(self, entries: list[Entry]) -> None:
        """Put entries that are already stored back to ready (requeue, timeout, detach)."""
        b = self.backlog
        self.ready.insert(entries if b is None else b.returns(entries, self.ready.volatile))

    # -- store writes and their commits ----------------------------------------------------

    def _mark(self, batch: WriteBatch) -> None:
        """``batch`` changes this queue's stored entries: track it until it is committed."""
        b = self.backlog
        if b is not None:
            b.mark(batch)
            self.ctx.commits.watch(batch, self)

    def _write(self, batch: WriteBatch) -> Deferred[None]:
        """Commit a batch of this queue's own writes (tracked until it is committed)."""
        if batch and self.durable:
            self._mark(batch)
        return self.ctx.commits.commit(batch)

    def batch_settled(self, batch: WriteBatch, ok: bool = True) -> None:
        """A batch this queue marked was committed (``ok``) or failed (BatchWatcher).

        Once every mark of a batch settled, its puts that await the commit enter the window
        (or, when it failed, are dropped: a publish refused to its publisher is never
        delivered); then a page waiting for that commit is read.
        """
        b = self.backlog
        if b is None:
            return
        rec = b.settle(batch)
        if rec is None:
            return
        if rec.awaiting is not None or rec.stored_only:
            self._settle_puts(rec, ok)
        if b.settled(rec):
            self._maybe_page()

    def _settle_puts(self, rec: PendingBatch, ok: bool) -> None:
        """The batch of ``rec`` settled: admit its awaiting puts, or forget them if it failed."""
        if ok:
            if rec.awaiting and not self.deleted:
                self._committed(rec.awaiting)
            return
        assert self.backlog is not None
        self.backlog.refused(rec)

    def batch_merged(self, batch: WriteBatch, into: WriteBatch) -> None:
        """A batch this queue marked was merged into ``into`` (BatchWatcher)."""
        if self.backlog is not None:
            self.backlog.rekey(batch, into)

    # -- paging the stored backlog -----------------------------------------------------------

    def maybe_page(self) -> None:
        """Read the next page of the stored backlog if the window is at its low-water mark."""
        self._maybe_page()

    def _maybe_page(self) -> None:
        """Refill the window from the stored backlog when its fill is at its low-water mark:
        from the remembered tail when that is the whole backlog, else by a page read (see
        :meth:`mqhub.core.backlog.Backlog.read`)."""
        b = self.backlog
        ready = self.ready
        if (b is None or b.paging or not b.stored_only or self.deleted
                or ready.count > self._effective_window() // LOW_WATER):
            return
        budget = self._byte_budget()
        if ready.count and (ready.nbytes > budget // LOW_WATER
                            or ready.nbytes + b.body_max > budget):
            return      # past low water, or no room for the largest body (it would be evicted)
        if b.tail_whole():
            if b.page_wait != WAIT_HOLD:
                self._from_tail(budget)
            return
        read = b.read(self._effective_window() - ready.count, budget - ready.nbytes)
        if read is not None:
            read.read.addCallbacks(self._paged, self._page_failed,
                                   callbackArgs=(self.incarnation, read.put_gen, read.asked))

    def _from_tail(self, budget: int) -> None:
        """The whole stored backlog is the remembered tail: move as much of it as fits into the
        window without reading it back."""
        b = self.backlog
        assert b is not None
        ready = self.ready
        room = min(max(1, self._effective_window() - ready.count),
                   max(1, (budget - ready.nbytes) // (b.body_max or 1)))
        take = b.take_tail(room)
        if not take:
            return
        if not self.may_expire and any(e[EXPIRES_AT] for e in take):
            self.may_expire = True
        if take[0][PRIORITY] == take[-1][PRIORITY]:
            ready.enter(take, True)    # in ready order, one priority: appended when it can be
        else:
            ready.insert(take)
        self._shrink()
        self.dispatch()

    def _paged(self, entries: list[Entry], incarnation: int, gen: int, asked: int) -> None:
        """A page read from the store: what the backlog lets through enters the window."""
        b = self.backlog
        assert b is not None
        inflight = self.inflight.entries if self.inflight is not None else NO_MAP
        d = self.delivery
        claimed = d.claimed if type(d) is Fanout else NO_MAP
        result = b.page(entries, gen, asked,
                        not self.deleted and incarnation == self.incarnation, inflight, claimed)
        fresh = result.fresh
        if fresh:
            if not self.may_expire and any(e[EXPIRES_AT] for e in fresh):
                self.may_expire = True
            # a page is in ready order (IStore.read_entries) and ``fresh`` keeps its order: a
            # page of one priority is in id order, appended as it is when it sorts after
            if fresh[0][PRIORITY] == fresh[-1][PRIORITY]:
                self.ready.enter(fresh, True)
            else:
                self.ready.insert(fresh)
        if result.again is not None:
            self.ctx.clock.callLater(result.again, self._maybe_page)
        if result.settle:
            self._shrink()
            self.dispatch()

    def _page_failed(self, failure: Any) -> None:
        """A page read failed: log it and try again later."""
        assert self.backlog is not None
        self.backlog.read_failed()
        log.error("paging %s failed: %s", self.name, failure.getErrorMessage())
        self.ctx.clock.callLater(1.0, self._maybe_page)

    def recovered(self, count: int) -> None:
        """Start-up: the store holds ``count`` entries; the window is paged from the start."""
        if self.backlog is not None:
            self.backlog.recovered(count)
            self._maybe_page()

    def load_page_after(self, d: Deferred[Any], limit: int) -> Deferred[bool] | None:
        """When ``d`` fires, read the next ``limit`` stored entries into the window whatever its
        size (draining a parking queue); fire with True when entries were read. None when there
        is no stored backlog or a read is already running."""
        b = self.backlog
        read = b.read_all_after(d, limit) if b is not None else None
        if read is None:
            return None

        def loaded(page: list[Entry]) -> bool:
            assert b is not None
            more = b.loaded(page)
            if more:
                self.ready.insert(page)
            return more
        return read.addCallback(loaded)

    # -- dead letters and expiry ------------------------------------------------------------

    def _dead(self, entries: list[Entry], reason: str, error: str | None,
              batch: WriteBatch | None, now: float) -> None:
        """Move ``entries`` (already out of the window/in-flight) to this queue's dead letters."""
        self.ctx.counters.dead_lettered(reason, len(entries))
        self.ctx.journal.dead_lettered(self, entries, reason)
        if self.link is not None:
            self.link.dead(entries, reason, error, now)
            return
        self.dead_letter_count += len(entries)
        dead = [to_dead(e, self.name, reason, error, now) for e in entries]
        if self.durable and batch is not None:
            batch.delete_entries(self.name, list(map(get_key, entries)))
            batch.put_entries(dlq_name(self.name), dead)
            self._mark(batch)
        else:
            self.keep_memory_dead_letters(dead)

    def keep_memory_dead_letters(self, dead: list[Entry], replace: bool = False) -> None:
        """Add (or with ``replace``, set) this memory queue's dead letters; the newest are kept."""
        if replace or self._mem_dead is NO_LIST:
            self._mem_dead = deque(self._mem_dead if not replace else (), maxlen=_MEM_DEAD_LIMIT)
        self._mem_dead.extend(dead)

    def memory_dead_letters(self) -> list[Entry]:
        """The dead letters a memory-tier queue keeps (newest kept), oldest first."""
        return list(self._mem_dead)

    def _ttl_cut(self, now: float) -> int:
        """Ids below this are older than the queue TTL (0 when the queue has no TTL)."""
        if not self.ttl:
            return 0
        return first_id_at(now - self.ttl)

    def _drop_expired(self, entries: list[Entry], now: float, ttl_cut: int) -> list[Entry]:
        """Expire the entries of ``entries`` past their deadline or the queue TTL; return the rest."""
        live = [e for e in entries
                if not ((e[EXPIRES_AT] and e[EXPIRES_AT] <= now) or e[MSG_ID] < ttl_cut)]
        if len(live) != len(entries):
            self._expire([e for e in entries
                          if (e[EXPIRES_AT] and e[EXPIRES_AT] <= now) or e[MSG_ID] < ttl_cut], now)
        return live

    def _expire(self, entries: list[Entry], now: float) -> None:
        """Count and drop (or dead-letter) expired entries taken from the window."""
        self.ctx.journal.expired(self, entries)
        if self.link is not None and not self.expire_to_dead_letters:
            self.expired_count += len(entries)
            self.link.done(entries)
            return
        volatile = self.ready.volatile
        if volatile:
            volatile.difference_update(list(map(get_msg_id, entries)))
        self.expired_count += len(entries)
        b = WriteBatch()
        if self.expire_to_dead_letters:
            self._dead(entries, REASON_EXPIRED, "expired", b, now)
        elif self.durable:
            b.delete_entries(self.name, list(map(get_key, entries)))
        if b:
            self._write(b)

    def sweep(self, now: float, budget: int) -> int:
        """Drop expired ready entries from the window, scanning at most ``budget``; return the
        scan count."""
        scanned, expired = self.ready.sweep(now, self._ttl_cut(now), budget)
        if expired:
            self._expire(expired, now)
        return scanned

    # -- removal by id ----------------------------------------------------------------------

    def remove(self, msg_ids: Iterable[int]) -> list[int]:
        """Remove ready (not in-flight) entries by id, with their store entries.

        Puts still awaiting their batch's commit are removed too: they never enter the window,
        and their stored rows are deleted once that batch is committed. Returns the ids that
        were not removed: unknown, in flight, deferred, or in the stored backlog beyond the
        in-memory window (only the window, at least ``window`` entries, is searched). One scan
        of the window and one store commit per call (plus one per batch a removed put awaits).
        """
        ids = msg_ids if isinstance(msg_ids, list) else list(msg_ids)
        wanted = set(ids)
        b = self.backlog
        if b is not None:
            b.skip_ids(wanted)      # a page being read may still hold them
        removed = self.ready.remove(wanted)
        gone = set(map(get_msg_id, removed))
        if b is not None and b.pending and len(gone) < len(wanted):
            for batch, taken in b.take_awaiting(wanted - gone):
                gone.update(list(map(get_msg_id, taken)))
                self.ctx.commits.on_settled(batch, self._drop_when_stored(taken))
        if not gone:
            return ids
        if removed:
            self._removed_from_window(removed, gone)
        return [mid for mid in ids if mid not in gone]

    def _removed_from_window(self, removed: list[Entry], gone: set[int]) -> None:
        """``removed`` entries were taken out of the window: delete their stored rows."""
        volatile = self.ready.volatile
        stored = [e for e in removed if e[MSG_ID] not in volatile]
        if volatile:
            volatile.difference_update(gone)
        if stored and self.durable:
            self._drop_stored(list(map(get_key, stored)))
        if self.link is not None:
            self.link.done(removed)
        self._maybe_page()

    def _drop_when_stored(self, taken: list[Entry]) -> Callable[[bool], None]:
        """A settle callback deleting the stored rows of ``taken`` once their put is stored."""
        keys = list(map(get_key, taken))

        def settled(ok: bool) -> None:
            if ok:
                self._drop_stored(keys)
        return settled

    def _drop_stored(self, keys: list[tuple[int, int]]) -> None:
        """Delete the stored rows of entries this queue no longer holds."""
        if self.deleted:
            return
        b = WriteBatch()
        b.delete_entries(self.name, keys)
        self._write(b)

    # -- pull (mq9 QUERY) -------------------------------------------------------------------

    def peek(self, limit: int) -> list[Entry]:
        """Return up to ``limit`` ready entries in order without changing anything."""
        if self.ready.count < limit:
            self._maybe_page()
        return self.ready.peek(limit)

    def take(self, limit: int) -> list[Entry]:
        """Remove and return up to ``limit`` ready entries (read and marked consumed)."""
        now = self.ctx.clock.seconds()
        taken = self.ready.pop(limit)
        out = self._drop_expired(taken, now, self._ttl_cut(now))
        self.ctx.journal.taken(self, out)
        if out and self.durable:
            b = WriteBatch()
            b.delete_entries(self.name, list(map(get_key, out)))
            self._write(b)
        self._maybe_page()
        return out

    # -- consumers ---------------------------------------------------------------------------

    def attach(self, target: Any, *, ready: int = 0, credit: int = 0,
               timeout: float | None = None, tag: Any = None) -> Consumer:
        """Attach a consumer; ``target.deliver_batch(consumer, queue_name, entries)`` receives."""
        if self.deleted:
            raise NoSuchQueue(self.name)
        d = self.delivery
        if type(d) is Fanout:
            c = d.attach(target, int(ready or 0), int(credit or 0), timeout, tag)
            self.dispatch()
            return c
        c = Consumer(self, target, int(ready or 0), int(credit or 0),
                     self.msg_timeout if timeout is None else float(timeout), tag)
        cast(Competing, d).add(c)
        self.dispatch()
        return c

    def detach(self, consumer: IConsumer, requeue: bool = True) -> None:
        """Detach ``consumer``; its in-flight messages return to ready (attempts kept)."""
        if consumer.queue is not self:
            consumer.queue.detach(consumer, requeue)
            return
        if not consumer.attached:
            return
        consumer.attached = False
        d = self.delivery
        if type(d) is Competing:
            d.remove(cast(Consumer, consumer))
        if self.link is not None:
            self.link.release()
            return
        mine = self.inflight.held_by(consumer) if self.inflight is not None else []
        if mine and requeue:
            self._requeue_ids(consumer, mine, 0.0, None, count=False)
        if self.auto_delete and not self.consumers and not self.deleted:
            self.ctx.unused(self)
        else:
            self.dispatch()

    def _new_subscriber(self, seq: int, link: FanoutLink) -> Queue:
        """Fan-out: the private memory sub-queue of a new subscriber."""
        return Queue(self.ctx, f"{self.name}~fan{seq}", tier=TIER_MEMORY, ttl=self.ttl,
                     max_attempts=self.max_attempts, msg_timeout=self.msg_timeout,
                     expire_to_dead_letters=self.expire_to_dead_letters, link=link)

    def _finished(self, entries: list[Entry]) -> None:
        """Fan-out: every subscriber is done with ``entries``: delete their stored copies."""
        if self.durable:
            b = WriteBatch()
            b.delete_entries(self.name, list(map(get_key, entries)))
            self._write(b)

    def _fan_dead(self, entries: list[Entry], reason: str, error: str | None,
                  now: float) -> None:
        """Fan-out: a subscriber's copies died: record them in this queue's dead letters."""
        self.dead_letter_count += len(entries)
        dead = [to_dead(e, self.name, reason, error, now) for e in entries]
        if self.durable:
            b = WriteBatch()
            b.put_entries(dlq_name(self.name), dead)
            self.ctx.commits.commit(b)
        else:
            self.keep_memory_dead_letters(dead)

    def _returned(self, entries: list[Entry]) -> None:
        """Fan-out: the last subscriber left; its unfinished copies return to the backlog."""
        self.ready.insert(entries)

    def _left(self) -> None:
        """Fan-out: the last subscriber left (an ``auto_delete`` queue goes with it)."""
        if self.auto_delete and not self.deleted:
            self.ctx.unused(self)

    # -- dispatch ---------------------------------------------------------------------------

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
        d = self.delivery
        if type(d) is Fanout:
            if d.links:
                self._spread(d)
                return
        self._dispatching = True
        try:
            self._again = True
            while self._again:
                self._again = False
                if not self.ready.count:
                    self._maybe_page()
                    if not self.ready.count:
                        break
                if not self.consumers or self.paused or self.deleted:
                    break
                self._dispatch_round(cast(Competing, d))
                if (not self.ready.count and self.backlog is not None
                        and self.backlog.stored_only):
                    self._again = True   # refill here: one loop, not one recursion per window
        finally:
            self._dispatching = False
        if self.backlog is not None and self.backlog.stored_only:
            self._maybe_page()

    def _dispatch_round(self, competing: Competing) -> None:
        """One round over the consumers: each with room gets one batch."""
        now = self.ctx.clock.seconds()
        ttl_cut = self._ttl_cut(now)
        record = self.max_attempts > 0 and self.durable
        ready = self.ready
        journal = self.ctx.journal
        for c in competing.turn():
            if not ready.count:
                break
            if not c.attached:
                continue
            avail = c.available()
            if avail <= 0:
                continue
            taken = ready.pop(avail)
            if self.may_expire or ttl_cut:
                n = len(taken)
                taken = self._drop_expired(taken, now, ttl_cut)
                if len(taken) != n:
                    self._again = True
                if not taken:
                    continue
            out = [(msg_id, priority, attempts + 1, deliver_at, expires_at, address, headers,
                    body, origin)
                   for msg_id, priority, attempts, deliver_at, expires_at, address, headers,
                   body, origin in taken]
            ids = list(map(get_msg_id, out))
            journal.delivered(self, out, ids)
            inflight = self.inflight
            if inflight is None:
                inflight = self.inflight = InFlight(self.ctx.clock, self._timed_out)
            inflight.add(c, ids, out, now + c.timeout)
            if record:
                b = WriteBatch()
                b.set_attempts(self.name, list(map(_KEY_ATTEMPTS, out)))
                self.ctx.commits.commit(b)
            self.ctx.counters.deliver(c.target, len(out))
            try:
                c.target.deliver_batch(c, self.name, out)
            except Exception:
                log.exception("deliver_batch of %r failed", c.target)

    def _spread(self, fanout: Fanout) -> None:
        """Fan-out: hand every ready entry to every subscriber's sub-queue."""
        entries = self.ready.pop(self.ready.count)
        if entries:
            now = self.ctx.clock.seconds()
            ttl_cut = self._ttl_cut(now)
            if self.may_expire or ttl_cut:
                entries = self._drop_expired(entries, now, ttl_cut)
            fanout.spread(entries, now)
        if self.backlog is not None and self.backlog.stored_only:
            self._maybe_page()

    def _timed_out(self, expired: Expired) -> None:
        """The in-flight timer found messages past their deadline: back to ready."""
        for consumer, ids in expired.items():
            self.timeout_count += len(ids)
            self._requeue_ids(consumer, ids, 0.0, "timeout", count=False)

    def stop_timer(self) -> None:
        """Cancel the in-flight timer (the broker is stopping)."""
        if self.inflight is not None:
            self.inflight.stop()

    # -- message operations -----------------------------------------------------------------

    def owner_of(self, msg_id: int) -> Consumer | None:
        """The consumer holding ``msg_id`` in flight on this queue (or its fan-out subscribers)."""
        c = self.inflight.owner(msg_id) if self.inflight is not None else None
        if c is None and type(self.delivery) is Fanout:
            return self.delivery.owner_of(msg_id)
        return cast(Consumer | None, c)

    def failure_reasons(self, consumer: IConsumer,
                        msg_ids: Iterable[int]) -> list[tuple[int, str]]:
        """Why ``consumer`` cannot ack/requeue/touch/reject each id: ``(msg_id, reason)``.

        ``NOT_OWNER`` ("not_owner"): the message is in flight on another consumer;
        ``NOT_IN_FLIGHT`` ("not_in_flight"): unknown, ready, deferred or already finished.
        Meant for the ids an operation returned as failed (NSQ ``E_FIN_FAILED`` texts); an id
        that ``consumer`` does hold is reported as ``"ok"``.
        """
        inflight = cast(Queue, consumer.queue).inflight
        if inflight is None:
            return [(mid, NOT_IN_FLIGHT) for mid in msg_ids]
        return inflight.reasons(consumer, msg_ids)

    def _take(self, consumer: IConsumer, msg_ids: Iterable[int]) -> tuple[list[Entry], list[int]]:
        """The in-flight entries of ``msg_ids`` on ``consumer``, and the ids that were not."""
        if self.inflight is None:
            return [], list(msg_ids)
        return self.inflight.take(consumer, msg_ids)

    def ack(self, consumer: IConsumer, msg_ids: Iterable[int]) -> list[int]:
        """Acknowledge (NSQ FIN); return the ids that were not in flight on ``consumer``."""
        if consumer.queue is not self:
            return cast(list[int], consumer.queue.ack(consumer, msg_ids))
        got, failed = self._take(consumer, msg_ids)
        if got and self.link is not None:
            self.link.done(got)
        if not got:
            return failed
        # the caller's list when it holds exactly the ids of ``got``, in order
        ids = msg_ids if not failed and isinstance(msg_ids, list) else None
        if self.durable:
            b = WriteBatch()
            prios = self.ready.prios
            if len(prios) == 1 and ids is not None:
                # one priority ever entered this window: one run of the ids, no key per id
                # and no pass over the entries (a copy: the batch keeps it until the commit)
                b.delete_ids(self.name, prios[0], ids[:])
            else:
                b.delete_entries(self.name, list(map(get_key, got)))
            self._write(b)
        journal = self.ctx.journal
        if journal.enabled:
            # the recorder packs (copies) the ids at once: no copy of its own
            journal.acked(self, got, ids)
        self.ctx.counters.ack(consumer.target, len(got))
        self.dispatch()
        return failed

    def touch(self, consumer: IConsumer, msg_ids: Iterable[int],
              extend: float | None = None) -> list[int]:
        """Reset the deadline of in-flight messages to now + ``extend`` (default: consumer timeout)."""
        if consumer.queue is not self:
            return cast(list[int], consumer.queue.touch(consumer, msg_ids, extend))
        deadline = self.ctx.clock.seconds() + (
            consumer.timeout if extend is None else float(extend))
        if self.inflight is None:
            return list(msg_ids)
        return self.inflight.touch(consumer, msg_ids, deadline)

    def requeue(self, consumer: IConsumer, msg_ids: Iterable[int], delay: float = 0.0,
                error: str | None = None) -> list[int]:
        """Return in-flight messages to ready (or deferred by ``delay`` seconds); dead-letter at
        max attempts."""
        if consumer.queue is not self:
            return cast(list[int], consumer.queue.requeue(consumer, msg_ids, delay, error))
        return self._requeue_ids(consumer, msg_ids, delay, error, count=True)

    def _requeue_ids(self, consumer: IConsumer, msg_ids: Iterable[int], delay: float,
                     error: str | None, count: bool) -> list[int]:
        """Shared by requeue, timeouts and detach."""
        got, failed = self._take(consumer, msg_ids)
        if not got:
            return failed
        if count:
            self.requeue_count += len(got)
        now = self.ctx.clock.seconds()
        b = WriteBatch()
        dead: list[Entry] = []
        back: list[Entry] = []
        for e in got:
            limit = self.max_attempts
            h = e[HEADERS]
            if h and MAX_ATTEMPTS_HEADER in h:
                try:
                    limit = int(h[MAX_ATTEMPTS_HEADER])
                except (TypeError, ValueError):
                    pass
            if limit > 0 and e[ATTEMPTS] >= limit:
                dead.append(e)
            else:
                back.append(e)
        if dead:
            self._dead(dead, REASON_MAX_ATTEMPTS, error, b, now)
        if back:
            self.ctx.journal.requeued(self, back, error)
            if self.durable:
                b.set_attempts(self.name, list(map(_KEY_ATTEMPTS, back)))
            if delay and delay > 0:
                if self.durable:
                    b.delete_entries(self.name, list(map(get_key, back)))
                self.ctx.defer(self, back, now + delay, b)
            else:
                self._return(back)
        if b:
            self._write(b)
        self.dispatch()
        return failed

    def reject(self, consumer: IConsumer, msg_ids: Iterable[int], reason: str = REASON_REJECTED,
               error: str | None = None) -> list[int]:
        """Dead-letter in-flight messages now with ``reason``; return ids not in flight."""
        if consumer.queue is not self:
            return cast(list[int], consumer.queue.reject(consumer, msg_ids, reason, error))
        got, failed = self._take(consumer, msg_ids)
        if got:
            b = WriteBatch()
            self._dead(got, reason, error, b, self.ctx.clock.seconds())
            self._write(b)
            self.dispatch()
        return failed

    # -- admin ------------------------------------------------------------------------------

    def pause(self) -> None:
        """Stop delivering to consumers (messages keep arriving)."""
        self.paused = True

    def unpause(self) -> None:
        """Resume delivering."""
        self.paused = False
        self.dispatch()

    def empty(self) -> Deferred[None]:
        """Drop every ready, stored, in-flight and deferred message; fire when stored."""
        self.reset()
        self.incarnation = self.ctx.ids.next_id()
        b = WriteBatch()
        if self.durable:
            b.purge_queue(self.name)
        self.save_settings(b)
        return self._write(b)

    def reset(self) -> None:
        """Forget all messages in memory and every consumer's in-flight count."""
        d = self.delivery
        if type(d) is Fanout:
            d.clear()
        self.ready.clear()
        if self.backlog is not None:
            self.backlog.forget_all()
        if self.inflight is not None:
            self.inflight.clear()
        for c in self.consumers:
            c.in_flight = 0
        self.deferred = 0

    def close(self) -> None:
        """The queue is deleted: drop everything, detach consumers silently."""
        self.deleted = True
        self.reset()
        d = self.delivery
        if isinstance(d, Fanout):
            d.close()
        else:
            for c in d.drop_all():
                c.attached = False

    def rewire(self, ctx: QueueContext) -> None:
        """The broker's context changed (a new flow journal): use ``ctx`` from now on."""
        self.ctx = ctx
        d = self.delivery
        if type(d) is Fanout:
            for sub in d.subs:
                cast(Queue, sub).rewire(ctx)

    def __repr__(self) -> str:
        """Readable form."""
        return f"<Queue {self.name} {self.tier} depth={self.depth} in_flight={self.in_flight}>"
