"""NSQ durability against a real broker: every OK'd message survives SIGKILL; DPUB/REQ delays too."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from mqhub.protocols.nsq import codec as wire
from tests.interop.broker import BrokerProcess

pytestmark = pytest.mark.interop


class NsqSocket:
    """A minimal blocking NSQ client built on the project's codec (for load and crash tests)."""

    def __init__(self, port: int) -> None:
        """Connect to 127.0.0.1:``port`` and send the V2 magic."""
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.sendall(wire.MAGIC_V2)
        self.codec = wire.ClientCodec()

    def send(self, data: bytes) -> None:
        """Send raw command bytes."""
        self.sock.sendall(data)

    def read(self, timeout: float = 0.5) -> list[Any]:
        """Frames that arrive within ``timeout`` (answers heartbeats with NOP); [] on silence."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 20)
        except TimeoutError:
            return []
        if not data:
            raise ConnectionError("closed by broker")
        self.codec.receive_data(data)
        frames = self.codec.frames()
        if any(f == wire.Response(wire.HEARTBEAT) for f in frames):
            self.send(b"NOP\n")
        return frames

    def consume(self, topic: str, channel: str, want: Callable[[list[bytes]], bool],
                timeout: float = 20.0, fin: bool = True) -> list[wire.Message]:
        """SUB, RDY 2500 and collect (and FIN) messages until ``want(bodies)`` or the deadline."""
        self.send(wire.encode_sub(topic, channel) + wire.encode_rdy(2500))
        got: list[wire.Message] = []
        deadline = time.monotonic() + timeout
        while not want([m.body for m in got]):
            if time.monotonic() > deadline:
                raise AssertionError(f"only {len(got)} messages before the deadline")
            msgs = [f for f in self.read() if isinstance(f, wire.Message)]
            if fin and msgs:
                self.send(b"".join(wire.encode_fin(m.msg_id) for m in msgs))
            got.extend(msgs)
        return got

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()


def http_post(broker: BrokerProcess, path: str, body: bytes = b"") -> bytes:
    """POST to the broker's NSQ HTTP API."""
    url = f"http://127.0.0.1:{broker.port('nsq', 'http')}{path}"
    with urllib.request.urlopen(urllib.request.Request(url, data=body, method="POST"), timeout=5) as r:
        return r.read()


def channel_stats(broker: BrokerProcess, topic: str, channel: str) -> dict[str, Any]:
    """One channel's entry of /stats?format=json."""
    url = f"http://127.0.0.1:{broker.port('nsq', 'http')}/stats?format=json&topic={topic}"
    with urllib.request.urlopen(url, timeout=5) as r:
        stats = json.loads(r.read())
    (t,) = stats["topics"]
    return next(c for c in t["channels"] if c["channel_name"] == channel)


def test_every_ok_survives_sigkill_during_pub_load(make_broker: Callable[..., BrokerProcess]) -> None:
    """SIGKILL during a pipelined PUB load: after restart every message that got OK is delivered."""
    broker = make_broker(["nsq"])
    http_post(broker, "/topic/create?topic=crash")
    http_post(broker, "/channel/create?topic=crash&channel=c")
    confirmed = [0]
    stop = threading.Event()

    def produce() -> None:
        """Pipelined PUB load counting OKs until the broker dies."""
        client = NsqSocket(broker.port("nsq", "tcp"))
        seq = 0
        try:
            while not stop.is_set():
                client.send(b"".join(wire.encode_pub("crash", b"msg-%d" % (seq + i)) for i in range(200)))
                seq += 200
                while confirmed[0] < seq - 600:  # keep about three batches in flight
                    confirmed[0] += sum(1 for f in client.read(2.0) if f == wire.Response(b"OK"))
        except (ConnectionError, OSError):
            pass
        finally:
            client.close()

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while confirmed[0] < 5000 and time.monotonic() < deadline:
        time.sleep(0.01)
    broker.kill()
    stop.set()
    thread.join(10)
    ok_count = confirmed[0]
    assert ok_count >= 5000, "the producer never got going"
    broker.start()
    expected = {b"msg-%d" % i for i in range(ok_count)}
    consumer = NsqSocket(broker.port("nsq", "tcp"))
    got = consumer.consume("crash", "c", lambda bodies: expected <= set(bodies), timeout=30)
    consumer.close()
    assert expected <= {m.body for m in got}


def test_deferred_and_requeued_messages_survive_restart(make_broker: Callable[..., BrokerProcess]) -> None:
    """A DPUB and a REQ with delay, both pending at SIGKILL, are delivered after the restart."""
    broker = make_broker(["nsq"])
    port = broker.port("nsq", "tcp")
    consumer = NsqSocket(port)
    consumer.send(wire.encode_sub("later", "c") + wire.encode_rdy(10))
    assert wire.Response(b"OK") in consumer.read(2.0)
    producer = NsqSocket(port)
    producer.send(wire.encode_pub("later", b"requeue-me") + wire.encode_dpub("later", 1500, b"deferred"))
    frames: list[Any] = []
    deadline = time.monotonic() + 5
    while frames.count(wire.Response(b"OK")) < 2 and time.monotonic() < deadline:
        frames += producer.read()
    assert frames.count(wire.Response(b"OK")) == 2
    msgs: list[Any] = []
    while not msgs and time.monotonic() < deadline:
        msgs = [f for f in consumer.read() if isinstance(f, wire.Message)]
    assert [m.body for m in msgs] == [b"requeue-me"]
    consumer.send(wire.encode_req(msgs[0].msg_id, 1500))
    deadline = time.monotonic() + 5
    while channel_stats(broker, "later", "c")["requeue_count"] < 1:  # the REQ reached the broker
        assert time.monotonic() < deadline, "REQ not seen by the broker"
        time.sleep(0.02)
    broker.kill()
    broker.start()
    after = NsqSocket(broker.port("nsq", "tcp"))
    got = after.consume("later", "c", lambda b: {b"requeue-me", b"deferred"} <= set(b), timeout=15)
    after.close()
    # at least once: both come back (the REQ's own commit may or may not have landed before the
    # SIGKILL, so the attempts count is not asserted here; the unit tests check it on restart)
    assert {m.body for m in got} >= {b"requeue-me", b"deferred"}
