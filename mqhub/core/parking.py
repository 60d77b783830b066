"""Parked and paused addresses: the broker keeps their publishes until queues take them.

An address is *parked* while no queue is bound to it (an NSQ topic without channels) or
*paused*: publishes to it go to its hidden parking queue (``~park/<address>``) and move to the
bound queues when it is released. :class:`Parking` is one object the broker holds; it owns the
parking queues. Durable state: store meta ``park/<address>``, ``pause/<address>`` and
``pcut/<address>`` (ids parked before an ``empty_parked``: their delayed publishes are dropped).

A move whose commit is refused (a full disk) puts its messages back into the parking queue,
where they are still stored, and the drain is tried again :data:`PARK_RETRY` seconds later: a
refused move never leaves parked messages undeliverable until a restart.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred, DeferredList, maybeDeferred, succeed
from twisted.python.failure import Failure

from mqhub.core.commits import Commits
from mqhub.core.counters import Counters
from mqhub.core.delays import PARK_PREFIX, Delays, Timers
from mqhub.core.ids import IdGenerator
from mqhub.core.queue import Queue
from mqhub.core.routing import Router
from mqhub.records import get_key, validate_address
from mqhub.store.batch import WriteBatch

log = logging.getLogger(__name__)

PARK_CUT_PREFIX = "pcut/"
#: seconds before a drain whose move was refused by the store is tried again
PARK_RETRY = 1.0
#: the most stored parked entries one drain step reads back
PARK_PAGE = 1000


class Parking:
    """Parked and paused addresses, their parking queues and how they drain."""

    def __init__(self, router: Router, commits: Commits, clock: Any, counters: Counters,
                 ids: IdGenerator, delays: Delays, timers: Timers,
                 make_queue: Callable[[str], Queue]) -> None:
        """:param make_queue: builds the (durable) parking queue of a name."""
        self._router = router
        self._commits = commits
        self._clock = clock
        self._counters = counters
        self._ids = ids
        self._delays = delays
        self._timers = timers
        self._make_queue = make_queue
        #: name -> parking queue (every one, also one whose address is released but not yet
        #: drained)
        self.queues: dict[str, Queue] = {}
        #: addresses being released (unparked) whose drain waits for a retry
        self._releasing: set[str] = set()
        #: addresses with a drain retry armed
        self._retrying: set[str] = set()
        #: address -> moves out of its parking queue whose commit has not settled yet
        self._moving: dict[str, int] = {}
        #: address -> the drains waiting for the one running on it
        self._draining: dict[str, list[Deferred[None]]] = {}

    def queue_of(self, address: str) -> Queue:
        """The parking queue of ``address`` (created on demand)."""
        q = self._router.parking.get(address)
        if q is None:
            name = PARK_PREFIX + address
            q = self.queues.get(name)
            if q is None:
                q = self.queues[name] = self._make_queue(name)
            self._router.parking[address] = q
            self._router.changed()
        return q

    def recover(self, address: str, paused: bool) -> None:
        """Start-up: ``address`` was parked (or paused)."""
        self.queue_of(address)
        if paused:
            self._router.paused.add(address)

    def park(self, address: str) -> Deferred[None]:
        """Keep publishes to ``address`` while no queue is bound to it."""
        validate_address(address)
        self._releasing.discard(address)
        self.queue_of(address)
        b = WriteBatch()
        b.put_meta("park/" + address, b"1")
        return self._commits.commit(b)

    def unpark(self, address: str) -> Deferred[None]:
        """Stop parking ``address``; parked messages go to the bound queues (or are dropped)."""
        b = WriteBatch()
        b.delete_meta("park/" + address)
        self._commits.commit(b)
        return self._release(address)

    def pause(self, address: str) -> Deferred[None]:
        """Keep every publish to ``address`` in its parking queue until resumed."""
        validate_address(address)
        self.queue_of(address)
        self._router.paused.add(address)
        self._router.changed()
        b = WriteBatch()
        b.put_meta("pause/" + address, b"1")
        return self._commits.commit(b)

    def resume(self, address: str) -> Deferred[None]:
        """Release a paused address: its parked messages go to the bound queues."""
        self._router.paused.discard(address)
        self._router.changed()
        b = WriteBatch()
        b.delete_meta("pause/" + address)
        self._commits.commit(b)
        return self.drain(address).addCallback(lambda _: None)

    def _release(self, address: str) -> Deferred[None]:
        """Drain then forget the parking queue of ``address`` unless it is still paused.

        When a move is refused, the parking queue keeps its messages and the release is tried
        again with the drain (nothing is forgotten while it still holds messages).
        """
        self._releasing.add(address)
        d = self.drain(address)

        def forget(moved: bool) -> None:
            if not moved or address not in self._releasing:
                return
            self._releasing.discard(address)
            if address in self._router.paused:
                return
            q = self._router.parking.pop(address, None)
            if q is not None:
                self.queues.pop(q.name, None)
                if q.depth:
                    q.empty()
                self._router.changed()
        return d.addCallback(forget)

    def empty(self, address: str) -> Deferred[None]:
        """Drop every message parked for ``address`` (NSQ ``/topic/empty``); parking stays.

        Parked means: in the parking queue (in memory or stored), and delayed publishes made
        while the address was parked or paused that are not due yet (they would have come due
        into the parking queue). Messages already in bound queues are not touched. Fires when
        durable.
        """
        cut = self._ids.next_id()
        self._delays.cut(address, cut)
        b = WriteBatch()
        b.put_meta(PARK_CUT_PREFIX + address, str(cut).encode())
        d = self._commits.commit(b)
        q = self._router.parking.get(address)
        if q is None:
            return d
        return DeferredList([d, q.empty()], fireOnOneErrback=True,
                            consumeErrors=True).addCallback(lambda _: None)

    def depth(self, address: str) -> int:
        """Messages parked for ``address`` (parked or paused)."""
        q = self._router.parking.get(address)
        return q.depth if q is not None else 0

    def drain_matching(self, matches: Callable[[str], bool]) -> None:
        """A queue was bound: drain every parked address it now takes (``matches``)."""
        for address in list(self._router.parking):
            if matches(address):
                self.drain(address)

    def drain(self, address: str) -> Deferred[bool]:
        """Move everything parked for ``address`` into the queues its route now reaches.

        One drain per address runs at a time (a second one starts when it ends). Fires with
        False when a move was refused by the store (its messages are back in the parking queue
        and a retry is armed), else True.
        """
        waiting = self._draining.get(address)
        if waiting is not None:
            after: Deferred[None] = Deferred()
            waiting.append(after)
            return after.addCallback(lambda _: self.drain(address))
        waiting = self._draining[address] = []

        def done(result: object) -> object:
            del self._draining[address]
            for w in waiting:
                w.callback(None)
            if isinstance(result, Failure):
                log.error("draining the parking queue of %r failed: %s", address,
                          result.getTraceback())
                return False
            return result
        return maybeDeferred(self._drain_step, address).addBoth(done)

    def _drain_step(self, address: str) -> Deferred[bool]:
        """One step of :meth:`drain`: move the window, read the next stored page."""
        q = self._router.parking.get(address)
        moving = address in self._moving
        if q is None or not (q.depth or moving):
            return succeed(True)
        route = self._router.route(address)
        if route.park is not None or not route.queues:
            return succeed(True)
        if q.awaiting_commit or moving:
            # parked puts enter the window once stored, and a move being stored may be
            # refused (its messages come back): drain once those commits settled
            return self._commits.barrier().addBoth(lambda _: self._drain_step(address))
        dests = route.queues
        now = self._clock.seconds()
        entries = q.pop_ready(q.in_memory)
        b = WriteBatch()
        refused: list[bool] = []
        incarnation = q.incarnation
        moving_now = self._moving

        def settled(ok: bool) -> None:
            left = moving_now.pop(address, 1) - 1
            if left:
                moving_now[address] = left
            if ok:
                return
            # the move never reached the store: its messages are still the parking queue's
            refused.append(True)
            self._counters.retry("park", len(entries))
            if not q.deleted and q.incarnation == incarnation:
                q.insert_ready(entries)
            log.warning("moving %d parked message(s) of %r was refused by the store; "
                        "retrying in %ss", len(entries), address, PARK_RETRY)
            self._retry(address)

        def move() -> None:
            if entries:
                b.delete_entries(q.name, list(map(get_key, entries)))
                for dest in dests:
                    dest.put(entries, b, True, now)
                moving_now[address] = moving_now.get(address, 0) + 1
                self._commits.on_settled(b, settled)

        d = self._commits.fill(b, move)
        loaded = None if refused else q.load_page_after(d, PARK_PAGE)
        if loaded is None:
            return d.addCallback(lambda _: not refused)
        return loaded.addCallback(
            lambda more: (False if refused else
                          self._drain_step(address) if more else True))

    def _retry(self, address: str) -> None:
        """Arm one retry of the drain (or release) of ``address``."""
        if address in self._retrying:
            return
        self._retrying.add(address)

        def retry() -> None:
            self._retrying.discard(address)
            d = (self._release(address) if address in self._releasing
                 else self.drain(address))
            d.addErrback(lambda f: log.error("retrying the drain of %r failed: %s",
                                             address, f.getErrorMessage()))
        self._timers.later(PARK_RETRY, retry)
