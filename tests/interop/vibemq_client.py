"""A VibeMQ test client that reproduces the .NET ``VibeMQClient``'s wire behaviour.

What it copies (docs/protocols/vibemq.md, ../shared/reference/vibemq.md §3, §9):

- Connect carries ``authUsername``/``authPassword`` (when given) and ``supported-compression``
  (``brotli,gzip`` by default); the client then reads **the next frame**, whatever its id: an
  Error means failure, anything else success.
- Requests carry 32-hex random ids and are matched by id (10 s timeout); other frames are kept.
- Outgoing frames are compressed with the negotiated algorithm when the body is ≥ 1024 bytes.
- A Deliver is acked with ``Ack{id = deliver.id}`` and no headers after the handler ran.
- CreateQueue sends the QueueOptions JSON exactly as the client serializes it (integer enums,
  "c" TimeSpans, null properties omitted); QueueInfo is parsed with the server's field names.
- Ping carries a random id (the real client sends one every 30 s; tests call ``ping()``).

Two drivers share that logic: :class:`SocketClient` (a real TCP socket, for interop tests,
benchmarks and the reliability suite) and :class:`LoopbackClient` (a protocol on a Twisted
StringTransport with a memory hub and Clock, for unit tests).
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections import deque
from typing import Any

from mqhub.protocols.vibemq import codec as c
from mqhub.protocols.vibemq.options import QueueOptions

COMMAND_TIMEOUT = 10.0


class VibeError(Exception):
    """An Error frame answered a request: ``code``, ``message`` and the frame."""

    def __init__(self, frame: c.Frame) -> None:
        super().__init__(f"{frame.error_code}: {frame.error_message}")
        self.frame = frame
        self.code = frame.error_code
        self.message = frame.error_message


class ConnectionFailed(Exception):
    """Connect was answered with an Error (the .NET client's "Connection failed: ...")."""

    def __init__(self, frame: c.Frame) -> None:
        super().__init__(f"Connection failed: {frame.error_message}")
        self.frame = frame
        self.code = frame.error_code


def new_id() -> str:
    """A request id like the .NET client's ``Guid.NewGuid().ToString("N")``."""
    return uuid.uuid4().hex


class VibeClientBase:
    """The client logic; subclasses provide ``_send(bytes)`` and ``_recv(timeout) -> bytes``."""

    def __init__(self, max_frame: int = c.DEFAULT_MAX_FRAME) -> None:
        self.decoder = c.FrameDecoder(max_frame)
        self.frames: deque[c.Frame] = deque()
        self.deliveries: deque[c.Frame] = deque()
        self.flag = c.FLAG_NONE
        self.threshold = c.DEFAULT_THRESHOLD
        self.negotiated: str | None = None
        self.received_flags: list[int] = []

    # transport hooks ------------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        raise NotImplementedError

    def _recv(self, timeout: float) -> bytes:
        raise NotImplementedError

    def send_frame(self, frame: c.Frame) -> None:
        """Encode (compressed when negotiated and ≥ threshold) and send."""
        self._send(c.encode(frame, self.flag, self.threshold))

    def send_raw(self, data: bytes) -> None:
        """Send bytes as they are (bad-input tests)."""
        self._send(data)

    def _pump(self, timeout: float) -> bool:
        """Read once; decoded frames go to ``frames`` (Delivers also to ``deliveries``)."""
        data = self._recv(timeout)
        if not data:
            return False
        for f in self.decoder.feed(data):
            assert isinstance(f, c.Frame), f
            self.received_flags.append(f.flags)
            if f.type == c.DELIVER:
                self.deliveries.append(f)
            else:
                self.frames.append(f)
        return True

    def pump(self, timeout: float) -> bool:
        """Read once (up to ``timeout``) into ``frames``/``deliveries``; False when nothing came."""
        return self._pump(timeout)

    def next_frame(self, timeout: float = COMMAND_TIMEOUT) -> c.Frame:
        """The next non-Deliver frame, whatever its id."""
        deadline = time.monotonic() + timeout
        while not self.frames:
            if time.monotonic() > deadline or not self._pump(max(0.0, deadline - time.monotonic())):
                if time.monotonic() > deadline:
                    raise TimeoutError("no frame")
        return self.frames.popleft()

    def wait_reply(self, msg_id: str, timeout: float = COMMAND_TIMEOUT) -> c.Frame:
        """The frame answering ``msg_id`` (other frames stay queued)."""
        deadline = time.monotonic() + timeout
        while True:
            for f in self.frames:
                if f.id == msg_id:
                    self.frames.remove(f)
                    return f
            if time.monotonic() > deadline:
                raise TimeoutError(f"no reply to {msg_id}")
            self._pump(max(0.0, deadline - time.monotonic()))

    def request(self, type_: int, queue: str | None = None, payload: bytes | None = None,
                headers: dict[str, str] | None = None, timeout: float = COMMAND_TIMEOUT) -> c.Frame:
        """Send a request and return its reply; an Error reply raises :class:`VibeError`."""
        msg_id = new_id()
        self.send_frame(c.Frame(type_, msg_id, queue, payload, headers))
        reply = self.wait_reply(msg_id, timeout)
        if reply.type == c.ERROR:
            raise VibeError(reply)
        return reply

    # commands -------------------------------------------------------------------------------

    def connect(self, username: str | None = None, password: str | None = None,
                compression: str | None = "brotli,gzip") -> c.Frame:
        """Connect and read the next frame, like the .NET client."""
        headers: dict[str, str] = {}
        if username is not None:
            headers["authUsername"] = username
        if password is not None:
            headers["authPassword"] = password
        if compression:
            headers["supported-compression"] = compression
        self.send_frame(c.Frame(c.CONNECT, new_id(), None, None, headers or None))
        reply = self.next_frame()
        if reply.type == c.ERROR:
            raise ConnectionFailed(reply)
        chosen = (reply.headers or {}).get("negotiated-compression")
        self.negotiated = chosen
        self.flag = c.COMPRESSIONS.get(chosen or "", c.FLAG_NONE)
        return reply

    def ping(self) -> c.Frame:
        """Ping with a random id; the Pong has the same id."""
        return self.request(c.PING)

    def publish(self, queue: str, payload: Any = None, headers: dict[str, str] | None = None,
                raw: bytes | None = None) -> c.Frame:
        """Publish one message and wait for its PublishAck."""
        body = raw if raw is not None else (
            None if payload is None else json.dumps(payload, separators=(",", ":")).encode())
        return self.request(c.PUBLISH, queue, body, headers)

    def publish_many(self, queue: str, payloads: list[Any],
                     headers: dict[str, str] | None = None) -> list[str]:
        """Pipeline several publishes (one write); return their ids (acks not awaited)."""
        ids = [new_id() for _ in payloads]
        data = b"".join(c.encode(c.Frame(
            c.PUBLISH, i, queue, json.dumps(p, separators=(",", ":")).encode(), headers),
            self.flag, self.threshold) for i, p in zip(ids, payloads, strict=True))
        self._send(data)
        return ids

    def wait_acks(self, ids: list[str], timeout: float = COMMAND_TIMEOUT) -> list[c.Frame]:
        """The replies to ``ids`` (in ``ids`` order)."""
        return [self.wait_reply(i, timeout) for i in ids]

    def subscribe(self, queue: str) -> c.Frame:
        """Subscribe; SubscribeAck carries the queue."""
        return self.request(c.SUBSCRIBE, queue)

    def unsubscribe(self, queue: str) -> c.Frame:
        """Unsubscribe."""
        return self.request(c.UNSUBSCRIBE, queue)

    def ack(self, deliver: c.Frame | str) -> None:
        """Ack a delivery by its Deliver id (no reply comes)."""
        msg_id = deliver if isinstance(deliver, str) else deliver.id
        self.send_frame(c.Frame(c.ACK, msg_id))

    def ack_many(self, delivers: list[c.Frame]) -> None:
        """Ack several deliveries in one write."""
        self._send(b"".join(c.encode(c.Frame(c.ACK, d.id), self.flag, self.threshold)
                            for d in delivers))

    def receive(self, n: int, timeout: float = COMMAND_TIMEOUT, ack: bool = False) -> list[c.Frame]:
        """Wait for ``n`` deliveries (acking each after "the handler", like the .NET client)."""
        deadline = time.monotonic() + timeout
        while len(self.deliveries) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.deliveries)} of {n} deliveries")
            self._pump(max(0.0, deadline - time.monotonic()))
        got = [self.deliveries.popleft() for _ in range(n)]
        if ack:
            self.ack_many(got)
        return got

    def create_queue(self, queue: str, options: QueueOptions | None = None) -> c.Frame:
        """CreateQueue with the options JSON as the .NET client writes it."""
        return self.request(c.CREATE_QUEUE, queue, options.to_json() if options else None)

    def delete_queue(self, queue: str) -> c.Frame:
        """DeleteQueue."""
        return self.request(c.DELETE_QUEUE, queue)

    def queue_info(self, queue: str) -> dict[str, Any] | None:
        """QueueInfo parsed (None when the server sent no payload: unknown queue)."""
        reply = self.request(c.QUEUE_INFO, queue)
        return reply.json()

    def list_queues(self) -> list[str]:
        """ListQueues."""
        return list(self.request(c.LIST_QUEUES).json())

    def disconnect(self) -> None:
        """Send Disconnect (no reply)."""
        self.send_frame(c.Frame(c.DISCONNECT, new_id()))


class SocketClient(VibeClientBase):
    """The client over a real TCP socket."""

    def __init__(self, port: int, host: str = "127.0.0.1", **kw: Any) -> None:
        super().__init__(**kw)
        self.sock = socket.create_connection((host, port), timeout=COMMAND_TIMEOUT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.closed = False

    def _send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _recv(self, timeout: float) -> bytes:
        self.sock.settimeout(max(0.01, timeout))
        try:
            data = self.sock.recv(1 << 20)
        except TimeoutError:
            return b""
        if not data:
            self.closed = True
            raise ConnectionError("server closed the connection")
        return data

    def is_closed(self, timeout: float = 5.0) -> bool:
        """Whether the server closes the socket within ``timeout`` (frames read meanwhile kept)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self._pump(0.1)
            except (ConnectionError, OSError):
                return True
        return False

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()


class LoopbackClient(VibeClientBase):
    """The client over a StringTransport connected to a factory on a memory hub (unit tests).

    Waiting advances the hub's Clock by 0 a few turns so commits land; ``timeout`` is in turns
    of ``step`` seconds of the Clock (so ack-timeout tests advance time explicitly instead).
    """

    def __init__(self, hub: Any, factory: Any, port: int = 40000, **kw: Any) -> None:
        from mqhub.testing import connect

        super().__init__(**kw)
        self.hub = hub
        self.proto, self.transport = connect(factory, port=port)

    def _send(self, data: bytes) -> None:
        self.proto.dataReceived(data)

    def _recv(self, timeout: float) -> bytes:
        from mqhub.testing import settle, take_output

        for _ in range(5):
            data = take_output(self.transport)
            if data:
                return data
            settle(self.hub)
        data = take_output(self.transport)
        if not data:
            raise TimeoutError("nothing written by the server")
        return data

    @property
    def disconnected(self) -> bool:
        """Whether the server closed this connection."""
        return bool(self.transport.disconnecting or not self.transport.connected)
