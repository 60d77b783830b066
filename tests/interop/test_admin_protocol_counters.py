"""The protocols' own counters (NATS slow consumers, refused bridged messages) in /api/stats and
/metrics, made non-zero by real clients on raw sockets against a running broker."""

from __future__ import annotations

import select
import socket
import time
from typing import Any

import pytest

from tests.interop.admin_client import call, get, queue_row, wait_for
from tests.interop.nsq_client import ok
from tests.interop.test_admin_api import metric_totals

pytestmark = pytest.mark.interop

#: NATS settings that make a subscriber that never reads a slow consumer within a second
SLOW_OPTIONS = ["--option", "mq9.max_pending=1048576", "--option", "mq9.write_deadline=0.5"]


def nats_client(port: int) -> socket.socket:
    """A connected NATS client (INFO read, CONNECT sent, PONG received)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.recv(4096)  # INFO
    sock.sendall(b'CONNECT {"verbose":false}\r\nPING\r\n')
    got = b""
    while b"PONG" not in got:
        chunk = sock.recv(4096)
        assert chunk, "server closed the connection"
        got += chunk
    return sock


def pub_and_ping(sock: socket.socket, subject: str, body: bytes) -> None:
    """PUB one message and wait for the PONG that follows it (the server has read the PUB)."""
    sock.sendall(b"PUB %s %d\r\n%s\r\nPING\r\n" % (subject.encode(), len(body), body))
    got = b""
    while b"PONG" not in got:
        chunk = sock.recv(4096)
        assert chunk, "server closed the connection"
        got += chunk
    assert b"-ERR" not in got


def protocol_row(broker: Any) -> dict[str, Any]:
    """The mq9 (NATS) row of /api/stats."""
    return get(broker, "/api/stats")["protocols"]["mq9"]


def flood_until_slow(broker: Any, pub: socket.socket, subject: str, timeout: float) -> None:
    """Publish 1 KiB messages to ``subject`` without blocking until a slow consumer is counted."""
    frame = b"PUB %s 1024\r\n%s\r\n" % (subject.encode(), b"x" * 1024)
    chunk = frame * 64
    pending = memoryview(chunk)
    pub.setblocking(False)
    deadline = time.monotonic() + timeout
    checked = 0.0
    while time.monotonic() < deadline:
        _, writable, _ = select.select([], [pub], [], 0.05)
        if writable:
            try:
                pending = pending[pub.send(pending):]
            except BlockingIOError:
                pass
            if not pending:
                pending = memoryview(chunk)
        if time.monotonic() - checked > 0.2:
            checked = time.monotonic()
            if protocol_row(broker)["slow_consumers"] > 0:
                return
    raise AssertionError(f"no slow consumer counted within {timeout} s")


def test_nats_slow_consumer_and_refused_bridge_counters(make_broker: Any) -> None:
    """A NATS subscriber that stops reading is closed and counted as ``slow_consumers``; a NATS
    message a full ``reject`` queue refuses is counted as ``bridge_refused``; both appear in
    /api/stats (the mq9 row) and /metrics (``mqhub_protocol_*_total{protocol="mq9"}``)."""
    broker = make_broker(["nsq", "mq9"], extra_args=["--durability", "none", *SLOW_OPTIONS])
    port = broker.port("mq9", "tcp")
    row = protocol_row(broker)
    assert (row["slow_consumers"], row["bridge_refused"]) == (0, 0)
    assert metric_totals(broker, "mqhub_protocol_slow_consumers") == {"mq9": 0.0}

    # bridge_refused: an NSQ channel on "orders" holding one message at most, refusing more
    ok(broker, "/topic/create?topic=orders")
    ok(broker, "/channel/create?topic=orders&channel=archive")
    status, _ = call(broker, "/api/queues/nsq%2Forders%2Farchive", "PATCH",
                     {"max_size": 1, "overflow": "reject"})
    assert status == 200
    pub = nats_client(port)
    pub_and_ping(pub, "orders", b"kept")
    wait_for(lambda: queue_row(broker, "nsq/orders/archive")["depth"] == 1, "the first kept")
    pub_and_ping(pub, "orders", b"refused")
    wait_for(lambda: protocol_row(broker)["bridge_refused"] == 1, "bridge_refused 1")
    assert queue_row(broker, "nsq/orders/archive")["depth"] == 1
    assert metric_totals(broker, "mqhub_protocol_bridge_refused") == {"mq9": 1.0}

    # slow_consumers: a subscriber that never reads while a publisher floods its subject
    sub = nats_client(port)
    sub.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    pub_and_ping(sub, "warmup", b"w")
    sub.sendall(b"SUB slow 1\r\n")
    pub_and_ping(sub, "warmup", b"w")  # the SUB was read before the flood starts
    try:
        flood_until_slow(broker, pub, "slow", timeout=30.0)
    finally:
        sub.close()
        pub.close()
    row = protocol_row(broker)
    assert row["slow_consumers"] == 1 and row["bridge_refused"] == 1
    assert row["total_connections"] >= 2
    assert metric_totals(broker, "mqhub_protocol_slow_consumers") == {"mq9": 1.0}
