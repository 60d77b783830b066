"""Delays the broker holds: deferred messages until they are due, and plain clock timers.

Deferred messages of durable queues are due rows ``dq/<queue>/<msg_id>`` (a requeue with a
delay) or ``da/<msg_id>`` (a delayed publish, routed when due) that the scheduler hands back
when due; memory queues and hubs without a scheduler keep them on clock timers (*timed*
delays). :class:`Delays` is one object the broker holds; it finds queues and routes addresses
through the two callables the broker gives it, and drops delayed publishes made for a parked
address before that address was emptied (its *cuts*). :class:`Timers` are the clock timers the
broker's parts share, all cancelled by ``stop()``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mqhub.core.commits import Commits
from mqhub.core.counters import Counters
from mqhub.records import MSG_ID
from mqhub.store import due_rows
from mqhub.store.batch import WriteBatch
from mqhub.store.records import Entry, entry_order

if TYPE_CHECKING:  # pragma: no cover
    from mqhub.core.queue import Queue
    from mqhub.core.routing import Route

log = logging.getLogger(__name__)
#: seconds before due rows whose handling failed are tried again
DUE_RETRY = 1.0

DUE_PREFIX = b"dq/"
ADDRESS_DUE_PREFIX = b"da/"
PARK_PREFIX = "~park/"

DueRows = list[tuple[float, bytes, bytes]]


class Timers:
    """Plain clock timers that forget themselves when they run; ``stop()`` cancels the rest."""

    __slots__ = ("_clock", "_pending")

    def __init__(self, clock: Any) -> None:
        """Timers on ``clock``."""
        self._clock = clock
        self._pending: set[Any] = set()

    def later(self, delay: float, func: Callable[..., object], *args: Any) -> None:
        """Call ``func(*args)`` after ``delay`` seconds (unless stopped first)."""
        holder: list[Any] = []

        def run() -> None:
            self._pending.discard(holder[0])
            func(*args)
        t = self._clock.callLater(delay, run)
        holder.append(t)
        self._pending.add(t)

    def stop(self) -> None:
        """Cancel every timer not run yet."""
        for t in list(self._pending):
            if t.active():
                t.cancel()
        self._pending.clear()


class Delays:
    """Deferred messages of every queue until they are due, and the scheduler's handlers of
    their due rows.

    :ivar started: the broker has recovered (due rows that fire before are put back).
    """

    def __init__(self, clock: Any, scheduler: Any, commits: Commits, counters: Counters,
                 timers: Timers, find: Callable[[str], Queue | None],
                 route: Callable[[str], Route]) -> None:
        """:param find: the queue of a name (declared or parking), or None.
        :param route: the route of an address now (unvalidated: a stored address was
            accepted when it was published)."""
        self._clock = clock
        self._scheduler = scheduler
        self._commits = commits
        self._counters = counters
        self._timers = timers
        self._find = find
        self._route = route
        self.started = False
        #: address -> delayed publishes with ids below this, made while the address was parked
        #: or paused, are dropped when due (``empty_parked``)
        self.cuts: dict[str, int] = {}
        if scheduler is not None:
            scheduler.register(DUE_PREFIX, self.on_due)
            scheduler.register(ADDRESS_DUE_PREFIX, self.on_address_due)

    def cut(self, address: str, below: int) -> None:
        """Drop the delayed publishes made for parked ``address`` with ids below ``below``."""
        self.cuts[address] = below

    # -- deferring -------------------------------------------------------------------------------

    def defer(self, queue: Queue, entries: list[Entry], when: float, batch: WriteBatch,
              persist: bool = True) -> None:
        """Defer ``entries`` of ``queue`` until ``when`` (due rows for durable queues)."""
        queue.deferred += len(entries)
        if queue.durable and persist and self._scheduler is not None:
            prefix = DUE_PREFIX + queue.name.encode() + b"/"
            inc = queue.incarnation
            for e in entries:
                batch.put_due(when, prefix + e[MSG_ID].to_bytes(8, "big"),
                              due_rows.encode_queue_row(inc, e))
            self._clock.callLater(0, self._scheduler.note_due, when)
        else:
            self._timers.later(max(0.0, when - self._clock.seconds()), self._queue_due_timed,
                               queue, list(entries), queue.incarnation)

    def defer_address(self, address: str, queues: tuple[Queue, ...], entries: list[Entry],
                      when: float, batch: WriteBatch, persist: bool) -> None:
        """Defer a delayed publish until ``when``, then route it by ``address`` (NSQ DPUB).

        ``queues`` (what the address reaches now) are counted in ``deferred`` and remembered
        with their incarnation: one of them that is emptied or re-created meanwhile does not
        get the batch. One due row per message (``da/<msg_id>``) when any of them is durable,
        otherwise a clock timer.
        """
        n = len(entries)
        for q in queues:
            q.deferred += n
        marks = tuple((q.name, q.incarnation) for q in queues)
        if persist and self._scheduler is not None and any(q.durable for q in queues):
            for e in entries:
                batch.put_due(when, ADDRESS_DUE_PREFIX + e[MSG_ID].to_bytes(8, "big"),
                              due_rows.encode_address_row(address, marks, e))
            self._clock.callLater(0, self._scheduler.note_due, when)
        else:
            self._timers.later(max(0.0, when - self._clock.seconds()), self._address_due_timed,
                               address, list(entries), marks, persist)

    # -- timed delays coming due ---------------------------------------------------------------

    def _queue_due_timed(self, queue: Queue, entries: list[Entry], incarnation: int) -> None:
        """A timed delay of ``queue`` came due."""
        if queue.deleted or queue.incarnation != incarnation:
            return
        queue.deferred = max(0, queue.deferred - len(entries))
        b = WriteBatch()
        self._commits.fill(b, lambda: queue.put(entries, b, True, self._clock.seconds()),
                           lambda: self._due_refused(b))

    def _address_due_timed(self, address: str, entries: list[Entry],
                           marks: tuple[tuple[str, int], ...], persist: bool) -> None:
        """A timed delayed publish came due (its store writes retried if refused)."""
        b = WriteBatch()
        self._commits.fill(b, lambda: self._route_due(address, entries, marks, b, persist,
                                                      self._clock.seconds()),
                           lambda: self._due_refused(b))

    def _due_refused(self, batch: WriteBatch) -> None:
        """A timed delay came due and the store refused the batch storing it (a full disk):
        its queues dropped their copies, so count them as deferred again and put them again
        :data:`DUE_RETRY` seconds later (counted in ``counters.retried["delay"]``)."""
        again: list[tuple[Queue, int, list[Entry]]] = []
        for name, entries in batch.puts.items():
            q = self._find(name)
            if q is None or q.deleted or not entries:
                continue
            q.deferred += len(entries)
            again.append((q, q.incarnation, list(entries)))
        n = sum([len(e) for _, _, e in again])
        if not n:
            return
        self._counters.retry("delay", n)
        log.warning("%d delayed message(s) coming due were refused by the store; retrying in "
                    "%ss", n, DUE_RETRY)
        self._timers.later(DUE_RETRY, self._due_again, again)

    def _due_again(self, again: list[tuple[Queue, int, list[Entry]]]) -> None:
        """Put refused timed delays again (queues emptied or re-created meanwhile are skipped,
        as a due row of theirs would be)."""
        b = WriteBatch()
        now = self._clock.seconds()

        def fill() -> None:
            for q, inc, entries in again:
                q.deferred = max(0, q.deferred - len(entries))
                if not q.deleted and q.incarnation == inc:
                    q.put(entries, b, True, now)
        self._commits.fill(b, fill, lambda: self._due_refused(b))

    # -- due rows (the scheduler's handlers) ---------------------------------------------------

    def _not_started_yet(self, rows: DueRows, batch: WriteBatch, now: float) -> bool:
        """Before the broker recovered: put due ``rows`` back :data:`DUE_RETRY` seconds later;
        return True."""
        if self.started:
            return False
        for _, key, payload in rows:
            batch.put_due(now + DUE_RETRY, key, payload)
        return True

    def on_address_due(self, rows: DueRows, batch: WriteBatch, now: float) -> Any:
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

    def on_due(self, rows: DueRows, batch: WriteBatch, now: float) -> Any:
        """Scheduler handler for ``dq/`` rows: move due entries into their queues."""
        if self._not_started_yet(rows, batch, now):
            return None
        per_queue: dict[Queue, list[Entry]] = {}
        for _, key, payload in rows:
            q = self._find(key[len(DUE_PREFIX):-9].decode("utf-8", "replace"))
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

    def _fill_due_batch(self, rows: DueRows, batch: WriteBatch, now: float,
                        fill: Callable[[], None]) -> Any:
        """Run ``fill`` with ``batch`` open (the scheduler commits it); return the after-commit
        hook.

        If ``fill`` fails half way, the error is logged and every row is put back for a retry
        a second later (at least once: puts already made stay in the batch), and the hook is
        still returned, so the puts already made are settled when the slice commits and no
        barrier waits for a hook that would never run.
        """
        prev = self._commits.open_batch(batch)
        try:
            fill()
        except Exception:
            log.exception("due rows failed; retrying them in %ss", DUE_RETRY)
            for _, key, payload in rows:
                batch.put_due(now + DUE_RETRY, key, payload)
        finally:
            hook = self._commits.close_due_batch(batch, prev)
        return hook

    def _route_due(self, address: str, entries: list[Entry], marks: tuple[tuple[str, int], ...],
                   batch: WriteBatch, persist: bool, now: float) -> None:
        """Put due ``entries`` into the queues ``address`` routes to now (or its parking queue).

        A queue counted at publish time whose incarnation changed since (emptied, deleted and
        re-created) is skipped; entries made for a parked address before ``empty_parked`` ran
        on it are dropped.
        """
        counted = dict(marks)
        n = len(entries)
        for name, inc in marks:
            q = self._find(name)
            if q is not None and q.incarnation == inc:
                q.deferred = max(0, q.deferred - n)
        cut = self.cuts.get(address)
        if cut is not None and PARK_PREFIX + address in counted:
            entries = [e for e in entries if e[MSG_ID] >= cut]
            if not entries:
                return
        route = self._route(address)
        dests = route.queues if route.park is None else (route.park,)
        if not dests:
            return
        entries.sort(key=entry_order)
        for q in dests:
            was = counted.get(q.name)
            if was is not None and was != q.incarnation and not q.name.startswith(PARK_PREFIX):
                continue
            q.put(entries, batch, persist, now)
