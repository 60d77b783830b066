"""Parking and pausing of the broker (a base of :class:`mqhub.core.broker.Broker`).

An address is *parked* while no queue is bound to it (an NSQ topic without channels) or
*paused*: publishes to it go to its hidden parking queue (``~park/<address>``) and move to the
bound queues when it is released. Durable state: store meta ``park/<address>``,
``pause/<address>`` and ``pcut/<address>`` (ids held before an ``empty_parked``).

A move whose commit is refused (a full disk) puts its messages back into the parking queue,
where they are still stored, and the drain is tried again :data:`PARK_RETRY` seconds later: a
refused move never leaves parked messages undeliverable until a restart.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from twisted.internet.defer import Deferred, DeferredList, maybeDeferred, succeed
from twisted.python.failure import Failure

from mqhub.core.address import validate_address
from mqhub.core.delays import PARK_PREFIX, BrokerDelays
from mqhub.core.queue import Queue
from mqhub.store.batch import WriteBatch

if TYPE_CHECKING:  # pragma: no cover
    from mqhub.core.ids import IdGenerator

log = logging.getLogger(__name__)

PARK_CUT_PREFIX = "pcut/"
#: seconds before a drain whose move was refused by the store is tried again
PARK_RETRY = 1.0
#: the most stored parked entries one drain step reads back
PARK_PAGE = 1000


class BrokerParking(BrokerDelays):
    """Parked and paused addresses, their parking queues and how they drain (on the broker's
    delays, whose clock timers it uses)."""

    ids: IdGenerator
    window: int
    #: addresses being released (unparked) whose drain waits for a retry
    _releasing: set[str]
    #: addresses with a drain retry armed
    _park_retry: set[str]
    #: address -> moves out of its parking queue whose commit has not settled yet
    _park_moving: dict[str, int]
    #: address -> the drains waiting for the one running on it
    _park_draining: dict[str, list[Deferred[None]]]

    def _park_queue(self, address: str) -> Queue:
        """The hidden parking queue of ``address`` (created on demand)."""
        q = self.router.parking.get(address)
        if q is None:
            name = PARK_PREFIX + address
            q = self._hidden.get(name)
            if q is None:
                q = self._hidden[name] = Queue(self, name, window=self.window)  # type: ignore[arg-type]
            self.router.parking[address] = q
            self.router.changed()
        return q

    def park(self, address: str) -> Deferred[None]:
        """Keep publishes to ``address`` while no queue is bound to it (NSQ topic without channels)."""
        validate_address(address)
        self._releasing.discard(address)
        self._park_queue(address)
        b = WriteBatch()
        b.put_meta("park/" + address, b"1")
        return self.commits.commit(b)

    def unpark(self, address: str) -> Deferred[None]:
        """Stop parking ``address``; parked messages go to the bound queues (or are dropped)."""
        b = WriteBatch()
        b.delete_meta("park/" + address)
        self.commits.commit(b)
        return self._release(address)

    def pause_address(self, address: str) -> Deferred[None]:
        """Hold every publish to ``address`` in its parking queue until resumed."""
        validate_address(address)
        self._park_queue(address)
        self.router.paused.add(address)
        self.router.changed()
        b = WriteBatch()
        b.put_meta("pause/" + address, b"1")
        return self.commits.commit(b)

    def resume_address(self, address: str) -> Deferred[None]:
        """Release a paused address: held messages go to the bound queues."""
        self.router.paused.discard(address)
        self.router.changed()
        b = WriteBatch()
        b.delete_meta("pause/" + address)
        self.commits.commit(b)
        return self._drain_park(address).addCallback(lambda _: None)

    def _release(self, address: str) -> Deferred[None]:
        """Drain then forget the parking queue of ``address`` unless it is still paused.

        When a move is refused, the parking queue keeps its messages and the release is tried
        again with the drain (nothing is forgotten while it still holds messages).
        """
        self._releasing.add(address)
        d = self._drain_park(address)

        def forget(moved: bool) -> None:
            if not moved or address not in self._releasing:
                return
            self._releasing.discard(address)
            if address in self.router.paused:
                return
            q = self.router.parking.pop(address, None)
            if q is not None:
                self._hidden.pop(q.name, None)
                if q.depth:
                    q.empty()
                self.router.changed()
        return d.addCallback(forget)

    def empty_parked(self, address: str) -> Deferred[None]:
        """Drop every message held for ``address`` (NSQ ``/topic/empty``); parking stays as it was.

        Held means: in the parking queue (in memory or stored), and delayed publishes made while
        the address was parked or paused that are not due yet (they would have come due into
        the parking queue). Messages already in bound queues are not touched. Fires when durable.
        """
        cut = self.ids.next_id()
        self._park_cut[address] = cut
        b = WriteBatch()
        b.put_meta(PARK_CUT_PREFIX + address, str(cut).encode())
        d = self.commits.commit(b)
        q = self.router.parking.get(address)
        if q is None:
            return d
        return DeferredList([d, q.empty()], fireOnOneErrback=True,
                            consumeErrors=True).addCallback(lambda _: None)

    def parked_depth(self, address: str) -> int:
        """Messages held for ``address`` (parked or paused)."""
        q = self.router.parking.get(address)
        return q.depth if q is not None else 0

    def _drain_park(self, address: str) -> Deferred[bool]:
        """Move everything held for ``address`` into the queues its route now reaches.

        One drain per address runs at a time (a second one starts when it ends). Fires with
        False when a move was refused by the store (its messages are back in the parking queue
        and a retry is armed), else True.
        """
        waiting = self._park_draining.get(address)
        if waiting is not None:
            after: Deferred[None] = Deferred()
            waiting.append(after)
            return after.addCallback(lambda _: self._drain_park(address))
        waiting = self._park_draining[address] = []

        def done(result: object) -> object:
            del self._park_draining[address]
            for w in waiting:
                w.callback(None)
            if isinstance(result, Failure):
                log.error("draining the parking queue of %r failed: %s", address,
                          result.getTraceback())
                return False
            return result
        return maybeDeferred(self._drain_step, address).addBoth(done)

    def _drain_step(self, address: str) -> Deferred[bool]:
        """One step of :meth:`_drain_park`: move the window, read the next stored page."""
        q = self.router.parking.get(address)
        moving = address in self._park_moving
        if q is None or not (q.depth or moving):
            return succeed(True)
        route = self.router.route(address)
        if route.park is not None or not route.queues:
            return succeed(True)
        if q.awaiting_commit or moving:
            # parked puts enter the window once stored, and a move being stored may be
            # refused (its messages come back): drain once those commits settled
            return self.commits.barrier().addBoth(lambda _: self._drain_step(address))
        dests = route.queues
        now = self.clock.seconds()
        entries = q.pop_ready(q.in_memory)
        b = WriteBatch()
        refused: list[bool] = []
        incarnation = q.incarnation
        moving_now = self._park_moving

        def settled(ok: bool) -> None:
            left = moving_now.pop(address, 1) - 1
            if left:
                moving_now[address] = left
            if ok:
                return
            # the move never reached the store: its messages are still the parking queue's
            refused.append(True)
            self.counters.retry("park", len(entries))
            if not q.deleted and q.incarnation == incarnation:
                q.insert_ready(entries)
            log.warning("moving %d parked message(s) of %r was refused by the store; "
                        "retrying in %ss", len(entries), address, PARK_RETRY)
            self._retry_park(address)

        def move() -> None:
            if entries:
                b.delete_entries(q.name, [(e[1], e[0]) for e in entries])
                for dest in dests:
                    dest.put(entries, b, True, now)
                moving_now[address] = moving_now.get(address, 0) + 1
                self.commits.on_settled(b, settled)

        d = self.commits.in_window(b, move)
        loaded = None if refused else q.load_page_after(d, PARK_PAGE)
        if loaded is None:
            return d.addCallback(lambda _: not refused)
        return loaded.addCallback(
            lambda more: (False if refused else
                          self._drain_step(address) if more else True))

    def _retry_park(self, address: str) -> None:
        """Arm one retry of the drain (or release) of ``address``."""
        if address in self._park_retry:
            return
        self._park_retry.add(address)

        def retry() -> None:
            self._park_retry.discard(address)
            d = self._release(address) if address in self._releasing \
                else self._drain_park(address)
            d.addErrback(lambda f: log.error("retrying the drain of %r failed: %s",
                                             address, f.getErrorMessage()))
        self._later(PARK_RETRY, retry)
