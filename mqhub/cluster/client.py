"""A NATS client on Twisted's reactor, shaped for JetStream: pipelined publishes whose PubAcks
are handled per read, JSON API requests, pull-consumer fetches and core subscriptions.

Why not nats-py: it is asyncio-only, and mqhub runs on Twisted's default (epoll) reactor; the
measurements in docs/cluster.md ("The client") compare the two. This client reuses mqhub's
sans-IO NATS parser (``server=False`` reads what servers send) and writes frames with its
encoders, so no second NATS grammar lives in the project.

Shape of the hot path: :meth:`NatsConnection.publish_acked` writes every message of a batch
in one ``writeSequence`` with one reply subject for the whole batch; each PubAck arriving on
that subject decrements the batch's count, and the batch's Deferred fires once when the last
one arrived (errbacks on the first error or on the deadline). No Deferred, dict or object
per message. Every reply-shaped message (PubAcks, API replies, pulled messages) arrives on
one wildcard inbox subscription and is routed by its subject to a :class:`Waiter`.

A connection walks its URLs until one answers; when it drops, every waiter fails with
:class:`~mqhub.errors.ClusterUnavailable` (a publish not acked is refused to its publisher,
never assumed stored) and the connection tries the URLs again, renewing its subscriptions.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import msgspec
from twisted.internet import defer, protocol
from twisted.internet.interfaces import IDelayedCall, IReactorTCP, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqhub.errors import ClusterUnavailable
from mqhub.protocols.nats.codec import (
    OP_ERR,
    OP_HMSG,
    OP_INFO,
    OP_MSG,
    OP_PING,
    OP_PONG,
    NatsParser,
    ProtocolError,
)
from mqhub.protocols.nats.encoders import PING, PONG, encode_connect, encode_sub, encode_unsub

__all__ = ["NatsConnection", "Waiter", "PublishBatch", "Request", "Event", "parse_status",
           "sign_nonce",
           "ServerUrl", "DEFAULT_TIMEOUT"]

log = Logger()

#: a parser event of a delivered message: (OP_MSG, subject, sid, reply, payload) or
#: (OP_HMSG, subject, sid, reply, header_block, payload)
Event = tuple
#: seconds a publish batch or an API request may wait for its replies
DEFAULT_TIMEOUT = 5.0
#: seconds between reconnect attempts once every URL failed
RECONNECT_DELAY = 0.25
#: seconds between the deadline checks of waiting publishes and requests
SWEEP_INTERVAL = 0.1
#: PING interval and how many unanswered PINGs make a connection dead
PING_INTERVAL = 2.0
PINGS_OUT = 3
#: times a batch that met no stream (503) is sent again, and the pause before each
RESENDS = 20
RESEND_DELAY = 0.05
_INBOX_SID = "1"
_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode
_ERROR_MARK = b'"error"'


def parse_status(block: bytes) -> tuple[int, str]:
    """The status code and description of a header block (``NATS/1.0 404 No Messages``);
    (0, "") when it has none."""
    first, _, _ = block.partition(b"\r\n")
    rest = first[8:].strip()
    if not rest:
        return 0, ""
    code, _, text = rest.partition(b" ")
    return (int(code) if code.isdigit() else 0), text.decode("utf-8", "replace").strip()


@dataclass(frozen=True)
class ServerUrl:
    """One ``nats://[user:pass@]host:port`` (or ``tls://``) of the cluster."""

    host: str
    port: int
    tls: bool = False
    user: str | None = None
    password: str | None = None

    @classmethod
    def parse(cls, text: str) -> ServerUrl:
        """Parse one URL (scheme optional, default port 4222)."""
        if "://" not in text:
            text = "nats://" + text
        parts = urlsplit(text)
        if parts.scheme not in ("nats", "tls"):
            raise ValueError(f"unsupported scheme in {text!r} (nats:// or tls://)")
        if not parts.hostname:
            raise ValueError(f"no host in {text!r}")
        return cls(host=parts.hostname, port=parts.port or 4222, tls=parts.scheme == "tls",
                   user=parts.username, password=parts.password)


class Waiter:
    """Something waiting for messages on one inbox subject (a batch's PubAcks, an API reply,
    a pull consumer's messages): :meth:`receive` gets every such event of one read,
    :meth:`fail` the reason when the connection drops or the deadline passes."""

    __slots__ = ("subject", "deadline")

    def __init__(self, subject: str, deadline: float) -> None:
        """Wait on ``subject`` until ``deadline`` (clock seconds; 0 = no deadline)."""
        self.subject = subject
        self.deadline = deadline

    def receive(self, events: list[Event]) -> bool:
        """Take events; return True when done waiting (the connection forgets it)."""
        return True

    def fail(self, reason: Exception) -> None:
        """The replies will not come."""


class PublishBatch(Waiter):
    """The PubAcks of one pipelined batch: fires ``done`` with the last stream sequence.

    A batch answered only by "no responders" (503: no stream took the subject, e.g. a moment
    after the stream was made, before its interest reached this server) stored nothing, so
    it is sent again (``resend``), up to :data:`RESENDS` times within its deadline.
    """

    __slots__ = ("count", "left", "refused", "done", "last_seq", "resend", "resends")

    def __init__(self, subject: str, deadline: float, count: int,
                 resend: Callable[[], None] | None = None) -> None:
        """Wait for ``count`` PubAcks on ``subject``."""
        super().__init__(subject, deadline)
        self.count = count
        self.left = count
        self.refused = 0
        self.done: defer.Deferred[int] = defer.Deferred()
        self.last_seq = 0
        self.resend = resend
        self.resends = 0

    def receive(self, events: list[Event]) -> bool:
        """Count PubAcks; an error reply ends the batch, 503s are counted (see above)."""
        for event in events:
            if event[0] == OP_HMSG:
                code, text = parse_status(event[4])
                if code == 503:
                    self.refused += 1
                    continue
                if code >= 300 or not event[5]:
                    self.done.errback(ClusterUnavailable(f"publish refused: {code} {text}"))
                    return True
                payload = event[5]
            else:
                payload = event[4]
            if _ERROR_MARK in payload:
                self.done.errback(ClusterUnavailable(f"publish refused: {_error_text(payload)}"))
                return True
            self.left -= 1
        if self.refused:
            return self._refused()
        if self.left <= 0:
            self.last_seq = _seq_of(events[-1])
            self.done.callback(self.last_seq)
            return True
        return False

    def _refused(self) -> bool:
        """Some publishes met no stream: once every answer is in, resend or refuse."""
        if self.refused < self.left:
            return False
        if self.left == self.count and self.resend is not None and self.resends < RESENDS:
            self.resends += 1
            self.refused = 0
            self.resend()
            return False
        self.done.errback(ClusterUnavailable(
            f"publish refused: no stream takes it ({self.refused} of {self.count})"))
        return True

    def fail(self, reason: Exception) -> None:
        """Refuse the batch to its publisher."""
        self.done.errback(reason)


class Request(Waiter):
    """One JSON API request: fires ``done`` with the decoded reply (a dict)."""

    __slots__ = ("done",)

    def __init__(self, subject: str, deadline: float) -> None:
        """Wait for one reply on ``subject``."""
        super().__init__(subject, deadline)
        self.done: defer.Deferred[dict] = defer.Deferred()

    def receive(self, events: list[Event]) -> bool:
        """Decode the first reply (a 503 status means nothing serves that API)."""
        event = events[0]
        if event[0] == OP_HMSG:
            code, text = parse_status(event[4])
            if code == 503:
                self.done.errback(ClusterUnavailable(f"no responders: {text}"))
                return True
            payload = event[5]
        else:
            payload = event[4]
        try:
            reply = _decode(payload) if payload else {}
        except msgspec.DecodeError as exc:
            self.done.errback(ClusterUnavailable(f"bad API reply: {exc}"))
            return True
        self.done.callback(reply if isinstance(reply, dict) else {"result": reply})
        return True

    def fail(self, reason: Exception) -> None:
        """The request failed."""
        self.done.errback(reason)


def sign_nonce(creds_path: str, nonce: str) -> tuple[str, str]:
    """The user JWT of a NATS credentials file and its nkey's signature of ``nonce``
    (base64url without padding), as CONNECT carries them. Needs the ``nkeys`` package."""
    import base64

    try:
        import nkeys
    except ImportError as exc:
        raise ClusterUnavailable("--cluster-creds needs the nkeys package") from exc
    with open(creds_path) as f:
        text = f.read()
    blocks = [line.strip() for line in text.splitlines()
              if line.strip() and not line.strip().startswith(("---", "***", "NATS", "*"))]
    jwt = next((b for b in blocks if b.startswith("ey")), "")
    seed = next((b for b in blocks if b.startswith("SU")), "")
    if not jwt or not seed:
        raise ClusterUnavailable(f"{creds_path}: no user JWT and nkey seed found")
    user = nkeys.from_seed(seed.encode())
    sig = base64.urlsafe_b64encode(user.sign(nonce.encode())).rstrip(b"=").decode()
    return jwt, sig


def _error_text(payload: bytes) -> str:
    """The description of a JetStream error reply."""
    try:
        reply = _decode(payload)
        err = reply.get("error") or {}
        return f"{err.get('code', '?')} {err.get('description', '')}".strip()
    except (msgspec.DecodeError, AttributeError):
        return payload[:200].decode("utf-8", "replace")


def _seq_of(event: Event) -> int:
    """The ``seq`` of a PubAck payload (0 when it has none)."""
    payload = event[5] if event[0] == OP_HMSG else event[4]
    at = payload.find(b'"seq":')
    if at < 0:
        return 0
    end = at + 6
    while end < len(payload) and 48 <= payload[end] <= 57:
        end += 1
    return int(payload[at + 6:end] or 0)


class _Wire(protocol.Protocol):
    """One TCP connection to one nats-server: handshake, parsing, dispatch to the owner."""

    transport: Any  # ITCPTransport and ITLSTransport

    def __init__(self, owner: NatsConnection, url: ServerUrl) -> None:
        """Belong to ``owner``; ``url`` gives the credentials sent in CONNECT."""
        self.owner = owner
        self.url = url
        self.parser = NatsParser(server=False, max_payload=64 << 20)
        self.info: dict = {}
        self.ready = False
        self.pings_out = 0

    def connectionMade(self) -> None:
        """No Nagle: a batch's last frames must not wait for the previous ones' ACKs."""
        try:
            self.transport.setTcpNoDelay(True)
        except (AttributeError, OSError):
            pass

    def dataReceived(self, data: bytes) -> None:
        """Parse everything buffered and hand it to the owner in one call."""
        parser = self.parser
        parser.receive_data(data)
        try:
            events = parser.events()
        except ProtocolError as exc:
            log.warn("cluster: bad data from {host}: {err}", host=self.url.host, err=exc)
            self.transport.loseConnection()
            return
        msgs: list[Event] = []
        for event in events:
            op = event[0]
            if op == OP_MSG or op == OP_HMSG:
                msgs.append(event)
            elif op == OP_PING:
                self.transport.write(PONG)
            elif op == OP_PONG:
                self.pings_out = 0
                if not self.ready:
                    self.ready = True
                    self.owner._wire_ready(self)
            elif op == OP_INFO:
                self._info(event[1])
            elif op == OP_ERR:
                log.warn("cluster: -ERR {text} from {host}", text=event[1], host=self.url.host)
        if msgs:
            self.owner._dispatch(msgs)

    def _info(self, info: dict) -> None:
        """First INFO: upgrade to TLS when asked for, answer with CONNECT (signing the
        server's nonce with the credentials' nkey) and a PING (PONG = ready)."""
        first = not self.info
        self.info = info
        if not first:
            return
        owner = self.owner
        if self.url.tls or owner.tls_ca or info.get("tls_required"):
            from twisted.internet import ssl

            trust = None
            if owner.tls_ca:
                with open(owner.tls_ca, "rb") as f:
                    trust = ssl.Certificate.loadPEM(f.read())
            self.transport.startTLS(ssl.optionsForClientTLS(self.url.host, trustRoot=trust))
        options: dict[str, object] = {
            "verbose": False, "pedantic": False, "headers": True, "no_responders": True,
            "protocol": 1, "lang": "python-twisted", "version": "mqhub",
            "name": self.owner.name, "echo": self.owner.echo}
        if self.url.user is not None:
            options["user"] = self.url.user
            options["pass"] = self.url.password or ""
        if owner.creds:
            jwt, sig = sign_nonce(owner.creds, str(info.get("nonce", "")))
            options["jwt"] = jwt
            options["sig"] = sig
        self.transport.write(encode_connect(options) + PING)

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        """Tell the owner (it fails the waiters and reconnects)."""
        self.owner._wire_lost(self, reason)


class NatsConnection:
    """A self-healing NATS connection over a list of URLs (see the module docstring).

    :param reactor: provides TCP connections and the clock.
    :param urls: the servers, tried in turn (``nats://host:port``).
    :param name: the client name servers show (the mqhub node's name).
    :param timeout: default seconds a publish batch or request may wait.
    :param echo: False: this connection's publishes never come back to its subscriptions.
    :param tls_ca: PEM file of the CA of the servers' certificates (TLS is then required).
    :param creds: NATS credentials file (user JWT and nkey seed).
    """

    def __init__(self, reactor: IReactorTCP, clock: IReactorTime, urls: Sequence[str],
                 name: str = "mqhub", timeout: float = DEFAULT_TIMEOUT,
                 echo: bool = True, tls_ca: str | None = None,
                 creds: str | None = None) -> None:
        """Prepare; :meth:`start` connects."""
        if not urls:
            raise ValueError("no cluster URLs")
        self.reactor = reactor
        self.clock = clock
        self.urls = [ServerUrl.parse(u) for u in urls]
        self.name = name
        self.timeout = timeout
        #: whether this connection's own publishes reach its own subscriptions
        self.echo = echo
        self.tls_ca = tls_ca
        self.creds = creds
        self.inbox = "_INBOX." + os.urandom(8).hex()
        self.wire: _Wire | None = None
        self.waiters: dict[str, Waiter] = {}
        self.subs: dict[str, tuple[str, str | None, Callable[[list[Event]], None]]] = {}
        self._next_sid = 2
        self._next_reply = 0
        self._url_index = 0
        self._connecting = False
        self._stopped = False
        self._ready_waiting: list[defer.Deferred[None]] = []
        self.on_state: list[Callable[[bool], None]] = []
        self._sweeper: IDelayedCall | None = None
        self._pinger: IDelayedCall | None = None
        self.connects = 0
        self.last_error = ""

    # lifecycle ---------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Whether a server has answered the handshake and the connection is up."""
        return self.wire is not None and self.wire.ready

    def start(self) -> defer.Deferred[None]:
        """Connect (retrying forever); the Deferred fires at the first ready connection."""
        self._stopped = False
        d = self.when_ready()
        self._connect()
        self._sweeper = self.clock.callLater(SWEEP_INTERVAL, self._sweep)
        self._pinger = self.clock.callLater(PING_INTERVAL, self._ping)
        return d

    def when_ready(self) -> defer.Deferred[None]:
        """Fires once the connection is up (at once if it is)."""
        if self.connected:
            return defer.succeed(None)
        d: defer.Deferred[None] = defer.Deferred()
        self._ready_waiting.append(d)
        return d

    def stop(self) -> None:
        """Close the connection and fail whatever still waits."""
        self._stopped = True
        for call in (self._sweeper, self._pinger):
            if call is not None and call.active():
                call.cancel()
        if self.wire is not None:
            self.wire.transport.loseConnection()
        self._fail_all(ClusterUnavailable("cluster connection closed"))

    def _connect(self) -> None:
        """Try the next URL."""
        if self._stopped or self._connecting:
            return
        self._connecting = True
        url = self.urls[self._url_index % len(self.urls)]
        self._url_index += 1
        d = protocol.ClientCreator(self.reactor, _Wire, self, url).connectTCP(
            url.host, url.port, timeout=2)

        def failed(reason: Failure) -> None:
            self._connecting = False
            self.last_error = f"{url.host}:{url.port}: {reason.getErrorMessage()}"
            self._retry()
        d.addCallbacks(lambda wire: None, failed)

    def _retry(self) -> None:
        """Try again: at once while other URLs are left in this round, then after a pause."""
        if self._stopped:
            return
        delay = 0.0 if self._url_index % len(self.urls) else RECONNECT_DELAY
        self.clock.callLater(delay, self._connect)

    def _wire_ready(self, wire: _Wire) -> None:
        """A server accepted us: renew subscriptions and wake whoever waits."""
        self._connecting = False
        self.wire = wire
        self.connects += 1
        frames = [encode_sub(self.inbox + ".>", _INBOX_SID)]
        for sid, (subject, queue, _) in self.subs.items():
            frames.append(encode_sub(subject, sid, queue))
        wire.transport.writeSequence(frames)
        waiting, self._ready_waiting = self._ready_waiting, []
        for d in waiting:
            d.callback(None)
        for listener in list(self.on_state):
            listener(True)

    def _wire_lost(self, wire: _Wire, reason: Failure) -> None:
        """The connection dropped: fail every waiter, tell listeners, reconnect."""
        if wire is not self.wire:
            if not wire.ready:
                self._connecting = False
                self.last_error = f"{wire.url.host}:{wire.url.port}: " \
                                  f"{reason.getErrorMessage()}"
                self._retry()
            return
        self.wire = None
        self.last_error = f"connection lost: {reason.getErrorMessage()}"
        self._fail_all(ClusterUnavailable(f"cluster connection lost "
                                          f"({reason.getErrorMessage()})"))
        for listener in list(self.on_state):
            listener(False)
        self._retry()

    def _fail_all(self, reason: Exception) -> None:
        """Fail and forget every waiter."""
        waiters, self.waiters = self.waiters, {}
        for waiter in waiters.values():
            waiter.fail(reason)

    def _sweep(self) -> None:
        """Fail waiters whose deadline passed (the oldest first; stop at the first alive)."""
        now = self.clock.seconds()
        expired = [w for w in self.waiters.values() if w.deadline and w.deadline <= now]
        for waiter in expired:
            del self.waiters[waiter.subject]
            waiter.fail(ClusterUnavailable("no reply from the cluster in time"))
        if not self._stopped:
            self._sweeper = self.clock.callLater(SWEEP_INTERVAL, self._sweep)

    def _ping(self) -> None:
        """PING the server; a connection that left PINGS_OUT unanswered is closed."""
        wire = self.wire
        if wire is not None and wire.ready:
            if wire.pings_out >= PINGS_OUT:
                wire.transport.abortConnection()
            else:
                wire.pings_out += 1
                wire.transport.write(PING)
        if not self._stopped:
            self._pinger = self.clock.callLater(PING_INTERVAL, self._ping)

    # dispatch ----------------------------------------------------------------------------

    def _dispatch(self, events: list[Event]) -> None:
        """Route one read's messages: inbox ones to their waiters, others to subscriptions,
        each receiver called once with its events of this read."""
        waiters = self.waiters
        if len(events) == 1:
            event = events[0]
            if event[2] == _INBOX_SID:
                waiter = waiters.get(event[1])
                if waiter is not None and waiter.receive(events):
                    waiters.pop(event[1], None)
            else:
                sub = self.subs.get(event[2])
                if sub is not None:
                    sub[2](events)
            return
        groups: dict[str, list[Event]] = {}
        for event in events:
            key = event[1] if event[2] == _INBOX_SID else "\0" + event[2]
            group = groups.get(key)
            if group is None:
                groups[key] = [event]
            else:
                group.append(event)
        for key, group in groups.items():
            if key[0] == "\0":
                sub = self.subs.get(key[1:])
                if sub is not None:
                    sub[2](group)
                continue
            waiter = waiters.get(key)
            if waiter is not None and waiter.receive(group):
                waiters.pop(key, None)

    # sending -----------------------------------------------------------------------------

    def reply_subject(self) -> str:
        """A fresh inbox subject of this connection."""
        self._next_reply += 1
        return f"{self.inbox}.{self._next_reply}"

    def _write(self, frames: list[bytes]) -> None:
        """Write frames, or refuse when there is no connection."""
        wire = self.wire
        if wire is None or not wire.ready:
            raise ClusterUnavailable(self.last_error or "not connected to the cluster")
        wire.transport.writeSequence(frames)

    def publish(self, frames: list[bytes]) -> None:
        """Write ready-made PUB/HPUB frames (core NATS, fire and forget).

        :raises ClusterUnavailable: when not connected.
        """
        self._write(frames)

    def publish_acked(self, frames: Callable[[str], list[bytes]], count: int,
                      timeout: float | None = None) -> defer.Deferred[int]:
        """Write ``count`` JetStream publishes built by ``frames(reply)`` (every one with that
        reply subject) and return a Deferred firing with the last stream sequence once every
        PubAck came back (errback :class:`ClusterUnavailable` otherwise)."""
        if count <= 0:
            return defer.succeed(0)
        subject = self.reply_subject()
        try:
            self._write(frames(subject))
        except ClusterUnavailable as exc:
            return defer.fail(exc)
        def resend() -> None:
            def again() -> None:
                try:
                    self._write(frames(subject))
                except ClusterUnavailable:
                    pass   # the lost connection fails the batch
            self.clock.callLater(RESEND_DELAY, again)

        batch = PublishBatch(subject, self._deadline(timeout), count, resend)
        self.waiters[subject] = batch
        return batch.done

    def request(self, subject: str, payload: bytes | dict,
                timeout: float | None = None) -> defer.Deferred[dict]:
        """Send a request and return a Deferred with the decoded JSON reply."""
        body = payload if isinstance(payload, bytes) else _encode(payload)
        reply = self.reply_subject()
        try:
            self._write([b"PUB %s %s %d\r\n%s\r\n" % (
                subject.encode(), reply.encode(), len(body), body)])
        except ClusterUnavailable as exc:
            return defer.fail(exc)
        waiter = Request(reply, self._deadline(timeout))
        self.waiters[reply] = waiter
        return waiter.done

    def wait(self, waiter: Waiter) -> None:
        """Register a waiter for messages on its subject (pull consumers)."""
        self.waiters[waiter.subject] = waiter

    def forget(self, subject: str) -> None:
        """Stop routing ``subject`` to its waiter."""
        self.waiters.pop(subject, None)

    def subscribe(self, subject: str, handler: Callable[[list[Event]], None],
                  queue: str | None = None) -> str:
        """Subscribe (renewed after reconnects); ``handler`` gets each read's messages."""
        sid = str(self._next_sid)
        self._next_sid += 1
        self.subs[sid] = (subject, queue, handler)
        wire = self.wire
        if wire is not None and wire.ready:
            wire.transport.write(encode_sub(subject, sid, queue))
        return sid

    def unsubscribe(self, sid: str) -> None:
        """End a subscription."""
        if self.subs.pop(sid, None) is None:
            return
        wire = self.wire
        if wire is not None and wire.ready:
            wire.transport.write(encode_unsub(sid))

    def _deadline(self, timeout: float | None) -> float:
        """The clock time a waiter gives up."""
        return self.clock.seconds() + (self.timeout if timeout is None else timeout)
