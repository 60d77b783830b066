"""The NSQ V2 TCP server: a thin Twisted adapter between the sans-IO codec and the core.

Strategy:

- ``dataReceived`` feeds the codec and walks every complete command of the read. Consecutive
  PUBs to one topic become ONE ``broker.publish_batch`` call (one store commit, one Deferred);
  consecutive FINs become one ``queue.ack`` call. Nothing per message sits between the read and
  the store commit.
- Responses leave strictly in command order: every command that answers takes a *slot* in
  ``_slots``; a publish's slot fills when its batch is durable (``OK`` is never sent before the
  commit), others fill at once; the filled prefix is written in one ``write``.
- A fatal error takes a slot too: pending ``OK``s go out first, then the error, then the close.
  Non-fatal errors (E_FIN_FAILED, E_REQ_FAILED, E_TOUCH_FAILED) keep the connection.
- Messages are pushed by the core through ``deliver_batch`` (this protocol is the consumer's
  IDeliveryTarget) and written at once, one write per batch.
- Heartbeats: one timer per connection on the injected clock; a client silent for two heartbeat
  intervals is closed without an error frame, as nsqd does.
- Consumer commands (SUB, RDY, FIN, REQ, TOUCH, CLS, NOP) are plain methods of the connection
  (no extra call per message): a run of FINs is one :meth:`NsqProtocol.finish` and one
  ``queue.ack`` call.
"""

from __future__ import annotations

import random
import zlib
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from mqhub.errors import InvalidName, MqhubError, QueueFull, Unauthorized
from mqhub.identity import Session
from mqhub.interfaces import ICore, IDeliveryTarget
from mqhub.listener import peer_text, set_no_delay
from mqhub.protocols.nsq import codec as wire
from mqhub.protocols.nsq import snappy
from mqhub.protocols.nsq.auth import AuthState, NsqGuard, SecretsFile
from mqhub.protocols.nsq.codec import (
    NEED_DATA,
    ProtocolError,
    encode_error,
    encode_response,
)
from mqhub.protocols.nsq.config import NsqConfig
from mqhub.protocols.nsq.identify import Identity, default_identity, negotiate
from mqhub.protocols.nsq.render import render_messages
from mqhub.protocols.nsq.topics import TopicRegistry, topic_address
from mqhub.records import MSG_ID, NOT_OWNER
from mqhub.tls import server_context

log = Logger(namespace="mqhub.nsq")

_OK = wire.OK_FRAME
STATE_INIT = "init"
STATE_SUBSCRIBED = "subscribed"
STATE_CLOSING = "closing"

_NOT_IN_FLIGHT = b"ID not in flight"
_NOT_OWNER = b"client does not own message"
#: unconfirmed messages per connection above which reading pauses until commits catch up
MAX_UNCONFIRMED = 50_000
#: Most bytes one inflate step of a deflate connection produces (bounds a decompression bomb).
INFLATE_STEP = 256 * 1024


#: unit and run kinds of a read (see NsqProtocol._read)
_PUB = "PUB"
_MPUB = "MPUB"
_FIN = "FIN"
_COMMAND = "command"

#: one unit of a read: (kind, topic, bodies | ids | the command's event)
_Unit = tuple[str, str, Any]


class _Run:
    """Coalesce step: consecutive PUBs (or MPUBs) to one topic, or FINs, within one read.

    ``oks`` counts the OK frames the run owes: one per PUB body, one per MPUB.
    """

    __slots__ = ("kind", "topic", "items", "oks")

    def __init__(self) -> None:
        """An empty run."""
        self.kind: str | None = None
        self.topic = ""
        self.items: list[Any] = []
        self.oks = 0

    def start(self, kind: str, topic: str, items: list[Any]) -> None:
        """Begin a run with this unit (the run was empty or dispatched)."""
        self.kind = kind
        self.topic = topic
        self.items = items
        self.oks = 1 if kind is _MPUB else len(items)

    def add(self, kind: str, topic: str, items: list[Any]) -> bool:
        """Take this unit into the run when it continues it (same kind, same topic for
        publishes); False when the run must be dispatched first (it is not empty and differs)."""
        if self.kind is None:
            self.start(kind, topic, items)
            return True
        if kind is not self.kind or (kind is not _FIN and topic != self.topic):
            return False
        self.items.extend(items)
        self.oks += 1 if kind is _MPUB else len(items)
        return True


class _Slot:
    """One pending response: ``data`` is None until it may be written."""

    __slots__ = ("data", "close")

    def __init__(self, data: bytes | None = None, close: bool = False) -> None:
        """:param close: close the connection once this slot is written."""
        self.data = data
        self.close = close


@implementer(IDeliveryTarget)
class NsqProtocol(Protocol):
    """One NSQ client connection (producer, consumer or both)."""

    protocol_name = "nsq"
    transport: Any

    def __init__(self, factory: NsqFactory) -> None:
        """Bind to the factory's hub, config and topic registry."""
        self.factory = factory
        self.config: NsqConfig = factory.config
        self.clock = factory.hub.clock
        self.registry: TopicRegistry = factory.registry
        #: the core session this connection subscribes through (ICore.session)
        self.core: ICore = factory.hub.broker.session(None)
        self.codec = wire.ServerCodec(
            max_msg_size=self.config.max_msg_size,
            max_body_size=self.config.max_body_size,
            max_req_timeout_ms=self.config.max_req_timeout,
        )
        self.state = STATE_INIT
        self.identity: Identity = default_identity(self.config)
        self.auth: AuthState | None = None
        #: who this connection acts as (None: rights are not checked, or AUTH is required)
        self.session: Session | None = None
        #: an AUTH waits for its turn (failed-login slowdown): read nothing meanwhile
        self._auth_held = False
        #: the last SUB was refused (E_UNAUTHORIZED): a RDY the client sent behind it is ignored
        self.sub_refused = False
        self.consumer: Any = None
        self.queue: Any = None
        self.topic_name = ""
        self.channel_name = ""
        self.ready_count = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.pub_counts: dict[str, int] = {}
        self.connect_ts = int(self.clock.seconds())
        self.tls = False
        self.closed = False
        self._failing = False  # a fatal error is queued: read nothing more
        self._slots: deque[_Slot] = deque()
        self._unconfirmed = 0
        self._read_paused = False
        self._deflate: Any = None
        self._inflate: Any = None
        self._snappy_out: Any = None
        self._snappy_in: Any = None
        self._last_read = 0.0
        self._hb_call: Any = None
        self._rng = random.Random()
        self._handlers: dict[type, Callable[[Any], None]] = {
            wire.Rdy: self.on_rdy,
            wire.Req: self.on_req,
            wire.Touch: self.on_touch,
            wire.Mpub: self.on_mpub,
            wire.Dpub: self.on_dpub,
            wire.Sub: self.on_sub,
            wire.Nop: self.on_nop,
            wire.Cls: self.on_cls,
            wire.Identify: self.on_identify,
            wire.Auth: self.on_auth,
            wire.Fin: self._bad_fin,
        }

    # connection lifecycle ---------------------------------------------------------------------

    def connectionMade(self) -> None:
        """Register the client and arm the heartbeat timer."""
        self.factory.clients.add(self)
        set_no_delay(self.transport)  # small replies must not wait for Nagle
        if self.factory.guard.active:
            self._act_as(self.factory.guard.open(self._peer_host()))
        self._last_read = self.clock.seconds()
        self._arm_heartbeat()

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        """Return in-flight messages to the channel and forget the client."""
        self.closed = True
        self.factory.clients.discard(self)
        if self._hb_call is not None and self._hb_call.active():
            self._hb_call.cancel()
        self._hb_call = None
        if self.consumer is not None and self.queue is not None:
            try:
                self.queue.detach(self.consumer, requeue=True)
            except MqhubError:
                pass
            self.consumer = None
            self.registry.forget_if_gone(self.topic_name, self.channel_name)

    # heartbeats -------------------------------------------------------------------------------

    def _arm_heartbeat(self) -> None:
        """Schedule the next heartbeat or the read deadline, whichever comes first."""
        interval = self.identity.heartbeat_interval
        if self._hb_call is not None and self._hb_call.active():
            self._hb_call.cancel()
        self._hb_call = None
        if interval <= 0 or self.closed:
            return
        self._hb_call = self.clock.callLater(interval / 1000.0, self._heartbeat)

    def _heartbeat(self) -> None:
        """Send ``_heartbeat_``, or close a client silent for two intervals."""
        self._hb_call = None
        if self.closed:
            return
        interval = self.identity.heartbeat_interval / 1000.0
        now = self.clock.seconds()
        deadline = self._last_read + 2 * interval
        if now >= deadline - 1e-9:
            log.info("nsq: closing {peer}: no command for {s:.1f}s", peer=self._peer(), s=now - self._last_read)
            self.closed = True
            self.transport.abortConnection()
            return
        self._write(wire.HEARTBEAT_FRAME)
        self._hb_call = self.clock.callLater(min(interval, deadline - now), self._heartbeat)

    # input ------------------------------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        """Decode every complete command; batch PUBs and FINs; dispatch the rest in order."""
        if self.closed or self._failing:
            return
        self._last_read = self.clock.seconds()
        if self._inflate is not None:
            self._inflate_and_read(data)
            return
        if self._snappy_in is not None:
            try:
                data = self._snappy_in.decode(data)
            except ProtocolError as exc:
                self._fatal(exc)
                return
        self._read(data)

    def _inflate_and_read(self, data: bytes) -> None:
        """Inflate ``data`` at most INFLATE_STEP bytes at a time, reading each step's commands.

        A deflate bomb therefore never expands at once: the codec's limits close the
        connection after a step or two of garbage, and memory stays bounded by one step.
        """
        inflate = self._inflate
        while True:
            try:
                plain = inflate.decompress(data, INFLATE_STEP)
            except zlib.error:
                self._fatal(ProtocolError("E_BAD_BODY", "failed to inflate"))
                return
            if plain:
                self._read(plain)
            data = inflate.unconsumed_tail
            if self.closed or self._failing or (not data and len(plain) < INFLATE_STEP):
                return

    def _read(self, data: bytes) -> None:
        """Decode and dispatch the commands in ``data`` (plain bytes after any decompression).

        Three steps: :meth:`_units` parses the read into units (a run of PUBs to one topic, a
        run of FINs, one other command); consecutive units of one kind (PUBs or MPUBs to one
        topic, FINs) are coalesced into one :class:`_Run`; each run becomes one core call
        (:meth:`_dispatch_run`) and each other command goes to its handler
        (:meth:`_dispatch`), in command order.
        """
        self.codec.receive_data(data)
        if self._auth_held:   # an AUTH waits for its turn: the rest is read after it
            return
        run = _Run()
        try:
            for kind, topic, items in self._units():
                if kind is not _COMMAND:
                    if not run.add(kind, topic, items):
                        self._dispatch_run(run)
                        run.start(kind, topic, items)
                    continue
                self._dispatch_run(run)
                self._dispatch(items)
                if self._stop_reading():
                    return
            self._dispatch_run(run)
        except ProtocolError as exc:
            try:
                self._dispatch_run(run)
            except ProtocolError as later:
                exc = exc if exc.fatal else later
            if exc.fatal:
                self._fatal(exc)
            else:
                self.respond(encode_error(exc.wire_text))
        except Exception:
            log.failure("nsq: unexpected error handling a command from {peer}", peer=self._peer())
            self._fatal(ProtocolError("E_INVALID", "internal error"))

    def _units(self) -> Iterator[_Unit]:
        """Parse step: the units of what the codec holds, in command order.

        A unit is ``(kind, topic, items)``: ``(_PUB, topic, bodies)`` for a run of PUBs read on
        the codec's fast path (or one PUB event), ``(_MPUB, topic, bodies)`` for one MPUB,
        ``(_FIN, "", ids)`` for a run of FINs (or one), and ``(_COMMAND, "", event)`` for any
        other command, a FIN whose id is not 16 hex digits included. Raises the codec's
        ProtocolError where the input is refused.
        """
        codec = self.codec
        read_pubs, read_fins, next_event = codec.read_pubs, codec.read_fin_ids, codec.next_event
        Pub, Fin, Mpub = wire.Pub, wire.Fin, wire.Mpub
        while True:
            topic, bodies = read_pubs()
            if bodies:
                yield _PUB, topic, bodies
                continue
            ids = read_fins()
            if ids:
                yield _FIN, "", ids
                continue
            ev = next_event()
            if ev is NEED_DATA:
                return
            kind = type(ev)
            if kind is Pub:
                yield _PUB, ev.topic, [ev.body]  # type: ignore[union-attr]
            elif kind is Mpub:
                yield _MPUB, ev.topic, ev.bodies  # type: ignore[union-attr]
            elif kind is Fin:
                mid = wire.parse_id(ev.msg_id)  # type: ignore[union-attr]
                yield (_FIN, "", [mid]) if mid is not None else (_COMMAND, "", ev)
            else:
                yield _COMMAND, "", ev

    def _dispatch_run(self, run: _Run) -> None:
        """Dispatch step of a run: one core publish (one OK per PUB, or per MPUB, once it is
        durable) or one ``ack`` of every FIN; the run is empty afterwards."""
        kind = run.kind
        if kind is None:
            return
        items, oks = run.items, run.oks
        run.kind = None
        run.items = []
        if kind is _FIN:
            self.finish(items)
        elif kind is _PUB:
            self._publish("PUB", run.topic, items, 0, len(items))
        else:
            self._publish("MPUB", run.topic, items, 0, oks)

    def _dispatch(self, ev: Any) -> None:
        """Dispatch step of any other command: its handler; a non-fatal error is answered."""
        try:
            self._handlers[type(ev)](ev)
        except ProtocolError as exc:
            if exc.fatal:
                raise
            self.respond(encode_error(exc.wire_text))

    def _stop_reading(self) -> bool:
        """True once nothing more of this read may be handled (closing, a fatal error, or an
        AUTH waiting for its turn)."""
        return self.closed or self._failing or self._auth_held

    def _bad_fin(self, ev: wire.Fin) -> None:
        """FIN of an id that is not 16 hex digits: E_FIN_FAILED (non-fatal), as nsqd."""
        self.finish([], [ev.msg_id])

    # output -----------------------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        """Write raw frames (compressed when deflate was negotiated)."""
        if self._deflate is not None:
            data = self._deflate.compress(data) + self._deflate.flush(zlib.Z_SYNC_FLUSH)
        elif self._snappy_out is not None:
            data = self._snappy_out.encode(data)
        self.transport.write(data)

    def respond(self, data: bytes, close: bool = False) -> None:
        """Queue a ready response behind any still-pending ones and flush."""
        self._slots.append(_Slot(data, close))
        self._flush()

    def _flush(self) -> None:
        """Write the prefix of filled slots in one write; close after a closing slot."""
        slots = self._slots
        out: list[bytes] = []
        close = False
        while slots and slots[0].data is not None:
            slot = slots.popleft()
            out.append(slot.data)  # type: ignore[arg-type]
            if slot.close:
                close = True
                slots.clear()
                break
        if out and not self.closed:
            self._write(b"".join(out))
        if close and not self.closed:
            self.closed = True
            self.transport.loseConnection()

    def _fatal(self, exc: ProtocolError) -> None:
        """Send a fatal error after the pending responses, then close; read nothing more."""
        log.debug("nsq: fatal {err} for {peer}", err=str(exc), peer=self._peer())
        self._failing = True
        self.transport.pauseProducing()
        self.respond(encode_error(exc.wire_text), close=True)

    def _peer(self) -> str:
        """host:port of the client, for logs and stats."""
        return peer_text(self.transport)

    # IDeliveryTarget --------------------------------------------------------------------------

    def deliver_batch(self, binding: Any, address: str, messages: list[tuple]) -> None:
        """Render core entries as NSQ message frames and write them in one go."""
        if self.closed:
            return
        if self.identity.sample_rate:
            rate = self.identity.sample_rate
            keep: list[tuple] = []
            drop: list[tuple] = []
            for entry in messages:
                (keep if self._rng.randrange(100) < rate else drop).append(entry)
            if drop and self.queue is not None:
                self.queue.ack(binding, [e[MSG_ID] for e in drop])
            messages = keep
            if not messages:
                return
        self._write(render_messages(messages))
        self.message_count += len(messages)

    # consuming: SUB, RDY, FIN, REQ, TOUCH, CLS, NOP -------------------------------------------

    def on_sub(self, ev: wire.Sub) -> None:
        """SUB topic channel: attach to the channel's queue with RDY 0."""
        if self.state != STATE_INIT:
            raise ProtocolError("E_INVALID", "cannot SUB in current state")
        if self.identity.heartbeat_interval <= 0:
            raise ProtocolError("E_INVALID", "cannot SUB with heartbeats disabled")
        if self.factory.guard.active:
            session = self.session
            if session is None:
                raise ProtocolError("E_AUTH_FIRST", "AUTH required before SUB")
            if not session.check_subscribe(topic_address(ev.topic), ev.channel):
                # not fatal (nsqd closes): the connection stays usable
                self.sub_refused = True
                raise ProtocolError("E_UNAUTHORIZED",
                                    f'AUTH failed for SUB on "{ev.topic}" "{ev.channel}"',
                                    fatal=False)
        queue = self.registry.ensure_channel(ev.topic, ev.channel)
        limit = self.config.max_channel_consumers
        if limit and len(queue.consumers) >= limit:
            raise ProtocolError(
                "E_SUB_FAILED", f"SUB failed consumers for {ev.topic}:{ev.channel} exceeds limit of {limit}"
            )
        try:  # RDY 0: nothing is delivered before the OK below
            consumer = self.core.attach(queue, self, ready=0,
                                        timeout=self.identity.msg_timeout / 1000.0)
        except Unauthorized:  # the seam's own refusal: the queue holds more than the topic
            self.sub_refused = True
            raise ProtocolError("E_UNAUTHORIZED",
                                f'AUTH failed for SUB on "{ev.topic}" "{ev.channel}"',
                                fatal=False) from None
        self.topic_name, self.channel_name = ev.topic, ev.channel
        self.queue = queue
        self.state = STATE_SUBSCRIBED
        # OK once the channel is in effect (at once in the embedded core; a cluster confirms it)
        slot = _Slot()
        self._slots.append(slot)
        self.core.settled(queue).addBoth(self._subscribed, slot, ev)
        self.consumer = consumer

    def _subscribed(self, result: object, slot: _Slot, ev: wire.Sub) -> None:
        """The SUB's channel is in effect: its OK (or nsqd's fatal E_SUB_FAILED) in order."""
        if isinstance(result, Failure):
            err = ProtocolError("E_SUB_FAILED", f"SUB failed {ev.topic}:{ev.channel} "
                                f"{result.getErrorMessage()}")
            slot.data = encode_error(err.wire_text)
            slot.close = True
            self._failing = True
        else:
            slot.data = _OK
        self._flush()

    def on_rdy(self, ev: wire.Rdy) -> None:
        """RDY n: how many messages may be in flight to this client."""
        if self.state == STATE_CLOSING:
            return
        if self.state != STATE_SUBSCRIBED:
            if self.sub_refused:  # clients send RDY right behind SUB: not their mistake
                return
            raise ProtocolError("E_INVALID", "cannot RDY in current state")
        if ev.count < 0 or ev.count > self.config.max_rdy_count:
            raise ProtocolError(
                "E_INVALID", f"RDY count {ev.count} out of range 0-{self.config.max_rdy_count}"
            )
        self.ready_count = ev.count
        self.consumer.set_ready(ev.count)

    def _require_consumer(self, verb: str) -> None:
        """FIN/REQ/TOUCH need a subscribed (or closing) connection."""
        if self.state not in (STATE_SUBSCRIBED, STATE_CLOSING):
            raise ProtocolError("E_INVALID", f"cannot {verb} in current state")

    def finish(self, ids: list[int], bad: Sequence[bytes] = ()) -> None:
        """FIN a run of parsed ids with one core call; E_FIN_FAILED (non-fatal) for unknown ones.

        :param bad: raw ids that are not 16 hex digits (they fail after ``ids``).
        """
        self._require_consumer("FIN")
        failed = self.queue.ack(self.consumer, ids) if ids else []
        self.finish_count += len(ids) - len(failed)
        if failed or bad:
            errs = [(wire.render_id(i), why) for i, why in self._why(failed)]
            errs += [(raw, _NOT_IN_FLIGHT) for raw in bad]
            self.respond(b"".join(
                encode_error(b"E_FIN_FAILED FIN %s failed %s" % err) for err in errs))

    def _why(self, failed: list[int]) -> list[tuple[int, bytes]]:
        """nsqd's reason text for each id an ack/requeue/touch refused (asked right after it)."""
        if not failed:
            return []
        return [(mid, _NOT_OWNER if reason == NOT_OWNER else _NOT_IN_FLIGHT)
                for mid, reason in self.queue.failure_reasons(self.consumer, failed)]

    def _one_id(self, verb: str, raw_id: bytes, op: Callable[[list[int]], list[int]]) -> None:
        """REQ or TOUCH of one raw id through ``op(ids)`` (a queue call returning refused ids).

        :raises ProtocolError: nsqd's non-fatal ``E_<VERB>_FAILED`` with its reason text.
        """
        self._require_consumer(verb)
        ids, _ = wire.parse_ids([raw_id])
        failed = op(ids) if ids else []
        if failed or not ids:
            why = self._why(failed)[0][1] if failed else _NOT_IN_FLIGHT
            raise ProtocolError(f"E_{verb}_FAILED",
                                f"{verb} {raw_id.decode('latin-1')} failed {why.decode()}", fatal=False)

    def on_req(self, ev: wire.Req) -> None:
        """REQ id timeout_ms: back to the channel now (0) or after the delay (durable)."""
        delay = ev.timeout_ms / 1000.0
        self._one_id("REQ", ev.msg_id, lambda ids: self.queue.requeue(self.consumer, ids, delay=delay))
        self.requeue_count += 1

    def on_touch(self, ev: wire.Touch) -> None:
        """TOUCH id: reset the in-flight deadline."""
        self._one_id("TOUCH", ev.msg_id, lambda ids: self.queue.touch(self.consumer, ids))

    def on_cls(self, ev: wire.Cls) -> None:
        """CLS: stop sending messages; the client closes once it has FINed what it holds."""
        if self.state != STATE_SUBSCRIBED:
            raise ProtocolError("E_INVALID", "cannot CLS in current state")
        self.close_wait()
        self.respond(wire.CLOSE_WAIT_FRAME)

    def close_wait(self) -> None:
        """nsqd's CLOSE_WAIT state: no new deliveries; in-flight messages may still be FINed
        (the hub's lame-duck mode puts every subscribed consumer here, without a frame)."""
        if self.state != STATE_SUBSCRIBED:
            return
        self.state = STATE_CLOSING
        self.ready_count = 0
        self.consumer.set_ready(0)

    def on_nop(self, ev: wire.Nop) -> None:
        """NOP: no response."""

    # publishing -------------------------------------------------------------------------------

    def _may_publish(self, verb: str, topic: str) -> bool:
        """Rights for PUB/MPUB/DPUB: ``E_AUTH_FIRST`` (fatal, as nsqd) without a session; a
        refused topic is answered ``E_UNAUTHORIZED`` in order and the connection goes on."""
        session = self.session
        if session is None:
            raise ProtocolError("E_AUTH_FIRST", f"AUTH required before {verb}")
        if session.publish_all or session.check_publish(topic_address(topic)):
            return True
        return False

    def _publish(self, verb: str, topic_name: str, bodies: list[bytes], defer_ms: int, oks: int) -> None:
        """One core publish for ``bodies``; ``oks`` OK frames are released once it is durable."""
        if self.factory.guard.active and not self._may_publish(verb, topic_name):
            # one error per command of the batch, in order with the other answers
            self.respond(encode_error(
                f'E_UNAUTHORIZED AUTH failed for {verb} on "{topic_name}" ""'.encode()) * oks)
            return
        try:
            if self.session is None:
                d = self.registry.publish(topic_name, bodies, defer_ms)
            else:  # through the connection's handle: its rights are enforced at the seam
                d = self.registry.publish(topic_name, bodies, defer_ms, core=self.core)
        except Unauthorized:  # the seam's own refusal (the check above makes it rare)
            self.respond(encode_error(
                f'E_UNAUTHORIZED AUTH failed for {verb} on "{topic_name}" ""'.encode()) * oks)
            return
        except (QueueFull, InvalidName) as exc:
            raise ProtocolError(f"E_{verb}_FAILED", f"{verb} failed {exc}") from None
        self.pub_counts[topic_name] = self.pub_counts.get(topic_name, 0) + len(bodies)
        slot = _Slot()
        self._slots.append(slot)
        count = len(bodies)
        self._unconfirmed += count
        if self._unconfirmed > MAX_UNCONFIRMED and not self._read_paused:
            self._read_paused = True  # a producer far ahead of the store waits for its commits
            self.transport.pauseProducing()
        d.addCallbacks(self._published, self._publish_failed, callbackArgs=(slot, oks, count),
                       errbackArgs=(slot, verb))

    def _published(self, _: Any, slot: _Slot, oks: int, count: int) -> None:
        """The batch is durable: release its OKs (in order with other responses)."""
        slot.data = _OK * oks if oks > 1 else _OK
        self._unconfirmed -= count
        self._flush()
        if (self._read_paused and self._unconfirmed <= MAX_UNCONFIRMED // 2 and not self.closed
                and not self._failing):
            self._read_paused = False
            self.transport.resumeProducing()

    def _publish_failed(self, failure: Failure, slot: _Slot, verb: str) -> None:
        """The store refused the batch: nsqd's fatal E_PUB_FAILED (no OK for unstored messages)."""
        log.failure("nsq: publish failed", failure)
        err = ProtocolError(f"E_{verb}_FAILED", f"{verb} failed {failure.getErrorMessage()}")
        slot.data = encode_error(err.wire_text)
        slot.close = True
        self._failing = True
        self._flush()

    def on_mpub(self, ev: wire.Mpub) -> None:
        """MPUB: one batch, one OK."""
        self._publish("MPUB", ev.topic, ev.bodies, 0, 1)

    def on_dpub(self, ev: wire.Dpub) -> None:
        """DPUB: deferred durably through the core's due-index."""
        self._publish("DPUB", ev.topic, [ev.body], ev.defer_ms, 1)

    # identify and auth ------------------------------------------------------------------------

    def on_identify(self, ev: wire.Identify) -> None:
        """IDENTIFY: validate, answer (OK or 13-field JSON), then TLS / deflate upgrades."""
        if self.state != STATE_INIT:
            raise ProtocolError("E_INVALID", "cannot IDENTIFY in current state")
        ident, reply = negotiate(
            ev.body, self.config, snappy_available=snappy.available(),
            auth_required=self.factory.guard.auth_required,
        )
        if (ident.tls_v1 or ident.deflate or ident.snappy) and self._slots:
            raise ProtocolError("E_IDENTIFY_FAILED", "IDENTIFY upgrade while responses are pending")
        self.identity = ident
        self._arm_heartbeat()
        self.respond(encode_response(reply))
        if ident.tls_v1:
            try:
                self.transport.startTLS(self.factory.tls_context())
            except Exception as exc:
                raise ProtocolError("E_IDENTIFY_FAILED", f"IDENTIFY failed {exc}") from None
            self.tls = True
            self.respond(_OK)
        if ident.snappy:
            self._snappy_out = snappy.SnappyEncoder()
            self._snappy_in = snappy.SnappyDecoder()
            self.respond(_OK)
        if ident.deflate:
            self._deflate = zlib.compressobj(ident.deflate_level, zlib.DEFLATED, -15)
            self._inflate = zlib.decompressobj(-15)
            self.respond(_OK)

    def on_auth(self, ev: wire.Auth) -> None:
        """AUTH: a users-file token or NAME:PASSWORD, or a secrets-file secret (auth.py).

        A peer with failed logins behind it waits for its turn: nothing more is read from
        this connection until the AUTH has been answered.
        """
        if self.state != STATE_INIT:
            raise ProtocolError("E_INVALID", "cannot AUTH in current state")
        guard = self.factory.guard
        if not guard.active:
            raise ProtocolError("E_AUTH_DISABLED", "AUTH disabled")
        if self.auth is not None:
            raise ProtocolError("E_INVALID", "AUTH already set")
        wait = guard.wait(self._peer_host())
        if wait > 0:
            self._auth_held = True
            self.transport.pauseProducing()
            self.clock.callLater(wait, self._auth_turn, ev)
            return
        self._authenticate(ev)

    def _auth_turn(self, ev: wire.Auth) -> None:
        """A held AUTH's turn has come: answer it, then read what waited behind it."""
        self._auth_held = False
        if self.closed or self._failing:
            return
        try:
            self._authenticate(ev)
        except ProtocolError as exc:
            self._fatal(exc)
            return
        self.transport.resumeProducing()
        self._read(b"")

    def _authenticate(self, ev: wire.Auth) -> None:
        """Check the secret and answer nsqd's AUTH reply (errors are fatal, as in nsqd)."""
        session, state = self.factory.guard.authenticate(ev.secret, self._peer_host())
        if self.session is not None:
            self.session.on_revoke = None
        self._act_as(session)
        self.auth = state
        self.respond(encode_response(state.reply()))

    def _act_as(self, session: Session | None) -> None:
        """Act as ``session`` from now on: its handle on the core enforces its rights."""
        self.session = session
        if session is not None:
            session.on_revoke = self._rights_changed
            self.core = self.factory.hub.broker.session(session)

    def _peer_host(self) -> str:
        """The client's host (no port): failed logins are counted per host."""
        return str(getattr(self.transport.getPeer(), "host", "") or self._peer())

    def _rights_changed(self, session: Session) -> None:
        """The users file was reloaded: a channel this client may no longer read is left (its
        in-flight messages go back) with ``E_UNAUTHORIZED``, and the connection is closed, as
        nsqd closes a client whose auth no longer allows it."""
        if self.consumer is None or self.closed:
            return
        if session.may_subscribe(topic_address(self.topic_name), self.channel_name):
            return
        session.refuse("subscribe", f"{topic_address(self.topic_name)} {self.channel_name}")
        self._fatal(ProtocolError(
            "E_UNAUTHORIZED", f'AUTH failed for SUB on "{self.topic_name}" "{self.channel_name}"'))


class NsqFactory(Factory):
    """Builds :class:`NsqProtocol` connections; holds the hub, config, topics and clients."""

    protocol = NsqProtocol

    def __init__(self, hub: Any, config: NsqConfig, registry: TopicRegistry,
                 secrets: SecretsFile | None = None) -> None:
        """:param registry: the topics shared with the HTTP API.
        :param secrets: the ``--nsq-auth-secrets`` file (with the hub's users: :attr:`guard`)."""
        self.hub = hub
        self.config = config
        self.registry = registry
        self.secrets = secrets
        self.guard = NsqGuard(getattr(hub, "identity", None), secrets)
        self.clients: set[NsqProtocol] = set()
        self._tls_context: Any = None
        registry.on_channel_deleted.append(self._channel_deleted)

    def _channel_deleted(self, topic: str, channel: str) -> None:
        """Close the clients of a deleted channel (nsqd does the same)."""
        for proto in list(self.clients):
            if proto.consumer is not None and (proto.topic_name, proto.channel_name) == (topic, channel):
                proto.consumer = None
                proto.closed = True
                proto.transport.loseConnection()

    def buildProtocol(self, addr: Any) -> NsqProtocol:
        """A new connection."""
        proto = NsqProtocol(self)
        return proto

    def tls_context(self) -> Any:
        """The server TLS context built from the configured certificate (cached)."""
        if self._tls_context is None:
            config = self.config
            self._tls_context = server_context(config.tls_cert or "", config.tls_key,
                                               config.tls_ca, config.tls_verify)
        return self._tls_context
