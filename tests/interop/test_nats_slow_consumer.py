"""The slow-consumer rule on real sockets: a subscriber that stops reading is cut, nobody waits.

One subscriber stops reading its socket, a second one reads, a publisher sends 1 KiB PUBs
as fast as the broker takes them. The stalled one must be cut (nats-server's rule, without
-ERR, counted in ``slow_consumers``), the reading one must never go 0.5 s without a message,
the publisher's sends must never block for 0.5 s, and the broker's memory stays bounded by
the pending budget.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import pytest

from mqhub.protocols.nats import codec
from tests.interop.admin_client import get
from tests.interop.broker import BrokerProcess
from tests.reliability.targets.natsock import NatsSocket

pytestmark = pytest.mark.interop

#: the pending budget the broker runs with here (small, so the test is short)
MAX_PENDING = 16 * 1024 * 1024
#: the longest a reader or the publisher may wait because of the stalled subscriber (s)
LIMIT = 0.5
#: how long the publisher floods (s)
FLOOD_SECONDS = 2.5


def rss_anon_mib(pid: int) -> float:
    """Anonymous resident memory of ``pid`` in MiB."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024.0
    raise AssertionError("no RssAnon")


class Reader(threading.Thread):
    """Reads everything its subscription gets; remembers the longest gap between reads."""

    def __init__(self, sock: socket.socket) -> None:
        """Read from ``sock`` until stopped."""
        super().__init__(daemon=True)
        self.sock = sock
        self.sock.settimeout(0.05)
        self.bytes = 0
        self.last = 0.0
        self.longest = 0.0
        self.running = True
        self.cut = False

    def run(self) -> None:
        """Read and time the gaps (from the first byte on)."""
        while self.running:
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                continue
            except OSError:
                data = b""
            if not data:
                self.cut = True
                return
            now = time.monotonic()
            if self.last:
                self.longest = max(self.longest, now - self.last)
            self.last = now
            self.bytes += len(data)


def test_a_stalled_subscriber_is_cut_and_delays_nobody(
        make_broker: Callable[..., BrokerProcess]) -> None:
    """Reader gaps and publisher sends stay under 0.5 s; the stalled subscriber is cut; RSS bounded."""
    broker = make_broker(["nats"], extra_args=[
        "--durability", "none", "--option", f"nats.max_pending={MAX_PENDING}"])
    assert broker.process is not None
    port = broker.port("mq9", "tcp")
    stalled = NatsSocket(port)
    stalled.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.send(codec.encode_sub("flood", "1") + b"PING\r\n")
    stalled.until(lambda e: e[0] == codec.OP_PONG)
    reading = NatsSocket(port)
    reading.send(codec.encode_sub("flood", "1") + b"PING\r\n")
    reading.until(lambda e: e[0] == codec.OP_PONG)
    pub = NatsSocket(port)
    before = rss_anon_mib(broker.process.pid)
    reader = Reader(reading.sock)
    reader.start()
    chunk = codec.encode_pub("flood", b"x" * 1024) * 64
    longest_send = 0.0
    peak = before
    end = time.monotonic() + FLOOD_SECONDS
    sent = 0
    while time.monotonic() < end:
        t0 = time.monotonic()
        pub.sock.sendall(chunk)
        longest_send = max(longest_send, time.monotonic() - t0)
        sent += len(chunk)
        if sent % (64 * len(chunk)) == 0:
            peak = max(peak, rss_anon_mib(broker.process.pid))
    pub.send(b"PING\r\n")
    pub.until(lambda e: e[0] == codec.OP_PONG)
    reader.running = False
    reader.join(5)
    # the stalled subscriber was cut: draining its socket ends in EOF (or a reset), no -ERR
    stalled.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    stalled.sock.settimeout(5)
    tail = b""
    try:
        while chunk_in := stalled.sock.recv(1 << 20):
            tail = (tail + chunk_in)[-4096:]
    except ConnectionResetError:
        pass
    assert b"-ERR" not in tail
    assert get(broker, "/api/stats")["protocols"]["mq9"]["slow_consumers"] == 1
    assert not reader.cut, "the reading subscriber was cut"
    assert reader.bytes > MAX_PENDING, "the reading subscriber got the flood"
    assert reader.longest < LIMIT, f"the reading subscriber waited {reader.longest:.2f} s"
    assert longest_send < LIMIT, f"a publisher send blocked {longest_send:.2f} s"
    assert sent > 4 * MAX_PENDING, "the publisher went on past the stalled subscriber's budget"
    assert peak - before < 4 * MAX_PENDING / (1 << 20), f"RSS grew {peak - before:.0f} MiB"
