"""The MQKS TCP server: a thin Twisted adapter between the sans-IO codec and the core.

Strategy:

- ``dataReceived`` splits the read into lines and runs them in order. Consecutive publishes to
  one event become ONE ``broker.publish_batch`` call (one store commit, one Deferred); each
  message carries its MQKS id (the publisher's request id) in the header ``mqks-id``.
- Replies leave in request order: a reply that must wait (a confirm after a commit) takes a
  *slot*, and later replies queue behind it; consumer pushes (messages, ``--update``) are not
  held back by slots. Everything a read produces goes out in one ``write``.
- Messages are pushed by the core through :class:`~mqhub.protocols.mqks.queues.MqksConsumer`
  and rendered here. A consumer holds at most ``prefetch`` unacked messages; an auto-ack consumer
  stops being acked (so it stops receiving) while the socket's write buffer is full.
- Errors get ``{id} error {error_id}`` (the id is logged with the request); a TAB closes the
  connection silently, an over-long line answers ``None error {error_id}`` and closes.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from mqhub.errors import MqhubError
from mqhub.identity import Session
from mqhub.interfaces import ICore
from mqhub.listener import peer_text, set_no_delay
from mqhub.protocols.mqks import codec as wire
from mqhub.protocols.mqks.access import MqksGuard, Refused, check_events
from mqhub.protocols.mqks.codec import (
    CONFIRM,
    FATAL_TOO_LONG,
    NONE_ID,
    RequestError,
    encode_error,
    encode_ok,
    render_body,
)
from mqhub.protocols.mqks.config import MqksConfig
from mqhub.protocols.mqks.evals import EvalRefused, answer
from mqhub.protocols.mqks.queues import MqksConsumer, MqksRegistry
from mqhub.records import ADDRESS, ATTEMPTS, BODY, HEADERS, MSG_ID, ORIGIN, format_id

log = Logger(namespace="mqhub.mqks")

#: the header holding a message's MQKS id (the publisher's request id)
ID_HEADER = "mqks-id"
#: unconfirmed publishes per connection above which reading pauses until commits catch up
MAX_UNCONFIRMED = 50_000
#: consumers one connection may hold (each is a core consumer; the original had no limit)
MAX_CONSUMERS = 10_000
_PUBLISH = b"publish"
_ACK = b"ack"
_CONFIRM_LEN = len(CONFIRM)
_EVENTS: dict[str, bytes] = {}


def _event_bytes(address: str) -> bytes:
    """``address`` encoded (cached; the cache is bounded)."""
    got = _EVENTS.get(address)
    if got is None:
        if len(_EVENTS) >= 4096:
            _EVENTS.clear()
        got = _EVENTS[address] = address.encode()
    return got


def foreign_id(headers: dict[str, str] | None, msg_id: int) -> bytes:
    """The MQKS id of a message another protocol published: its ``mqks-id`` header when that is
    a plain token (printable ASCII without spaces), else the core id in 16 hex digits."""
    raw = headers.get(ID_HEADER) if headers else None
    if raw and isinstance(raw, str) and raw.isascii() and raw.isprintable() and " " not in raw:
        return raw.encode()
    return format_id(msg_id).encode()


def render_entries(cid: bytes, entries: list[tuple]) -> tuple[bytes, list[bytes]]:
    """The delivery lines of ``entries`` for consumer ``cid``, and their MQKS ids.

    An MQKS publish carries its id in the ``mqks-id`` header and its data goes as it is; a
    message of another protocol gets :func:`foreign_id` and
    :func:`~mqhub.protocols.mqks.codec.render_body`. ``retry`` is attempts - 1.
    """
    head = cid + b" ok "
    out: list[bytes] = []
    ids: list[bytes] = []
    add_line = out.append
    add_id = ids.append
    for e in entries:
        h = e[HEADERS]
        if e[ORIGIN] == "mqks" and h and ID_HEADER in h:
            mid = h[ID_HEADER].encode("latin-1")
            extra, data = b"", e[BODY]
        else:
            mid = foreign_id(h, e[MSG_ID])
            extra, data = render_body(e[BODY])
        add_id(mid)
        retry = e[ATTEMPTS] - 1
        props = b"event=" + _event_bytes(e[ADDRESS])
        if retry > 0:
            props += b",retry=%d" % retry
        add_line(head + mid + b" " + props + extra + b" " + data)
    out.append(b"")
    return b"\n".join(out), ids


@implementer(IPushProducer)
class MqksProtocol(Protocol):
    """One MQKS client connection (publisher, consumer or both).

    :ivar consumers: this connection's consumers by id (deleted when it closes).
    :ivar writes_paused: the transport's write buffer is full (see :class:`MqksConsumer`).
    """

    transport: Any

    def __init__(self, factory: MqksFactory) -> None:
        """Bind to the factory's hub, config and registry."""
        self.factory = factory
        self.registry: MqksRegistry = factory.registry
        #: the core session this connection publishes and consumes through (ICore.session)
        self.broker: ICore = factory.hub.broker.session(None)
        self.clock = factory.hub.clock
        self.reader = wire.LineReader(factory.config.max_line)
        self.consumers: dict[bytes, MqksConsumer] = {}
        #: who this connection acts as (None: nothing is checked)
        self.session: Session | None = None
        self.writes_paused = False
        self.closed = False
        self._closing = False  # a fatal line: read nothing more, close once replies are out
        self._out: list[bytes] | None = None
        self._slots: deque[list[Any]] = deque()
        self._unconfirmed = 0
        self._read_paused = False
        self._backlog = False
        self._actions = {
            b"publish": self.on_bad_publish,
            b"consume": self.on_consume,
            b"rebind": self.on_rebind,
            b"ack": self.on_ack,
            b"reject": self.on_reject,
            b"delete_consumer": self.on_delete_consumer,
            b"delete_queue": self.on_delete_queue,
            b"ping": self.on_ping,
            b"_eval": self.on_eval,
        }

    # connection lifecycle -------------------------------------------------------------------------

    def connectionMade(self) -> None:
        """Register the client; watch the write buffer; no Nagle delay for small replies."""
        self.factory.clients.add(self)
        set_no_delay(self.transport)  # small replies must not wait for Nagle
        self.transport.registerProducer(self, True)
        self.session = self.factory.guard.open(self._peer())
        if self.session is not None:
            self.session.on_revoke = self._rights_changed
            # publishes and consumers go through this handle: the rights enforced at the seam
            self.broker = self.factory.hub.broker.session(self.session)

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        """Delete this connection's consumers (their unacked messages return with retry + 1)."""
        self.closed = True
        self.factory.clients.discard(self)
        self.registry.disconnect(self)

    def pauseProducing(self) -> None:
        """The write buffer is full: auto-ack consumers stop acking (so stop receiving), and
        this connection's requests are not read until it drains (replies cannot pile up)."""
        self.writes_paused = True
        self._update_reading()

    def resumeProducing(self) -> None:
        """The write buffer drained: ack what auto-ack consumers held; read again."""
        self.writes_paused = False
        for consumer in list(self.consumers.values()):
            consumer.resume()
        self._update_reading()

    def _update_reading(self) -> None:
        """Pause reading while the write buffer is full or too many publishes wait for commits."""
        if self.closed:
            return
        pause = self.writes_paused or self._backlog
        if pause and not self._read_paused:
            self._read_paused = True
            self.transport.pauseProducing()
        elif not pause and self._read_paused:
            self._read_paused = False
            self.transport.resumeProducing()

    def stopProducing(self) -> None:
        """The connection is closing (connectionLost does the cleanup)."""

    # output ---------------------------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        """Write now, or collect into the current read's single write."""
        if self._out is not None:
            self._out.append(data)
        elif not self.closed:
            self.transport.write(data)

    def reply(self, data: bytes) -> None:
        """A reply in request order (behind replies still waiting for a commit)."""
        if self._slots:
            self._slots.append([data])
        else:
            self._write(data)

    def _slot(self) -> list[Any]:
        """Reserve the place of a reply that is not known yet (fill it with :meth:`_fill`)."""
        slot: list[Any] = [None]
        self._slots.append(slot)
        return slot

    def _fill(self, slot: list[Any], data: bytes) -> None:
        """Fill ``slot`` and write every leading filled slot."""
        slot[0] = data
        slots = self._slots
        ready = []
        while slots and slots[0][0] is not None:
            ready.append(slots.popleft()[0])
        if ready:
            self._write(b"".join(ready))
        if self._closing:
            self._maybe_close()

    def push(self, cid: bytes, data: bytes) -> None:
        """A consumer push (``--update``): ``{cid} ok {data}``, not held behind slots."""
        self._write(encode_ok(cid, data))

    def deliver(self, consumer: MqksConsumer, entries: list[tuple]) -> list[bytes]:
        """Write the delivery lines of ``entries``; return their MQKS ids."""
        data, ids = render_entries(consumer.cid, entries)
        self._write(data)
        self.registry.consumed += len(entries)
        return ids

    def error(self, request_id: bytes, why: str, line: bytes = b"") -> None:
        """Reply ``{id} error {error_id}`` and log the error id with the request."""
        eid = wire.make_error_id(self.clock.seconds(), self.factory.rng)
        log.info("mqks error {eid}: {why} (request {line!r} from {peer})",
                 eid=eid.decode(), why=why, line=line[:200], peer=self._peer())
        self.reply(encode_error(request_id, eid))

    def _peer(self) -> str:
        """host:port of the client, for logs and stats."""
        return peer_text(self.transport)

    # input ----------------------------------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        """Run every complete line of the read; consecutive publishes to one event are batched."""
        if self.closed or self._closing:
            return
        reader = self.reader
        lines = reader.feed(data)
        out: list[bytes] = []
        self._out = out
        try:
            self._run(lines)
            if reader.fatal is not None:
                if reader.fatal == FATAL_TOO_LONG:
                    self.error(NONE_ID, f"line longer than {reader.max_line} bytes")
                else:
                    log.info("mqks: TAB in a request from {peer}: closing", peer=self._peer())
                self._closing = True
        except Exception:
            log.failure("mqks: unexpected error handling a request from {peer}", peer=self._peer())
            self._closing = True
        finally:
            self._out = None
        if out and not self.closed:
            self.transport.write(b"".join(out))
        self._maybe_close()

    def _maybe_close(self) -> None:
        """After a fatal line: close once every earlier reply (confirms after commits) is out."""
        if self._closing and not self._slots and not self.closed:
            self.closed = True
            self.transport.loseConnection()

    def _run(self, lines: list[bytes]) -> None:
        """Handle ``lines`` in order (publish runs grouped, acks batched per consumer)."""
        event = b""
        ids: list[bytes] = []
        bodies: list[bytes] = []
        confirms: list[bytes] = []
        acks: dict[MqksConsumer, list[int]] = {}
        actions = self._actions
        take_acked = self.registry.take_acked
        for line in lines:
            parts = line.rstrip().split(b" ", 2)  # split_request, inlined on the hot path
            if len(parts) != 3:
                if bodies:
                    self._publish(event, ids, bodies, confirms)
                    ids, bodies, confirms = [], [], []
                self.error(NONE_ID, "unsplittable line", line)
                continue
            rid, action, rdata = parts
            confirm = rdata[:_CONFIRM_LEN] == CONFIRM  # take_confirm, inlined
            if confirm:
                rdata = rdata[_CONFIRM_LEN:]
            if action == _PUBLISH:
                ev, sep, body = rdata.partition(b" ")
                if sep:
                    if ev != event and bodies:
                        self._publish(event, ids, bodies, confirms)
                        ids, bodies, confirms = [], [], []
                    event = ev
                    ids.append(rid)
                    bodies.append(body)
                    if confirm:
                        confirms.append(rid)
                    continue
            if bodies:
                self._publish(event, ids, bodies, confirms)
                ids, bodies, confirms = [], [], []
            if action == _ACK:
                cid, sep, mid = rdata.partition(b" ")
                if sep:
                    got = take_acked(cid, mid)
                    if got is not None:
                        if got[1]:
                            acks.setdefault(got[0], []).extend(got[1])
                        if confirm:
                            self._ack(acks)
                            acks = {}
                            self._confirm_after(rid, self.broker.barrier())
                    continue
            if acks:
                self._ack(acks)
                acks = {}
            handler = actions.get(action)
            try:
                if handler is None:
                    raise RequestError(f"unknown action {action[:64]!r}")
                handler(rid, rdata, confirm)
            except (RequestError, MqhubError, ValueError) as exc:
                self.error(rid, str(exc), line)
        if bodies:
            self._publish(event, ids, bodies, confirms)
        if acks:
            self._ack(acks)

    def _ack(self, acks: dict[MqksConsumer, list[int]]) -> None:
        """One core ack per consumer for the acks collected from a read."""
        for consumer, ids in acks.items():
            if consumer.core is not None:
                consumer.queue.core.ack(consumer.core, ids)

    # publish --------------------------------------------------------------------------------------

    def _publish(self, event: bytes, ids: list[bytes], bodies: list[bytes],
                 confirms: list[bytes]) -> None:
        """One core publish for a run of publishes to ``event``; confirms after the commit."""
        n = len(bodies)
        # one decode for the run (request ids never hold a newline); one small dict per message
        headers = [{ID_HEADER: v} for v in b"\n".join(ids).decode("latin-1").split("\n")]
        try:
            address = wire.text(event)
            d: Deferred[None] = self.broker.publish_batch(address, bodies, origin="mqks",
                                                         headers=headers)
        except (RequestError, MqhubError, ValueError) as exc:
            for rid in ids:
                self.error(rid, f"publish: {exc}", b"publish " + event)
            return
        self.registry.published += n
        slots = [(rid, self._slot()) for rid in confirms]
        self._unconfirmed += n
        if self._unconfirmed > MAX_UNCONFIRMED and not self._backlog:
            self._backlog = True
            self._update_reading()
        d.addCallbacks(self._published, self._publish_failed, callbackArgs=(n, slots),
                       errbackArgs=(n, slots))

    def _published(self, _: Any, n: int, slots: list[tuple[bytes, list[Any]]]) -> None:
        """The batch is durable: fill its confirm slots."""
        for rid, slot in slots:
            self._fill(slot, encode_ok(rid))
        self._settled(n)

    def _publish_failed(self, failure: Failure, n: int,
                        slots: list[tuple[bytes, list[Any]]]) -> None:
        """The commit failed: every confirm of the batch becomes an error."""
        log.failure("mqks: publish commit failed", failure)
        for rid, slot in slots:
            eid = wire.make_error_id(self.clock.seconds(), self.factory.rng)
            self._fill(slot, encode_error(rid, eid))
        self._settled(n)

    def _settled(self, n: int) -> None:
        """Count settled publishes; read again once commits caught up."""
        self._unconfirmed -= n
        if self._backlog and self._unconfirmed <= MAX_UNCONFIRMED // 2:
            self._backlog = False
            self._update_reading()

    def _confirm_after(self, rid: bytes, d: Deferred[Any]) -> None:
        """Reply ``{rid} ok `` once ``d`` fires (an error reply if it fails)."""
        slot = self._slot()

        def done(_: Any) -> None:
            """Durable: confirm."""
            self._fill(slot, encode_ok(rid))

        def failed(failure: Failure) -> None:
            """Not durable: error."""
            log.failure("mqks: commit failed", failure)
            self._fill(slot, encode_error(rid, wire.make_error_id(self.clock.seconds(),
                                                                   self.factory.rng)))

        d.addCallbacks(done, failed)

    # actions --------------------------------------------------------------------------------------

    def on_bad_publish(self, rid: bytes, data: bytes, confirm: bool) -> None:
        """A publish without ``{event} {data}`` (data is mandatory)."""
        raise RequestError("publish needs an event and data")

    def on_consume(self, rid: bytes, data: bytes, confirm: bool) -> None:
        """``consume {queue} [ev..] [--add ev..] [--delete-queue-when-unused[=s]] [--manual-ack]``."""
        args = wire.parse_consume(data)
        if len(self.consumers) >= MAX_CONSUMERS and rid not in self.consumers:
            raise RequestError(f"more than {MAX_CONSUMERS} consumers on one connection")
        if self.session is not None:
            check_events(self.session, args.queue, wire.apply_rebind(
                self._events(args.queue), args.replace, [], [], args.add))
        d = self.registry.consume(self, rid, args)
        if confirm:
            self._confirm_after(rid, d)

    def on_rebind(self, rid: bytes, data: bytes, confirm: bool) -> None:
        """``rebind {queue} [ev..] [--remove ev..] [--remove-mask m..] [--add ev..]``."""
        a = wire.parse_rebind(data)
        if self.session is not None:
            check_events(self.session, a.queue, wire.apply_rebind(
                self._events(a.queue), a.replace, a.remove, a.remove_mask, a.add))
        d = self.registry.rebind(a.queue, a.replace, a.remove, a.remove_mask, a.add)
        if confirm:
            self._confirm_after(rid, d)

    def on_ack(self, rid: bytes, data: bytes, confirm: bool) -> None:
        """``ack {consumer_id} {msg_id}|--all``; confirm only when the consumer is known."""
        cid, mid = wire.split2(data)
        if self.registry.ack(cid, mid) and confirm:
            self._confirm_after(rid, self.broker.barrier())

    def on_reject(self, rid: bytes, data: bytes, confirm: bool) -> None:
        """``reject {consumer_id} {msg_id}|--all``: back to the queue's tail with retry + 1."""
        cid, mid = wire.split2(data)
        if self.registry.reject(cid, mid) and confirm:
            self._confirm_after(rid, self.broker.barrier())

    def on_delete_consumer(self, rid: bytes, data: bytes, confirm: bool) -> None:
        """``delete_consumer {consumer_id}``; confirm only when it existed."""
        if self.registry.delete_consumer(data) and confirm:
            self._confirm_after(rid, self.broker.barrier())

    def on_delete_queue(self, rid: bytes, data: bytes, confirm: bool) -> None:
        """``delete_queue {queue}``; always confirmed (even for an unknown queue)."""
        name = wire.text(data)
        if self.session is not None:
            check_events(self.session, name, self._events(name))
        d = self.registry.delete_queue(name)
        if confirm:
            self._confirm_after(rid, d)

    def _events(self, queue: str) -> set[str]:
        """The events queue ``queue`` is bound to now (none for an unknown queue)."""
        q = self.registry.queues.get(queue)
        return set(q.events) if q is not None else set()

    def _rights_changed(self, session: Session) -> None:
        """The users file was reloaded: a consumer whose queue receives events this
        connection may no longer read is deleted (its unacked messages return), with an
        error line under its consumer id."""
        for cid, consumer in list(self.consumers.items()):
            try:
                check_events(session, consumer.queue.name, consumer.queue.events)
            except Refused as exc:
                self.registry.delete_consumer(cid)
                self.error(cid, f"consumer deleted after a users reload: {exc}")

    def on_ping(self, rid: bytes, data: bytes, confirm: bool) -> None:
        """``ping {data}`` → ``{id} ok {data}`` (one reply, even with ``--confirm``)."""
        self.reply(encode_ok(rid, data))

    def on_eval(self, rid: bytes, data: bytes, confirm: bool) -> None:
        """``_eval``: never evaluates; off by default, else the lookup table of read-only stats."""
        if self.factory.config.eval != "stats":
            raise RequestError("_eval is disabled (see --mqks-eval)")
        try:
            result = answer(data.decode("utf-8", "replace"), self._fact)
        except EvalRefused as exc:
            raise RequestError(f"_eval refused: {exc}") from None
        self.reply(encode_ok(rid, result.encode()))

    def _fact(self, name: str, queue: str | None) -> int:
        """One number for ``_eval`` (connection counts are the factory's)."""
        if name == "clients_connected":
            return len(self.factory.clients)
        if name == "responses_waiting":
            return sum(len(c._slots) for c in self.factory.clients)
        return self.registry.fact(name, queue)


class MqksFactory(Factory):
    """Builds :class:`MqksProtocol` connections; holds the hub, config, registry and clients."""

    protocol = MqksProtocol
    noisy = False

    def __init__(self, hub: Any, config: MqksConfig, registry: MqksRegistry) -> None:
        """:param registry: the MQKS queues and consumers."""
        self.hub = hub
        self.config = config
        self.registry = registry
        #: the listener-level user (``mqks.user``) or anonymous, with a users file
        self.guard = MqksGuard(getattr(hub, "identity", None), config.user)
        self.clients: set[MqksProtocol] = set()
        self.rng = random.Random()

    def buildProtocol(self, addr: Any) -> MqksProtocol:
        """A new connection."""
        return MqksProtocol(self)
