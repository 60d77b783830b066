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
- Consumer commands (SUB, RDY, FIN, REQ, TOUCH, CLS, NOP) live in the
  :class:`~mqhub.protocols.nsq.consumer.ConsumerCommands` mixin this protocol inherits.
"""

from __future__ import annotations

import random
import zlib
from collections import deque
from collections.abc import Callable
from typing import Any

from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from mqhub.errors import InvalidName, MqhubError, QueueFull
from mqhub.interfaces import ICore, IDeliveryTarget
from mqhub.listener import peer_text, set_no_delay
from mqhub.protocols.nsq import codec as wire
from mqhub.protocols.nsq import snappy
from mqhub.protocols.nsq.auth import AuthState, SecretsFile
from mqhub.protocols.nsq.codec import (
    NEED_DATA,
    ProtocolError,
    encode_error,
    encode_response,
)
from mqhub.protocols.nsq.config import NsqConfig
from mqhub.protocols.nsq.consumer import STATE_INIT, ConsumerCommands
from mqhub.protocols.nsq.identify import Identity, default_identity, negotiate
from mqhub.protocols.nsq.render import render_messages
from mqhub.protocols.nsq.topics import TopicRegistry
from mqhub.records import MSG_ID

log = Logger(namespace="mqhub.nsq")

_OK = wire.OK_FRAME
#: unconfirmed messages per connection above which reading pauses until commits catch up
MAX_UNCONFIRMED = 50_000
#: Most bytes one inflate step of a deflate connection produces (bounds a decompression bomb).
INFLATE_STEP = 256 * 1024


class _Slot:
    """One pending response: ``data`` is None until it may be written."""

    __slots__ = ("data", "close")

    def __init__(self, data: bytes | None = None, close: bool = False) -> None:
        """:param close: close the connection once this slot is written."""
        self.data = data
        self.close = close


@implementer(IDeliveryTarget)
class NsqProtocol(ConsumerCommands, Protocol):
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
        }

    # connection lifecycle ---------------------------------------------------------------------

    def connectionMade(self) -> None:
        """Register the client and arm the heartbeat timer."""
        self.factory.clients.add(self)
        set_no_delay(self.transport)  # small replies must not wait for Nagle
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
        """Decode and dispatch the commands in ``data`` (plain bytes after any decompression)."""
        codec = self.codec
        codec.receive_data(data)
        pub_topic = ""
        pub_bodies: list[bytes] = []
        fins: list[int] = []
        # a run of MPUBs to one topic becomes one core publish releasing one OK per MPUB
        mpub_topic = ""
        mpub_bodies: list[bytes] = []
        mpubs = 0
        Pub, Fin, Mpub = wire.Pub, wire.Fin, wire.Mpub
        handlers = self._handlers
        read_pubs, read_fins = codec.read_pubs, codec.read_fin_ids
        try:
            while True:
                topic, bodies = read_pubs()
                if bodies:
                    if mpubs:
                        flush, mpub_bodies, n, mpubs = mpub_bodies, [], mpubs, 0
                        self._publish("MPUB", mpub_topic, flush, 0, n)
                    if fins:
                        batch, fins = fins, []
                        self.finish(batch)
                    if topic != pub_topic and pub_bodies:
                        flush, pub_bodies = pub_bodies, []
                        self._publish("PUB", pub_topic, flush, 0, len(flush))
                    pub_topic = topic
                    if pub_bodies:
                        pub_bodies.extend(bodies)
                    else:
                        pub_bodies = bodies
                    continue
                got = read_fins()
                if got:
                    if mpubs:
                        flush, mpub_bodies, n, mpubs = mpub_bodies, [], mpubs, 0
                        self._publish("MPUB", mpub_topic, flush, 0, n)
                    if pub_bodies:
                        flush, pub_bodies = pub_bodies, []
                        self._publish("PUB", pub_topic, flush, 0, len(flush))
                    if fins:
                        fins.extend(got)
                    else:
                        fins = got
                    continue
                ev = codec.next_event()
                if ev is NEED_DATA:
                    break
                kind = type(ev)
                if kind is Mpub:
                    if fins:
                        batch, fins = fins, []
                        self.finish(batch)
                    if pub_bodies:
                        bodies, pub_bodies = pub_bodies, []
                        self._publish("PUB", pub_topic, bodies, 0, len(bodies))
                    if mpubs and ev.topic != mpub_topic:  # type: ignore[union-attr]
                        flush, mpub_bodies, n, mpubs = mpub_bodies, [], mpubs, 0
                        self._publish("MPUB", mpub_topic, flush, 0, n)
                    mpub_topic = ev.topic  # type: ignore[union-attr]
                    if mpubs:
                        mpub_bodies.extend(ev.bodies)  # type: ignore[union-attr]
                    else:
                        mpub_bodies = ev.bodies  # type: ignore[union-attr]
                    mpubs += 1
                    continue
                if mpubs:
                    flush, mpub_bodies, n, mpubs = mpub_bodies, [], mpubs, 0
                    self._publish("MPUB", mpub_topic, flush, 0, n)
                if kind is Pub:
                    if fins:
                        batch, fins = fins, []
                        self.finish(batch)
                    if ev.topic != pub_topic or not pub_bodies:  # type: ignore[union-attr]
                        if pub_bodies:
                            bodies, pub_bodies = pub_bodies, []
                            self._publish("PUB", pub_topic, bodies, 0, len(bodies))
                        pub_topic = ev.topic  # type: ignore[union-attr]
                    pub_bodies.append(ev.body)  # type: ignore[union-attr]
                    continue
                if pub_bodies:
                    bodies, pub_bodies = pub_bodies, []
                    self._publish("PUB", pub_topic, bodies, 0, len(bodies))
                if kind is Fin:
                    mid = wire.parse_id(ev.msg_id)  # type: ignore[union-attr]
                    if mid is not None:
                        fins.append(mid)
                        continue
                    if fins:
                        batch, fins = fins, []
                        self.finish(batch)
                    self.finish([], [ev.msg_id])  # type: ignore[union-attr]
                    continue
                if fins:
                    batch, fins = fins, []
                    self.finish(batch)
                try:
                    handlers[kind](ev)
                except ProtocolError as exc:
                    if exc.fatal:
                        raise
                    self.respond(encode_error(exc.wire_text))
                if self.closed or self._failing:
                    return
            if mpubs:
                flush, mpub_bodies, n, mpubs = mpub_bodies, [], mpubs, 0
                self._publish("MPUB", mpub_topic, flush, 0, n)
            if pub_bodies:
                bodies, pub_bodies = pub_bodies, []
                self._publish("PUB", pub_topic, bodies, 0, len(bodies))
            if fins:
                batch, fins = fins, []
                self.finish(batch)
        except ProtocolError as exc:
            try:
                if mpubs:
                    self._publish("MPUB", mpub_topic, mpub_bodies, 0, mpubs)
                if pub_bodies:
                    self._publish("PUB", pub_topic, pub_bodies, 0, len(pub_bodies))
                if fins:
                    self.finish(fins)
            except ProtocolError as later:
                exc = exc if exc.fatal else later
            if exc.fatal:
                self._fatal(exc)
            else:
                self.respond(encode_error(exc.wire_text))
        except Exception:
            log.failure("nsq: unexpected error handling a command from {peer}", peer=self._peer())
            self._fatal(ProtocolError("E_INVALID", "internal error"))

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

    # publishing -------------------------------------------------------------------------------

    def _check_publish(self, verb: str, topic: str) -> None:
        """Auth checks for PUB/MPUB/DPUB (fatal, as in nsqd)."""
        if self.factory.secrets is None:
            return
        if self.auth is None:
            raise ProtocolError("E_AUTH_FIRST", f"AUTH required before {verb}")
        if not self.auth.allows(topic, None, "publish"):
            raise ProtocolError("E_UNAUTHORIZED", f'AUTH failed for {verb} on "{topic}" ""')

    def _publish(self, verb: str, topic_name: str, bodies: list[bytes], defer_ms: int, oks: int) -> None:
        """One core publish for ``bodies``; ``oks`` OK frames are released once it is durable."""
        self._check_publish(verb, topic_name)
        try:
            d = self.registry.publish(topic_name, bodies, defer_ms)
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
            auth_required=self.factory.secrets is not None,
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
        """AUTH against the secrets file."""
        if self.state != STATE_INIT:
            raise ProtocolError("E_INVALID", "cannot AUTH in current state")
        secrets = self.factory.secrets
        if secrets is None:
            raise ProtocolError("E_AUTH_DISABLED", "AUTH disabled")
        if self.auth is not None:
            raise ProtocolError("E_INVALID", "AUTH already set")
        state = secrets.lookup(ev.secret)
        if state is None:
            raise ProtocolError("E_AUTH_FAILED", "AUTH failed")
        if not state.authorizations:
            raise ProtocolError("E_UNAUTHORIZED", "AUTH no authorizations found")
        self.auth = state
        self.respond(encode_response(state.reply()))


class NsqFactory(Factory):
    """Builds :class:`NsqProtocol` connections; holds the hub, config, topics and clients."""

    protocol = NsqProtocol

    def __init__(self, hub: Any, config: NsqConfig, registry: TopicRegistry,
                 secrets: SecretsFile | None = None) -> None:
        """:param registry: the topics shared with the HTTP API."""
        self.hub = hub
        self.config = config
        self.registry = registry
        self.secrets = secrets
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
            from twisted.internet import ssl

            with open(self.config.tls_cert, "rb") as handle:  # type: ignore[arg-type]
                cert_pem = handle.read()
            key_pem = cert_pem
            if self.config.tls_key and self.config.tls_key != self.config.tls_cert:
                with open(self.config.tls_key, "rb") as handle:
                    key_pem = handle.read()
            cert = ssl.PrivateCertificate.loadPEM(cert_pem + b"\n" + key_pem)
            self._tls_context = cert.options()
        return self._tls_context
