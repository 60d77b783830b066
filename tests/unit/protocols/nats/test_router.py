"""The pure parser and the fast-path router give the same result on any stream (issue 23 item 6).

Two ways through one random client stream, cut into random reads, over the routes a real
``NatsServer`` builds for its subscriptions (plain, several receivers, a reply, a queue group,
a wildcard):

- **parser**: :meth:`NatsParser.events` for every read; each PUB delivered by its route;
- **router**: :class:`PubRouter` as the connection drives it (``route_pubs`` then
  ``slow_run``), the events it leaves delivered the same way.

Both must give every receiver the same bytes, the same other events in the same order (SUB,
PING, HPUB, errors...), the same PUB count and MSG copies, with the scanner on (small reads
allowed) or off.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mqhub.protocols.nats import scan
from mqhub.protocols.nats.codec import OP_ERROR, OP_PUB, Event, NatsParser
from mqhub.protocols.nats.router import PubRouter
from mqhub.protocols.nats.server import NatsServer
from tests.unit.protocols.nats.helpers import Client, make_server

#: every test here runs with the scanner's C loop and with its fallback (conftest.py)
pytestmark = pytest.mark.usefixtures("scan_impl")

CRLF = b"\r\n"

#: subjects the subscribers below cover in different ways, and one nobody takes
SUBJECTS = [b"a", b"a", b"b.c", b"b.c", b"w.x", b"q", b"nobody", b"a r.1"]
PAYLOADS = st.one_of(
    st.binary(max_size=48),
    st.sampled_from([b"PUB a 3\r\nabc\r\n", CRLF, b"\n", b"x\r\nPUB a 1\r\ny\r\n", b"PUB b.c 0\r\n\r\n"]),
    st.integers(4090, 4100).map(lambda n: b"z" * n),
)
PUB = st.tuples(st.sampled_from(SUBJECTS), PAYLOADS).map(
    lambda t: b"PUB %s %d\r\n%s\r\n" % (t[0], len(t[1]), t[1]))
OTHER = st.sampled_from([
    b"PING\r\n", b"PONG\r\n", b"SUB late 7\r\n", b"UNSUB 7\r\n", b"PUB a 03\r\nabc\r\n",
    b"HPUB a 12 14\r\nNATS/1.0\r\n\r\nhi\r\n", b"PUB a 3\nabc\r\n", b"\r\n",
    b"PUB a 2\r\nabc\r\n", b"BOGUS\r\n", b"pub a 1\r\nx\r\n",
])
#: runs of one frame (the router's run path) and single frames
STREAM = st.lists(st.one_of(PUB, PUB.map(lambda f: f * 12), OTHER), max_size=40)


def server_with_subscribers() -> tuple[NatsServer, list[Client]]:
    """A server whose routes cover one receiver, two receivers, a queue group and a wildcard."""
    srv = make_server(max_payload=8192)
    one, two, group = Client(srv), Client(srv), Client(srv)
    one.send(b"SUB a 1\r\nSUB b.c 2\r\nSUB w.* 3\r\n")
    two.send(b"SUB b.c 1\r\nSUB w.x 2\r\n")
    group.send(b"SUB q workers 1\r\n")
    for c in (one, two, group):
        c.raw()
    return srv, [one, two, group]


def deliver(srv: NatsServer, ev: Event, log: list[object]) -> int:
    """Deliver one PUB event by its route (as the connection's slow path does); MSG copies."""
    hit, payload = ev[1], ev[2]
    route = srv.routes.get(hit[0]) or srv.resolve(hit)
    for _conn, out, prefix in route[0]:
        out.append(prefix)
        out.append(payload + CRLF)
    if route[1] is not None:
        log.append(("special", hit[1], hit[2], payload))
    return len(route[0])


def note(ev: Event, log: list[object]) -> None:
    """Record a non-PUB event comparably (errors by code and fatality)."""
    if ev[0] == OP_ERROR:
        log.append((OP_ERROR, ev[1].code, ev[1].fatal))
    else:
        log.append(ev[:1] + tuple(e[1:] if isinstance(e, tuple) else e for e in ev[1:]))


def by_parser(srv: NatsServer, reads: list[bytes]) -> tuple[list[object], int, int]:
    """Every event from the pure parser, PUBs delivered by route: (log, PUBs, MSG copies)."""
    parser = NatsParser(max_payload=srv.settings.max_payload)
    log: list[object] = []
    pubs = copies = 0
    for data in reads:
        parser.receive_data(data)
        for ev in parser.events():
            if ev[0] == OP_PUB:
                pubs += 1
                copies += deliver(srv, ev, log)
            else:
                note(ev, log)
    return log, pubs, copies


def by_router(srv: NatsServer, reads: list[bytes]) -> tuple[list[object], int, int]:
    """The router's fast path with the parser's events in between, as the connection runs it."""
    parser = NatsParser(max_payload=srv.settings.max_payload)
    router = PubRouter(parser)
    log: list[object] = []
    pubs = copies = 0
    for data in reads:
        parser.receive_data(data)
        while True:
            pubs += router.route_pubs(srv.routes, srv.dirty, srv.head_routes)
            copies += router.last_sent
            events = router.slow_run(srv.routes, srv.head_routes)
            if not events:
                break
            for ev in events:
                if ev[0] == OP_PUB:
                    pubs += 1
                    copies += deliver(srv, ev, log)
                else:
                    note(ev, log)
            if any(e[0] == OP_ERROR and e[1].fatal for e in events):
                break
    return log, pubs, copies


def outputs(clients: list[Client]) -> list[bytes]:
    """Each receiver's delivered bytes (taken: the lists are emptied)."""
    got = [b"".join(c.proto.out) for c in clients]
    for c in clients:
        c.proto.out.clear()
    return got


def cut(stream: bytes, cuts: list[int]) -> list[bytes]:
    """``stream`` split into reads of the given lengths (the rest as the last read)."""
    reads, at = [], 0
    for n in cuts:
        reads.append(stream[at:at + n])
        at += n
    reads.append(stream[at:])
    return [r for r in reads if r]


@settings(max_examples=150, deadline=None)
@given(frames=STREAM, cuts=st.lists(st.integers(1, 9000), max_size=5),
       scan_bytes=st.sampled_from([scan.SCAN_BYTES, 0]), warm=st.booleans())
@example(frames=[b"PUB a 5\r\nhello\r\n" * 12, b"PING\r\n", b"PUB w.x 1\r\ny\r\n" * 12],
         cuts=[], scan_bytes=0, warm=True)
@example(frames=[b"PUB a 3\r\nabc\r\n", b"PUB a 4\r\nabcd\r\n" * 12, b"PUB q 1\r\nz\r\n"],
         cuts=[17, 3], scan_bytes=0, warm=False)
@example(frames=[b"PUB a 0\r\n\r\n", b"PUB a 03\r\nabc\r\n"], cuts=[11], scan_bytes=8192,
         warm=False)   # a zero-padded size on a known head: MSG ... 3, as nats-server writes it
def test_router_and_parser_give_the_same_result(frames: list[bytes], cuts: list[int],
                                                scan_bytes: int, warm: bool) -> None:
    """Same bytes per receiver, same other events in order, same counts, for any cut."""
    stream = b"".join(frames)
    reads = cut(stream, cuts)
    saved = scan.SCAN_BYTES
    scan.SCAN_BYTES = scan_bytes
    try:
        srv, clients = server_with_subscribers()
        if warm:        # routes cached before the stream (the steady state), or built in it
            by_parser(srv, reads)
            outputs(clients)
        expected = by_parser(srv, reads)
        want = outputs(clients)
        if not warm:
            srv.changed()       # the router starts from empty caches too
        got = by_router(srv, reads)
        assert outputs(clients) == want
        assert got == expected
    finally:
        scan.SCAN_BYTES = saved
