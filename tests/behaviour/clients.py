"""Blocking drivers for the behaviour suite: one publisher and one consumer shape per protocol.

Every driver speaks to a real broker on 127.0.0.1 with the client users have (nats-py,
redis-py, pyzmq frames as eventmq sends them) or, for NSQ, a small raw-socket client written
here from the wire format, so that the suite does not depend on the project's own NSQ codec.
Waiting is always a condition polled against a deadline.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import socket
import struct
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import nats
import redis
import zmq

from tests.interop.broker import WAIT, wait_until

HOST = "127.0.0.1"


class Publisher(Protocol):
    """Publishes bodies to a hub address and returns once the broker has taken them."""

    def publish(self, address: str, bodies: list[bytes]) -> None:
        """Publish ``bodies`` in order to ``address``."""

    def close(self) -> None:
        """Release the connection."""


class Consumer(Protocol):
    """A subscription on one address that is live when the constructor returns."""

    def take(self, count: int, timeout: float = WAIT) -> list[bytes]:
        """The next ``count`` bodies, in arrival order, within ``timeout``."""

    def close(self) -> None:
        """Release the connection."""


# NSQ (raw TCP, protocol V2) -----------------------------------------------------------------

NSQ_RESPONSE, NSQ_ERROR, NSQ_MESSAGE = 0, 1, 2


class NsqConnection:
    """A raw NSQ V2 connection: frames in, commands out, heartbeats answered."""

    def __init__(self, port: int) -> None:
        """Connect and send the ``  V2`` magic."""
        self.sock = socket.create_connection((HOST, port), timeout=WAIT)
        self.sock.sendall(b"  V2")
        self.buffer = b""
        self.closed = False

    def send(self, data: bytes) -> None:
        """Send raw command bytes."""
        self.sock.sendall(data)

    def frames(self, timeout: float = 0.2) -> list[tuple[int, bytes]]:
        """Frames (type, data) that arrive within ``timeout``; [] on silence."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 20)
        except TimeoutError:
            return []
        if not data:
            self.closed = True
            return []
        self.buffer += data
        out: list[tuple[int, bytes]] = []
        while len(self.buffer) >= 8:
            (size,) = struct.unpack(">I", self.buffer[:4])
            if len(self.buffer) < 4 + size:
                break
            (kind,) = struct.unpack(">I", self.buffer[4:8])
            payload = self.buffer[8:4 + size]
            self.buffer = self.buffer[4 + size:]
            if (kind, payload) == (NSQ_RESPONSE, b"_heartbeat_"):
                self.send(b"NOP\n")
                continue
            out.append((kind, payload))
        return out

    def expect(self, kind: int, timeout: float = WAIT) -> bytes:
        """The next frame, which must be of ``kind``; returns its data."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.frames()
            if got:
                assert len(got) == 1 and got[0][0] == kind, f"unexpected NSQ frames {got}"
                return got[0][1]
            assert not self.closed, "NSQ connection closed by the broker"
            assert time.monotonic() < deadline, "no NSQ frame in time"

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()


class NsqPublisher:
    """NSQ ``PUB`` over TCP, one command at a time, each confirmed by ``OK``."""

    def __init__(self, port: int) -> None:
        """Connect to the NSQ TCP port."""
        self.conn = NsqConnection(port)

    def publish(self, address: str, bodies: list[bytes]) -> None:
        """PUB each body and wait for its OK."""
        for body in bodies:
            self.conn.send(b"PUB %s\n%s%s" % (address.encode(), struct.pack(">I", len(body)), body))
            assert self.conn.expect(NSQ_RESPONSE) == b"OK"

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()


class NsqMpubPublisher(NsqPublisher):
    """NSQ ``MPUB`` over TCP: all bodies in one command, confirmed by one ``OK``."""

    def publish(self, address: str, bodies: list[bytes]) -> None:
        """MPUB every body at once and wait for the OK."""
        parts = [struct.pack(">I", len(bodies))]
        for body in bodies:
            parts += [struct.pack(">I", len(body)), body]
        payload = b"".join(parts)
        self.conn.send(b"MPUB %s\n%s%s" % (address.encode(), struct.pack(">I", len(payload)), payload))
        assert self.conn.expect(NSQ_RESPONSE) == b"OK"


class NsqHttpPublisher:
    """NSQ HTTP ``POST /pub?topic=T`` per body; ``OK`` comes after the commit."""

    def __init__(self, port: int) -> None:
        """:param port: the broker's NSQ HTTP port."""
        self.port = port

    def publish(self, address: str, bodies: list[bytes]) -> None:
        """POST each body and check the 200 ``OK``."""
        for body in bodies:
            url = f"http://{HOST}:{self.port}/pub?topic={urllib.parse.quote(address)}"
            request = urllib.request.Request(url, data=body, method="POST")
            with urllib.request.urlopen(request, timeout=WAIT) as response:
                assert (response.status, response.read()) == (200, b"OK")

    def close(self) -> None:
        """Nothing to close (one HTTP connection per request)."""


class NsqConsumer:
    """An NSQ channel consumer (``SUB topic channel``, ``RDY``); messages are FINished on receipt."""

    def __init__(self, port: int, address: str, channel: str = "behaviour") -> None:
        """SUB to topic ``address`` and open RDY 100."""
        self.conn = NsqConnection(port)
        self.conn.send(b"SUB %s %s\n" % (address.encode(), channel.encode()))
        assert self.conn.expect(NSQ_RESPONSE) == b"OK"
        self.conn.send(b"RDY 100\n")
        self.received: list[bytes] = []
        #: (timestamp ns, attempts, message id) of every message received, in order.
        self.meta: list[tuple[int, int, bytes]] = []

    def take(self, count: int, timeout: float = WAIT) -> list[bytes]:
        """Collect ``count`` messages (FIN each) within ``timeout``."""
        deadline = time.monotonic() + timeout
        while len(self.received) < count:
            assert time.monotonic() < deadline, f"NSQ consumer got only {self.received}"
            for kind, data in self.conn.frames():
                assert kind == NSQ_MESSAGE, f"unexpected NSQ frame {(kind, data)}"
                timestamp, attempts = struct.unpack(">qH", data[:10])
                msg_id, body = data[10:26], data[26:]
                self.meta.append((timestamp, attempts, msg_id))
                self.conn.send(b"FIN %s\n" % msg_id)
                self.received.append(body)
            assert not self.conn.closed, "NSQ consumer closed by the broker"
        taken, self.received = self.received[:count], self.received[count:]
        return taken

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()


# NATS (nats-py on a background event loop) -------------------------------------------------


class AsyncLoop:
    """An asyncio loop on a daemon thread, so blocking tests can drive nats-py."""

    def __init__(self) -> None:
        """Start the loop thread."""
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = WAIT) -> Any:
        """Run ``coro`` on the loop and return its result (bounded by ``timeout``)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        """Stop the loop and join its thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class NatsPublisher:
    """nats-py ``publish`` followed by a flush (the broker has read everything sent)."""

    def __init__(self, loop: AsyncLoop, url: str) -> None:
        """Connect with nats-py."""
        self.loop = loop
        self.nc = loop.run(nats.connect(url, allow_reconnect=False))
        #: Headers sent with every publish (HPUB) when set.
        self.headers: dict[str, str] | None = None

    def publish(self, address: str, bodies: list[bytes]) -> None:
        """Publish every body (with ``headers`` if set), then flush."""
        async def go() -> None:
            """Publish and wait for the PONG."""
            for body in bodies:
                await self.nc.publish(address, body, headers=self.headers)
            await self.nc.flush()
        self.loop.run(go())

    def close(self) -> None:
        """Close the nats-py connection."""
        self.loop.run(self.nc.close())


class NatsConsumer:
    """A nats-py subscriber; live once two flushes (an ordering barrier) returned."""

    def __init__(self, loop: AsyncLoop, url: str, address: str) -> None:
        """Connect, SUB ``address`` and flush twice."""
        self.loop = loop
        self.received: list[bytes] = []
        self.headers: list[Any] = []

        async def go() -> Any:
            """Connect and subscribe."""
            nc = await nats.connect(url, allow_reconnect=False)

            async def on_message(msg: Any) -> None:
                """Collect one message."""
                self.headers.append(msg.headers)
                self.received.append(msg.data)

            await nc.subscribe(address, cb=on_message)
            await nc.flush()
            await nc.flush()
            return nc

        self.nc = loop.run(go())

    def take(self, count: int, timeout: float = WAIT) -> list[bytes]:
        """Wait for ``count`` messages and return them."""
        wait_until(lambda: len(self.received) >= count, f"{count} NATS messages (got {self.received})",
                   timeout)
        taken, self.received[:] = self.received[:count], self.received[count:]
        return taken

    @property
    def connected(self) -> bool:
        """Whether nats-py still has its connection."""
        return bool(self.nc.is_connected)

    def close(self) -> None:
        """Close the nats-py connection."""
        self.loop.run(self.nc.close())


# Redis example plugin (redis-py) -----------------------------------------------------------


class RedisPublisher:
    """redis-py ``PUBLISH``; each returns after the broker stored and counted receivers."""

    def __init__(self, port: int) -> None:
        """Open a redis-py client (RESP3, redis-py's default handshake)."""
        self.conn = redis.Redis(host=HOST, port=port, protocol=3, socket_timeout=WAIT)

    def publish(self, address: str, bodies: list[bytes]) -> None:
        """PUBLISH each body; at least one receiver must be counted."""
        for body in bodies:
            assert self.conn.publish(address, body) >= 1

    def close(self) -> None:
        """Close the client."""
        self.conn.close()


class RedisConsumer:
    """A redis-py ``SUBSCRIBE``; live once the subscribe confirmation arrived."""

    def __init__(self, port: int, address: str) -> None:
        """SUBSCRIBE ``address`` and wait for the confirmation."""
        self.conn = redis.Redis(host=HOST, port=port, protocol=3, socket_timeout=WAIT)
        self.pubsub = self.conn.pubsub()
        self.pubsub.subscribe(address)
        deadline = time.monotonic() + WAIT
        while True:
            assert time.monotonic() < deadline, "SUBSCRIBE not confirmed"
            message = self.pubsub.get_message(timeout=0.2)
            if message is not None:
                assert message["type"] == "subscribe", message
                break

    def take(self, count: int, timeout: float = WAIT) -> list[bytes]:
        """The next ``count`` ``message`` pushes' data."""
        got: list[bytes] = []
        deadline = time.monotonic() + timeout
        while len(got) < count:
            assert time.monotonic() < deadline, f"Redis subscriber got only {got}"
            message = self.pubsub.get_message(timeout=0.2)
            if message is not None:
                assert message["type"] == "message", message
                got.append(message["data"])
        return got

    def close(self) -> None:
        """Close the pub/sub connection and the client."""
        self.pubsub.close()
        self.conn.close()


# eMQP (ZeroMQ frames as eventmq's publisher sends them) -------------------------------------

EMQP_VERSION = b"eMQP/1.0"


class EmqpPublisher:
    """eMQP ``PUBLISH`` frames on a DEALER connected to the pub-in ROUTER.

    eMQP has no publish confirmation; callers wait for the consumer instead (a DEALER queues
    frames until connected, so nothing is lost to ZeroMQ's slow-joiner effect).
    """

    def __init__(self, address: str) -> None:
        """Connect a DEALER to ``address`` (a ``tcp://`` ZeroMQ address)."""
        self.sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)

    def send(self, frames: list[bytes]) -> None:
        """Send raw frames (the ROUTER prepends our routing id)."""
        self.sock.send_multipart(frames)

    def publish(self, address: str, bodies: list[bytes]) -> None:
        """Send one 6-frame PUBLISH per body."""
        for body in bodies:
            msgid = str(uuid.uuid4()).encode()
            self.send([b"", EMQP_VERSION, b"PUBLISH", msgid, address.encode(), body])

    def close(self) -> None:
        """Close the socket."""
        self.sock.close(linger=0)


# mq9 mailboxes (nats-py requests and subscriptions) -----------------------------------------


def create_mailbox(loop: AsyncLoop, url: str) -> tuple[str, str]:
    """``$mq9.AI.MAILBOX.CREATE`` a standard mailbox; return (inbox subject prefix, token)."""
    async def go() -> dict[str, Any]:
        """Connect, request, disconnect."""
        nc = await nats.connect(url, allow_reconnect=False)
        try:
            reply = await nc.request("$mq9.AI.MAILBOX.CREATE", b'{"type":"standard"}', timeout=WAIT)
        finally:
            await nc.close()
        return dict(json.loads(reply.data))

    created = loop.run(go())
    assert "error" not in created, created
    return str(created["inbox"]), str(created["token"])


class Mq9PushConsumer(NatsConsumer):
    """A new mq9 mailbox read by SUB push (``$mq9.AI.INBOX.{id}.*``); bodies arrive as bytes.

    :ivar address: the mailbox's ``normal`` INBOX subject, where publishers send.
    """

    def __init__(self, loop: AsyncLoop, url: str) -> None:
        """Create the mailbox and subscribe to all its priorities."""
        inbox, _token = create_mailbox(loop, url)
        self.address = f"{inbox}.normal"
        super().__init__(loop, url, f"{inbox}.*")


class Mq9QueryConsumer:
    """A new mq9 mailbox read by ``MAILBOX.QUERY`` (JSON; non-UTF-8 bodies come as base64).

    :ivar address: the mailbox's ``normal`` INBOX subject, where publishers send.
    :ivar encodings: the ``encoding`` of every message taken, in order.
    """

    def __init__(self, loop: AsyncLoop, url: str) -> None:
        """Create the mailbox and keep a nats-py connection for queries."""
        self.loop = loop
        inbox, self.token = create_mailbox(loop, url)
        self.address = f"{inbox}.normal"
        self.query_subject = "$mq9.AI.MAILBOX.QUERY." + inbox.rsplit(".", 1)[1]
        self.nc = loop.run(nats.connect(url, allow_reconnect=False))
        self.encodings: list[str] = []

    def _query(self) -> list[dict[str, Any]]:
        """One QUERY: the unread messages (they are marked read)."""
        async def go() -> Any:
            """Request and decode the JSON reply."""
            request = json.dumps({"token": self.token}).encode()
            return json.loads((await self.nc.request(self.query_subject, request, timeout=WAIT)).data)

        reply = self.loop.run(go())
        assert "error" not in reply, reply
        return list(reply["messages"])

    def take(self, count: int, timeout: float = WAIT) -> list[bytes]:
        """Query until ``count`` messages arrived; decode each by its ``encoding``."""
        got: list[bytes] = []
        deadline = time.monotonic() + timeout
        while len(got) < count:
            assert time.monotonic() < deadline, f"mailbox query returned only {got}"
            for item in self._query():
                self.encodings.append(item["encoding"])
                if item["encoding"] == "base64":
                    got.append(base64.b64decode(item["payload"]))
                else:
                    assert item["encoding"] == "utf-8", item
                    got.append(item["payload"].encode("utf-8"))
            if len(got) < count:
                time.sleep(0.01)
        return got

    def close(self) -> None:
        """Close the nats-py connection."""
        self.loop.run(self.nc.close())


# MQKS (raw text lines, as the original client library writes them) ---------------------------

_MQKS_IDS = itertools.count()


class MqksPublisher:
    """``publish --confirm``, one line per body; returns once every ``ok `` arrived."""

    def __init__(self, port: int) -> None:
        """Connect."""
        self.sock = socket.create_connection((HOST, port), timeout=WAIT)
        self.buf = b""

    def publish(self, address: str, bodies: list[bytes]) -> None:
        """Publish each body (it must be one an MQKS line can carry) and wait for the confirms."""
        ids = [b"p%d" % next(_MQKS_IDS) for _ in bodies]
        self.sock.sendall(b"".join(i + b" publish --confirm " + address.encode() + b" " + body + b"\n"
                                   for i, body in zip(ids, bodies, strict=True)))
        want = {i + b" ok " for i in ids}
        while want:
            data = self.sock.recv(65536)
            assert data, "MQKS connection closed"
            self.buf += data
            *lines, self.buf = self.buf.split(b"\n")
            for line in lines:
                assert b" error " not in line, line
                want.discard(line)

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()


class MqksConsumer:
    """An MQKS queue of its own bound to the address (auto-ack); bodies decoded by the MQKS rule
    (``enc=json`` / ``enc=base64``, see docs/protocols/mqks.md)."""

    def __init__(self, port: int, address: str) -> None:
        """``consume --confirm`` a fresh queue bound to ``address``; live once confirmed."""
        self.sock = socket.create_connection((HOST, port), timeout=WAIT)
        self.cid = b"c%d" % next(_MQKS_IDS)
        queue = f"behaviour-{uuid.uuid4().hex[:12]}"
        self.sock.sendall(self.cid + b" consume --confirm " + f"{queue} {address}".encode() + b"\n")
        self.buf = b""
        self.lines: list[bytes] = []
        self._read_until(lambda: self.cid + b" ok " in self.lines)
        self.lines.remove(self.cid + b" ok ")

    def _read_until(self, cond: Callable[[], bool], timeout: float = WAIT) -> None:
        """Read lines until ``cond()``."""
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, f"MQKS consumer got only {self.lines[:5]!r}"
            self.sock.settimeout(0.2)
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                continue
            assert data, "MQKS connection closed"
            self.buf += data
            *lines, self.buf = self.buf.split(b"\n")
            self.lines.extend(lines)

    def take(self, count: int, timeout: float = WAIT) -> list[bytes]:
        """The next ``count`` message bodies, decoded."""
        self._read_until(lambda: len(self.lines) >= count, timeout)
        got, self.lines = self.lines[:count], self.lines[count:]
        out = []
        for line in got:
            cid, ok, _mid, props, data = line.split(b" ", 4)
            assert (cid, ok) == (self.cid, b"ok"), line
            prop = dict(p.split(b"=", 1) for p in props.split(b","))
            if prop.get(b"enc") == b"base64":
                data = base64.b64decode(data)
            elif prop.get(b"enc") == b"json":
                data = json.loads(data).encode()
            out.append(data)
        return out

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()
