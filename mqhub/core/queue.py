"""The Queue: the one work-queue primitive every protocol uses.

A :class:`Queue` is assembled from one class per responsibility, each in its own module: the
ready window and the paging of its stored backlog (:mod:`mqhub.core.window`), consumers, credit,
dispatch and in-flight entries (:mod:`mqhub.core.delivery`), fan-out copies
(:mod:`mqhub.core.fanout`); this module adds its settings, counters, puts, overflow, dead
letters, expiry, removal, pull and admin. Its Consumer is in :mod:`mqhub.core.consumer`.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from zope.interface import implementer

from mqhub.core.backlog import NO_IDS, NO_LIST, NO_MAP
from mqhub.core.consumer import Consumer
from mqhub.core.deadletter import REASON_EXPIRED, REASON_OVERFLOW, dlq_name, to_dead
from mqhub.core.delivery import MAX_ATTEMPTS_HEADER, NOT_IN_FLIGHT, NOT_OWNER
from mqhub.core.fanout import QueueFanout
from mqhub.core.message import TIER_DURABLE, TIER_MEMORY
from mqhub.errors import InvalidName
from mqhub.interfaces import IQueue
from mqhub.records import MODES, OVERFLOW_POLICIES
from mqhub.store.batch import WriteBatch
from mqhub.store.records import Entry

if TYPE_CHECKING:  # pragma: no cover
    from mqhub.core.host import QueueHost

log = logging.getLogger(__name__)

__all__ = ["Consumer", "Queue", "MAX_ATTEMPTS_HEADER", "OVERFLOW_POLICIES", "MODES",
           "NOT_IN_FLIGHT", "NOT_OWNER"]

_MEM_DEAD_LIMIT = 10_000
_NO_MAP = NO_MAP
_NO_IDS = NO_IDS
_NO_LIST = NO_LIST


@implementer(IQueue)
class Queue(QueueFanout):
    """Ready entries ordered by (priority desc, msg_id asc), in-flight entries with deadlines.

    Slotted, and its containers are made on first use: an idle queue is one small object
    (see docs/core-api.md, "Memory").
    """

    __slots__ = (
        "broker", "name", "tier", "durable", "max_size", "overflow", "ttl", "max_attempts",
        "msg_timeout", "expires_at", "auto_delete", "expire_to_dead_letters", "window",
        "window_setting", "mode", "incarnation", "paused", "deleted", "deferred",
        "message_count", "expired_count", "dropped_count", "_mem_dead")

    def __init__(self, broker: QueueHost, name: str, *, tier: str = TIER_DURABLE,
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
        self.incarnation = incarnation
        self.paused = False
        self.deleted = False
        self._window_init()
        self._delivery_init()
        self._fanout_init()
        # counters
        self.deferred = 0
        self.message_count = 0
        self.expired_count = 0
        self.dropped_count = 0
        self._mem_dead: deque[Entry] = _NO_LIST   # memory-tier dead letters (newest kept)

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
        self.broker.persist_settings(self)
        if "window" in settings and self.durable:
            if self.over_window():
                self._evict()
            else:
                self._maybe_page()
        if "expires_at" in settings:
            self.broker.schedule_expiry(self)

    # -- counts -----------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Ready messages (in memory plus stored backlog, and puts awaiting their commit), not
        counting in flight or deferred."""
        return self._nready + self._stored_only + self._awaiting()

    @property
    def deliverable(self) -> int:
        """Ready messages a consumer's credit can be spent on: :attr:`depth` without the puts
        still awaiting their commit (they are delivered once stored)."""
        return self._nready + self._stored_only

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

    @property
    def needs_sweep(self) -> bool:
        """True when the window holds entries the TTL sweep may have to drop."""
        return bool(self._nready and (self.ttl or self._may_expire))

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

    def _committed(self, puts: list[tuple[list[Entry], bool]]) -> None:
        """The batch holding ``puts`` was committed: they enter the window, the overflow policy
        and the window size apply to them, and they are dispatched."""
        for entries, uniform in puts:
            self._enter(entries, uniform)
        if self.max_size and self.deliverable > self.max_size:
            b = WriteBatch()
            self._overflow(self.deliverable - self.max_size, b, self.broker.clock.seconds())
            self._write(b)
        if self.over_window():
            self._evict()
        self.dispatch()

    def _overflow(self, excess: int, batch: WriteBatch | None, now: float) -> None:
        """Apply the overflow policy to ``excess`` entries beyond ``max_size``."""
        victims = self._pop_oldest(excess)
        if not victims:
            return
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

    # -- dead letters and expiry ------------------------------------------------------------

    def _dead(self, entries: list[Entry], reason: str, error: str | None,
              batch: WriteBatch | None, now: float) -> None:
        """Move ``entries`` (already out of the window/in-flight) to this queue's dead letters."""
        self.broker.counters.dead_lettered(reason, len(entries))
        self.broker.journal.dead_lettered(self, entries, reason)
        if self._parent is not None:
            self._parent.fan_dead(self, entries, reason, error, now)
            return
        self.dead_letter_count += len(entries)
        dead = [to_dead(e, self.name, reason, error, now) for e in entries]
        if self.durable and batch is not None:
            batch.delete_entries(self.name, [(e[1], e[0]) for e in entries])
            batch.put_entries(dlq_name(self.name), dead)
            self._mark(batch)
        else:
            self.keep_memory_dead_letters(dead)

    def keep_memory_dead_letters(self, dead: list[Entry], replace: bool = False) -> None:
        """Add (or with ``replace``, set) this memory queue's dead letters; the newest are kept."""
        if replace or self._mem_dead is _NO_LIST:
            self._mem_dead = deque(self._mem_dead if not replace else (), maxlen=_MEM_DEAD_LIMIT)
        self._mem_dead.extend(dead)

    def _expire(self, entries: list[Entry], now: float) -> None:
        """Count and drop (or dead-letter) expired entries taken from the window."""
        self.broker.journal.expired(self, entries)
        if self._parent is not None and not self.expire_to_dead_letters:
            self.expired_count += len(entries)
            self._parent.fan_done(self, entries)
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
            self._held_less(expired)
            self._expire(expired, now)
        return scanned

    def memory_dead_letters(self) -> list[Entry]:
        """The dead letters a memory-tier queue keeps (newest kept), oldest first."""
        return list(self._mem_dead)

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
        gone = {e[0] for e in removed}
        if self._pend and len(gone) < len(wanted):
            for batch, taken in self._take_awaiting(wanted - gone):
                gone.update([e[0] for e in taken])
                self.broker.commits.on_settled(batch, self._drop_when_stored(taken))
        if not gone:
            return ids
        if removed:
            self._removed_from_window(removed, gone)
        return [mid for mid in ids if mid not in gone]

    def _removed_from_window(self, removed: list[Entry], gone: set[int]) -> None:
        """Account for ``removed`` entries taken out of the window, delete their stored rows."""
        self._nready -= len(removed)
        self._held_less(removed)
        stored = [e for e in removed if e[0] not in self._volatile]
        if self._volatile:
            self._volatile.difference_update(gone)
        if stored and self.durable:
            self._drop_stored([(e[1], e[0]) for e in stored])
        if self._parent is not None:
            self._parent.fan_done(self, removed)
        self._maybe_page()

    def _drop_when_stored(self, taken: list[Entry]) -> Callable[[bool], None]:
        """A settle callback deleting the stored rows of ``taken`` once their put is stored."""
        keys = [(e[1], e[0]) for e in taken]

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

    # -- admin ------------------------------------------------------------------------------

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
        self.broker.persist_settings(self, b)
        return self._write(b)

    def _clear(self) -> None:
        """Forget all messages in memory and every consumer's in-flight count."""
        self._fan_clear()
        self._window_clear()
        self._delivery_clear()
        self.deferred = 0

    def close(self) -> None:
        """The queue is deleted: drop everything, detach consumers silently."""
        self.deleted = True
        self._clear()
        for c in self.consumers:
            c.attached = False
        self.consumers = _NO_LIST
        for sub in self._subs:
            sub.close()
        self._subs = _NO_LIST

    def __repr__(self) -> str:
        """Readable form."""
        return f"<Queue {self.name} {self.tier} depth={self.depth} in_flight={len(self._inflight)}>"
