"""The whole-read frame scanner of the NATS fast path (``scan.py``, issue 11).

The scanner's pattern must frame exactly as NATS does, and a parser using it must deliver,
report and refuse exactly what the per-line paths do, for any stream cut anywhere:
payloads that hold frame-like text or CRLFs, other operations in between, sizes over the
pattern's limit or over max_payload, zero-padded sizes, bare-LF lines, replies, heads with
several targets or another receiver, and a broken frame at the end.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mqhub.protocols.nats import codec, scan
from mqhub.protocols.nats.codec import OP_ERROR, OP_MSG, NatsParser
from mqhub.protocols.nats.heads import route_heads
from mqhub.protocols.nats.router import PubRouter, fold_counts
from mqhub.protocols.nats.scan import SCAN_CHUNK, SCAN_LIMIT, HeadScanner, frame_pattern
from tests.unit.protocols.nats.helpers import Client, make_server

#: every test here runs with the scanner's C loop and with its fallback (conftest.py)
pytestmark = pytest.mark.usefixtures("scan_impl")


def test_pattern_frames_exactly_the_canonical_sizes_up_to_its_limit() -> None:
    """Every size 0…limit frames its payload exactly (the match is the space before the
    size and the tail after it); larger, padded, signed, spaced or LF-only forms and wrong
    lengths do not match."""
    pat = frame_pattern(300)
    for n in range(0, 302):
        tail = b"%d\r\n" % n + b"\r" * n + b"\r\n"
        m = pat.fullmatch(b" " + tail)
        assert (m is not None) == (n <= 300), n
        if m:
            assert m.groups() == (tail,)
            assert pat.split(b"PUB a.b " + tail) == [b"PUB a.b", tail, b""]
    for bad in (b" 03\r\nabc\r\n", b" 00\r\n\r\n", b" 3\nabc\r\n", b" 3\r\nabcd\r\n",
                b" 3\r\nab\r\n", b" +3\r\nabc\r\n", b" 3 \r\nabc\r\n", b"  3\r\nabc\r\n",
                b"3\r\nabc\r\n", b" 3\r\nabc\n", b" 1_0\r\n0123456789\r\n"):
        assert pat.fullmatch(bad) is None, bad
    assert pat.split(b"PUB a r.1 3\r\nabc\r\nPUB a 12 2\r\nab\r\n") == [
        b"PUB a r.1", b"3\r\nabc\r\n", b"PUB a 12", b"2\r\nab\r\n", b""]
    assert frame_pattern(SCAN_LIMIT).fullmatch(b" 4095\r\n" + b"x" * 4095 + b"\r\n")
    assert not frame_pattern(SCAN_LIMIT).fullmatch(b" 4096\r\n" + b"x" * 4096 + b"\r\n")


class _Owner:
    """A receiving connection: its output list and its own MSG heads."""

    def __init__(self, sid: int) -> None:
        """No output yet."""
        self.out: list[bytes] = []
        self.sid = sid
        self.out_msgs = 0
        self.out_bytes = 0


def _table(main: _Owner, other: _Owner, second: _Owner) -> dict[bytes, tuple]:
    """Head routes as the server builds them: one-target heads for ``main`` (with and without
    reply), one for ``other``, and a head with two targets (no single one); each one-target
    route carries its connection's table of such heads (head -> MSG head)."""
    tables: dict[_Owner, dict[bytes, bytes]] = {main: {}, other: {}}

    def one(owner: _Owner, head: bytes, subject: bytes, reply: bytes = b"") -> tuple:
        target = (owner, owner.out, b"MSG %s %d %s" % (subject, owner.sid, reply + b" " if reply
                                                         else b""))
        tables[owner][head] = target[2]
        return [target], None, target, tables[owner], [0, 0]
    two = [(main, main.out, b"MSG m 1 "), (second, second.out, b"MSG m 3 ")]
    return {b"PUB a": one(main, b"PUB a", b"a"), b"PUB b.c": one(main, b"PUB b.c", b"b.c"),
            b"PUB a r.1": one(main, b"PUB a r.1", b"a", b"r.1"),
            b"PUB o": one(other, b"PUB o", b"o"), b"PUB m": (two, None, None, None, [0, 0])}


#: payloads that look like frames, hold CRLFs or LFs, or are plain
PAYLOADS = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([b"PUB a 3\r\nabc\r\n", b"\r\n", b"\n", b"x\r\nPUB a 1\r\ny\r\n",
                     b"PUB b.c 0\r\n\r\n", b"PUB a 2\r\nhi"]),
    st.integers(4090, 4100).map(lambda n: b"z" * n),
)
FRAMES = st.one_of(
    st.tuples(st.sampled_from([b"a", b"a", b"a", b"b.c", b"b.c", b"o", b"m", b"zz", b"a r.1"]),
              PAYLOADS).map(
        lambda t: b"PUB %s %d\r\n" % (t[0], len(t[1])) + t[1] + b"\r\n"),
    st.sampled_from([b"PING\r\n", b"PUB a 03\r\nabc\r\n", b"PUB a 3\nabc\r\n",
                     b"HPUB a 12 14\r\nNATS/1.0\r\n\r\nhi\r\n", b"PUB a 200\r\n" + b"p" * 200
                     + b"\r\n", b"SUB q 9\r\n"]),
)


def _run(stream: bytes, cuts: list[int], max_payload: int, scan_bytes: int
         ) -> tuple[list[bytes], list[object], list[tuple], tuple]:
    """Feed ``stream`` in pieces through route_pubs/slow_run as the connection does, the
    scanner taking buffers from ``scan_bytes`` bytes on; return each receiver's output, the
    dirty marks, the other events and the counts (payload bytes routed, and each receiver's
    messages and payload bytes folded from the routes)."""
    saved = scan.SCAN_BYTES
    scan.SCAN_BYTES = scan_bytes
    try:
        return _feed(stream, cuts, max_payload)
    finally:
        scan.SCAN_BYTES = saved


def _feed(stream: bytes, cuts: list[int], max_payload: int
          ) -> tuple[list[bytes], list[object], list[tuple], tuple]:
    """The loop of :func:`_run`."""
    main, other, second = _Owner(1), _Owner(2), _Owner(3)
    table = _table(main, other, second)
    parser = NatsParser(max_payload=max_payload)
    router = PubRouter(parser)
    dirty: list[object] = []
    events: list[tuple] = []
    nbytes = 0
    at = 0
    for cut in [*cuts, len(stream)]:
        parser.receive_data(stream[at:at + cut])
        at += cut
        while True:
            router.route_pubs({}, dirty, table)
            nbytes += router.last_bytes
            evs = router.slow_run({}, table)
            if not evs:
                break
            for ev in evs:
                if ev[0] == OP_ERROR:
                    events.append((OP_ERROR, ev[1].code, ev[1].fatal))
                else:
                    events.append((ev[0], *[e[1:] if isinstance(e, tuple) else e
                                            for e in ev[1:]]))
            if any(e[0] == OP_ERROR and e[2] for e in events):
                break
    marks = [{main: "main", other: "other", second: "second"}[o] for o in dirty]
    stats = {"out_bytes": 0}
    fold_counts(table.values(), stats)
    owners = (main, other, second)
    counts = (nbytes, stats["out_bytes"], [(o.out_msgs, o.out_bytes) for o in owners])
    return [b"".join(o.out) for o in owners], marks, events, counts


@settings(max_examples=200, deadline=None)
@given(frames=st.lists(FRAMES, max_size=30), cuts=st.lists(st.integers(1, 9000), max_size=6),
       max_payload=st.sampled_from([100, 8192]),
       end=st.sampled_from([b"", b"PUB a 3\r\nabcd\r\n", b"PUB a"]))
@example(frames=[b"PUB a 5\r\nhello\r\n"] * 5 + [b"PING\r\n"] + [b"PUB b.c 5\r\nhello\r\n"] * 5,
         cuts=[], max_payload=8192, end=b"")
@example(frames=[b"PUB a 5\r\nhello\r\n"] * 20 + [b"PUB o 1\r\nx\r\n"]
         + [b"PUB a 1\r\ny\r\n"] * 9, cuts=[], max_payload=8192, end=b"")
@example(frames=[b"PUB a 5\r\nhello\r\n"] * 10 + [b"PUB a 3\r\nx\r\n\r\n"]
         + [b"PUB b.c 1\r\ny\r\n"] * 9, cuts=[40], max_payload=8192, end=b"PUB a 3\r\nabcd\r\n")
def test_scanner_delivers_exactly_what_the_per_line_paths_deliver(
        frames: list[bytes], cuts: list[int], max_payload: int, end: bytes) -> None:
    """With the scanner on for every buffer and off, the same bytes reach the same receivers,
    the same owners are marked dirty, the same events and errors come out."""
    stream = b"".join(frames) + end
    on = _run(stream, cuts, max_payload, 0)
    off = _run(stream, cuts, max_payload, 1 << 40)
    assert on == off
    # the counts are exact: each receiver's MSGs and their payload bytes, as nats-server's
    # out_msgs/out_bytes; the payload bytes routed are what the receivers got (one each)
    outputs, _, _, (nbytes, out_bytes, per_owner) = on
    for out, counted in zip(outputs, per_owner, strict=True):
        client = NatsParser(server=False)
        client.receive_data(out)
        msgs = [ev for ev in client.events() if ev[0] == OP_MSG]
        assert counted == (len(msgs), sum(len(ev[4]) for ev in msgs))
    assert out_bytes == sum(b for _, b in per_owner)


def test_scanner_takes_a_whole_stretch_and_stops_at_what_it_cannot_take() -> None:
    """One receiver's frames are taken in one call; a frame for another receiver, a head
    with two targets, a gap (PING) or the incomplete end stops it right there."""
    main, other, second = _Owner(1), _Owner(2), _Owner(3)
    table = _table(main, other, second)
    msgs = [(b"a", b"x" * 300), (b"b.c", b""), (b"a r.1", b"PUB a 1\r\nz")] * 30
    body = b"".join(b"PUB %s %d\r\n%s\r\n" % (s, len(p), p) for s, p in msgs)
    expected = b"".join(b"MSG %s %d\r\n%s\r\n" % (s.replace(b" ", b" 1 ") if b" " in s
                                                    else s + b" 1", len(p), p) for s, p in msgs)
    for stop in (b"PUB o 1\r\nx\r\n", b"PUB m 1\r\nx\r\n", b"PING\r\n", b"PUB a 9\r\nabc"):
        main.out.clear()
        dirty: list[object] = []
        table = _table(main, other, second)
        k, used, nbytes = HeadScanner().take(body + stop + body, 0, table.get, dirty.append,
                                             8192)
        assert (k, used) == (90, len(body)), stop
        payload = sum(len(p) for _, p in msgs)
        # the stretch's count goes to its first head's route (all of it is main's)
        assert nbytes == payload and table[b"PUB a"][4] == [90, payload]
        assert dirty == [main]
        assert b"".join(main.out) == expected


@settings(max_examples=40, deadline=None)
@given(k=st.integers(1, 4 * SCAN_CHUNK), n=st.integers(0, 300),
       gap=st.sampled_from([b"PING\r\n", b"SUB q 9\r\n", b"PUB a 03\r\nabc\r\n",
                            b"PUB o 1\r\nx\r\n", b"PUB m 1\r\nx\r\n", b"PUB a\t1\r\nx\r\n"]))
@example(k=SCAN_CHUNK, n=100, gap=b"PING\r\n")
@example(k=3 * SCAN_CHUNK, n=100, gap=b"SUB q 9\r\n")
def test_a_gap_anywhere_in_a_long_stretch_ends_it_there(k: int, n: int, gap: bytes) -> None:
    """Stretches longer than one pass of the scanner (its passes grow from SCAN_CHUNK frames):
    another operation, an unframed line or a frame for someone else at any place, also where
    one pass ends and the next begins, stops it exactly there (the scanner once skipped a
    gap at a pass boundary, losing its place in the stream)."""
    stream = b"PUB a 5\r\nhello\r\n" * k + gap + b"PUB b.c 4\r\nbody\r\n" * n
    assert _run(stream, [], 8192, 0) == _run(stream, [], 8192, 1 << 40)
    main, other, second = _Owner(1), _Owner(2), _Owner(3)
    saved, scan.SCAN_BYTES = scan.SCAN_BYTES, 0
    try:
        taken = HeadScanner().take(stream, 0, _table(main, other, second).get, [].append,
                                   8192)[:2]
    finally:
        scan.SCAN_BYTES = saved
    assert taken == (k, 16 * k)
    assert b"".join(main.out) == b"MSG a 1 5\r\nhello\r\n" * k


def test_scanner_goes_on_after_frames_the_per_line_loop_took() -> None:
    """Called again further into the same buffer (after frames taken elsewhere), it finds its
    place in the split and takes the rest; an offset inside another operation or a payload
    takes nothing and leaves the scanner on."""
    main, other, second = _Owner(1), _Owner(2), _Owner(3)
    table = _table(main, other, second)
    frame = b"PUB a 500\r\n" + b"5" * 500 + b"\r\n"
    buf = frame * 10 + b"PING\r\n" + frame * 10
    sc = HeadScanner()
    assert sc.take(buf, 0, table.get, [].append, 8192)[:2] == (10, 10 * len(frame))
    pos = 10 * len(frame)
    assert sc.take(buf, pos + 2, table.get, [].append, 8192)[:2] == (0, 0)     # inside PING
    pos += 6
    pos, k, *_ = route_heads(buf, pos, table.get, [].append, 8192, 3)       # 3 the slow way
    assert k == 3
    assert sc.take(buf, pos, table.get, [].append, 8192)[:2] == (7, 7 * len(frame))
    assert b"".join(main.out) == (b"MSG a 1 500\r\n" + b"5" * 500 + b"\r\n") * 20
    # right after what the per-line paths took (PING; the end of a frame completed across
    # reads) the scanner goes on at once: the rest of that piece is the next frame's head
    main.out.clear()
    sc = HeadScanner()
    assert sc.take(buf, 0, table.get, [].append, 8192)[:2] == (10, 10 * len(frame))
    assert sc.take(buf, 10 * len(frame), table.get, [].append, 8192)[:2] == (0, 0)  # PING: per line
    assert sc.take(buf, 10 * len(frame) + 6, table.get, [].append, 8192)[:2] == (10, 10 * len(frame))
    sc = HeadScanner()
    assert sc.take(buf, 300, table.get, [].append, 8192)[:2] == (0, 0)   # in the first payload
    assert sc.take(buf, len(frame), table.get, [].append, 8192)[:2] == (9, 9 * len(frame))
    assert b"".join(main.out) == (b"MSG a 1 500\r\n" + b"5" * 500 + b"\r\n") * 29


def test_scanner_backs_off_from_traffic_it_cannot_take_in_long_stretches() -> None:
    """Buffers it takes nothing of, or only short stretches of (8 frames between two-target
    heads), make it skip the next buffers, more each time (bounded); a buffer of long
    stretches resets that."""
    main, other, second = _Owner(1), _Owner(2), _Owner(3)
    table = _table(main, other, second)
    frame = b"PUB a 10\r\n0123456789\r\n"
    bad = b"PUB m 10\r\n0123456789\r\n" * 500
    short = (frame * 8 + b"PUB m 10\r\n0123456789\r\n") * 60
    good = frame * 500
    for traffic, first in ((bad, 0), (short, 8)):
        sc = HeadScanner()
        taken = []
        for _ in range(12):
            taken.append(sc.take(bytes(bytearray(traffic)), 0, table.get, [].append, 8192)[0])
            sc.release()
        assert set(taken) == {0, first}
        assert taken[:4] == [first, first, 0, first]       # skips 0, 1, then 3 buffers
        assert sc.skip + sc.backoff > 0
        for _ in range(sc.skip):
            assert sc.take(bytes(bytearray(good)), 0, table.get, [].append, 8192)[:2] == (0, 0)
            sc.release()
        assert sc.take(bytes(bytearray(good)), 0, table.get, [].append, 8192)[0] == 500
        sc.release()
        assert sc.backoff == 0


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), read=st.integers(8192, 70000), reply=st.booleans())
def test_a_wildcard_subscriber_gets_mixed_traffic_complete_and_in_order(
        seed: int, read: int, reply: bool) -> None:
    """Through the NATS server, mixed subjects and sizes (with or without replies) in reads
    large enough for the scanner reach a wildcard subscriber complete, in order and with its
    sid; the server counts every message once in and once out."""
    rnd = random.Random(seed)
    srv = make_server()
    sub, pub = Client(srv), Client(srv)
    sub.send(b"SUB mx.> 7\r\n")
    msgs = [(f"mx.s{rnd.randrange(8)}", f"_R.{k % 3}" if reply and k % 2 else None,
             bytes([97 + k % 26]) * rnd.randint(0, 3000)) for k in range(200)]
    stream = b"".join(codec.encode_pub(s, p, r) for s, r, p in msgs)
    before = srv.stats["in_msgs"], srv.stats["out_msgs"]
    for at in range(0, len(stream), read):
        pub.send(stream[at:at + read])
    got = [(e[1], e[3], e[4]) for e in sub.events() if e[0] == OP_MSG and e[2] == "7"]
    assert got == msgs
    assert (srv.stats["in_msgs"] - before[0], srv.stats["out_msgs"] - before[1]) == (200, 200)
    assert not pub.closed and not sub.closed


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), read=st.integers(8192, 40000))
def test_subscriptions_changing_between_reads_reach_the_scanner(seed: int, read: int) -> None:
    """The scanner's per-connection head tables follow subscription changes: a second
    subscriber on one subject (so its heads get two targets), its UNSUB, and a wildcard
    subscriber leaving and coming back between reads of mixed traffic; every receiver gets
    exactly the messages published while it was subscribed, in order."""
    rnd = random.Random(seed)
    srv = make_server()
    wild, exact, pub = Client(srv), Client(srv), Client(srv)
    wild.send(b"SUB mx.> 7\r\n")
    want_wild: list[tuple] = []
    want_exact: list[tuple] = []
    state = {"wild": True, "exact": False}
    for step in range(6):
        msgs = [(f"mx.s{rnd.randrange(4)}", bytes([97 + k % 26]) * rnd.randint(0, 1500))
                for k in range(rnd.randint(20, 120))]
        stream = b"".join(codec.encode_pub(s, p) for s, p in msgs)
        for at in range(0, len(stream), read):
            pub.send(stream[at:at + read])
        if state["wild"]:
            want_wild += msgs
        if state["exact"]:
            want_exact += [m for m in msgs if m[0] == "mx.s1"]
        action = step % 3
        if action == 0:
            exact.send(b"SUB mx.s1 8\r\n" if not state["exact"] else b"UNSUB 8\r\n")
            state["exact"] = not state["exact"]
        elif action == 1:
            wild.send(b"UNSUB 7\r\n" if state["wild"] else b"SUB mx.> 7\r\n")
            state["wild"] = not state["wild"]
    got_wild = [(e[1], e[4]) for e in wild.events() if e[0] == OP_MSG]
    got_exact = [(e[1], e[4]) for e in exact.events() if e[0] == OP_MSG]
    assert got_wild == want_wild
    assert got_exact == want_exact
    assert not pub.closed


def test_a_ping_after_a_full_scanner_pass_keeps_the_publisher_connected() -> None:
    """Through the server: SCAN_CHUNK PUBs of new sizes on a known subject, then PING, then
    more PUBs in one read (main closed this publisher with -ERR 'Unknown Protocol Operation':
    the scanner skipped the PING where its first pass ended)."""
    srv = make_server()
    sub, pub = Client(srv), Client(srv)
    sub.send(b"SUB a.> 1\r\n")
    pub.send(codec.encode_pub("a.b", b"x" * 99))        # the head is known from here on
    sizes = [100 + k for k in range(SCAN_CHUNK)] + [300 + k for k in range(10)]
    frames = [codec.encode_pub("a.b", b"x" * n) for n in sizes]
    pub.send(b"".join(frames[:SCAN_CHUNK]) + b"PING\r\n" + b"".join(frames[SCAN_CHUNK:]))
    assert pub.events() == [(codec.OP_PONG,)]
    assert not pub.closed
    assert [len(e[4]) for e in sub.events() if e[0] == OP_MSG] == [99, *sizes]


def _reference_run(buf: bytes, pos: int, table: dict[bytes, bytes], max_payload: int
                   ) -> tuple[bytes, int, int, int]:
    """What ``scan_run`` must return, written the slow way: frames one by one while the
    control line is ``<head> <canonical size>\\r\\n``, the payload is followed by CRLF and the
    head is in ``table``."""
    out = []
    p = pos
    k = nbytes = 0
    while True:
        i = buf.find(b"\n", p)
        if i < 0 or i - 1 <= p or buf[i - 1] != 13:
            break
        sp = buf.rfind(b" ", p, i - 1)
        digits = buf[sp + 1:i - 1]
        if sp <= p or not digits.isdigit() or len(digits) > 18 \
                or (len(digits) > 1 and digits.startswith(b"0")) or int(digits) > max_payload:
            break
        size = int(digits)
        start = i + 1
        msg = table.get(buf[p:sp])
        if buf[start + size:start + size + 2] != b"\r\n" or msg is None:
            break
        out.append(msg + buf[sp + 1:start + size + 2])
        k += 1
        nbytes += size
        p = start + size + 2
    return b"".join(out), p - pos, k, nbytes


PIECES = st.sampled_from([b"PUB a", b"PUB a r.1", b"PUB b.c", b"PUB zz", b"PUB", b" ", b"  ",
                          b"\r", b"\n", b"\r\n", b"0", b"5", b"05", b"12", b"4095", b"99999",
                          b"x" * 5, b"y" * 12, b"PING\r\n", b"\x00", b"-1", b"+3"])


@settings(max_examples=300, deadline=None)
@given(frames=st.lists(st.one_of(
           st.tuples(st.sampled_from([b"PUB a", b"PUB a r.1", b"PUB b.c", b"PUB zz"]),
                     st.binary(max_size=30)).map(
               lambda t: b"%s %d\r\n%s\r\n" % (t[0], len(t[1]), t[1])),
           st.lists(PIECES, max_size=8).map(b"".join)), max_size=20),
       pos=st.integers(0, 40), max_payload=st.sampled_from([0, 4, 12, 1 << 20]))
def test_the_c_loop_frames_exactly_as_written(frames: list[bytes], pos: int,
                                              max_payload: int) -> None:
    """scan_run on well-formed frames mixed with junk (bare CR or LF, spaces, zero-padded,
    signed, oversized or truncated sizes, unknown heads), from any offset: the same output,
    length, frame count and payload bytes as the slow reference."""
    from mqhub.protocols.nats._scan import scan_run  # built by `make venv` (setup.py)

    table = {b"PUB a": b"MSG a 1 ", b"PUB a r.1": b"MSG a 1 r.1 ", b"PUB b.c": b"MSG b.c 22 "}
    buf = b"".join(frames)
    pos = min(pos, len(buf))
    assert scan_run(buf, pos, table, max_payload) == _reference_run(buf, pos, table, max_payload)
