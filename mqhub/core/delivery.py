"""Delivery of a queue: consumers, credit, dispatch, in-flight entries and their deadlines.

In-flight entries sit in one dict keyed by msg_id with their consumer and deadline; deadlines
are tracked per delivered batch in a heap, so one timer per queue serves them all. Every
operation takes and returns lists (batch-oriented); no per-message Deferred is made.
:class:`QueueDelivery` sits between the window (:mod:`mqhub.core.window`) and fan-out.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Iterable
from typing import Any, cast

from mqhub.core.backlog import NO_LIST, NO_MAP
from mqhub.core.consumer import Consumer
from mqhub.core.deadletter import REASON_MAX_ATTEMPTS, REASON_REJECTED
from mqhub.core.ids import first_id_at
from mqhub.core.window import QueueWindow
from mqhub.errors import NoSuchQueue
from mqhub.interfaces import IConsumer
from mqhub.records import MAX_ATTEMPTS_HEADER, NOT_IN_FLIGHT, NOT_OWNER
from mqhub.store.batch import WriteBatch
from mqhub.store.records import Entry

log = logging.getLogger(__name__)

INF = float("inf")
_NO_MAP = NO_MAP
_NO_LIST = NO_LIST


class QueueDelivery(QueueWindow):
    """Consumers, dispatch and in-flight state of a queue (see :class:`mqhub.core.queue.Queue`).

    The fan-out and dead-letter hooks (``_fan_attach``, ``_fan_dispatch``, ``fan_release``,
    ``fan_done``, ``_dead``, ``_expire``) are provided by the subclasses.
    """

    __slots__ = ("consumers", "_inflight", "_owner", "_deadlines", "_heap_ids", "_dseq",
                 "_timer", "_timer_at", "_rr", "_dispatching", "_again", "requeue_count",
                 "timeout_count", "dead_letter_count")

    paused: bool
    mode: str
    msg_timeout: float
    max_attempts: int
    ttl: float
    auto_delete: bool
    deferred: int
    _parent: Any
    _subs: list[Any]

    def _delivery_init(self) -> None:
        """No consumer, nothing in flight."""
        self.consumers: list[Consumer] = _NO_LIST
        self._inflight: dict[int, Entry] = _NO_MAP
        # msg_id -> (consumer, deadline); one tuple shared by every message of a delivered batch
        self._owner: dict[int, tuple[Consumer, float]] = _NO_MAP
        self._deadlines: list[tuple[float, int, list[int]]] = _NO_LIST
        self._heap_ids = 0                    # ids held by _deadlines (acked ones included)
        self._dseq = 0
        self._timer: Any = None
        self._timer_at = INF
        self._rr = 0
        self._dispatching = False
        self._again = False
        self.requeue_count = 0
        self.timeout_count = 0
        self.dead_letter_count = 0

    # hooks of the subclasses
    def _fan_attach(self, target: Any, ready: int, credit: int, timeout: float | None,
                    tag: Any) -> Consumer:
        """Fan-out attach (mqhub.core.fanout)."""
        raise NotImplementedError

    def _fan_dispatch(self) -> None:
        """Fan-out dispatch (mqhub.core.fanout)."""
        raise NotImplementedError

    def fan_release(self, sub: Any) -> None:
        """A fan-out subscriber left (mqhub.core.fanout)."""
        raise NotImplementedError

    def fan_done(self, sub: Any, entries: list[Entry]) -> None:
        """A fan-out subscriber is done with ``entries`` (mqhub.core.fanout)."""
        raise NotImplementedError

    def _dead(self, entries: list[Entry], reason: str, error: str | None,
              batch: WriteBatch | None, now: float) -> None:
        """Dead-letter ``entries`` (mqhub.core.queue)."""
        raise NotImplementedError

    def _expire(self, entries: list[Entry], now: float) -> None:
        """Drop or dead-letter expired ``entries`` (mqhub.core.queue)."""
        raise NotImplementedError

    # -- counts -----------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Messages delivered and not yet acked (over every subscriber in fan-out mode)."""
        if self._subs:
            return len(self._inflight) + sum(len(sub._inflight) for sub in self._subs)
        return len(self._inflight)

    # -- consumers --------------------------------------------------------------------------

    def attach(self, target: Any, *, ready: int = 0, credit: int = 0,
               timeout: float | None = None, tag: Any = None) -> Consumer:
        """Attach a consumer; ``target.deliver_batch(consumer, queue_name, entries)`` receives."""
        if self.deleted:
            raise NoSuchQueue(self.name)
        if self.mode == "fanout" and self._parent is None:
            return self._fan_attach(target, ready, credit, timeout, tag)
        c = Consumer(self, target, int(ready or 0), int(credit or 0),
                     self.msg_timeout if timeout is None else float(timeout), tag)
        if self.consumers is _NO_LIST:
            self.consumers = []
        self.consumers.append(c)
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
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        if self._parent is not None:
            self._parent.fan_release(self)
            return
        mine = [mid for mid, rec in self._owner.items() if rec[0] is consumer]
        if mine and requeue:
            self._requeue_ids(consumer, mine, 0.0, None, count=False)
        if self.auto_delete and not self.consumers and not self.deleted:
            self.broker.delete_queue(self.name)
        else:
            self.dispatch()

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
        if self._subs:
            self._fan_dispatch()
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
                if not self._nready and self._stored_only:
                    self._again = True   # refill here: one loop, not one recursion per window
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
            ids = [e[0] for e in out]
            self.broker.journal.delivered(self, out, ids)
            deadline = now + c.timeout
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
                self.broker.commits.commit(b)
            self.broker.counters.deliver(c.target, n)
            try:
                c.target.deliver_batch(c, self.name, out)
            except Exception:
                log.exception("deliver_batch of %r failed", c.target)

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

    def _delivery_clear(self) -> None:
        """Forget every in-flight entry and every consumer's in-flight count."""
        if self._inflight:
            self._inflight.clear()
            self._owner.clear()
        self._deadlines = _NO_LIST
        self._heap_ids = 0
        for c in self.consumers:
            c.in_flight = 0
        self.stop_timer()
        self._timer_at = INF

    def stop_timer(self) -> None:
        """Cancel the in-flight timer (the broker is stopping)."""
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    # -- message operations -----------------------------------------------------------------

    def _take(self, consumer: IConsumer, msg_ids: Iterable[int]) -> tuple[list[Entry], list[int]]:
        """Pop the in-flight records of ``msg_ids`` held by ``consumer``; return (entries, failed).

        Fast path (C-level passes only): the owner records are popped at once; when every id
        was in flight on ``consumer`` (one shared record per delivered batch), the entries are
        popped too. An unknown or repeated id, or one held by another consumer, puts the
        records back and takes the careful per-id path.
        """
        ids = msg_ids if isinstance(msg_ids, list) else list(msg_ids)
        owner = self._owner
        n = len(ids)
        if n and owner is not _NO_MAP:
            recs: list[tuple[Consumer, float]] = []
            try:
                recs.extend(map(owner.pop, ids))
            except KeyError:
                mine = False
            else:
                first = recs[0]
                if recs.count(first) == n:  # identity compare: one shared record
                    mine = first[0] is consumer
                else:
                    mine = all(rec[0] is consumer for rec in set(recs))
            if mine:
                got = list(map(self._inflight.pop, ids))
                consumer.in_flight -= n
                return got, []
            owner.update(zip(ids, recs, strict=False))  # as it was (``recs`` may be short)
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

    def failure_reasons(self, consumer: IConsumer,
                        msg_ids: Iterable[int]) -> list[tuple[int, str]]:
        """Why ``consumer`` cannot ack/requeue/touch/reject each id: ``(msg_id, reason)``.

        ``NOT_OWNER`` ("not_owner"): the message is in flight on another consumer;
        ``NOT_IN_FLIGHT`` ("not_in_flight"): unknown, ready, deferred or already finished.
        Meant for the ids an operation returned as failed (NSQ ``E_FIN_FAILED`` texts); an id
        that ``consumer`` does hold is reported as ``"ok"``.
        """
        owner = cast(QueueDelivery, consumer.queue)._owner
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

    def ack(self, consumer: IConsumer, msg_ids: Iterable[int]) -> list[int]:
        """Acknowledge (NSQ FIN); return the ids that were not in flight on ``consumer``."""
        if consumer.queue is not self:
            return consumer.queue.ack(consumer, msg_ids)
        got, failed = self._take(consumer, msg_ids)
        if got and self._parent is not None:
            self._parent.fan_done(self, got)
        if not got:
            return failed
        # the caller's list when it holds exactly the ids of ``got``, in order
        ids = msg_ids if not failed and isinstance(msg_ids, list) else None
        if self.durable:
            b = WriteBatch()
            prios = self._prios
            if len(prios) == 1 and ids is not None:
                # one priority ever entered this window: one run of the ids, no key per id
                # and no pass over the entries (a copy: the batch keeps it until the commit)
                b.delete_ids(self.name, prios[0], ids[:])
            else:
                b.delete_entries(self.name, [(e[1], e[0]) for e in got])
            self._write(b)
        journal = self.broker.journal
        if journal.enabled:
            # the recorder packs (copies) the ids at once: no copy of its own
            journal.acked(self, got, ids)
        self.broker.counters.ack(consumer.target, len(got))
        self.dispatch()
        return failed

    def touch(self, consumer: IConsumer, msg_ids: Iterable[int],
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

    def requeue(self, consumer: IConsumer, msg_ids: Iterable[int], delay: float = 0.0,
                error: str | None = None) -> list[int]:
        """Return in-flight messages to ready (or deferred by ``delay`` seconds); dead-letter at max attempts."""
        if consumer.queue is not self:
            return consumer.queue.requeue(consumer, msg_ids, delay, error)
        return self._requeue_ids(consumer, msg_ids, delay, error, count=True)

    def _requeue_ids(self, consumer: IConsumer, msg_ids: Iterable[int], delay: float,
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
                self.broker.defer(self, back, now + delay, b)
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
            return consumer.queue.reject(consumer, msg_ids, reason, error)
        got, failed = self._take(consumer, msg_ids)
        if got:
            b = WriteBatch()
            self._dead(got, reason, error, b, self.broker.clock.seconds())
            self._write(b)
            self.dispatch()
        return failed

