"""Delays, due rows and queue expiry of the broker (the base of :class:`mqhub.core.broker.Broker`).

Deferred messages of durable queues are due rows ``dq/<queue>/<msg_id>`` (requeue with a delay)
or ``da/<msg_id>`` (a delayed publish, routed when due) that the scheduler hands back when due;
memory queues and hubs without a scheduler use clock timers. Queues with their own expiry are
deleted through ``qx/<queue>`` due rows, or one shared clock timer.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mqhub.store import due_rows
from mqhub.store.batch import WriteBatch
from mqhub.store.records import Entry, entry_order

if TYPE_CHECKING:  # pragma: no cover
    from mqhub.core.commits import Commits
    from mqhub.core.counters import Counters
    from mqhub.core.queue import Queue
    from mqhub.core.routing import Router

log = logging.getLogger(__name__)
#: seconds before due rows whose handling failed are tried again
DUE_RETRY = 1.0

DUE_PREFIX = b"dq/"
ADDRESS_DUE_PREFIX = b"da/"
EXPIRY_PREFIX = b"qx/"
PARK_PREFIX = "~park/"


class BrokerDelays:
    """Deferred messages, due-row handlers, memory timers and queue expiry of the broker."""

    clock: Any
    scheduler: Any
    commits: Commits
    counters: Counters
    router: Router
    _queues: dict[str, Queue]
    _hidden: dict[str, Queue]
    _started: bool
    _park_cut: dict[str, int]
    _mem_timers: set[Any]
    _expiries: list[tuple[float, int, Queue]]
    _expiry_seq: int
    _expiry_call: Any
    _expiry_at: float
    _sweep_cursor: int

    def delete_queue(self, name: str) -> Any:
        """Delete a queue (the broker's)."""
        raise NotImplementedError

    def _any_queue(self, name: str) -> Queue | None:
        """The queue named ``name``: a declared one, else a hidden (parking) one, else None."""
        return self._queues.get(name) or self._hidden.get(name)

    def schedule_expiry(self, q: Queue) -> None:
        """(Re)arm the deletion of ``q`` at its ``expires_at`` (0 = cancel)."""
        key = EXPIRY_PREFIX + q.name.encode()
        if self.scheduler is not None and q.durable:
            if q.expires_at:
                self.scheduler.call_at(q.expires_at, key, b"")
            else:
                self.scheduler.cancel(key)
        elif q.expires_at:
            self._arm_memory_expiry(q)

    def _arm_memory_expiry(self, q: Queue) -> None:
        """Delete ``q`` at its ``expires_at`` (memory queues, or no scheduler).

        Every such queue shares one heap and one clock timer armed for the earliest (a timer
        per queue would cost more than an idle queue itself).
        """
        self._expiry_seq += 1
        heapq.heappush(self._expiries, (q.expires_at, self._expiry_seq, q))
        if q.expires_at < self._expiry_at:
            self._arm_expiry_timer(q.expires_at)

    def _arm_expiry_timer(self, when: float) -> None:
        """(Re)arm the shared queue-expiry timer for ``when``."""
        if self._expiry_call is not None and self._expiry_call.active():
            self._expiry_call.cancel()
        self._expiry_at = when
        self._expiry_call = self.clock.callLater(max(0.0, when - self.clock.seconds()),
                                                 self._run_expiries)

    def _run_expiries(self) -> None:
        """The shared timer fired: delete every queue whose time has come, then re-arm."""
        self._expiry_call = None
        self._expiry_at = float("inf")
        now = self.clock.seconds()
        heap = self._expiries
        while heap and heap[0][0] <= now:
            q = heapq.heappop(heap)[2]
            try:
                self._expire_queue(q)
            except Exception:
                log.exception("expiring queue %r failed", q.name)
        if heap:
            self._arm_expiry_timer(heap[0][0])

    def _later(self, delay: float, func: Any, *args: Any) -> None:
        """A plain clock timer that ``stop()`` cancels and that forgets itself when it runs."""
        holder: list[Any] = []

        def run() -> None:
            self._mem_timers.discard(holder[0])
            func(*args)
        t = self.clock.callLater(delay, run)
        holder.append(t)
        self._mem_timers.add(t)

    def _expire_queue(self, q: Queue) -> None:
        """Delete ``q`` if it is still the live queue of its name and has expired."""
        if self._queues.get(q.name) is q and q.expires_at and q.expires_at <= self.clock.seconds():
            self.delete_queue(q.name)

    # -- delays --------------------------------------------------------------------------------

    def defer(self, queue: Queue, entries: list[Entry], when: float, batch: WriteBatch,
              persist: bool = True) -> None:
        """Hold ``entries`` for ``queue`` until ``when`` (due rows for durable queues)."""
        queue.deferred += len(entries)
        if queue.durable and persist and self.scheduler is not None:
            prefix = DUE_PREFIX + queue.name.encode() + b"/"
            inc = queue.incarnation
            for e in entries:
                batch.put_due(when, prefix + e[0].to_bytes(8, "big"), due_rows.encode_queue_row(inc, e))
            sched = self.scheduler
            self.clock.callLater(0, sched.note_due, when)
        else:
            self._later(max(0.0, when - self.clock.seconds()), self._undefer_memory, queue,
                        list(entries), queue.incarnation)

    def _defer_address(self, address: str, queues: tuple[Queue, ...], entries: list[Entry],
                       when: float, batch: WriteBatch, persist: bool) -> None:
        """Hold a delayed publish until ``when``, then route it by ``address`` (NSQ DPUB).

        ``queues`` (what the address reaches now) are counted in ``deferred`` and remembered
        with their incarnation: one of them that is emptied or re-created meanwhile does not
        get the batch. One due row per message (``da/<msg_id>``) when any of them is durable,
        otherwise a clock timer.
        """
        n = len(entries)
        for q in queues:
            q.deferred += n
        marks = tuple((q.name, q.incarnation) for q in queues)
        if persist and self.scheduler is not None and any(q.durable for q in queues):
            for e in entries:
                batch.put_due(when, ADDRESS_DUE_PREFIX + e[0].to_bytes(8, "big"),
                              due_rows.encode_address_row(address, marks, e))
            self.clock.callLater(0, self.scheduler.note_due, when)
        else:
            self._later(max(0.0, when - self.clock.seconds()), self._address_due_memory,
                        address, list(entries), marks, persist)

    def _address_due_memory(self, address: str, entries: list[Entry],
                            marks: tuple[tuple[str, int], ...], persist: bool) -> None:
        """A clock-held delayed publish came due (its store writes retried if refused)."""
        b = WriteBatch()
        self.commits.in_window(b, lambda: self._route_due(address, entries, marks, b, persist,
                                                   self.clock.seconds()),
                               lambda: self._due_refused(b))

    def _due_refused(self, batch: WriteBatch) -> None:
        """A memory-held delay came due and the store refused the batch storing it (a full
        disk): its queues dropped their copies, so count them as deferred again and put them
        again :data:`DUE_RETRY` seconds later (counted in ``counters.retried["delay"]``)."""
        again: list[tuple[Queue, int, list[Entry]]] = []
        for name, entries in batch.puts.items():
            q = self._any_queue(name)
            if q is None or q.deleted or not entries:
                continue
            q.deferred += len(entries)
            again.append((q, q.incarnation, list(entries)))
        n = sum([len(e) for _, _, e in again])
        if not n:
            return
        self.counters.retry("delay", n)
        log.warning("%d delayed message(s) coming due were refused by the store; retrying in "
                    "%ss", n, DUE_RETRY)
        self._later(DUE_RETRY, self._due_again, again)

    def _due_again(self, again: list[tuple[Queue, int, list[Entry]]]) -> None:
        """Put refused memory-held delays again (queues emptied or re-created meanwhile are
        skipped, as a due row of theirs would be)."""
        b = WriteBatch()
        now = self.clock.seconds()

        def fill() -> None:
            for q, inc, entries in again:
                q.deferred = max(0, q.deferred - len(entries))
                if not q.deleted and q.incarnation == inc:
                    q.put(entries, b, True, now)
        self.commits.in_window(b, fill, lambda: self._due_refused(b))

    def _not_started_yet(self, rows: list[tuple[float, bytes, bytes]], batch: WriteBatch,
                         now: float) -> bool:
        """Before start(): put due ``rows`` back :data:`DUE_RETRY` seconds later; return True."""
        if self._started:
            return False
        for _, key, payload in rows:
            batch.put_due(now + DUE_RETRY, key, payload)
        return True

    def _on_address_due(self, rows: list[tuple[float, bytes, bytes]], batch: WriteBatch,
                        now: float) -> Any:
        """Scheduler handler for ``da/`` rows: route due publishes by their address now."""
        if self._not_started_yet(rows, batch, now):
            return None
        groups: dict[tuple[str, Any], list[Entry]] = {}
        for _, key, payload in rows:
            try:
                address, marks, entry = due_rows.decode_address_row(payload)
            except ValueError:
                log.error("dropping unreadable due row %r", key)
                continue
            groups.setdefault((address, tuple(map(tuple, marks))), []).append(entry)

        def fill() -> None:
            for (address, marks), entries in groups.items():
                self._route_due(address, entries, marks, batch, True, now)
        return self._fill_due_batch(rows, batch, now, fill)

    def _fill_due_batch(self, rows: list[tuple[float, bytes, bytes]], batch: WriteBatch,
                        now: float, fill: Callable[[], None]) -> Any:
        """Run ``fill`` inside the scheduler's commit window; return the after-commit hook.

        If ``fill`` fails half way, the error is logged and every row is put back for a retry
        a second later (at least once: puts already made stay in the batch), and the hook is
        still returned, so the puts already made are settled when the slice commits and no
        barrier waits for a hook that would never run.
        """
        prev = self.commits.open_window(batch)
        try:
            fill()
        except Exception:
            log.exception("due rows failed; retrying them in %ss", DUE_RETRY)
            for _, key, payload in rows:
                batch.put_due(now + DUE_RETRY, key, payload)
        finally:
            hook = self.commits.close_due_window(batch, prev)
        return hook

    def _route_due(self, address: str, entries: list[Entry], marks: tuple[tuple[str, int], ...],
                   batch: WriteBatch, persist: bool, now: float) -> None:
        """Put due ``entries`` into the queues ``address`` routes to now (or its parking queue).

        A queue counted at publish time whose incarnation changed since (emptied, deleted and
        re-created) is skipped; entries held for a parked address before ``empty_parked`` ran
        on it are dropped.
        """
        counted = dict(marks)
        n = len(entries)
        for name, inc in marks:
            q = self._any_queue(name)
            if q is not None and q.incarnation == inc:
                q.deferred = max(0, q.deferred - n)
        cut = self._park_cut.get(address)
        if cut is not None and PARK_PREFIX + address in counted:
            entries = [e for e in entries if e[0] >= cut]
            if not entries:
                return
        # the router's cached route, unvalidated: a stored address was accepted when published
        route = self.router.route(address)
        dests = route.queues if route.park is None else (route.park,)
        if not dests:
            return
        entries.sort(key=entry_order)
        for q in dests:
            was = counted.get(q.name)
            if was is not None and was != q.incarnation and not q.name.startswith(PARK_PREFIX):
                continue
            q.put(entries, batch, persist, now)

    def _undefer_memory(self, queue: Queue, entries: list[Entry], incarnation: int) -> None:
        """A memory-held delay came due."""
        if queue.deleted or queue.incarnation != incarnation:
            return
        queue.deferred = max(0, queue.deferred - len(entries))
        b = WriteBatch()
        self.commits.in_window(b, lambda: queue.put(entries, b, True, self.clock.seconds()),
                               lambda: self._due_refused(b))

    def _on_due(self, rows: list[tuple[float, bytes, bytes]], batch: WriteBatch,
                now: float) -> Any:
        """Scheduler handler for ``dq/`` rows: move due entries into their queues."""
        if self._not_started_yet(rows, batch, now):
            return None
        per_queue: dict[Queue, list[Entry]] = {}
        for _, key, payload in rows:
            q = self._any_queue(key[len(DUE_PREFIX):-9].decode("utf-8", "replace"))
            try:
                inc, entry = due_rows.decode_queue_row(payload)
            except ValueError:
                log.error("dropping unreadable due row %r", key)
                continue
            if q is None or q.deleted or inc != q.incarnation:
                continue
            per_queue.setdefault(q, []).append(entry)

        def fill() -> None:
            for q, entries in per_queue.items():
                q.deferred = max(0, q.deferred - len(entries))
                entries.sort(key=entry_order)
                q.put(entries, batch, True, now)
        return self._fill_due_batch(rows, batch, now, fill)

    def _on_queue_expiry(self, rows: list[tuple[float, bytes, bytes]], batch: WriteBatch,
                         now: float) -> None:
        """Scheduler handler for ``qx/`` rows: delete queues whose own TTL ran out."""
        if self._not_started_yet(rows, batch, now):
            return
        for _, key, _ in rows:
            q = self._queues.get(key[len(EXPIRY_PREFIX):].decode("utf-8", "replace"))
            if q is not None and q.expires_at and q.expires_at <= now:
                self.delete_queue(q.name)

    def sweep_ttl(self, now: float, budget: int) -> bool:
        """Drop expired ready messages from queue windows, at most ``budget`` scanned; True = more."""
        queues = [q for q in self._queues.values() if q.needs_sweep]
        if not queues:
            return False
        used = 0
        i = self._sweep_cursor % len(queues)
        visited = 0
        while visited < len(queues) and used < budget:
            used += queues[i].sweep(now, budget - used)
            i = (i + 1) % len(queues)
            visited += 1
        self._sweep_cursor = i
        return visited < len(queues)
