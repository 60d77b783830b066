"""Fan-out delivery for a Queue: one private memory sub-queue per consumer, refcounted copies.

The parent queue keeps the stored entry until every sub-queue that received a copy is done with
it (acked, expired or dead-lettered). Messages published while nobody is attached wait in the
parent and go to the next subscriber; the last subscriber leaving returns its unfinished copies
to the parent's backlog. :class:`QueueFanout` sits between delivery and the Queue itself.
"""

from __future__ import annotations

from typing import Any

from mqhub.core.backlog import NO_IDS, NO_LIST, NO_MAP
from mqhub.core.consumer import Consumer
from mqhub.core.deadletter import dlq_name, to_dead
from mqhub.core.delivery import QueueDelivery
from mqhub.core.message import TIER_MEMORY
from mqhub.store.batch import WriteBatch
from mqhub.store.records import Entry, entry_order


class QueueFanout(QueueDelivery):
    """Fan-out state of a queue: its subscriber sub-queues and the copies they hold."""

    __slots__ = ("_parent", "_subs", "_claimed", "_refs", "_open", "_fan_seq")

    expire_to_dead_letters: bool

    def _fanout_init(self) -> None:
        """No subscriber; not a sub-queue."""
        # fan-out: one private memory sub-queue per consumer gets a copy of every message; the
        # parent keeps the stored entry until every sub-queue that got it is done with it
        self._parent: QueueFanout | None = None
        self._subs: list[Any] = NO_LIST
        self._claimed: dict[int, Entry] = NO_MAP
        self._refs: dict[int, int] = NO_MAP
        self._open: set[int] = NO_IDS         # (sub-queue) ids received and not yet done
        self._fan_seq = 0

    def put(self, entries: list[Entry], batch: WriteBatch | None, persist: bool,
            now: float, uniform: bool = False, run: bool = False) -> None:
        """Add entries (mqhub.core.queue)."""
        raise NotImplementedError

    def close(self) -> None:
        """The queue is deleted (mqhub.core.queue)."""
        raise NotImplementedError

    def keep_memory_dead_letters(self, dead: list[Entry], replace: bool = False) -> None:
        """Keep memory-tier dead letters (mqhub.core.queue)."""
        raise NotImplementedError

    def _fan_attach(self, target: Any, ready: int, credit: int, timeout: float | None,
                    tag: Any) -> Consumer:
        """Fan-out attach: a private memory sub-queue for this consumer, then the consumer."""
        self._fan_seq += 1
        make: Any = type(self)
        sub = make(self.broker, f"{self.name}~fan{self._fan_seq}", tier=TIER_MEMORY,
                   ttl=self.ttl, max_attempts=self.max_attempts, msg_timeout=self.msg_timeout,
                   expire_to_dead_letters=self.expire_to_dead_letters)
        sub._parent = self
        sub._open = set()
        if not self._subs:
            self._subs = []
            if not self._claimed:
                self._claimed = {}
                self._refs = {}
        self._subs.append(sub)
        c = sub.attach(target, ready=ready, credit=credit, timeout=timeout, tag=tag)
        self.dispatch()
        return c

    def _fan_dispatch(self) -> None:
        """Hand every ready entry to every sub-queue (one copy each, refcounted here)."""
        entries = self._pop_ready(self._nready)
        if entries:
            now = self.broker.clock.seconds()
            ttl_cut = self._ttl_cut(now)
            if self._may_expire or ttl_cut:
                entries = self._drop_expired(entries, now, ttl_cut)
            subs = list(self._subs)
            ids = [e[0] for e in entries]
            self._claimed.update(zip(ids, entries, strict=False))
            self._refs.update(dict.fromkeys(ids, len(subs)))
            for sub in subs:
                sub._open.update(ids)
                sub.put(list(entries), None, False, now)
        if self._stored_only:
            self._maybe_page()

    def fan_done(self, sub: QueueFanout, entries: list[Entry]) -> None:
        """``sub`` is finished with ``entries`` (acked, expired or dead): release the copies."""
        done: list[Entry] = []
        for e in entries:
            mid = e[0]
            if mid not in sub._open:
                continue
            sub._open.discard(mid)
            orig = self._drop_copy(mid)
            if orig is not None:
                done.append(orig)
        self._delete_stored(done)

    def _drop_copy(self, mid: int) -> Entry | None:
        """One copy of ``mid`` is finished: return this queue's entry when it was the last copy."""
        refs = self._refs
        left = refs.get(mid, 1) - 1
        if left > 0:
            refs[mid] = left
            return None
        refs.pop(mid, None)
        return self._claimed.pop(mid, None)

    def _delete_stored(self, entries: list[Entry]) -> None:
        """Delete the stored copies of ``entries`` (every subscriber is done with them)."""
        if entries and self.durable:
            b = WriteBatch()
            b.delete_entries(self.name, [(e[1], e[0]) for e in entries])
            self._write(b)

    def fan_dead(self, sub: QueueFanout, entries: list[Entry], reason: str, error: str | None,
                 now: float) -> None:
        """A subscriber's copy died: record it in this queue's dead letters, release the copy."""
        self.dead_letter_count += len(entries)
        dead = [to_dead(e, self.name, reason, error, now) for e in entries]
        if self.durable:
            b = WriteBatch()
            b.put_entries(dlq_name(self.name), dead)
            self.broker.commits.commit(b)
        else:
            self.keep_memory_dead_letters(dead)
        self.fan_done(sub, entries)

    def fan_release(self, sub: QueueFanout) -> None:
        """A subscriber left: drop its copies; if it was the last, unfinished messages return."""
        if sub in self._subs:
            self._subs.remove(sub)
        back: list[Entry] = []
        done: list[Entry] = []
        for mid in sub._open:
            orig = self._drop_copy(mid)
            if orig is not None:
                (done if self._subs else back).append(orig)
        self._delete_stored(done)
        sub._open = set()
        sub.close()
        if back:
            back.sort(key=entry_order)
            self._insert_many(back)
        if self.auto_delete and not self._subs and not self.deleted:
            self.broker.delete_queue(self.name)

    def _fan_clear(self) -> None:
        """The queue is emptied: so are its subscribers' sub-queues and the copies they hold."""
        for sub in self._subs:
            sub._clear()
            sub._open = set() if sub._open is not NO_IDS else NO_IDS
            sub.incarnation += 1
        if self._claimed:
            self._claimed.clear()
        if self._refs:
            self._refs.clear()

    def _clear(self) -> None:
        """Forget all messages in memory (mqhub.core.queue)."""
        raise NotImplementedError
