"""VibeMQ on a real broker (``twistd -n mqhub``): users file, compression, SIGKILL durability,
bad input isolation, and cross-protocol NSQ → VibeMQ and VibeMQ → NATS."""

from __future__ import annotations

import json
import random
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path

import brotli
import pytest

from mqhub.protocols.nsq import codec as nsq_wire
from mqhub.protocols.vibemq import codec as c
from mqhub.protocols.vibemq.options import QueueOptions
from tests.interop.broker import BrokerProcess
from tests.interop.nsq_client import NsqSocket
from tests.interop.vibemq_client import ConnectionFailed, SocketClient, new_id

Make = Callable[..., BrokerProcess]


def client(broker: BrokerProcess, **kw: object) -> SocketClient:
    """A connected test client."""
    cl = SocketClient(broker.port("vibemq", "tcp"))
    cl.connect(**kw)  # type: ignore[arg-type]
    return cl


def test_users_file_auth_and_compression(make_broker: Make, tmp_path: Path) -> None:
    users = tmp_path / "users.json"
    users.write_text(json.dumps({"users": [
        {"username": "admin", "password": "secret", "superuser": True}]}))
    broker = make_broker(["vibemq"], extra_args=["--vibemq-users", str(users)])
    a = SocketClient(broker.port("vibemq", "tcp"))
    with pytest.raises(ConnectionFailed) as exc:
        a.connect("admin", "nope")
    assert exc.value.code == "AUTH_FAILED"
    assert a.connect("admin", "secret", compression="gzip,brotli").headers == {
        "negotiated-compression": "gzip"}
    b = client(broker, username="admin", password="secret", compression="brotli")
    b.subscribe("docs")
    big = {"text": "all work and no play " * 300}
    a.publish("docs", big)
    (d,) = b.receive(1, ack=True)
    assert json.loads(d.payload) == big and b.received_flags[-1] == c.FLAG_BROTLI


def test_sigkill_keeps_every_acknowledged_message(make_broker: Make) -> None:
    """Publish in pipelined chunks, SIGKILL at a random moment; every PublishAck'd one survives."""
    broker = make_broker(["vibemq"])
    rng = random.Random(13)
    acked: set[int] = set()
    n = 0
    for _ in range(3):
        pub = client(broker, compression=None)
        sent: dict[str, int] = {}
        stop_after = rng.randrange(300, 1500)
        while len(sent) < stop_after:
            chunk = list(range(n, n + 50))
            n += 50
            for i, p in zip(pub.publish_many("durable", [{"n": k} for k in chunk]), chunk,
                            strict=True):
                sent[i] = p
            try:
                pub._pump(0.001)
            except (ConnectionError, OSError):
                break
            acked.update(sent[f.id] for f in list(pub.frames) if f.type == c.PUBLISH_ACK)
        broker.kill()
        try:
            while pub._pump(0.05):
                pass
        except (ConnectionError, OSError):
            pass
        acked.update(sent[f.id] for f in pub.frames if f.type == c.PUBLISH_ACK)
        pub.close()
        broker.start()
    assert len(acked) > 500
    sub = client(broker, compression=None)
    sub.subscribe("durable")
    seen: set[int] = set()
    deadline = time.monotonic() + 30
    while not acked <= seen:
        assert time.monotonic() < deadline, f"missing {len(acked - seen)} acknowledged messages"
        try:
            got = sub.receive(1, timeout=1.0)
        except TimeoutError:
            continue
        got += [sub.deliveries.popleft() for _ in range(len(sub.deliveries))]
        sub.ack_many(got)
        seen.update(json.loads(d.payload)["n"] for d in got)


BAD_INPUTS = {
    "zero length": struct.pack(">IB", 0, 0),
    "huge length": struct.pack(">IB", 0x7FFFFFFF, 0),
    "bad flags": struct.pack(">IB", 2, 9) + b"\x01\x0a",
    "gzip bomb": None,
    "brotli bomb": None,
    "corrupt gzip": struct.pack(">IB", 4, 1) + b"\x1f\x8b\x00\x00",
}


def _bombs() -> dict[str, bytes]:
    """Decompression bombs: 100 MiB of zeros in a small frame."""
    import gzip
    raw = b"\x01\x14\x00\x01a" + bytes(100 << 20)
    out = {}
    for name, data, flag in (("gzip bomb", gzip.compress(raw, 9), 1),
                             ("brotli bomb", brotli.compress(raw, quality=5), 2)):
        out[name] = struct.pack(">IB", len(data), flag) + data
    return out


def test_bad_input_leaves_other_clients_unaffected(make_broker: Make) -> None:
    broker = make_broker(["vibemq", "nsq"])
    good = client(broker)
    good.subscribe("steady")
    nsq = NsqSocket(broker.port("nsq", "tcp"))
    inputs = {**BAD_INPUTS, **_bombs()}
    for name, data in inputs.items():
        bad = SocketClient(broker.port("vibemq", "tcp"))
        bad.connect()
        bad.send_raw(data)  # type: ignore[arg-type]
        assert bad.is_closed(), f"{name}: connection stayed open"
        errors = [f for f in bad.frames if f.type == c.ERROR]
        assert errors and errors[-1].error_code == "INVALID_MESSAGE", name
        bad.close()
        good.publish("steady", {"after": name})
        (d,) = good.receive(1, ack=True)
        assert json.loads(d.payload) == {"after": name}
    # answered, connection kept: invalid UTF-8 in the queue, bad JSON payload
    kept = client(broker)
    body = b"\x01\x14\x00\x02m1\x00\x02\xff\xfe\x00\x00\x00\x00\x00\x00"
    kept.send_raw(struct.pack(">IB", len(body), 0) + body)
    assert kept.wait_reply("m1").error_code == "INVALID_MESSAGE"
    rid = new_id()
    kept.send_frame(c.Frame(c.PUBLISH, rid, "steady", b'{"unterminated": '))
    assert kept.wait_reply(rid).error_code == "INVALID_MESSAGE"
    assert kept.ping().type == c.PONG
    nsq.send(nsq_wire.encode_pub("other", b"still fine"))
    nsq.read_until(lambda fs: nsq_wire.Response(b"OK") in fs, "nsq OK")
    nsq.close()


def test_cross_protocol_nsq_to_vibemq_and_vibemq_to_nats(make_broker: Make) -> None:
    broker = make_broker(["vibemq", "nsq", "nats"])
    sub = client(broker)
    sub.create_queue("orders", QueueOptions())
    sub.subscribe("orders")
    nsq = NsqSocket(broker.port("nsq", "tcp"))
    nsq.send(nsq_wire.encode_pub("orders", b'{"from":"nsq"}') + nsq_wire.encode_pub("orders", b"hi"))
    first, second = sub.receive(2, ack=True)
    assert json.loads(first.payload) == {"from": "nsq"}
    assert json.loads(second.payload) == "hi" and second.headers["payload-encoding"] == "text"
    nsq.close()

    nats = socket.create_connection(("127.0.0.1", broker.port("mq9", "tcp")), timeout=5)
    nats.sendall(b'CONNECT {"verbose":false,"headers":true}\r\nSUB invoices 1\r\nPING\r\n')
    buf = b""
    deadline = time.monotonic() + 10
    while b"PONG" not in buf:
        assert time.monotonic() < deadline
        buf += nats.recv(65536)
    sub.publish("invoices", {"total": 12.5}, {"tenant": "acme"})
    buf = b""
    while b'{"total":12.5}' not in buf:
        assert time.monotonic() < deadline, buf
        buf += nats.recv(65536)
    assert b"tenant: acme" in buf  # VibeMQ headers become NATS headers
    sub.subscribe("invoices")
    sub.receive(1, ack=True)  # the VibeMQ publish itself, now in the queue
    nats.sendall(b"HPUB invoices 24 31\r\nNATS/1.0\r\nregion: eu\r\n\r\n{\"n\":1}\r\nPING\r\n")
    (d,) = sub.receive(1, ack=True)
    assert json.loads(d.payload) == {"n": 1} and d.headers["region"] == "eu"  # and back
    nats.close()


def test_redirect_to_dlq_dead_letters_the_incoming_message(make_broker: Make) -> None:
    """RedirectToDlq as the original server: a publish to a full queue is acknowledged, goes to
    the dead letters with reason ``overflow`` (readable as ``<queue>.dlq``, kept across a
    restart) and the queue keeps the messages it had."""
    broker = make_broker(["vibemq"])
    pub = client(broker)
    pub.create_queue("orders", QueueOptions(max_queue_size=2, overflow_strategy=3,
                                            enable_dead_letter_queue=True))
    ids = pub.publish_many("orders", [{"n": n} for n in range(4)])
    assert [f.type for f in pub.wait_acks(ids)] == [c.PUBLISH_ACK] * 4
    assert pub.queue_info("orders")["messageCount"] == 2
    broker.restart()
    sub = client(broker)
    sub.subscribe("orders.dlq")
    dead = sub.receive(2, ack=True)
    assert [json.loads(d.payload) for d in dead] == [{"n": 2}, {"n": 3}]
    assert {d.headers["dead-letter-reason"] for d in dead} == {"overflow"}
    sub.subscribe("orders")
    assert [json.loads(d.payload) for d in sub.receive(2, ack=True)] == [{"n": 0}, {"n": 1}]
