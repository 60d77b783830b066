"""NATS server behaviour over StringTransport with a memory hub and a Clock."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from mqhub.protocols.nats import codec
from mqhub.protocols.nats.codec import OP_ERR, OP_HMSG, OP_MSG, OP_OK, OP_PING, OP_PONG
from mqhub.protocols.nats.settings import STALL_MAX
from tests.unit.protocols.nats.helpers import Client, make_mq9_server, make_server


def test_info_first_with_required_fields() -> None:
    """INFO comes first with a semver version, headers and max_payload."""
    srv = make_server()
    c = Client(srv, handshake=False)
    assert c.info["proto"] == 1 and c.info["headers"] is True
    assert c.info["max_payload"] == 1024 * 1024
    major, minor, patch = c.info["version"].split(".")
    assert all(p.isdigit() for p in (major, minor, patch))
    assert "auth_required" not in c.info


def test_pub_sub_and_wildcards() -> None:
    """Exact, *, > and catch-all subscriptions each get their MSG."""
    srv = make_server()
    sub = Client(srv)
    pub = Client(srv)
    sub.send(b"SUB foo.bar 1\r\nSUB foo.* 2\r\nSUB foo.> 3\r\nSUB > 4\r\nSUB foo 5\r\n")
    pub.send(b"PUB foo.bar reply.me 5\r\nhello\r\n")
    got = sorted(sub.events())
    assert got == sorted([(OP_MSG, "foo.bar", sid, "reply.me", b"hello") for sid in "1234"])
    pub.send(b"PUB foo.bar.baz 1\r\nx\r\n")
    assert sorted(e[2] for e in sub.events()) == ["3", "4"]
    pub.send(b"PUB foo 0\r\n\r\n")
    assert sorted(e[2] for e in sub.events()) == ["4", "5"]


def test_many_pubs_in_one_read_are_written_once() -> None:
    """A hundred PUBs in one read reach a subscriber in one write."""
    srv = make_server()
    sub = Client(srv)
    pub = Client(srv)
    sub.send(b"SUB a 1\r\n")
    writes: list[bytes] = []
    orig = sub.transport.write

    def counting_write(data: bytes) -> None:
        writes.append(data)
        orig(data)

    sub.transport.write = counting_write  # type: ignore[method-assign]
    pub.send(b"".join(codec.encode_pub("a", b"m%d" % i) for i in range(100)))
    assert len(writes) == 1
    assert [e[4] for e in sub.events()] == [b"m%d" % i for i in range(100)]


def test_route_cache_follows_subscription_changes() -> None:
    """Cached routes follow SUB and UNSUB from any connection."""
    srv = make_server()
    a = Client(srv)
    b = Client(srv)
    pub = Client(srv)
    a.send(b"SUB x 1\r\n")
    pub.send(b"PUB x 1\r\n1\r\n")
    b.send(b"SUB x 9\r\n")
    pub.send(b"PUB x 1\r\n2\r\n")
    a.send(b"UNSUB 1\r\n")
    pub.send(b"PUB x 1\r\n3\r\n")
    assert [e[4] for e in a.events()] == [b"1", b"2"]
    assert [e[4] for e in b.events()] == [b"2", b"3"]


def test_queue_group_each_message_to_one_member_plus_plain() -> None:
    """Each message reaches one queue member per group and every plain subscriber."""
    srv = make_server()
    m1, m2, plain, pub = Client(srv), Client(srv), Client(srv), Client(srv)
    m1.send(b"SUB work q 1\r\n")
    m2.send(b"SUB * q 1\r\n")           # same group name, another pattern: one group
    plain.send(b"SUB work 7\r\n")
    pub.send(b"".join(codec.encode_pub("work", b"%d" % i) for i in range(200)))
    got1 = [e[4] for e in m1.events()]
    got2 = [e[4] for e in m2.events()]
    assert len(got1) + len(got2) == 200
    assert sorted(got1 + got2) == sorted(b"%d" % i for i in range(200))
    assert got1 and got2
    assert len(plain.events()) == 200


def test_unsub_with_max_and_already_reached() -> None:
    """UNSUB with max stops after max; an already reached max removes at once."""
    srv = make_server()
    s, pub = Client(srv), Client(srv)
    s.send(b"SUB a 1\r\nUNSUB 1 2\r\n")
    pub.send(b"PUB a 1\r\nx\r\n" * 5)
    assert len(s.events()) == 2
    s.send(b"SUB b 2\r\nUNSUB 2 1\r\nUNSUB nosuch\r\n")   # unknown sid ignored
    pub.send(b"PUB b 1\r\nx\r\n")
    s.send(b"UNSUB 2 1\r\n")                     # already delivered 1: removed at once
    pub.send(b"PUB b 1\r\nx\r\n")
    assert len(s.events()) == 1
    assert srv.sublist.count == 0 and not s.proto.subs


def test_echo_off() -> None:
    """echo=false keeps a connection's own publishes from it."""
    srv = make_server()
    c = Client(srv, {"echo": False})
    other = Client(srv)
    c.send(b"SUB e 1\r\n")
    other.send(b"SUB e 1\r\n")
    c.send(b"PUB e 1\r\nx\r\n")
    assert c.events() == []
    assert len(other.events()) == 1


def test_verbose_and_pedantic_defaults_before_connect() -> None:
    """Before and with an empty CONNECT, verbose and pedantic are on."""
    srv = make_server()
    c = Client(srv, handshake=False)
    c.send(b"SUB foo 1\r\nPING\r\n")
    assert c.events() == [(OP_OK,), (OP_PONG,)]
    c.send(b"CONNECT {}\r\nPUB foo.* 1\r\nx\r\n")
    assert c.events() == [(OP_OK,), (OP_ERR, "Invalid Publish Subject")]
    assert not c.closed
    c.send(b"PUB foo 1\r\nx\r\n")
    assert c.events() == [(OP_MSG, "foo", "1", None, b"x"), (OP_OK,)]


def test_headers_and_headerless_subscriber() -> None:
    """HPUB reaches header subscribers as HMSG and others as MSG."""
    srv = make_server()
    h = Client(srv)
    plain = Client(srv, {"headers": False, "no_responders": False})
    pub = Client(srv)
    h.send(b"SUB foo 1\r\n")
    plain.send(b"SUB foo 1\r\n")
    block = b"NATS/1.0\r\nBar: Baz\r\n\r\n"
    pub.send(codec.encode_hpub("foo", block, b"Hello NATS!"))
    assert h.events() == [(OP_HMSG, "foo", "1", None, block, b"Hello NATS!")]
    assert plain.events() == [(OP_MSG, "foo", "1", None, b"Hello NATS!")]
    plain.send(codec.encode_hpub("foo", block, b"x"))     # HPUB without negotiated headers
    assert plain.closed


def test_no_responders() -> None:
    """A request nobody receives gets a 503 HMSG only with no_responders."""
    srv = make_server()
    c = Client(srv)
    c.send(b"SUB _INBOX.abc.* 3\r\nPUB svc.none _INBOX.abc.1 2\r\nhi\r\n")
    evs = c.events()
    assert evs == [(OP_HMSG, "_INBOX.abc.1", "3", None, b"NATS/1.0 503\r\n\r\n", b"")]
    assert codec.parse_headers(evs[0][4])[0] == 503
    quiet = Client(srv, {"no_responders": False})
    quiet.send(b"SUB _INBOX.q.* 3\r\nPUB svc.none _INBOX.q.1 2\r\nhi\r\n")
    assert quiet.events() == []


def test_request_reply_through_wildcard_inbox() -> None:
    """Request/reply works through a muxed _INBOX.x.* subscription."""
    srv = make_server()
    svc, req = Client(srv), Client(srv)
    svc.send(b"SUB svc.echo q 1\r\n")
    req.send(b"SUB _INBOX.n1.* 2\r\nPUB svc.echo _INBOX.n1.t1 4\r\nping\r\n")
    (ev,) = svc.events()
    assert ev == (OP_MSG, "svc.echo", "1", "_INBOX.n1.t1", b"ping")
    svc.send(codec.encode_pub(ev[3], b"pong"))
    assert req.events() == [(OP_MSG, "_INBOX.n1.t1", "2", None, b"pong")]


def test_fatal_errors_close_only_that_connection() -> None:
    """Fatal errors send nats-server's -ERR (or nothing) and close only that connection."""
    srv = make_server()
    good, sub = Client(srv), Client(srv)
    sub.send(b"SUB ok 1\r\n")
    cases = [
        (b"FOO\r\n", "Unknown Protocol Operation"),
        (b"PUB foo 2000000\r\n", "Maximum Payload Violation"),
        (b"SUB " + b"a" * 4100 + b" 1\r\n", "maximum control line exceeded"),
        (b"PUB foo 2\r\nhiXX", "Unknown Protocol Operation"),
        (b'CONNECT {"protocol":2}\r\n', "invalid client protocol"),
        (b'CONNECT {"no_responders":true,"headers":false}\r\n',
         "no responders requires headers support"),
    ]
    for data, text in cases:
        bad = Client(srv)
        bad.send(data)
        assert bad.events()[-1] == (OP_ERR, text)
        assert bad.closed
    for data in (b"PUB foo\r\n", b"PUB foo x\r\n", b"SUB a b c d\r\n", b"CONNECT {x\r\n"):
        bad = Client(srv)
        bad.send(data)
        assert bad.events() == []      # closed without -ERR, like nats-server
        assert bad.closed
    good.send(b"PUB ok 2\r\nok\r\n")
    assert sub.events() == [(OP_MSG, "ok", "1", None, b"ok")]
    assert not good.closed and not sub.closed


def test_invalid_subject_stays_open() -> None:
    """An invalid SUB subject gets -ERR and the connection keeps working."""
    srv = make_server()
    c = Client(srv)
    c.send(b"SUB foo..bar 1\r\nSUB foo 2\r\nPUB foo 1\r\nx\r\n")
    assert c.events() == [(OP_ERR, "Invalid Subject"), (OP_MSG, "foo", "2", None, b"x")]
    assert not c.closed


def test_token_auth() -> None:
    """Token auth: a wrong token or no CONNECT first is an Authorization Violation."""
    srv = make_server(token="s3cret")
    c = Client(srv, handshake=False)
    assert c.info["auth_required"] is True
    c.send(b'CONNECT {"auth_token":"nope","verbose":false}\r\n')
    assert c.events() == [(OP_ERR, "Authorization Violation")] and c.closed
    c = Client(srv, {"auth_token": "s3cret"})
    c.send(b"SUB a 1\r\nPUB a 1\r\nx\r\n")
    assert len(c.events()) == 1
    c = Client(srv, handshake=False)
    c.send(b"SUB a 1\r\n")
    assert c.events() == [(OP_ERR, "Authorization Violation")] and c.closed


def test_user_password_auth_and_timeout() -> None:
    """User/password auth, and the authentication timeout."""
    srv = make_server(user="u", password="p")
    c = Client(srv, {"user": "u", "pass": "p"})
    assert not c.closed
    c = Client(srv, handshake=False)
    c.send(b'CONNECT {"user":"u","pass":"x"}\r\n')
    assert c.events() == [(OP_ERR, "Authorization Violation")] and c.closed
    c = Client(srv, handshake=False)
    srv.clock.advance(2.1)
    assert c.events() == [(OP_ERR, "Authentication Timeout")] and c.closed


def test_server_ping_and_stale_connection() -> None:
    """Server PINGs; a connection that never answers is closed as stale."""
    srv = make_server(ping_interval=1.0, ping_max=2)
    c = Client(srv)
    alive = Client(srv)
    srv.clock.advance(1.0)
    assert c.events() == [(OP_PING,)]
    assert alive.events() == [(OP_PING,)]
    alive.send(b"PONG\r\n")
    srv.clock.advance(1.0)
    assert c.events() == [(OP_PING,)]
    alive.send(b"PONG\r\n")
    srv.clock.advance(1.0)
    assert c.events() == [(OP_ERR, "Stale Connection")] and c.closed
    assert not alive.closed


def test_slow_consumer_is_closed_and_others_continue() -> None:
    """A subscriber past max_pending is closed; the others keep receiving."""
    srv = make_server(max_pending=10_000)
    slow, fast, pub = Client(srv), Client(srv), Client(srv)
    slow.send(b"SUB s 1\r\n")
    fast.send(b"SUB s 1\r\n")
    slow.proto.pauseProducing()          # what the transport does when its buffer is full
    for _ in range(20):
        pub.send(codec.encode_pub("s", b"x" * 1000))
    assert slow.closed
    assert srv.stats["slow_consumers"] == 1
    assert len(fast.events()) == 20
    pub.send(codec.encode_pub("s", b"after"))
    assert fast.events()[-1][4] == b"after"


def test_closing_connection_drops_its_subscriptions() -> None:
    """A closed connection's subscriptions are gone."""
    srv = make_server()
    c, pub = Client(srv), Client(srv)
    c.send(b"SUB a 1\r\nSUB b q 2\r\n")
    assert srv.sublist.count == 2
    c.transport.loseConnection()
    assert srv.sublist.count == 0
    pub.send(b"PUB a 1\r\nx\r\n")
    assert not pub.closed


def test_a_publisher_feeding_a_subscriber_near_its_budget_pauses_for_milliseconds() -> None:
    """Under 3/4 of max_pending the publisher is read on; above, it is not read for at most
    STALL_MAX seconds (nats-server's fast-producer stall), and nobody else is held."""
    srv = make_server(max_pending=1_000_000)
    sub, other_sub, pub, bystander = Client(srv), Client(srv), Client(srv), Client(srv)
    sub.send(b"SUB s 1\r\n")
    other_sub.send(b"SUB calm 1\r\n")
    sub.proto.pauseProducing()
    pub.send(codec.encode_pub("s", b"x" * 1000) * 500)      # ~ 500 KB: under 3/4
    assert pub.transport.producerState == "producing"
    pub.send(codec.encode_pub("s", b"x" * 1000) * 300)      # ~ 800 KB: over 3/4
    assert pub.transport.producerState == "paused" and not sub.closed
    bystander.send(codec.encode_pub("calm", b"fine"))
    assert bystander.transport.producerState == "producing"
    assert other_sub.events()[-1][4] == b"fine"
    srv.clock.advance(STALL_MAX)
    assert pub.transport.producerState == "producing"
    sub.proto.resumeProducing()
    assert len(sub.events()) == 800


def test_fast_path_mixed_sizes_replies_and_sub_changes_in_one_read() -> None:
    """The fused path handles sizes, replies and SUB/UNSUB mid-read at every split."""
    srv = make_server(max_payload=100)
    sub, pub = Client(srv), Client(srv)
    sub.send(b"SUB m.* 1\r\n")
    pub.send(codec.encode_pub("m.a", b"x"))                # warms the routes
    assert len(sub.events()) == 1
    stream = (codec.encode_pub("m.a", b"yy") + codec.encode_pub("m.a", b"zzz", "r.1")
              + codec.encode_pub("m.a", b"q" * 50) + b"SUB m.a 2\r\n"
              + codec.encode_pub("m.a", b"after") + b"UNSUB 2\r\n" + codec.encode_pub("m.a", b"w"))
    for cut in range(1, len(stream)):                       # every split of the stream
        srv2 = make_server(max_payload=100)
        s2, p2 = Client(srv2), Client(srv2)
        s2.send(b"SUB m.* 1\r\n")
        p2.send(codec.encode_pub("m.a", b"x"))
        s2.events()
        p2.send(stream[:cut])
        p2.send(stream[cut:])
        # the SUB/UNSUB come from the publisher's connection: its own subs get echoes
        got = [(e[2], e[3], e[4]) for e in p2.events()]
        assert got == [("2", None, b"after")], cut
        assert [(e[2], e[3], e[4]) for e in s2.events()] == [
            ("1", None, b"yy"), ("1", "r.1", b"zzz"), ("1", None, b"q" * 50),
            ("1", None, b"after"), ("1", None, b"w")], cut


def test_fast_path_still_enforces_framing_and_limits() -> None:
    """The fused path still enforces payload framing and max_payload."""
    srv = make_server(max_payload=100)
    sub, pub = Client(srv), Client(srv)
    sub.send(b"SUB f 1\r\n")
    pub.send(codec.encode_pub("f", b"12"))
    pub.send(b"PUB f 2\r\nabXX")                          # cached line, bad trailer
    assert pub.events()[-1] == (codec.OP_ERR, "Unknown Protocol Operation") and pub.closed
    pub2 = Client(srv)
    pub2.send(codec.encode_pub("f", b"12"))
    pub2.send(b"PUB f 101\r\n")                           # known head, size over the limit
    assert pub2.events()[-1] == (codec.OP_ERR, "Maximum Payload Violation") and pub2.closed
    assert [e[4] for e in sub.events()] == [b"12", b"12"]


#: payloads that hold their own frame's header line (12 and 20 bytes) must not confuse the run path
_RUN_PAYLOADS = [b"abcd", b"PUB r.a 12\r\n", b"PUB r.b 12\r\n", b"PUB r.a r.reply 20\r\n",
                 b"\r\n\r\n"]


@settings(max_examples=120, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["r.a", "r.b", "r.a r.reply"]),
                          st.sampled_from(_RUN_PAYLOADS),
                          st.integers(min_value=1, max_value=30)), min_size=1, max_size=6),
       st.integers(min_value=1, max_value=400), st.booleans())
@example([("r.a", b"PUB r.a 12\r\n", 20), ("r.a r.reply", b"PUB r.a r.reply 20\r\n", 12),
          ("r.b", b"abcd", 30)], 4000, True)
@example([("r.a", b"abcd", 9), ("r.b", b"abcd", 9), ("r.a", b"abcd", 7)], 4000, False)
def test_runs_of_identical_frames_are_delivered_exactly(runs: list[tuple[str, bytes, int]],
                                                        cut: int, bad_end: bool) -> None:
    """Long runs of identical PUB frames (the run path) deliver exactly what one-by-one
    parsing would, to every subscriber, whatever the payload holds and wherever reads split;
    a broken frame inside a run still closes the publisher after the frames before it."""
    srv = make_server(max_payload=100)
    plain, wild, pub = Client(srv), Client(srv), Client(srv)
    plain.send(b"SUB r.a 1\r\n")
    wild.send(b"SUB r.* 7\r\n")
    expected: list[tuple[str, str | None, bytes]] = []
    stream = b""
    for subj, payload, count in runs:
        subject, _, reply = subj.partition(" ")
        stream += codec.encode_pub(subject, payload, reply or None) * count
        expected += [(subject, reply or None, payload)] * count
    for subject, reply in (("r.a", None), ("r.b", None), ("r.a", "r.reply")):
        for size in {len(p) for p in _RUN_PAYLOADS}:   # the route cache knows every line
            pub.send(codec.encode_pub(subject, b"w" * size, reply))
    plain.events()
    wild.events()
    if bad_end:
        stream += codec.encode_pub("r.a", b"abcd")[:-2] + b"XX"
    for i in range(0, len(stream), cut):
        pub.send(stream[i:i + cut])
    got_wild = [(e[1], e[3], e[4]) for e in wild.events() if e[0] == OP_MSG]
    got_plain = [(e[1], e[3], e[4]) for e in plain.events() if e[0] == OP_MSG]
    assert got_wild == expected
    assert got_plain == [x for x in expected if x[0] == "r.a"]
    assert pub.closed == bad_end


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(
    st.binary(max_size=60),
    st.sampled_from([b"PUB a 1\r\nx\r\n", b"PUB a.b r 2\r\nxy\r\n", b"SUB a 1\r\n", b"SUB > q 2\r\n",
                     b"UNSUB 1\r\n", b"UNSUB 2 3\r\n", b"PING\r\n", b"HPUB a 12 12\r\nNATS/1.0\r\n\r\n\r\n",
                     b"PUB $mq9.AI.MAILBOX.CREATE _INBOX.x 0\r\n\r\n", b"SUB $mq9.AI.INBOX.m.* 5\r\n",
                     b"PUB $mq9.AI.INBOX.m.urgent 1\r\nu\r\n", b"\r\n", b"PUB a 3\r\n", b"PUB a 1\r\nxxx"])),
    max_size=25), st.integers(min_value=1, max_value=40), st.booleans())
def test_fuzzed_clients_never_hurt_the_server_or_others(chunks: list[bytes], cut: int,
                                                        fast: bool) -> None:
    """Fuzzed input (slow and fused paths) never raises and never hurts others."""
    srv = make_mq9_server()
    watcher, pub = Client(srv), Client(srv)
    watcher.send(b"SUB probe 1\r\n")
    fuzzed = Client(srv, handshake=fast)       # fast: CONNECT verbose=false, the fused path
    data = b"".join(chunks)
    for i in range(0, len(data), cut):
        if fuzzed.closed:
            break
        fuzzed.send(data[i:i + cut])                        # must never raise
    srv.hub.clock.advance(0)
    pub.send(b"PUB probe 2\r\nok\r\n")
    assert watcher.events()[-1] == (OP_MSG, "probe", "1", None, b"ok")
    assert not watcher.closed and not pub.closed


def test_a_subscriber_backed_up_for_the_write_deadline_is_cut() -> None:
    """A never-reading subscriber under max_pending is closed at the write deadline."""
    srv = make_server(max_pending=1_000_000, write_deadline=10)
    stuck, other, pub = Client(srv), Client(srv), Client(srv)
    stuck.send(b"SUB s 1\r\n")
    other.send(b"SUB s 1\r\n")
    stuck.proto.pauseProducing()                 # its socket never drains
    pub.send(codec.encode_pub("s", b"x" * 1000) * 100)
    assert pub.transport.producerState == "producing"
    srv.clock.advance(9)
    assert not stuck.closed
    srv.clock.advance(1.1)                        # the write deadline passed
    assert stuck.closed and srv.stats["slow_consumers"] == 1
    assert all(ev[0] == OP_MSG for ev in stuck.events())    # cut without -ERR, as nats-server
    pub.send(codec.encode_pub("s", b"later"))
    assert other.events()[-1][4] == b"later"


def test_a_drained_subscriber_cancels_its_write_deadline() -> None:
    """A subscriber that drains in time is not closed."""
    srv = make_server(max_pending=1_000_000, write_deadline=10)
    sub, pub = Client(srv), Client(srv)
    sub.send(b"SUB s 1\r\n")
    sub.proto.pauseProducing()
    pub.send(codec.encode_pub("s", b"x" * 1000) * 800)
    sub.proto.resumeProducing()
    srv.clock.advance(20)
    assert not sub.closed and srv.stats["slow_consumers"] == 0


def test_a_slow_consumer_is_cut_at_once_and_the_publisher_goes_on() -> None:
    """Past max_pending within one read: cut at once, counted once; the feeder is still read."""
    srv = make_server(max_pending=1_000_000)
    slow, other_sub, feeder = Client(srv), Client(srv), Client(srv)
    slow.send(b"SUB busy 1\r\n")
    other_sub.send(b"SUB busy 1\r\n")
    slow.proto.pauseProducing()
    feeder.send(codec.encode_pub("busy", b"x" * 1000) * 800)
    feeder.send(codec.encode_pub("busy", b"x" * 1000) * 800)    # 1.6 MB > max_pending
    assert slow.closed and srv.stats["slow_consumers"] == 1
    srv.clock.advance(STALL_MAX)                  # at most a fast-producer stall
    feeder.send(codec.encode_pub("busy", b"fine"))
    assert feeder.transport.producerState == "producing" and not feeder.closed
    assert srv.stats["slow_consumers"] == 1
    assert other_sub.events()[-1][4] == b"fine"
