"""The eMQP plugin's Service: txzmq ROUTER/PUB sockets around :class:`EmqpRouter`.

ZeroMQ sockets are not Twisted stream endpoints, so ``make_service`` returns a Service that
binds them in ``startService``. Each socket read drains up to :data:`READ_BATCH` multipart
messages (and at most about :data:`READ_BYTES`) and hands them to the router as one batch (one
core call and one store commit per read).

Memory in front of the router is bounded for big jobs too, not only in messages: ZeroMQ's
receive HWM counts messages, so the frontend (clients' jobs, the only socket whose messages are
stored) buffers at most :data:`FRONTEND_HWM` messages per client, one drain of all sockets
takes at most about :data:`DRAIN_BYTES`, and the frontend stops being read once
:data:`UNSTORED_BYTES` read from it wait for their store commit, until a ``broker.barrier()``
says they are stored. A client sending big jobs faster than the broker stores them is then held
back by TCP instead of piling up in libzmq or in pending commits. (The HWM is fixed at bind
time: libzmq applies a changed ``RCVHWM`` to connected pipes without re-syncing their flow
control, which can stall a peer for good, so it is never changed on a live socket.)
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import zmq
import zmq.auth
from twisted.application.service import IService, Service
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from txzmq import ZmqEndpoint, ZmqEndpointType, ZmqFactory
from txzmq.connection import ZmqConnection

from mqhub.errors import InvalidName, PluginError
from mqhub.protocols.emqp.access import EmqpGuard
from mqhub.protocols.emqp.peers import row_count
from mqhub.protocols.emqp.router import EmqpRouter
from mqhub.records import validate_pattern

log = Logger(namespace="mqhub.emqp")

#: Most messages taken from one socket per reactor read.
READ_BATCH = 4096
# pyzmq's sugar layer turns every flag into an enum (about 10x the cost of the send itself);
# the hot path calls the backend methods with plain int flags.
_SEND = zmq.backend.Socket.send
_RECV = zmq.backend.Socket.recv
_NOBLOCK = int(zmq.NOBLOCK)
_NOBLOCK_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)
#: Most bytes (frames of the messages read) one read takes, past which it stops (one message
#: more at most).
READ_BYTES = 16 << 20
#: Most messages handled in one reactor call before yielding to other protocols.
DRAIN_LIMIT = 16384
#: Most bytes handled in one reactor call (the batches of one turn are stored in one group
#: commit, so what a drain reads stays in memory until that turn ends).
DRAIN_BYTES = 64 << 20
#: Replies queued for one client that is not reading before further ones are dropped.
CLIENT_HWM = 100_000
#: Messages ZeroMQ buffers from one peer before it stops reading that peer's connection (TCP
#: back-pressure; nothing is dropped). Unlimited let a client sending faster than the broker
#: handles grow the broker without bound.
RECEIVE_HWM = 10_000
#: Messages the frontend buffers from one client by default (``--option emqp.receive_hwm``):
#: its jobs are stored and may be big (2 MiB jobs: 32 MiB per client); small jobs still flow
#: (the kernel's socket buffer holds the rest and ZeroMQ refills the queue as it is read).
FRONTEND_HWM = 16
#: Bytes read from the frontend whose store commits may be pending before it stops reading
#: (until a barrier fires: everything read so far is stored).
UNSTORED_BYTES = 64 << 20
#: Messages queued for one slow SUB subscriber before PUB drops (ZeroMQ pub/sub semantics).
SUBSCRIBER_HWM = 100_000
ROLES = ("frontend", "backend", "pub-in", "pub-out")


class Drainer:
    """Reads every eMQP socket in turn until all are empty, in one reactor call.

    A job crosses the broker as several messages on two sockets; draining them all in one loop
    (bounded by DRAIN_LIMIT messages) saves a reactor turn per message, and a socket is always
    re-read after the loop's last send, which ZeroMQ's edge-triggered fd requires.
    """

    def __init__(self, reactor: Any) -> None:
        """:param reactor: IReactorTime for the follow-up call when the limit is hit."""
        self.reactor = reactor
        self.sockets: list[BatchSocket] = []
        self.running = False
        self.call: Any = None

    def schedule(self) -> None:
        """Arrange one drain on the next reactor turn (after a send outside a drain)."""
        if self.call is None and not self.running:
            self.call = self.reactor.callLater(0, self.drain)

    def cancel(self) -> None:
        """Cancel the pending follow-up drain, if any."""
        if self.call is not None:
            if self.call.active():
                self.call.cancel()
            self.call = None

    def drain(self) -> None:
        """Read and handle batches from every socket until a whole pass finds nothing."""
        self.cancel()
        if self.running:
            return
        self.running = True
        total = nbytes = 0
        try:
            while True:
                got = 0
                for sock in self.sockets:
                    if sock.held:
                        continue
                    got += sock.read_batch()
                    nbytes += sock.last_read_bytes
                total += got
                if not got:
                    break
                if total >= DRAIN_LIMIT or nbytes >= DRAIN_BYTES:
                    self.call = self.reactor.callLater(0, self.drain)
                    break
        finally:
            self.running = False


class BatchSocket(ZmqConnection):
    """A txzmq socket whose reads go through a shared :class:`Drainer` as message batches."""

    socketType: Any = zmq.ROUTER
    read_scheduled: Any

    def __init__(self, factory: ZmqFactory, socket_type: int, address: str,
                 on_batch: Callable[[list[list[bytes]]], None] | None,
                 drainer: Drainer,
                 on_unreachable: Callable[[bytes], None] | None = None,
                 sndhwm: int = 0, curve_secret: bytes | None = None,
                 barrier: Callable[[], Deferred[None]] | None = None,
                 rcvhwm: int = RECEIVE_HWM, keys: dict[bytes, str] | None = None) -> None:
        """Create the socket of ``socket_type`` and bind it to ``address``.

        :param sndhwm: messages queued per peer before sends fail (ROUTER) or are dropped
            (PUB); 0 = unlimited.
        :param curve_secret: the server's CURVE secret key: peers must speak CURVE with the
            matching public key (encrypted; which client keys are let in is the ZAP handler's).
        :param rcvhwm: messages ZeroMQ buffers from one peer (set before binding, never
            changed later).
        :param barrier: ``broker.barrier``: when given, reading stops once UNSTORED_BYTES read
            since the last barrier may still be waiting for their commit, until one fires.
        :param keys: when given, each message's sender key (CURVE's ZAP User-Id) is noted
            there under its routing id (users file: the key is the peer's user).
        """
        self.socketType = socket_type
        self.on_batch = on_batch
        #: bytes the last read_batch took
        self.last_read_bytes = 0
        self.barrier = barrier
        #: bytes read since the last barrier fired; True while reading waits for one
        self.unstored = 0
        self.held = False
        self.on_unreachable = on_unreachable
        self.drainer = drainer
        self.keys = keys
        super().__init__(factory)
        if socket_type == zmq.ROUTER:
            self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.socket.setsockopt(zmq.SNDHWM, sndhwm)
        self.socket.setsockopt(zmq.RCVHWM, rcvhwm)
        if curve_secret is not None:
            self.socket.curve_secretkey = curve_secret
            self.socket.curve_server = True
        self.addEndpoints([ZmqEndpoint(ZmqEndpointType.bind, address)])
        if on_batch is not None:
            drainer.sockets.append(self)

    def doRead(self) -> None:
        """The fd signalled: drain every socket (or just clear the signal of a PUB socket)."""
        if self.read_scheduled is not None:
            if not self.read_scheduled.called:
                self.read_scheduled.cancel()
            self.read_scheduled = None
        if self.factory is None:
            return
        if self.on_batch is None:
            self.socket.get(zmq.EVENTS)  # lets ZeroMQ process commands and re-arm the fd
            return
        self.drainer.drain()

    def read_batch(self) -> int:
        """Receive up to READ_BATCH messages, hand them to ``on_batch``; return how many."""
        sock = self.socket
        if sock is None or self.on_batch is None:
            return 0
        recv = _RECV
        batch: list[list[bytes]] = []
        nbytes = 0
        keys = self.keys
        try:
            while True:
                frame = recv(sock, _NOBLOCK, False)
                data = frame.bytes
                if keys is not None:
                    keys[data] = str(frame.get("User-Id"))
                message = [data]
                size = len(data)
                while frame.more:
                    frame = recv(sock, 0, False)
                    data = frame.bytes
                    message.append(data)
                    size += len(data)
                batch.append(message)
                nbytes += size
                if len(batch) >= READ_BATCH or nbytes >= READ_BYTES:
                    break
        except zmq.Again:
            pass
        self.last_read_bytes = nbytes
        if batch:
            if self.barrier is not None:
                self.unstored += nbytes
                if self.unstored >= UNSTORED_BYTES:
                    self._hold()
            try:
                self.on_batch(batch)
            except Exception:  # noqa: BLE001 - a bug must not stop the socket
                log.failure("eMQP: handling a batch failed")
        return len(batch)

    def _hold(self) -> None:
        """Stop reading until everything read so far is stored (a barrier fires, whatever its
        result: a failed commit was answered already)."""
        assert self.barrier is not None
        self.held = True
        self.unstored = 0

        def release(_: object) -> None:
            self.held = False
            self.drainer.schedule()
        self.barrier().addBoth(release)

    def send_frames(self, frames: list[bytes]) -> None:
        """Send one multipart message; an unroutable peer is reported, never raised."""
        sock = self.socket
        if sock is None:
            return
        send = _SEND
        try:
            last = len(frames) - 1
            for i in range(last):
                send(sock, frames[i], _NOBLOCK_MORE)
            send(sock, frames[last], _NOBLOCK)
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH and self.on_unreachable is not None:
                self.on_unreachable(frames[0])
            else:
                log.debug("eMQP: send failed: {e}", e=exc)
        # ZeroMQ may not signal the fd again after a send: make sure every socket is re-read.
        self.drainer.schedule()


class EmqpService(Service):
    """Owns the ZeroMQ context, the four sockets and the router."""

    name: Any = "emqp"

    def __init__(self, hub: Any, endpoints: dict[str, str], settings: dict[str, Any],
                 curve: CurveSettings | None = None, receive_hwm: int = FRONTEND_HWM) -> None:
        """Build the router now (its schedule handler must exist before the scheduler fires);
        the sockets are made in startService.

        :param curve: CURVE encryption (and optional client allowlist) for every socket.
        :param receive_hwm: messages the frontend buffers from one client.
        """
        self.hub = hub
        self.curve = curve
        self.receive_hwm = receive_hwm
        self.authenticator: Any = None
        self.endpoints = endpoints
        self.factory: ZmqFactory | None = None
        self.sockets: dict[str, BatchSocket] = {}
        self.drainer: Drainer | None = None
        self.guard = EmqpGuard(getattr(hub, "identity", None), curve is not None,
                               curve.clients if curve is not None else None)
        self.router = EmqpRouter(hub, self._sender("frontend"), self._sender("backend"),
                                 self._sender("pub-out"), guard=self.guard, **settings)

    def peers(self) -> list[dict[str, Any]]:
        """The eMQP peers the router knows, as connection rows (admin ``/api/connections``)."""
        return self.router.peers()

    def peer_count(self) -> int:
        """How many rows :meth:`peers` would return, without building them (admin counts)."""
        r = self.router
        return row_count(r.workers, r.clients, r.publishers)

    def counters(self) -> dict[str, int]:
        """Monotonic totals the admin API and /metrics show beside published/delivered/acked
        (:meth:`mqhub.introspect.Inspector.protocol_counters`): the router's counts, messages it
        dropped (bad frames, unknown peers) and jobs the core refused."""
        router = self.router
        out = {("relayed" if name == "published" else name): n
               for name, n in router.stats.items()}
        out["dropped"] = router.drops.total
        return out

    def _sender(self, role: str) -> Callable[[list[bytes]], None]:
        """A send function for ``role`` that drops messages while the socket is closed."""
        def send(frames: list[bytes]) -> None:
            sock = self.sockets.get(role)
            if sock is not None:
                sock.send_frames(frames)
        return send

    def startService(self) -> None:
        """Bind the sockets, start the router (recovered queues, heartbeats)."""
        super().startService()
        factory = ZmqFactory()
        factory.reactor = self.hub.clock
        factory.lingerPeriod = 0
        self.factory = factory
        router = self.router
        drainer = self.drainer = Drainer(self.hub.clock)
        secret = self.curve.secret if self.curve is not None else None
        if self.curve is not None:
            self.authenticator = start_authenticator(
                factory.context, self.curve, self.guard if self.guard.enforcing else None)
        guard = self.guard
        try:
            # eventmq clients often never read their acks: bound what waits for each of them
            front = BatchSocket(factory, zmq.ROUTER, self.endpoints["frontend"],
                                router.frontend_received, drainer, sndhwm=CLIENT_HWM,
                                curve_secret=secret, barrier=self.hub.broker.barrier,
                                rcvhwm=self.receive_hwm, keys=guard.table("frontend"))
            back = BatchSocket(factory, zmq.ROUTER, self.endpoints["backend"],
                               router.backend_received, drainer, router.peer_unreachable,
                               curve_secret=secret, keys=guard.table("backend"))
            pub_in = BatchSocket(factory, zmq.ROUTER, self.endpoints["pub-in"],
                                 router.pubin_received, drainer, curve_secret=secret,
                                 keys=guard.table("pub-in"))
            pub_out = BatchSocket(factory, zmq.PUB, self.endpoints["pub-out"], None, drainer,
                                  sndhwm=SUBSCRIBER_HWM, curve_secret=secret)
        except zmq.ZMQError as exc:
            self._stop_authenticator()
            factory.shutdown()
            self.factory = None
            raise PluginError(f"emqp cannot bind: {exc}") from exc
        self.sockets = {"frontend": front, "backend": back, "pub-in": pub_in, "pub-out": pub_out}
        router.start()
        log.info("eMQP listening: {e}", e=self.endpoints)

    def stopService(self) -> None:
        """Stop the router and close the sockets."""
        super().stopService()
        self.router.stop()
        self._stop_authenticator()
        if self.factory is not None:
            self.factory.shutdown()
            self.factory = None
        if self.drainer is not None:
            self.drainer.cancel()
        self.sockets = {}

    def _stop_authenticator(self) -> None:
        """Stop the ZAP handler thread, if CURVE started one."""
        if self.authenticator is not None:
            self.authenticator.stop()
            self.authenticator = None


class CurveSettings(NamedTuple):
    """ZeroMQ CURVE for the eMQP sockets: the server's key pair and the allowed clients."""

    public: bytes
    secret: bytes
    #: Directory of client public-key certificates let in; None lets in any client that knows
    #: the server's public key (the traffic is still encrypted).
    clients: str | None


def emqp_options(options: dict[str, Any]) -> dict[str, Any]:
    """The ``--option emqp.KEY=VALUE`` settings: ``options["plugin_options"]["emqp"]``, or the
    plugin options themselves when they are not nested by plugin name."""
    raw = options.get("plugin_options") or {}
    if isinstance(raw.get("emqp"), dict):
        return raw["emqp"]
    return raw


def curve_settings(options: dict[str, Any]) -> CurveSettings | None:
    """``--option emqp.curve_secret_file=PATH [emqp.curve_clients=DIR]``, or None.

    PATH is a ZeroMQ certificate with a secret key (``zmq.auth.create_certificates`` writes
    one); DIR holds the public certificates of the clients that may connect.

    :raises PluginError: when the file cannot be read, holds no secret key, or DIR is missing.
    """
    raw = emqp_options(options)
    path = raw.get("curve_secret_file")
    if not path:
        if raw.get("curve_clients"):
            raise PluginError("emqp.curve_clients needs emqp.curve_secret_file")
        return None
    if not zmq.has("curve"):
        raise PluginError("emqp.curve_secret_file: this libzmq has no CURVE support")
    try:
        public, secret = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise PluginError(f"emqp.curve_secret_file: {exc}") from exc
    if not secret:
        raise PluginError(f"emqp.curve_secret_file {path!r} holds no secret key")
    clients = raw.get("curve_clients") or None
    if clients is not None and not os.path.isdir(str(clients)):
        raise PluginError(f"emqp.curve_clients {clients!r} is not a directory")
    return CurveSettings(public, secret, str(clients) if clients else None)


def start_authenticator(context: zmq.Context[Any], curve: CurveSettings,
                        provider: Any = None) -> Any:
    """Start pyzmq's ZAP handler thread: only ``curve.clients`` (or any CURVE client) get in;
    with a users file, ``provider`` (:class:`EmqpGuard`) decides by key instead."""
    from zmq.auth.thread import ThreadAuthenticator

    auth = ThreadAuthenticator(context)
    auth.start()
    if provider is not None:
        auth.configure_curve_callback(domain="*", credentials_provider=provider)
    else:
        auth.configure_curve(domain="*", location=curve.clients or zmq.auth.CURVE_ALLOW_ANY)
    return auth


def _flag(value: Any) -> bool:
    """Truth of an option string (``true/1/yes/on``)."""
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def router_settings(options: dict[str, Any]) -> dict[str, Any]:
    """Translate ``--option emqp.KEY=VALUE`` settings into EmqpRouter keyword arguments."""
    raw = emqp_options(options)
    out: dict[str, Any] = {}
    try:
        if "heartbeat_interval" in raw:
            out["heartbeat_interval"] = float(raw["heartbeat_interval"])
        if "heartbeat_timeout" in raw:
            out["heartbeat_timeout"] = float(raw["heartbeat_timeout"])
        if "max_body" in raw:
            out["max_body"] = int(raw["max_body"])
        if "queues" in raw:
            queues = json.loads(raw["queues"])
            out["default_queues"] = [(int(w), str(n)) for w, n in queues]
    except (ValueError, TypeError) as exc:
        raise PluginError(f"emqp: bad option: {exc}") from exc
    if "pub_bridge" in raw:
        patterns = tuple(x.strip() for x in str(raw["pub_bridge"]).split(",") if x.strip())
        for pattern in patterns:
            try:
                validate_pattern(pattern)
            except InvalidName as exc:
                raise PluginError(f"emqp.pub_bridge: {exc}") from exc
        out["pub_bridge"] = patterns
    if "schedules" in raw:
        mode = str(raw["schedules"])
        if mode not in ("internal", "forward"):
            raise PluginError("emqp.schedules must be internal or forward")
        out["forward_schedules"] = mode == "forward"
    return out


def make_service(hub: Any, endpoints: dict[str, str], options: dict[str, Any]) -> IService:
    """Build (not start) the eMQP service for ``hub`` on the ZeroMQ ``endpoints``.

    :raises PluginError: on a missing role or a bad ``--option emqp.*`` value.
    """
    missing = [role for role in ROLES if role not in endpoints]
    if missing:
        raise PluginError(f"emqp: no endpoint for {', '.join(missing)}")
    for role in ROLES:
        if not endpoints[role].startswith(("tcp://", "ipc://", "inproc://")):
            raise PluginError(f"emqp.{role} takes a ZeroMQ address, got {endpoints[role]!r}")
    return EmqpService(hub, dict(endpoints), router_settings(options), curve_settings(options),
                       frontend_hwm(options))


def frontend_hwm(options: dict[str, Any]) -> int:
    """``--option emqp.receive_hwm=N`` (messages the frontend buffers per client, >= 1), or
    :data:`FRONTEND_HWM`."""
    raw = emqp_options(options)
    if "receive_hwm" not in raw:
        return FRONTEND_HWM
    try:
        value = int(raw["receive_hwm"])
    except (ValueError, TypeError) as exc:
        raise PluginError(f"emqp: bad option: {exc}") from exc
    if value < 1:
        raise PluginError("emqp.receive_hwm must be at least 1")
    return value
