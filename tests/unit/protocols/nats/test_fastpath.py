"""The NATS hot path on mixed traffic and the direct socket output (issue 11).

Mixed subjects and sizes (both sides of the run path's frame limit), several subscribers at
once (exact, wildcard, a queue group, a limited subscription), reads split anywhere; and the
output written straight to a real socket (a socketpair), with what it refuses handed to the
transport and the rest held until the transport drains, in order.
"""

from __future__ import annotations

import socket

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mqhub.protocols.nats import codec
from mqhub.protocols.nats.codec import NEED_DATA, OP_MSG, NatsParser
from mqhub.protocols.nats.output import MAX_IOV, remainder, send_chunks
from mqhub.protocols.nats.reads import frame_completion
from mqhub.protocols.nats.server import NatsServer
from mqhub.testing import take_output
from tests.unit.protocols.nats.helpers import Client, make_server

#: every test here runs with the scanner's C loop and with its fallback (conftest.py)
pytestmark = pytest.mark.usefixtures("scan_impl")

SUBJECTS = ["mx.a", "mx.b", "mx.c.d", "mx.e"]
#: 0 B, small, around the run path's 512 B frame limit, larger than one 4 KiB read
SIZES = st.one_of(st.integers(0, 40), st.integers(490, 530), st.integers(1000, 5000))


def _frames(spec: list[tuple[int, int, bool]]) -> list[tuple[str, str | None, bytes]]:
    """Messages (subject, reply, payload) for (subject index, size, with reply) triples."""
    out = []
    for k, (s, size, rep) in enumerate(spec):
        payload = bytes([65 + (k % 26)]) * size
        out.append((SUBJECTS[s], f"_R.{k}" if rep else None, payload))
    return out


def _msgs(client: Client) -> list[tuple[str, str | None, bytes]]:
    """(subject, reply, payload) of every MSG the client got so far."""
    return [(e[1], e[3], e[4]) for e in client.events() if e[0] == OP_MSG]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(SUBJECTS) - 1), SIZES, st.booleans()),
                min_size=1, max_size=40),
       st.lists(st.integers(1, 9000), min_size=1, max_size=12), st.booleans(),
       st.integers(0, 5))
@example([(0, 10, False)] * 30 + [(1, 600, False)] * 10 + [(0, 10, True)] * 9, [7, 4096], True, 3)
@example([(2, 700, False)] * 12 + [(2, 1500, True)] * 9 + [(0, 5, False)], [3000], True, 1)
@example([(2, 2000, False)] * 20, [5, 9000, 17], True, 0)
def test_mixed_traffic_reaches_every_kind_of_subscriber_in_order(
        spec: list[tuple[int, int, bool]], cuts: list[int], warm: bool, limit: int) -> None:
    """Mixed subjects, sizes and replies, read in arbitrary pieces, reach an exact, a wildcard,
    a two-member queue group and a limited subscriber exactly as one-by-one delivery would."""
    srv = make_server(max_payload=8192)
    exact, wild, q1, q2, limited, pub = (Client(srv) for _ in range(6))
    exact.send(b"SUB mx.a 1\r\n")
    wild.send(b"SUB mx.> 2\r\n")
    q1.send(b"SUB mx.* grp 3\r\n")
    q2.send(b"SUB mx.* grp 4\r\n")
    limited.send(b"SUB mx.b 5\r\n" + f"UNSUB 5 {limit}\r\n".encode())
    msgs = _frames(spec)
    if warm:    # the route caches know every line already (the fused path's per-line hits)
        for subject, reply, payload in msgs:
            pub.send(codec.encode_pub(subject, payload, reply))
        for c in (exact, wild, q1, q2, limited):
            c.events()
        limited.send(b"UNSUB 5\r\nSUB mx.b 6\r\n" + f"UNSUB 6 {limit}\r\n".encode())
    stream = b"".join(codec.encode_pub(s, p, r) for s, r, p in msgs)
    at = 0
    for cut in cuts:
        pub.send(stream[at:at + cut])
        at += cut
    pub.send(stream[at:])
    assert _msgs(wild) == msgs
    assert _msgs(exact) == [m for m in msgs if m[0] == "mx.a"]
    group = [m for m in msgs if m[0].count(".") == 1]        # mx.* matches one token
    got1, got2 = _msgs(q1), _msgs(q2)

    def key(m: tuple[str, str | None, bytes]) -> tuple[str, str, bytes]:
        return m[0], m[1] or "", m[2]

    assert sorted(got1 + got2, key=key) == sorted(group, key=key)
    for got in (got1, got2):                                  # each member keeps the order
        it = iter(group)
        assert all(any(m == g for g in it) for m in got)
    assert _msgs(limited) == [m for m in msgs if m[0] == "mx.b"][:limit]
    assert not pub.closed


# direct socket output ---------------------------------------------------------------------

def _pair(sndbuf: int) -> tuple[socket.socket, socket.socket]:
    """A non-blocking socketpair whose sending end has a small buffer."""
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    a.setblocking(False)
    b.setblocking(False)
    return a, b


def _direct_subscriber(srv: NatsServer, subject: bytes) -> tuple[Client, Client,
                                                             socket.socket, socket.socket]:
    """A subscriber to ``subject`` written straight to a socket with a small send buffer (its
    reading end is the fourth item), and a publisher."""
    sub, pub = Client(srv), Client(srv)
    sub.send(b"SUB %s 1\r\n" % subject)
    a, b = _pair(4096)
    sub.proto.sock = a
    return sub, pub, a, b


def _drain(sock: socket.socket) -> bytes:
    """Everything readable on ``sock`` now."""
    got = []
    while True:
        try:
            chunk = sock.recv(1 << 20)
        except BlockingIOError:
            break
        if not chunk:
            break
        got.append(chunk)
    return b"".join(got)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20000), st.integers(1, 4), st.booleans(), st.booleans()),
                min_size=1, max_size=25),
       st.sampled_from([4096, 16384, 65536]))
@example([(30000, 1, True, False), (10, 1, True, False), (10, 1, True, True)], 4096)
def test_direct_output_keeps_order_through_partial_sends(
        reads: list[tuple[int, int, bool, bool]], sndbuf: int) -> None:
    """Output sent straight to the socket, the remainder handed to the transport and output
    held meanwhile arrive complete and in order, as a client sees them; the client reads at
    its own pace and the transport drains only sometimes."""
    srv = make_server(max_payload=1 << 20)
    sub, pub = Client(srv), Client(srv)
    sub.send(b"SUB d.* 1\r\n")
    a, b = _pair(sndbuf)
    sub.proto.sock = a
    seen = b""
    expected = []
    for k, (size, count, read, drained) in enumerate(reads):
        batch = [(f"d.{k % 3}", bytes([97 + k % 26]) * size) for _ in range(count)]
        expected += batch
        pub.send(b"".join(codec.encode_pub(s, p) for s, p in batch))
        if read:                               # the client reads what the socket holds
            seen += _drain(b)
        if read and drained and sub.proto.paused:
            # play Twisted: it writes its buffer after what the socket held, then resumes
            seen += take_output(sub.transport)
            sub.proto.resumeProducing()
    seen += _drain(b)
    while sub.proto.paused:
        seen += take_output(sub.transport)
        sub.proto.resumeProducing()
        seen += _drain(b)
    seen += take_output(sub.transport)
    parser = NatsParser(server=False, max_payload=1 << 30)
    parser.receive_data(seen)
    got = []
    while (ev := parser.next_event()) is not NEED_DATA:
        assert isinstance(ev, tuple)
        got.append((ev[1], ev[4]))
    assert got == expected
    a.close()
    b.close()


def test_held_output_counts_toward_max_pending() -> None:
    """While the transport holds a remainder, held output counts for the slow-consumer rule."""
    srv = make_server(max_pending=200_000)
    sub, pub, a, b = _direct_subscriber(srv, b"h")
    pub.send(codec.encode_pub("h", b"x" * 50_000))
    assert sub.proto.paused and take_output(sub.transport)      # the socket refused a part
    for _ in range(3):
        pub.send(codec.encode_pub("h", b"y" * 60_000))
    assert sub.proto.held and not sub.closed
    pub.send(codec.encode_pub("h", b"z" * 60_000))                # past max_pending
    assert sub.closed and not sub.proto.held
    assert srv.stats["slow_consumers"] == 1 and not pub.closed
    a.close()
    b.close()


def test_held_output_refused_again_on_resume_counts_toward_max_pending() -> None:
    """Held output the socket refuses on resumeProducing goes to the transport and still counts:
    a subscriber that stopped reading cannot have max_pending held twice over."""
    srv = make_server(max_pending=200_000)
    sub, pub, a, b = _direct_subscriber(srv, b"h")
    pub.send(codec.encode_pub("h", b"x" * 50_000))
    for _ in range(3):
        pub.send(codec.encode_pub("h", b"y" * 60_000))
    assert sub.proto.held and not sub.closed
    take_output(sub.transport)         # Twisted wrote its remainder; the client reads nothing
    sub.proto.resumeProducing()
    assert sub.proto.paused and not sub.proto.held and sub.proto.paused_bytes > 150_000
    assert not sub.closed
    pub.send(codec.encode_pub("h", b"z" * 60_000))                # past max_pending
    assert sub.closed and srv.stats["slow_consumers"] == 1
    a.close()
    b.close()


def test_close_writes_held_output_before_the_error() -> None:
    """A close with held output writes it, then the -ERR, in order, and lets go of the producer."""
    srv = make_server()
    sub, pub, a, b = _direct_subscriber(srv, b"c")
    pub.send(codec.encode_pub("c", b"1" * 30_000))
    pub.send(codec.encode_pub("c", b"2" * 10))
    assert sub.proto.held
    direct = _drain(b)
    sub.proto.close("Stale Connection")
    rest = take_output(sub.transport)
    assert rest.endswith(b"MSG c 1 10\r\n" + b"2" * 10 + b"\r\n-ERR 'Stale Connection'\r\n")
    assert (direct + rest).count(b"MSG c 1") == 2
    assert sub.transport.producer is None
    a.close()
    b.close()


def test_send_chunks_and_remainder() -> None:
    """Gathered sends report what went out; the remainder is exactly what did not."""
    a, b = _pair(4096)
    chunks = [b"a" * 3000, b"b" * 5000, b"c" * 100_000]
    sent = send_chunks(a, chunks)
    assert sent is not None and 0 < sent < 108_000
    assert _drain(b) + remainder(chunks, sent) == b"".join(chunks)
    assert remainder([b"xyz"], 1) == b"yz" and remainder([b"ab", b"cd"], 4) == b""
    b.close()
    _drain(a)
    assert send_chunks(a, [b"q" * 10]) is None                # a closed peer: an error, no raise
    a.close()


class _FullAfter:
    """A socket that takes the first ``sendmsg`` whole, then fails every call with ``error``."""

    def __init__(self, error: OSError) -> None:
        """No call made yet."""
        self.error = error
        self.calls = 0

    def sendmsg(self, buffers: list[bytes]) -> int:
        """The first call sends everything; the later ones raise."""
        self.calls += 1
        if self.calls > 1:
            raise self.error
        return sum(map(len, buffers))


@pytest.mark.parametrize("error", [BlockingIOError(), BrokenPipeError()])
def test_send_chunks_counts_parts_sent_before_a_refusal(error: OSError) -> None:
    """More than MAX_IOV chunks: a part sent whole before the socket refuses (or fails) the next
    counts as sent, so the remainder does not send those bytes a second time."""
    chunks = [b"%05d" % i for i in range(MAX_IOV + 10)]
    sock = _FullAfter(error)
    sent = send_chunks(sock, chunks)  # type: ignore[arg-type]
    assert sock.calls == 2 and sent == 5 * MAX_IOV
    assert remainder(chunks, sent) == b"".join(chunks[MAX_IOV:])


# frames split across reads ------------------------------------------------------------------

def test_frame_completion_finds_where_a_split_frame_ends() -> None:
    """The bytes of the next read that complete the leftover frame, or -1 to join whole."""
    data = b"yz\r\nPUB a 1\r\nq\r\n"
    assert frame_completion(b"PUB a 3\r\nx", data) == 4              # payload split
    assert frame_completion(b"PUB a ", b"3\r\nxyz\r\nPING\r\n") == 8  # line split
    assert frame_completion(b"pub a r 2\r\n", b"ab\r\nPING\r\n") == 4  # reply, lower case
    assert frame_completion(b"HPUB a 12 14\r\nNATS", b"/1.0\r\n\r\nhi\r\nX") == 12
    assert frame_completion(b"MSG a 1 2\r\n", b"ab\r\n+OK\r\n") == 4
    assert frame_completion(b"HMSG a 1 2 3\r\n", b"ab\r\n\r\nPONG\r\n") == 5
    assert frame_completion(b"SUB a ", b"1\r\nPING\r\n") == 3
    assert frame_completion(b"PUB a 3\r\nx", b"yz\r\n") == -1          # nothing would remain
    assert frame_completion(b"PUB a x\r\n", data) == -1               # bad size: join whole
    assert frame_completion(b"PUB a 100000\r\n", b"x" * 200_000) == -1  # too far
    assert frame_completion(b"PUB a", b"b" * 70_000) == -1            # no line end near


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(SUBJECTS) - 1), st.integers(0, 3000),
                          st.booleans()), min_size=1, max_size=30),
       st.lists(st.integers(1, 5000), min_size=1, max_size=20))
def test_client_parser_reads_split_anywhere(spec: list[tuple[int, int, bool]],
                                            cuts: list[int]) -> None:
    """MSG/HMSG streams split at any points parse to the same events as one read."""
    msgs = _frames(spec)
    stream = b"".join(
        codec.encode_hmsg(s, "9", r, codec.build_headers({"k": "v"}), p) if r
        else codec.encode_msg(s, "9", None, p) for s, r, p in msgs) + codec.PING
    whole = NatsParser(server=False, max_payload=1 << 20)
    whole.receive_data(stream)
    expected = whole.events()
    split = NatsParser(server=False, max_payload=1 << 20)
    got: list[tuple] = []
    at = 0
    for cut in cuts + [len(stream)]:
        split.receive_data(stream[at:at + cut])
        at += cut
        got += split.events()
    assert got == expected and split.buffered == 0
    assert len(expected) == len(msgs) + 1
