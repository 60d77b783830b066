"""Paused addresses in cluster mode: what is published while an address is paused is held for
the address, not given to its queues, and moved into them when it is resumed.

While an address is paused (a record ``~pause/<address>`` in the cluster's adapter state, which
every node mirrors and watches: the check before a publish is a set lookup), every node
publishes that address's messages to ``mqp.<address>`` instead of ``mq.<address>``. No queue's
consumer filters ``mqp.``; the address's **hold consumer** (``hold<token>``, made before the
record is written, never pulled while paused) does, so interest retention keeps them, its
pending count is the address's held depth, and a subject purge of ``mqp.<address>`` empties it.

Resuming deletes the record (every live node confirms it), then a :class:`HoldDrain` pulls the
hold consumer and republishes each message, with its own header block, to ``mq.<address>``;
only once that batch's PubAcks are in does it ack the held copies. A node that dies midway
leaves the rest (and anything republished but not yet acked) on the hold consumer, which
JetStream redelivers: at least once, never lost. The drain's Deferred fires once the hold
consumer has nothing pending or unacked; the consumer itself is deleted :data:`HOLD_GRACE`
seconds later if it is still empty (a node slow to hear of the resume may still publish to
``mqp.`` meanwhile: the drain then goes on), and is kept when the address is paused again.
A hold consumer whose address is no longer paused that no node drains (its node died during a
resume) is drained by whichever node notices it at two directory reads in a row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqhub.cluster.client import Event, NatsConnection
from mqhub.cluster.jetstream import (
    STREAM,
    JetStream,
    JetStreamError,
    Puller,
    ack_frames,
    address_subject,
    consumer_name,
    nak_frames,
)
from mqhub.cluster.messages import publish_frames
from mqhub.protocols.nats.codec import OP_HMSG

__all__ = ["HoldDrain", "PAUSE_PREFIX", "HOLD_GRACE", "hold_config", "hold_name",
           "hold_subject"]

log = Logger()

#: adapter-state key prefix of the pause records
PAUSE_PREFIX = "~pause/"
#: seconds an emptied hold consumer is kept before it is deleted
HOLD_GRACE = 5.0
#: seconds between the drain's checks of the hold consumer's counts
CHECK_EVERY = 0.25
#: the most held messages one node moves at once
MOVE_WINDOW = 500


def hold_subject(address: str) -> str:
    """The subject publishes to a paused ``address`` are stored under."""
    return "mqp." + address


def hold_name(address: str) -> str:
    """The durable consumer holding a paused address's publishes."""
    return "hold" + consumer_name(address)[1:]


def hold_config(address: str) -> dict:
    """The hold consumer of ``address`` (deliver all: it holds everything since the pause)."""
    return {"durable_name": hold_name(address), "ack_policy": "explicit",
            "filter_subject": hold_subject(address), "deliver_policy": "all",
            "ack_wait": 30_000_000_000, "max_ack_pending": 10 * MOVE_WINDOW,
            "metadata": {"mqhub_hold": address}}


class HoldDrain:
    """Moves what a hold consumer holds into ``mq.<address>`` (see the module docstring).

    :param conn: the node's cluster connection; :param js: its JetStream API.
    :param address: the resumed address.
    :param paused: whether the address is paused again (then the drain stops, the consumer
        is kept).
    :param finished: called once the drain ends (deleted its consumer or stopped).
    """

    def __init__(self, conn: NatsConnection, js: JetStream, clock: IReactorTime, address: str,
                 paused: Callable[[str], bool], finished: Callable[[HoldDrain], None]) -> None:
        self.conn = conn
        self.js = js
        self.clock = clock
        self.address = address
        self.paused = paused
        self.finished = finished
        self.moving = 0
        self.moved = 0
        self.stopped = False
        self._waiters: list[defer.Deferred[None]] = []
        self._timer: Any = None
        self._checking = False
        self._empty_since = 0.0
        self._puller = Puller(conn, STREAM, hold_name(address), self._want, self._move,
                              expires=1.0, max_batch=MOVE_WINDOW)

    def start(self) -> None:
        """Begin pulling and checking."""
        self._puller.start()
        self._timer = self.clock.callLater(CHECK_EVERY, self._check)

    def emptied(self) -> defer.Deferred[None]:
        """Fires once the hold consumer has nothing pending or unacked (or the drain stops)."""
        d: defer.Deferred[None] = defer.Deferred()
        if self.stopped:
            d.callback(None)
        else:
            self._waiters.append(d)
        return d

    def stop(self) -> None:
        """Stop moving (the address was paused again, or the node stops); what was pulled and
        not yet republished is redelivered to the next drain after the consumer's ack wait."""
        if self.stopped:
            return
        self.stopped = True
        self._puller.stop()
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._fire()
        self.finished(self)

    def _fire(self) -> None:
        """Tell the waiters the hold is empty."""
        waiters, self._waiters = self._waiters, []
        for d in waiters:
            d.callback(None)

    def _want(self) -> int:
        """Room in the move window."""
        return 0 if self.stopped else max(0, MOVE_WINDOW - self.moving)

    def _move(self, events: list[Event]) -> None:
        """Republish pulled held messages to the address; ack them once stored there."""
        if self.stopped:
            self._answer(nak_frames([e[3] for e in events], 0.0))
            return
        bodies = []
        blocks = []
        replies = []
        for event in events:
            if event[0] == OP_HMSG:
                blocks.append(event[4])
                bodies.append(event[5])
            else:
                blocks.append(b"")
                bodies.append(event[4])
            replies.append(event[3])
        n = len(bodies)
        self.moving += n
        subject = address_subject(self.address)
        d = self.conn.publish_acked(lambda reply: publish_frames(subject, reply, bodies, blocks),
                                    n)

        def stored(_: object) -> None:
            self.moving -= n
            self.moved += n
            self._answer(ack_frames(replies))
            self._puller.refill()

        def refused(failure: Any) -> None:
            self.moving -= n
            log.warn("cluster: moving held messages of {address} refused ({err}); retrying",
                     address=self.address, err=failure.value)
            self._answer(nak_frames(replies, 1.0))
            self._puller.refill()
        d.addCallbacks(stored, refused)

    def _answer(self, frames: list[bytes]) -> None:
        """Acks/naks to the hold consumer (lost with the connection: JetStream redelivers)."""
        try:
            self.conn.publish(frames)
        except Exception as exc:   # ClusterUnavailable: redelivered after the ack wait
            log.debug("cluster: hold answer lost: {err}", err=exc)

    def _check(self) -> None:
        """Is the hold empty? Then fire the waiters; delete the consumer after the grace."""
        self._timer = None
        if self.stopped:
            return
        if self.paused(self.address):
            self.stop()
            return
        self._puller.tick()      # requests the server dropped (a leader change) are renewed
        if self.moving or self._checking or not self.conn.connected:
            self._timer = self.clock.callLater(CHECK_EVERY, self._check)
            return
        self._checking = True
        d = self.js.consumer_info(STREAM, hold_name(self.address))
        d.addCallbacks(self._counted, self._info_failed)

    def _counted(self, info: dict) -> None:
        """The hold consumer's counts."""
        self._checking = False
        if self.stopped:
            return
        empty = not int(info.get("num_pending", 0)) and not int(info.get("num_ack_pending", 0))
        now = self.clock.seconds()
        if not empty:
            self._empty_since = 0.0
        else:
            self._fire()
            if not self._empty_since:
                self._empty_since = now
            elif now - self._empty_since >= HOLD_GRACE and not self.paused(self.address):
                self._delete()
                return
        self._timer = self.clock.callLater(CHECK_EVERY if not empty else 1.0, self._check)

    def _info_failed(self, failure: Any) -> None:
        """No hold consumer (someone else finished it): done; else try again."""
        self._checking = False
        if self.stopped:
            return
        if isinstance(failure.value, JetStreamError) and failure.value.not_found:
            self.stop()
            return
        self._timer = self.clock.callLater(CHECK_EVERY, self._check)

    def _delete(self) -> None:
        """Delete the emptied hold consumer and end."""
        d = self.js.delete_consumer(STREAM, hold_name(self.address))

        def done(result: object) -> None:
            if isinstance(result, Failure) and not (
                    isinstance(result.value, JetStreamError) and result.value.not_found):
                log.warn("cluster: deleting the hold of {address} failed: {err}",
                         address=self.address, err=result.value)
            self.stop()
        d.addBoth(done)
