"""The VibeMQ TCP server: a thin Twisted adapter between the sans-IO codec and the core.

- ``dataReceived`` decodes every complete frame of the read. Consecutive Publishes to one queue
  become ONE ``publish_batch`` (one store commit); their PublishAcks are written in that
  Deferred's callback, so a PublishAck always means "stored" (durable by default). A full
  DropNewest queue drops (and counts) what does not fit; a full BlockPublisher queue withholds
  it, retried on the clock, without blocking anything else. Acks of a read become one
  ``queue.ack`` call per subscription.
- Deliveries are pushed by the core through ``deliver_batch`` (this protocol is the consumer's
  ``IDeliveryTarget``), one write per batch, with a ``deliveryAttempts`` header.
- Every error answers with the request id when the frame had one. A framing error (bad length or
  flags, corrupt or oversized compressed body) sends ``INVALID_MESSAGE`` and closes only this
  connection.
"""

from __future__ import annotations

import json
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from mqhub.errors import InvalidName, MqhubError, QueueFull, Unauthorized
from mqhub.identity import Session
from mqhub.interfaces import ICore, IDeliveryTarget
from mqhub.listener import set_no_delay, set_read_size
from mqhub.protocols.vibemq import codec as c
from mqhub.protocols.vibemq import publishing
from mqhub.protocols.vibemq.admin import handle_admin
from mqhub.protocols.vibemq.auth import UserStore, VibeGuard, allowed
from mqhub.protocols.vibemq.config import VibeMQConfig
from mqhub.protocols.vibemq.dlq import DeadLetterView
from mqhub.protocols.vibemq.options import (
    BLOCK_PUBLISHER,
    DROP_NEWEST,
    PayloadError,
    QueueOptions,
    parse_priority,
    queue_info_json,
)
from mqhub.protocols.vibemq.publishing import MAX_HEADER_VALUE, MAX_HEADERS, validate_json
from mqhub.protocols.vibemq.queues import QueueRegistry, VibeQueue, valid_queue_name
from mqhub.protocols.vibemq.render import (
    deliver_body,
    deliver_frames,
    publish_acks,
    queue_field,
    render_payload,
)
from mqhub.records import ATTEMPTS, MSG_ID, REASON_MAX_ATTEMPTS, get_msg_id

log = Logger(namespace="mqhub.vibemq")

BUFFER_SIZE = 1 << 20
H_DLQ_REASON = "dead-letter-reason"
H_DLQ_QUEUE = "dead-letter-queue"
_DUMPS = json.dumps


def backoff(attempts: int) -> float:
    """Seconds a redelivery may stay unacked: the original's ``min(2 s * 2^(n-1), 120 s)``."""
    return float(min(2 * 2 ** (attempts - 1), 120))


def _random_id() -> str:
    """A server-made id, as the original: 32 lowercase hex characters."""
    return uuid.uuid4().hex


#: distinct hosts kept for the connection-rate limit before stale ones are swept
ACCEPT_HOSTS_SWEEP = 10_000


class VibeMQFactory(Factory):
    """Shared state of every VibeMQ connection: config, users, queues, dead-letter views."""

    def __init__(self, hub: Any, config: VibeMQConfig, registry: QueueRegistry,
                 users: UserStore | None = None) -> None:
        """:param users: the users file (None = open broker, as the original's default)."""
        self.hub = hub
        self.broker = hub.broker
        self.clock = hub.clock
        self.config = config
        self.registry = registry
        self.users = users
        #: the hub's users (--users) and this users file: who a Connect makes a client
        self.guard = VibeGuard(getattr(hub, "identity", None), users)
        self.clients: set[VibeMQProtocol] = set()
        self.views: dict[str, DeadLetterView] = {}
        self.accepts: dict[str, deque[float]] = {}
        self.counters = {"dropped_newest": 0, "blocked": 0, "bad_frames": 0, "rate_limited": 0}
        self.server_compressions = c.compression_names(config.compressions)

    def buildProtocol(self, addr: Any) -> VibeMQProtocol:
        """A protocol instance for one connection."""
        return VibeMQProtocol(self)

    def view(self, source: VibeQueue) -> DeadLetterView:
        """The dead-letter view of ``source`` (made on first use)."""
        v = self.views.get(source.dlq_name)
        if v is None or v.source != source.name:
            v = DeadLetterView(self.broker, self.clock, source.name, source.dlq_name,
                               self.config.dlq_poll)
            self.views[source.dlq_name] = v
        return v

    def subscriber_count(self, name: str) -> int:
        """How many connections subscribe to ``name``."""
        return sum(1 for p in self.clients if name in p.subs or name in p.dlq_subs)

    def allow_connection(self, host: str) -> str | None:
        """None when a new connection from ``host`` is allowed, else the error code."""
        cfg = self.config
        if cfg.max_connections and len(self.clients) >= cfg.max_connections:
            return "CONNECTION_LIMIT"
        if cfg.connection_rate:
            now = self.clock.seconds()
            times = self.accepts.setdefault(host, deque())
            while times and times[0] <= now - 60:
                times.popleft()
            if len(self.accepts) > ACCEPT_HOSTS_SWEEP:
                # hosts whose last accept left the window are forgotten: the map stays bounded
                for other in [h for h, t in self.accepts.items() if not t or t[-1] <= now - 60]:
                    if other != host:
                        del self.accepts[other]
            if len(times) >= cfg.connection_rate:
                return "RATE_LIMITED"
            times.append(now)
        return None


@implementer(IDeliveryTarget)
class VibeMQProtocol(Protocol):
    """One VibeMQ client connection (publisher, subscriber or both)."""

    protocol_name = "vibemq"
    transport: Any

    def __init__(self, factory: VibeMQFactory) -> None:
        """Bind to the factory's config, registry and users."""
        self.factory = factory
        cfg = self.config = factory.config
        #: the core session this connection publishes and subscribes through (ICore.session)
        self.broker: ICore = factory.broker.session(None)
        self.clock = factory.clock
        self.registry = factory.registry
        self.decoder = c.FrameDecoder(cfg.max_frame_size, cfg.max_decompressed)
        self.authenticated = not factory.guard.active
        #: the --vibemq-users user (its per-operation ACL), or None
        self.user: Any = None
        #: who this connection acts as (None: nothing is checked)
        self.session: Session | None = None
        self.flag = c.FLAG_NONE
        self.threshold = cfg.compression_threshold
        self.subs: dict[str, tuple[VibeQueue, Any]] = {}
        self.dlq_subs: dict[str, DeadLetterView] = {}
        self.blocked: deque[tuple[VibeQueue, c.Frame]] = deque()
        self.closed = False
        self._retry: Any = None
        self._paused = False  # reads paused by BlockPublisher
        self._write_full = False  # the transport's write buffer is full
        self._unconfirmed = 0  # publishes handed to the core whose commit has not settled
        self._backlog = False  # reads paused until those commits catch up
        self._reading = True
        self._window = 0.0
        self._frames = 0
        self._handlers: dict[int, Callable[[c.Frame], None]] = {
            c.CONNECT: self.on_connect, c.PING: self.on_ping,
            c.SUBSCRIBE: self.on_subscribe, c.UNSUBSCRIBE: self.on_unsubscribe,
            c.CREATE_QUEUE: self.on_create_queue, c.DELETE_QUEUE: self.on_delete_queue,
            c.QUEUE_INFO: self.on_queue_info, c.LIST_QUEUES: self.on_list_queues,
        }

    # connection lifecycle --------------------------------------------------------------------

    def connectionMade(self) -> None:
        """Apply the connection limits, then register the client."""
        peer = getattr(self.transport.getPeer(), "host", "")
        refused = self.factory.allow_connection(peer)
        if refused is not None:
            text = ("Maximum connections reached." if refused == "CONNECTION_LIMIT"
                    else "Connection rate limit exceeded.")
            self.transport.write(c.encode_error(_random_id(), refused, text))
            self.closed = True
            self.transport.loseConnection()
            return
        self.factory.clients.add(self)
        # bigger reads (bigger publish batches) and up to 1 MiB of unsent output before the
        # transport says "pause" (Twisted's 64 KiB would pause a subscriber on every burst)
        set_read_size(self.transport, BUFFER_SIZE)
        try:
            # the transport tells us when its write buffer fills (a client that does not read)
            self.transport.registerProducer(self, True)
        except Exception:  # pragma: no cover - transports without producer support
            pass
        set_no_delay(self.transport)  # small replies must not wait for Nagle

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        """Return unacked deliveries to their queues; withheld publishes are never acked."""
        self.closed = True
        self.factory.clients.discard(self)
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self.blocked.clear()
        for vq, consumer in self.subs.values():
            try:
                vq.core.detach(consumer, requeue=True)
            except MqhubError:
                pass
        self.subs.clear()
        for view in self.dlq_subs.values():
            view.unsubscribe(self)
        self.dlq_subs.clear()

    def write(self, data: bytes) -> None:
        """Write unless the connection is gone."""
        if data and not self.closed:
            self.transport.write(data)

    def error(self, msg_id: str | None, code: str, text: str) -> None:
        """Send an Error frame (request id when there is one)."""
        self.write(c.encode_error(msg_id or _random_id(), code, text))

    def reply(self, type_: int, msg_id: str, queue: str | None = None,
              payload: bytes | None = None, headers: dict[str, str] | None = None) -> None:
        """Send a reply frame (compressed when negotiated and large enough)."""
        self.write(c.frame(c.encode_body(type_, msg_id, queue, payload, headers),
                           self.flag, self.threshold))

    # reading ---------------------------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        """Decode the read, batch Publishes and Acks, dispatch the rest in order."""
        if self.closed:
            return
        fatal: c.ProtocolError | None = None
        try:
            frames = self.decoder.feed(data)
        except c.ProtocolError as exc:
            frames, fatal = self.decoder.salvage(), exc
        run: list[c.Frame] = []
        acks: list[str] = []
        rate = self.config.frame_rate
        for f in frames:
            if rate and not self._within_rate(rate):
                self.factory.counters["rate_limited"] += 1
                self.error(f.id, "RATE_LIMITED", "Message rate limit exceeded.")
                continue
            if isinstance(f, c.BadFrame):
                self.factory.counters["bad_frames"] += 1
                self.error(f.id, f.code, f.message)
                continue
            t = f.type
            if t == c.ACK and self.authenticated:
                acks.append(f.id)
                continue
            if t == c.PUBLISH and self.authenticated:
                if run and run[0].queue != f.queue:
                    self._publish(run)
                    run = []
                if self._valid_publish(f):
                    run.append(f)
                continue
            if run:
                self._publish(run)
                run = []
            if acks:  # an Ack before an Unsubscribe or Disconnect is settled first
                self._ack(acks)
                acks = []
            self._command(f)
            if self.closed:
                return
        if run:
            self._publish(run)
        if acks:
            self._ack(acks)
        if fatal is not None:
            self.factory.counters["bad_frames"] += 1
            self.error(None, "INVALID_MESSAGE", str(fatal))
            self.closed = True
            self.transport.loseConnection()

    def _within_rate(self, rate: int) -> bool:
        """Count one frame in the current one-second window."""
        now = self.clock.seconds()
        if now - self._window >= 1.0:
            self._window, self._frames = now, 0
        self._frames += 1
        return self._frames <= rate

    def _command(self, f: c.Frame) -> None:
        """Dispatch one non-batched frame."""
        t = f.type
        if not self.authenticated and t not in (c.CONNECT, c.PING):
            self.error(f.id, "NOT_AUTHENTICATED", "Please send a Connect command first.")
            return
        if t == c.DISCONNECT:
            self.closed = True
            self.transport.loseConnection()
            return
        handler = self._handlers.get(t)
        if handler is None and self.factory.users is not None and 50 <= t <= 56:
            handler = self.on_admin
        if handler is None:
            self.error(f.id, "UNKNOWN_COMMAND", f"Unknown command type: {t}")
            return
        try:
            handler(f)
        except PayloadError as exc:
            self.error(f.id, "INVALID_PAYLOAD", str(exc))
        except Exception as exc:  # a bug must not drop the connection silently
            log.failure("vibemq: command {type} failed", type=t)
            self.error(f.id, "SERVER_ERROR", f"Internal error: {type(exc).__name__}")

    def _allowed(self, operation: str, queue: str | None) -> bool:
        """ACL check (always true on an open broker; a refusal is counted)."""
        session = self.session
        return session is None or allowed(session, self.user, operation, queue)

    def _queue_ok(self, f: c.Frame, operation: str, what: str) -> bool:
        """Name check then ACL check, answering the error; True when both pass."""
        if not f.queue:
            self.error(f.id, "INVALID_QUEUE", f"Queue name is required for {what}.")
            return False
        if not valid_queue_name(f.queue):
            self.error(f.id, "INVALID_QUEUE", f"Invalid queue name: {f.queue[:300]}")
            return False
        if not self._allowed(operation, f.queue):
            self.error(f.id, "NOT_AUTHORIZED", "Access denied.")
            return False
        return True

    # connect / ping --------------------------------------------------------------------------

    def on_connect(self, f: c.Frame, turn: bool = False) -> None:
        """Authenticate (users file or --vibemq-users), negotiate compression, send ConnectAck.

        A Connect from a peer with failed logins behind it is checked at its turn (``turn``:
        it has come); the connection reads nothing meanwhile (the .NET client waits for
        ConnectAck anyway).
        """
        h = f.headers or {}
        guard = self.factory.guard
        if guard.active:
            name, password = h.get("authUsername"), h.get("authPassword")
            peer = getattr(self.transport.getPeer(), "host", "") or ""
            wait = guard.wait(peer) if name and password and not turn else 0.0
            if wait > 0:
                self._paused = True
                self._sync_reading()
                self.clock.callLater(wait, self._connect_turn, f)
                return
            result = guard.connect(name, password, peer)
            if isinstance(result, str):
                self.error(f.id, result, "Username and password are required."
                           if result == "AUTH_REQUIRED" else "Invalid username or password.")
                return
            old = self.session
            if old is not None:
                old.on_revoke = None
            self.session, self.user = result
            # this connection's handle on the core: its rights enforced at the seam
            self.broker = self.factory.broker.session(self.session)
            if self.session is not None:
                self.session.on_revoke = self._rights_changed
            self.authenticated = True
        chosen = c.negotiate_compression(h.get("supported-compression", ""),
                                         self.factory.server_compressions)
        self.write(c.frame(c.encode_body(
            c.CONNECT_ACK, _random_id(), None, None,
            {"negotiated-compression": chosen} if chosen else None)))
        self.flag = c.COMPRESSIONS[chosen] if chosen else c.FLAG_NONE

    def _connect_turn(self, f: c.Frame) -> None:
        """A held Connect's turn has come: answer it and read again."""
        if self.closed:
            return
        self._paused = False
        self.on_connect(f, turn=True)
        self._sync_reading()

    def _rights_changed(self, session: Session) -> None:
        """The users file was reloaded: leave every queue this client may no longer read
        (unacked deliveries go back), telling it ``NOT_AUTHORIZED`` for each."""
        if self.closed:
            return
        for name, (vq, consumer) in list(self.subs.items()):
            if session.may_subscribe(name):
                continue
            session.refuse("subscribe", f"{name} (Subscribe, reloaded)")
            del self.subs[name]
            if consumer is not None:
                try:
                    vq.core.detach(consumer, requeue=True)
                except MqhubError:
                    pass
            self.error(None, "NOT_AUTHORIZED", f"Access to '{name}' was revoked.")
        for name, view in list(self.dlq_subs.items()):
            if session.may_subscribe(view.source):
                continue
            session.refuse("subscribe", f"{view.source} ({name}, reloaded)")
            del self.dlq_subs[name]
            view.unsubscribe(self)
            self.error(None, "NOT_AUTHORIZED", f"Access to '{name}' was revoked.")

    def on_ping(self, f: c.Frame) -> None:
        """Pong with the same id (allowed before Connect)."""
        self.reply(c.PONG, f.id)

    # backpressure ----------------------------------------------------------------------------

    def pauseProducing(self) -> None:
        """The write buffer is full (the client is not reading): stop reading and delivering."""
        self._write_full = True
        self._sync_reading()
        for _, consumer in self.subs.values():
            if consumer is not None:
                consumer.set_ready(0)

    def resumeProducing(self) -> None:
        """The write buffer drained: read and deliver again."""
        self._write_full = False
        self._sync_reading()
        for _, consumer in list(self.subs.values()):
            if consumer is not None and not self.closed:
                consumer.set_ready(self.config.prefetch)

    def stopProducing(self) -> None:
        """The connection is going away (connectionLost cleans up)."""

    def _sync_reading(self) -> None:
        """Pause reads while withheld or unconfirmed publishes pile up or the write buffer is full."""
        want = not (self._paused or self._write_full or self._backlog)
        if want != self._reading and not self.closed:
            self._reading = want
            if want:
                self.transport.resumeProducing()
            else:
                self.transport.pauseProducing()

    # publishing ------------------------------------------------------------------------------

    def _valid_publish(self, f: c.Frame) -> bool:
        """Check one Publish (queue, ACL, headers, JSON); answer and refuse it when bad."""
        if not self._queue_ok(f, "Publish", "publish"):
            return False
        h = f.headers
        if h and (len(h) > MAX_HEADERS or any(len(v) > MAX_HEADER_VALUE for v in h.values())):
            self.error(f.id, "INVALID_MESSAGE", "Too many headers or a header value too long.")
            return False
        if f.payload is not None and len(f.payload) > self.config.max_frame_size - 1024:
            # it arrived compressed; uncompressed it could not be delivered to a .NET client
            self.error(f.id, "INVALID_MESSAGE", "Message too large.")
            return False
        if f.payload is not None and self.config.validate_json:
            try:
                validate_json(f.payload)
            except (ValueError, msgspec.DecodeError, RecursionError):
                self.error(f.id, "INVALID_MESSAGE", "Payload is not valid UTF-8 JSON.")
                return False
        return True

    def _target(self, f: c.Frame) -> VibeQueue | None:
        """The queue a publish goes to (auto-created), or None after answering an error."""
        vq = self.registry.get(f.queue)  # type: ignore[arg-type]
        if vq is not None:
            return vq
        if not self.config.auto_create:
            self.error(f.id, "QUEUE_NOT_FOUND", f"Queue '{f.queue}' does not exist.")
            return None
        try:
            return self.registry.create(f.queue)  # type: ignore[arg-type]
        except InvalidName as exc:
            self.error(f.id, "INVALID_QUEUE", str(exc))
            return None

    def _publish(self, run: list[c.Frame]) -> None:
        """Publish a run of frames to one queue with one core call."""
        vq = self._target(run[0])
        if vq is None:
            for f in run[1:]:
                self.error(f.id, "QUEUE_NOT_FOUND", f"Queue '{f.queue}' does not exist.")
            return
        if self.blocked:
            self._block(vq, run)
            return
        try:
            self._put(vq, run)
        except QueueFull:
            self._overflow(vq, run)
        except InvalidName as exc:
            for f in run:
                self.error(f.id, "INVALID_QUEUE", str(exc))
        except Unauthorized:  # the seam's refusal (each frame was checked before)
            for f in run:
                self.error(f.id, "NOT_AUTHORIZED", "Access denied.")

    def _put(self, vq: VibeQueue, run: list[c.Frame]) -> None:
        """The core call; PublishAcks go out once the batch is stored."""
        bodies = [f.payload or b"" for f in run]
        headers: list[dict[str, str] | None] | None = [f.headers for f in run]
        if not any(headers):  # type: ignore[arg-type]
            headers = None
        if vq.priority:
            first = self.broker.ids.reserve(len(run))
            name = vq.name
            entries = [(first + i, parse_priority((f.headers or {}).get("priority")), 0, 0.0,
                        0.0, name, f.headers, bodies[i], "vibemq") for i, f in enumerate(run)]
            d = self.broker.publish_entries(name, entries)
        else:
            d = self.broker.publish_batch(vq.name, bodies, origin="vibemq", headers=headers)
        ids = [f.id for f in run]
        self._unconfirmed += len(ids)
        if self._unconfirmed > publishing.MAX_UNCONFIRMED and not self._backlog:
            self._backlog = True
            self._sync_reading()
        d.addCallbacks(self._stored, self._store_failed, callbackArgs=(ids, vq.name),
                       errbackArgs=(ids,))

    def _stored(self, _: Any, ids: list[str], queue: str) -> None:
        """Send the PublishAcks of a stored batch."""
        self._settled(len(ids))
        self.write(publish_acks(ids, queue))

    def _store_failed(self, failure: Failure, ids: list[str]) -> None:
        """The store refused the batch: every publisher of it gets an error."""
        self._settled(len(ids))
        log.failure("vibemq: publish batch not stored", failure)
        for i in ids:
            self.error(i, "SERVER_ERROR", "The message could not be stored.")

    def _settled(self, n: int) -> None:
        """Count settled publishes; read again once commits caught up."""
        self._unconfirmed -= n
        if self._backlog and self._unconfirmed <= publishing.MAX_UNCONFIRMED // 2:
            self._backlog = False
            self._sync_reading()

    def _overflow(self, vq: VibeQueue, run: list[c.Frame]) -> None:
        """A full DropNewest or BlockPublisher queue: put what fits, drop or withhold the rest."""
        room = max(0, vq.core.room())
        fits, rest = run[:room], run[room:]
        if fits:
            self._put(vq, fits)
        if vq.options.overflow_strategy == BLOCK_PUBLISHER:
            self._block(vq, rest)
            return
        if vq.options.overflow_strategy == DROP_NEWEST:
            self.factory.counters["dropped_newest"] += len(rest)
            log.debug("vibemq: {n} messages dropped (DropNewest) on {q}", n=len(rest), q=vq.name)
            self.write(b"".join(c.frame(c.encode_body(c.PUBLISH_ACK, f.id, vq.name, None,
                                                      {"overflow": "dropped"})) for f in rest))
            return
        for f in rest:
            self.error(f.id, "QUEUE_FULL", f"Queue '{vq.name}' is full.")

    def _block(self, vq: VibeQueue, run: list[c.Frame]) -> None:
        """Withhold these publishes until their queue has room (other connections go on)."""
        self.factory.counters["blocked"] += len(run)
        self.blocked.extend((vq, f) for f in run)
        if len(self.blocked) >= self.config.max_blocked and not self._paused:
            self._paused = True
            self._sync_reading()
        if self._retry is None or not self._retry.active():
            self._retry = self.clock.callLater(0.05, self._unblock)

    def _unblock(self) -> None:
        """Publish withheld messages while their queues have room (in arrival order)."""
        self._retry = None
        while self.blocked and not self.closed:
            vq = self.blocked[0][0]
            if self.registry.get(vq.name) is not vq:
                vq = self.registry.create(vq.name)
            room = vq.core.room()
            if room <= 0:
                break
            run: list[c.Frame] = []
            while self.blocked and self.blocked[0][0].name == vq.name and len(run) < room:
                run.append(self.blocked.popleft()[1])
            try:
                self._put(vq, run)
            except QueueFull:
                self.blocked.extendleft((vq, f) for f in reversed(run))
                break
        if self._paused and len(self.blocked) < self.config.max_blocked // 2:
            self._paused = False
            self._sync_reading()
        if self.blocked and not self.closed:
            self._retry = self.clock.callLater(0.05, self._unblock)

    # delivering ------------------------------------------------------------------------------

    def deliver_batch(self, consumer: Any, queue_name: str, entries: list[tuple]) -> None:
        """Write Deliver frames for a core batch (IDeliveryTarget)."""
        if self.closed:
            return
        name = consumer.tag  # the VibeMQ queue (a fan-out consumer sits on a private sub-queue)
        sub = self.subs.get(name)
        if sub is None:
            self.write(deliver_frames(entries, name, self.flag, self.threshold,
                                      self.config.max_frame_size)[0])
            return
        vq = sub[0]
        core = vq.core
        limit = vq.max_deliveries
        if entries[-1][ATTEMPTS] > limit or entries[0][ATTEMPTS] > limit:
            dead = [e[MSG_ID] for e in entries if e[ATTEMPTS] > limit]
            if dead:
                entries = [e for e in entries if e[ATTEMPTS] <= limit]
                core.reject(consumer, dead, reason=REASON_MAX_ATTEMPTS, error="ack timeout")
            if not entries:
                return
        data, too_big = deliver_frames(entries, name, self.flag, self.threshold,
                                       self.config.max_frame_size)
        self.write(data)
        if too_big:  # never deliverable to a VibeMQ client: dead-letter instead of looping
            core.reject(consumer, too_big, error="larger than the VibeMQ frame limit")
            held = set(too_big)
            entries = [e for e in entries if e[MSG_ID] not in held]
        if vq.no_ack:
            core.ack(consumer, list(map(get_msg_id, entries)))
            return
        retried: dict[int, list[int]] = {}
        for e in entries:
            if e[ATTEMPTS] > 1:
                retried.setdefault(e[ATTEMPTS], []).append(e[MSG_ID])
        for attempts, ids in retried.items():
            core.touch(consumer, ids, extend=backoff(attempts))

    def deliver_dead(self, view: DeadLetterView, dead: list[Any]) -> None:
        """Write Deliver frames for dead letters served under the DLQ name."""
        qf = queue_field(view.name)
        out = []
        for d in dead:
            payload, enc = render_payload(d.body, d.origin)
            extra = [(H_DLQ_REASON, d.reason), (H_DLQ_QUEUE, d.queue)]
            if enc:
                extra.append(("payload-encoding", enc))
            out.append(c.frame(deliver_body(d.msg_id, qf, payload, d.headers, extra,
                                            max(1, d.attempts)), self.flag, self.threshold))
        self.write(b"".join(out))

    def _ack(self, ack_ids: list[str]) -> None:
        """Settle Acks (by Deliver id) on this connection's subscriptions; unknown ids are ignored."""
        ids = []
        for text in ack_ids:
            if len(text) == 16:
                try:
                    ids.append(int(text, 16))
                except ValueError:
                    pass
        for vq, consumer in list(self.subs.values()):
            if not ids:
                return
            ids = vq.core.ack(consumer, ids)
        for view in self.dlq_subs.values():
            if not ids:
                return
            ids = view.ack(self, ids)

    # subscriptions ---------------------------------------------------------------------------

    def on_subscribe(self, f: c.Frame) -> None:
        """SubscribeAck first, then attach (the backlog follows at once)."""
        if not self._queue_ok(f, "Subscribe", "subscribe"):
            return
        name: str = f.queue  # type: ignore[assignment]
        if name in self.subs or name in self.dlq_subs:
            self.reply(c.SUBSCRIBE_ACK, f.id, name)
            return
        source = None if self.registry.get(name) else self.registry.dead_letter_source(name)
        if source is not None:
            # dead letters keep their queue's addresses: reading them needs that right too
            if self.user is None and not self._may_read(source.name):
                self.error(f.id, "NOT_AUTHORIZED", "Access denied.")
                return
            self.reply(c.SUBSCRIBE_ACK, f.id, name)
            view = self.dlq_subs[name] = self.factory.view(source)
            view.subscribe(self)
            return
        try:
            vq = self.registry.create(name)
        except InvalidName as exc:
            self.error(f.id, "INVALID_QUEUE", str(exc))
            return
        if not self._may_read(name):
            self.error(f.id, "NOT_AUTHORIZED", "Access denied.")
            return
        self.subs[name] = (vq, None)
        # once the queue is in effect (at once in the embedded core; a cluster confirms it)
        self.broker.settled(vq.core).addBoth(self._subscribed, f.id, name, vq)

    def _subscribed(self, result: object, msg_id: str, name: str, vq: VibeQueue) -> None:
        """The subscribed queue is in effect: SubscribeAck, then attach (the backlog follows)."""
        if isinstance(result, Failure):
            if self.subs.get(name, (None,))[0] is vq:
                del self.subs[name]
            self.error(msg_id, "SERVER_ERROR", f"Subscribe failed: {result.getErrorMessage()}")
            return
        if self.subs.get(name, (None,))[0] is not vq or self.closed:
            return      # unsubscribed (or gone) meanwhile
        self.reply(c.SUBSCRIBE_ACK, msg_id, name)
        consumer = self.broker.attach(vq.core, self, ready=self.config.prefetch, tag=name)
        if name in self.subs and not self.closed:
            self.subs[name] = (vq, consumer)
        else:
            vq.core.detach(consumer, requeue=True)

    def _may_read(self, queue: str) -> bool:
        """May this connection read what queue ``queue`` holds: every address pattern bound
        to it (the seam's rule for attach and dead letters, asked before the SubscribeAck;
        a queue another protocol binds wider is refused). A refusal is counted."""
        session = self.session
        if session is None or session.subscribe_all:
            return True
        for binding in self.broker.bindings(queue):
            if not session.may_receive(binding.pattern):
                session.refuse("subscribe", f"{binding.pattern} (queue {queue})")
                return False
        return True

    def on_unsubscribe(self, f: c.Frame) -> None:
        """Detach; unacked deliveries return to the queue."""
        if not f.queue:
            self.error(f.id, "INVALID_QUEUE", "Queue name is required for unsubscribe.")
            return
        sub = self.subs.pop(f.queue, None)
        if sub is not None and sub[1] is not None:
            try:
                sub[0].core.detach(sub[1], requeue=True)
            except MqhubError:
                pass
        view = self.dlq_subs.pop(f.queue, None)
        if view is not None:
            view.unsubscribe(self)
        self.reply(c.UNSUBSCRIBE_ACK, f.id, f.queue)

    # queue management ------------------------------------------------------------------------

    def on_create_queue(self, f: c.Frame) -> None:
        """Create with the JSON QueueOptions (an existing queue keeps its options)."""
        if not self._queue_ok(f, "CreateQueue", "create"):
            return
        opts = QueueOptions.from_json(f.payload)
        try:
            vq = self.registry.create(f.queue, opts)  # type: ignore[arg-type]
        except InvalidName as exc:
            self.error(f.id, "INVALID_QUEUE", str(exc))
            return

        def created(result: Any) -> Any:
            """Answer once the queue's options are stored."""
            self.reply(c.CREATE_QUEUE, f.id, f.queue)
            return result

        vq.saved.addCallback(created)

    def on_delete_queue(self, f: c.Frame) -> None:
        """Delete the queue, its messages and dead letters (unknown queue: success too)."""
        if not self._queue_ok(f, "DeleteQueue", "delete"):
            return
        name: str = f.queue  # type: ignore[assignment]
        for p in list(self.factory.clients):
            p.subs.pop(name, None)
        self.registry.delete(name)
        self.reply(c.DELETE_QUEUE, f.id, name)

    def on_queue_info(self, f: c.Frame) -> None:
        """QueueInfo JSON, or no payload for an unknown queue (what the .NET client expects)."""
        if not self._queue_ok(f, "GetQueueInfo", "queue info"):
            return
        name: str = f.queue  # type: ignore[assignment]
        vq = self.registry.get(name)
        payload = None
        if vq is not None:
            payload = queue_info_json(name, vq.options, vq.core.depth,
                                      self.factory.subscriber_count(name), vq.created_at,
                                      vq.options.dead_letter_queue_name)
        else:
            src = self.registry.dead_letter_source(name)
            if src is not None:
                payload = queue_info_json(name, QueueOptions(max_queue_size=0),
                                          src.core.dead_letter_count,
                                          self.factory.subscriber_count(name),
                                          src.created_at, None)
        self.reply(c.QUEUE_INFO, f.id, name, payload)

    def on_list_queues(self, f: c.Frame) -> None:
        """Names of the queues (and enabled DLQ names) this user may see."""
        user, session = self.user, self.session
        if user is not None:
            names = [n for n in self.registry.names() if user.superuser
                     or user.allowed("ListQueues", n)
                     or any(user.allowed(op, n) for op in ("Publish", "Subscribe"))]
        elif session is not None:
            names = [n for n in self.registry.names()
                     if session.may_publish(n) or session.may_subscribe(n)]
        else:
            names = self.registry.names()
        self.reply(c.LIST_QUEUES, f.id, None, _DUMPS(names).encode())

    def on_admin(self, f: c.Frame) -> None:
        """Admin user commands (superusers only; users file required)."""
        if self.user is None or not self.user.superuser:
            self.error(f.id, "NOT_AUTHORIZED", "Superuser required.")
            return
        users = self.factory.users
        assert users is not None
        result = handle_admin(users, self.user.username, f.type, f.payload)
        if isinstance(result, tuple):
            self.error(f.id, result[0], result[1])
        else:
            self.reply(f.type, f.id, None, result)
