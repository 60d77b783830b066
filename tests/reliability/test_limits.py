"""Resource limits against a real broker: stalled consumers, idle connections and churn, huge
inputs. Each test checks the protocol's own error or rule, a bounded broker anonymous RSS
(``RssAnon``: heap and buffers, not the LMDB map's page cache) and a bystander of another
protocol that keeps publishing and receiving.

The RSS bounds are documented in docs/guarantees.md; they are deliberately loose (the machine
is shared and Python's allocator keeps freed arenas) and far below what an unbounded buffer
reaches under the same load.
"""

from __future__ import annotations

import json
import resource
import socket
import struct
import time
import urllib.request
from collections.abc import Callable, Iterator

import psutil
import pytest
import zmq

from mqhub.protocols.nats import codec as nats
from mqhub.protocols.nsq import codec as wire
from tests.interop.admin_client import queue_row
from tests.interop.broker import HOST, BrokerProcess, wait_until
from tests.interop.nsq_client import NsqSocket, channel_stats, ok
from tests.reliability.targets.emqp import Worker, job
from tests.reliability.targets.natsock import NatsSocket

pytestmark = pytest.mark.interop

#: Bound (MiB) on the broker's anonymous RSS under every stalled-consumer and flood scenario below.
RSS_BOUND_MIB = 400
#: How long each producer runs at full speed against a stalled consumer (s).
LOAD_SECONDS = 4.0


@pytest.fixture
def broker(make_broker: Callable[..., BrokerProcess]) -> BrokerProcess:
    """A broker with NSQ, mq9/NATS and eMQP (durability none: the limits, not the disk, are tested)."""
    return make_broker(["nsq", "mq9", "emqp"], extra_args=["--durability", "none"])


def rss_mib(broker: BrokerProcess) -> float:
    """The broker's anonymous resident memory in MiB (heap, buffers: what a flood could grow).

    File-backed pages are left out: the LMDB map of a store that holds the flood's messages is
    resident too while it is hot, but those pages are the page cache of data on disk (bounded by
    the disk and the store's reserve, and reclaimed by the kernel), and a faster broker stores
    more of the flood in the same seconds.
    """
    assert broker.process is not None
    with open(f"/proc/{broker.process.pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024.0
    raise AssertionError("no RssAnon in /proc/PID/status")


class Bystander:
    """An NSQ producer and consumer on their own topic: proves the broker still serves others."""

    def __init__(self, broker: BrokerProcess) -> None:
        """Subscribe to topic ``bystander``."""
        self.port = broker.port("nsq", "tcp")
        self.consumer = NsqSocket(self.port)
        self.consumer.send(wire.encode_sub("bystander", "c") + wire.encode_rdy(100))
        self.consumer.read_until(lambda fs: wire.Response(b"OK") in fs, "SUB OK")
        self.n = 0

    def check(self) -> None:
        """One message round trip within 10 s."""
        self.n += 1
        body = b"still-alive-%d" % self.n
        producer = NsqSocket(self.port)
        producer.send(wire.encode_pub("bystander", body))
        producer.read_until(lambda fs: wire.Response(b"OK") in fs, "bystander OK")
        producer.close()
        msgs = self.consumer.messages_until(1, "the bystander's message")
        assert [m.body for m in msgs] == [body]
        self.consumer.send(wire.encode_fin(msgs[0].msg_id))


class Pusher:
    """Writes a repeated chunk to a non-blocking socket at full speed, never cutting a command."""

    def __init__(self, sock: socket.socket, chunk: bytes) -> None:
        """Make ``sock`` non-blocking."""
        self.sock, self.chunk, self.pending = sock, chunk, b""
        sock.setblocking(False)
        self.sent = 0

    def step(self) -> None:
        """Send what the kernel takes now; the rest waits for the next step."""
        if not self.pending:
            self.pending = self.chunk
        n = self.sock.send(self.pending)
        self.pending = self.pending[n:]
        self.sent += n

    def step_and_drain(self) -> None:
        """Push, then read what the broker answered, so only the broker's side can back up."""
        self.step()
        _drain_replies(self.sock)


def full_speed(seconds: float, step: Callable[[], None], broker: BrokerProcess) -> float:
    """Call ``step`` in a loop for ``seconds``; return the broker's peak RSS seen (MiB)."""
    peak = 0.0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            step()
        except (BlockingIOError, TimeoutError):
            pass  # the broker stopped reading us: back-pressure, which is the rule
        peak = max(peak, rss_mib(broker))
    return peak


def flood_stays_bounded(step: Callable[[], None], broker: BrokerProcess, bystander: Bystander,
                        pusher: Pusher | None = None) -> None:
    """Run ``step`` at full speed for LOAD_SECONDS; the broker's RSS stays under RSS_BOUND_MIB,
    the ``pusher`` (if any) got over 10 MiB out, and the ``bystander`` is still served."""
    peak = full_speed(LOAD_SECONDS, step, broker)
    if pusher is not None:
        assert pusher.sent > 10 << 20, "the producer never got going"
    assert peak < RSS_BOUND_MIB, f"broker RSS {peak:.0f} MiB"
    bystander.check()


def test_nats_subscriber_that_never_reads(broker: BrokerProcess) -> None:
    """A NATS subscriber that never reads, a publisher at full speed: bounded RSS; the slow
    consumer is cut off (nats-server's rule) or the publisher is held back; others go on."""
    bystander = Bystander(broker)
    stalled = NatsSocket(broker.port("mq9"))
    stalled.send(nats.encode_sub("flood", "1") + b"PING\r\n")
    stalled.until(lambda e: e[0] == nats.OP_PONG)
    stalled.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    pub = NatsSocket(broker.port("mq9"))
    pusher = Pusher(pub.sock, nats.encode_pub("flood", b"x" * 1024) * 256)
    flood_stays_bounded(pusher.step, broker, bystander, pusher)
    stalled.close()
    pub.close()


def test_nsq_consumer_at_rdy_2500_that_never_reads(broker: BrokerProcess) -> None:
    """An NSQ consumer with RDY 2500 that never reads, PUBs at full speed: bounded RSS."""
    bystander = Bystander(broker)
    ok(broker, "/topic/create?topic=flood")
    stalled = NsqSocket(broker.port("nsq", "tcp"))
    stalled.send(wire.encode_sub("flood", "c") + wire.encode_rdy(2500))
    stalled.read_until(lambda fs: wire.Response(b"OK") in fs, "SUB OK")
    producer = NsqSocket(broker.port("nsq", "tcp"))
    pusher = Pusher(producer.sock, wire.encode_mpub("flood", [b"y" * 1024] * 256))

    flood_stays_bounded(pusher.step_and_drain, broker, bystander, pusher)
    stalled.close()
    producer.close()


def test_emqp_worker_that_never_answers(broker: BrokerProcess) -> None:
    """An eMQP worker that takes jobs and never answers, a client sending at full speed.

    Regression: the sockets had an unlimited ZeroMQ receive queue, so libzmq read a fast client
    into the broker's memory without bound (770 MiB of anonymous memory after 511k jobs in
    11 s); with RECEIVE_HWM the client is held back by TCP and RSS stays flat.
    """
    bystander = Bystander(broker)
    worker = Worker(broker, "flood", 2500)
    client = zmq.Context.instance().socket(zmq.DEALER)
    client.setsockopt(zmq.LINGER, 0)
    client.setsockopt(zmq.SNDHWM, 1000)
    client.connect(broker.url("emqp", "frontend"))
    body = job(b"z" * 512)
    seq = [0]

    def step() -> None:
        for _ in range(200):
            seq[0] += 1
            client.send_multipart([b"", b"eMQP/1.0", b"REQUEST", b"j%d" % seq[0], b"flood", b"", body],
                                  flags=zmq.NOBLOCK)

    flood_stays_bounded(lambda: _ignore_again(step), broker, bystander)
    client.close(linger=0)
    worker.close()


def test_big_bodies_to_a_stalled_consumer(broker: BrokerProcess) -> None:
    """NSQ PUBs of 1 MiB bodies (nsqd's largest) to a channel whose consumer took one and never
    FINs: 600 MiB in all, far more than RSS_BOUND_MIB; each PUB waits for its OK, so nothing
    piles up in front of the queue and what is measured is the queue's own memory.

    Regression (defect 7): a queue's window was bounded by entry count only (10,000), so every
    waiting message stayed in memory (4 MiB eMQP jobs took the broker to 2.1 GiB in 7 s); now
    the window and the remembered backlog tail keep at most ``window_bytes`` (64 MiB) of bodies
    each and the rest stays in the store only.
    """
    bystander = Bystander(broker)
    ok(broker, "/topic/create?topic=big")
    ok(broker, "/channel/create?topic=big&channel=c")
    port = broker.port("nsq", "tcp")
    stalled = NsqSocket(port)
    stalled.send(wire.encode_sub("big", "c") + wire.encode_rdy(1))
    producer = NsqSocket(port)
    body = b"b" * (1 << 20)
    peak = 0.0
    for i in range(600):
        producer.send(wire.encode_pub("big", b"%06d" % i + body[6:]))
        producer.read_until(lambda fs: wire.Response(b"OK") in fs, "the PUB's OK")
        if i % 10 == 0:
            peak = max(peak, rss_mib(broker))
    peak = max(peak, rss_mib(broker))
    stats = channel_stats(broker, "big", "c")
    assert (stats["depth"], stats["in_flight_count"]) == (599, 1), stats
    assert peak < RSS_BOUND_MIB, f"broker RSS {peak:.0f} MiB after 600 bodies of 1 MiB"
    bystander.check()
    producer.close()
    stalled.close()


#: --window-bytes, --windows-bytes, --tails-bytes of the many-queues run below (MiB): twelve
#: windows of 32 MiB (384 MiB, what the broker held before the windows shared an account) could
#: not fit the bound with the tails; 64 MiB for all windows and 64 MiB for all tails do
MANY_QUEUES_PAGING = (32, 64, 64)


def test_big_bodies_into_many_queues(make_broker: Callable[..., BrokerProcess]) -> None:
    """NSQ PUBs of 1 MiB into 12 topics of one channel each, nobody consuming: 40 each, 480 MiB
    in all; each PUB waits for its OK. All windows together hold at most ``--windows-bytes`` (plus
    one body per queue), so the broker's memory does not grow with the number of queues.

    Regression: each queue's window was bounded (``window_bytes``) but the windows had no global
    cap, so twelve of them held 12 x 32 MiB here (peak anonymous RSS 493 MiB, over the bound;
    174 MiB with the account).
    """
    window, windows, tails = (str(m << 20) for m in MANY_QUEUES_PAGING)
    broker = make_broker(["nsq"], extra_args=[
        "--durability", "none", "--window-bytes", window, "--windows-bytes", windows,
        "--tails-bytes", tails])
    bystander = Bystander(broker)
    topics = [f"big{n}" for n in range(12)]
    for topic in topics:
        ok(broker, f"/topic/create?topic={topic}")
        ok(broker, f"/channel/create?topic={topic}&channel=c")
    producer = NsqSocket(broker.port("nsq", "tcp"))
    body = b"b" * (1 << 20)
    peak = 0.0
    for i in range(40):
        for topic in topics:
            producer.send(wire.encode_pub(topic, b"%06d" % i + body[6:]))
            producer.read_until(lambda fs: wire.Response(b"OK") in fs, "the PUB's OK")
        peak = max(peak, rss_mib(broker))
    for topic in topics:
        assert channel_stats(broker, topic, "c")["depth"] == 40
    assert peak < RSS_BOUND_MIB, f"broker RSS {peak:.0f} MiB after 12 x 40 bodies of 1 MiB"
    print(f"NSQ 12 queues x 40 x 1 MiB: peak broker RSS {peak:.0f} MiB")
    bystander.check()
    producer.close()


def test_big_emqp_jobs_sent_without_waiting(broker: BrokerProcess) -> None:
    """300 eMQP jobs of 2 MiB (600 MiB) sent at full speed, never waiting for an ACK, to a
    queue whose worker took one and never answers.

    Regression: ZeroMQ's receive queue was bounded in messages only (RECEIVE_HWM 10,000 per
    peer), so libzmq read all of them into the broker before it handled them (0.7-0.87 GiB peak
    RSS). Now the frontend buffers FRONTEND_HWM (16) messages per client, reads are capped in
    bytes and the frontend pauses while UNSTORED_BYTES await their commit: TCP holds the
    client back.
    """
    bystander = Bystander(broker)
    worker = Worker(broker, "big", 1)
    client = zmq.Context.instance().socket(zmq.DEALER)
    client.setsockopt(zmq.LINGER, 0)
    client.connect(broker.url("emqp", "frontend"))
    body = job(b"j" * (2 << 20))
    sent, peak = 0, 0.0
    deadline = time.monotonic() + 60
    while sent < 300 and time.monotonic() < deadline:
        try:
            client.send_multipart([b"", b"eMQP/1.0", b"REQUEST", b"b%d" % sent, b"big", b"",
                                   body], flags=zmq.NOBLOCK)
            sent += 1
        except zmq.Again:
            time.sleep(0.01)
        peak = max(peak, rss_mib(broker))
    end = time.monotonic() + 30
    while _emqp_depth(broker, "big") < sent - 1 and time.monotonic() < end:
        peak = max(peak, rss_mib(broker))     # until the broker stored what it took in
        time.sleep(0.05)
    peak = max(peak, rss_mib(broker))
    print(f"eMQP 300 x 2 MiB: peak broker RSS {peak:.0f} MiB")
    assert sent == 300, f"only {sent} jobs went out in 60 s"
    assert _emqp_depth(broker, "big") == 299
    assert peak < RSS_BOUND_MIB, f"broker RSS {peak:.0f} MiB after 300 jobs of 2 MiB"
    bystander.check()
    client.close(linger=0)
    worker.close()


def _emqp_depth(broker: BrokerProcess, queue: str) -> int:
    """Ready jobs of eMQP queue ``queue`` (admin API; 0 while it does not exist)."""
    row = queue_row(broker, "emqp.jobs." + queue)
    return int(row["depth"]) if row else 0


def _ignore_again(step: Callable[[], None]) -> None:
    """Run ``step``; a full ZeroMQ queue (zmq.Again) is back-pressure, not an error."""
    try:
        step()
    except zmq.Again:
        pass


@pytest.fixture
def many_fds() -> Iterator[int]:
    """Raise RLIMIT_NOFILE (soft to hard) for this process and the brokers it starts."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    yield hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_idle_connections_and_churn(many_fds: int, make_broker: Callable[..., BrokerProcess]) -> None:
    """5,000 idle connections (fewer if the fd limit is lower) and 2,000 connect/close cycles."""
    idle_target = min(5000, (many_fds - 200) // 2)
    assert idle_target >= 1000, f"fd limit {many_fds} too low for this test"
    broker = make_broker(["nsq", "mq9"], extra_args=["--durability", "none"])
    bystander = Bystander(broker)
    before = rss_mib(broker)
    ports = [broker.port("nsq", "tcp"), broker.port("mq9")]
    idle = [socket.create_connection((HOST, ports[i % 2]), timeout=10) for i in range(idle_target)]
    for sock in idle[::2]:
        sock.sendall(wire.MAGIC_V2)
    bystander.check()
    during = rss_mib(broker)
    assert during - before < 200, f"{idle_target} idle connections cost {during - before:.0f} MiB"
    for sock in idle:
        sock.close()
    for i in range(2000):
        with socket.create_connection((HOST, ports[i % 2]), timeout=10) as sock:
            if i % 3 == 0:
                sock.sendall(b"PING\r\n" if i % 2 else wire.MAGIC_V2 + b"NOP\n")
    bystander.check()
    after = rss_mib(broker)
    assert after < RSS_BOUND_MIB
    server = psutil.Process(broker.process.pid)  # type: ignore[union-attr]

    def closes_reached_it() -> bool:
        """At most 50 of the broker's TCP connections are still established."""
        return sum(c.status == psutil.CONN_ESTABLISHED for c in server.net_connections(kind="tcp")) <= 50

    wait_until(closes_reached_it, "the broker to close the closed connections", timeout=20)


def read_all(sock: socket.socket, timeout: float = 10.0) -> bytes:
    """Everything the broker sends until it closes the connection (or ``timeout``)."""
    sock.settimeout(timeout)
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            data = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not data:
            break
        out += data
    return out


def send_all(sock: socket.socket, data: bytes) -> None:
    """Send what the broker takes; it may close the connection before reading everything."""
    try:
        sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        pass


def test_huge_inputs_get_the_protocols_error(broker: BrokerProcess) -> None:
    """Absurd length prefixes and 1 MB control lines: each protocol's error, that connection only."""
    bystander = Bystander(broker)
    port = broker.port("nsq", "tcp")
    with socket.create_connection((HOST, port)) as sock:  # PUB claiming 4 GiB
        send_all(sock, wire.MAGIC_V2 + b"PUB t\n" + struct.pack(">I", 0xFFFFFFFF) + b"x" * 100)
        assert b"E_BAD_MESSAGE" in read_all(sock)
    with socket.create_connection((HOST, port)) as sock:  # MPUB with 2**31 messages
        send_all(sock, wire.MAGIC_V2 + b"MPUB t\n" + struct.pack(">II", 100, 0x7FFFFFFF) + b"x" * 96)
        assert b"E_BAD" in read_all(sock)
    with socket.create_connection((HOST, port)) as sock:  # a 1 MB command line
        send_all(sock, wire.MAGIC_V2 + b"PUB " + b"t" * (1 << 20) + b"\n")
        assert b"E_" in read_all(sock)
    nport = broker.port("mq9")
    with socket.create_connection((HOST, nport)) as sock:  # a 1 MB control line
        send_all(sock, b"PUB " + b"s" * (1 << 20) + b" 1\r\nx\r\n")
        assert b"-err 'maximum control line exceeded'" in read_all(sock).lower()
    with socket.create_connection((HOST, nport)) as sock:  # a payload size of 10**15
        send_all(sock, b"CONNECT {}\r\nPUB s 1000000000000000\r\n")
        assert b"-err 'maximum payload violation'" in read_all(sock).lower()
    assert rss_mib(broker) < RSS_BOUND_MIB
    bystander.check()


def test_fifty_megabyte_http_body_is_refused(broker: BrokerProcess) -> None:
    """A 50 MB POST to the NSQ HTTP /pub is refused with nsqd's MSG_TOO_BIG; RSS stays bounded."""
    bystander = Bystander(broker)
    url = f"http://{HOST}:{broker.port('nsq', 'http')}/pub?topic=big"
    request = urllib.request.Request(url, data=b"b" * (50 << 20), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            status, data = resp.status, resp.read()
    except urllib.error.HTTPError as err:
        status, data = err.code, err.read()
    assert status == 413 and json.loads(data)["message"] == "MSG_TOO_BIG", (status, data)
    assert rss_mib(broker) < RSS_BOUND_MIB
    bystander.check()


@pytest.fixture
def mq_broker(make_broker: Callable[..., BrokerProcess]) -> BrokerProcess:
    """A broker with NSQ (the bystander), MQKS and VibeMQ (durability none)."""
    return make_broker(["nsq", "mqks", "vibemq"], extra_args=["--durability", "none"])


def _drain_replies(sock: socket.socket) -> None:
    """Read what the broker answered the producer, so only the broker's side can back up."""
    try:
        while sock.recv(1 << 16):
            pass
    except (BlockingIOError, TimeoutError):
        pass


def test_mqks_consumer_that_never_reads(mq_broker: BrokerProcess) -> None:
    """An MQKS auto-ack consumer that never reads, ``publish`` lines at full speed: bounded RSS."""
    bystander = Bystander(mq_broker)
    port = mq_broker.port("mqks", "tcp")
    stalled = socket.create_connection((HOST, port))
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.sendall(b"c1 consume --confirm floodq flood.e\n")
    stalled.settimeout(10)
    assert stalled.recv(100).startswith(b"c1 ok ")
    producer = socket.create_connection((HOST, port))
    pusher = Pusher(producer, b"".join(b"p%d publish flood.e %s\n" % (i, b"m" * 1024)
                                       for i in range(256)))

    flood_stays_bounded(pusher.step_and_drain, mq_broker, bystander, pusher)
    stalled.close()
    producer.close()


def test_vibemq_subscriber_that_never_reads(mq_broker: BrokerProcess) -> None:
    """A VibeMQ subscriber that never reads nor acks, an unbounded queue, Publish frames at full
    speed: bounded RSS (deliveries wait in the queue, not in the connection's write buffer;
    publishes awaiting their commit pause the producer's reads: before that bound this scenario
    grew the broker to 1.9 GiB in 30 s, see tests/unit/protocols/vibemq/test_server.py)."""
    from mqhub.protocols.vibemq import codec as vc
    from mqhub.protocols.vibemq.options import QueueOptions
    from tests.interop.vibemq_client import SocketClient

    bystander = Bystander(mq_broker)
    port = mq_broker.port("vibemq", "tcp")
    stalled = SocketClient(port)
    stalled.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect(compression=None)
    stalled.create_queue("flood", QueueOptions(max_queue_size=0))
    stalled.subscribe("flood")
    producer = SocketClient(port)
    producer.connect(compression=None)
    chunk = b"".join(vc.encode(vc.Frame(vc.PUBLISH, f"p{i}", "flood", b'"' + b"v" * 1024 + b'"'))
                     for i in range(256))
    pusher = Pusher(producer.sock, chunk)

    flood_stays_bounded(pusher.step_and_drain, mq_broker, bystander, pusher)
    stalled.close()
    producer.close()
