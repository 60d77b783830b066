"""The VibeMQ TCP server: a thin Twisted adapter between the sans-IO codec and the core.

- ``dataReceived`` decodes every complete frame of the read. Consecutive Publishes to one queue
  become ONE ``publish_batch`` (one store commit); their PublishAcks are written in that
  Deferred's callback, so a PublishAck always means "stored" (durable by default); see
  ``publishing.py``. Acks of a read become one ``queue.ack`` call per subscription.
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

from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from mqhub.errors import InvalidName, MqhubError
from mqhub.interfaces import ICore, IDeliveryTarget
from mqhub.listener import set_no_delay, set_read_size
from mqhub.protocols.vibemq import codec as c
from mqhub.protocols.vibemq.admin import handle_admin
from mqhub.protocols.vibemq.auth import UserStore
from mqhub.protocols.vibemq.config import VibeMQConfig
from mqhub.protocols.vibemq.dlq import DeadLetterView
from mqhub.protocols.vibemq.options import (
    PayloadError,
    QueueOptions,
    queue_info_json,
)
from mqhub.protocols.vibemq.publishing import PublishingMixin
from mqhub.protocols.vibemq.queues import QueueRegistry, VibeQueue, valid_queue_name
from mqhub.protocols.vibemq.render import (
    deliver_body,
    deliver_frames,
    queue_field,
    render_payload,
)
from mqhub.records import REASON_MAX_ATTEMPTS

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
class VibeMQProtocol(PublishingMixin, Protocol):
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
        self.authenticated = factory.users is None
        self.user: Any = None
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
        """ACL check (always true on an open broker)."""
        return self.user is None or self.user.allowed(operation, queue)

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

    def on_connect(self, f: c.Frame) -> None:
        """Authenticate (when a users file is set), negotiate compression, send ConnectAck."""
        h = f.headers or {}
        users = self.factory.users
        if users is not None:
            name, password = h.get("authUsername"), h.get("authPassword")
            if not name or not password:
                self.error(f.id, "AUTH_REQUIRED", "Username and password are required.")
                return
            user = users.authenticate(name, password)
            if user is None:
                self.error(f.id, "AUTH_FAILED", "Invalid username or password.")
                return
            self.user = user
            self.authenticated = True
        chosen = c.negotiate_compression(h.get("supported-compression", ""),
                                         self.factory.server_compressions)
        self.write(c.frame(c.encode_body(
            c.CONNECT_ACK, _random_id(), None, None,
            {"negotiated-compression": chosen} if chosen else None)))
        self.flag = c.COMPRESSIONS[chosen] if chosen else c.FLAG_NONE

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
        if entries[-1][2] > limit or entries[0][2] > limit:
            dead = [e[0] for e in entries if e[2] > limit]
            if dead:
                entries = [e for e in entries if e[2] <= limit]
                core.reject(consumer, dead, reason=REASON_MAX_ATTEMPTS, error="ack timeout")
            if not entries:
                return
        data, too_big = deliver_frames(entries, name, self.flag, self.threshold,
                                       self.config.max_frame_size)
        self.write(data)
        if too_big:  # never deliverable to a VibeMQ client: dead-letter instead of looping
            core.reject(consumer, too_big, error="larger than the VibeMQ frame limit")
            held = set(too_big)
            entries = [e for e in entries if e[0] not in held]
        if vq.no_ack:
            core.ack(consumer, [e[0] for e in entries])
            return
        retried: dict[int, list[int]] = {}
        for e in entries:
            if e[2] > 1:
                retried.setdefault(e[2], []).append(e[0])
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
            self.reply(c.SUBSCRIBE_ACK, f.id, name)
            view = self.dlq_subs[name] = self.factory.view(source)
            view.subscribe(self)
            return
        try:
            vq = self.registry.create(name)
        except InvalidName as exc:
            self.error(f.id, "INVALID_QUEUE", str(exc))
            return
        self.reply(c.SUBSCRIBE_ACK, f.id, name)
        self.subs[name] = (vq, None)
        consumer = self.broker.attach(vq.core, self, ready=self.config.prefetch, tag=name)
        if name in self.subs and not self.closed:
            self.subs[name] = (vq, consumer)
        else:
            vq.core.detach(consumer, requeue=True)

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
        names = [n for n in self.registry.names() if self.user is None
                 or self.user.superuser or self.user.allowed("ListQueues", n)
                 or any(self.user.allowed(op, n) for op in ("Publish", "Subscribe"))]
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
