"""Tests of the sans-IO NATS codec: whole, byte by byte, random splits, round trips, limits, fuzz."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqhub.protocols.nats import codec
from mqhub.protocols.nats.codec import (
    NEED_DATA,
    OP_CONNECT,
    OP_ERR,
    OP_ERROR,
    OP_HMSG,
    OP_HPUB,
    OP_INFO,
    OP_MSG,
    OP_OK,
    OP_PING,
    OP_PONG,
    OP_PUB,
    OP_SUB,
    OP_UNSUB,
    NatsParser,
    ProtocolError,
)

CLIENT_STREAM = (
    b'CONNECT {"verbose":false,"pedantic":false,"headers":true}\r\n'
    b"PING\r\n"
    b"SUB foo  1\r\n"
    b"sub bar.* q.grp 2\r\n"
    b"PUB foo 5\r\nhello\r\n"
    b"PUB foo reply.x 0\r\n\r\n"
    b"HPUB foo 22 27\r\nNATS/1.0\r\nBar: Baz\r\n\r\nhello\r\n"
    b"UNSUB 1 5\r\n"
    b"UNSUB 2\r\n"
    b"PONG\r\n"
    b"+OK\r\n"
    b"pub foo\t3\nabc\r\n"
)


def norm(ev: tuple) -> tuple:
    """Make events comparable: PUB/HPUB hits reduced to (subject, reply, sizes)."""
    if ev[0] in (OP_PUB, OP_HPUB):
        return (ev[0], ev[1][1:]) + ev[2:]
    return ev


EXPECTED = [
    (OP_CONNECT, {"verbose": False, "pedantic": False, "headers": True}),
    (OP_PING,),
    (OP_SUB, "foo", None, "1"),
    (OP_SUB, "bar.*", "q.grp", "2"),
    (OP_PUB, ("foo", None, 5), b"hello"),
    (OP_PUB, ("foo", "reply.x", 0), b""),
    (OP_HPUB, ("foo", None, 22, 27), b"NATS/1.0\r\nBar: Baz\r\n\r\n", b"hello"),
    (OP_UNSUB, "1", 5),
    (OP_UNSUB, "2", None),
    (OP_PONG,),
    (OP_OK,),
    (OP_PUB, ("foo", None, 3), b"abc"),
]


def drain(parser: NatsParser) -> list[tuple]:
    """Collect events with next_event until NEED_DATA."""
    out: list[tuple] = []
    while (ev := parser.next_event()) is not NEED_DATA:
        assert isinstance(ev, tuple)
        out.append(norm(ev))
    return out


def feed_in_pieces(data: bytes, cuts: list[int], server: bool = True) -> list[tuple]:
    """Feed ``data`` cut at ``cuts`` and collect every event."""
    p = NatsParser(server=server)
    out: list[tuple] = []
    last = 0
    for c in sorted(set(cuts)) + [len(data)]:
        p.receive_data(data[last:c])
        last = c
        out.extend(drain(p))
    return out


def test_whole_stream() -> None:
    """A whole client stream parses into the expected events."""
    assert feed_in_pieces(CLIENT_STREAM, []) == EXPECTED


def test_one_byte_at_a_time() -> None:
    """Feeding one byte per read gives the same events."""
    assert feed_in_pieces(CLIENT_STREAM, list(range(len(CLIENT_STREAM)))) == EXPECTED


def test_random_splits() -> None:
    """Random splits of the stream give the same events."""
    rnd = random.Random(6)
    for _ in range(200):
        cuts = [rnd.randrange(len(CLIENT_STREAM)) for _ in range(rnd.randrange(1, 12))]
        assert feed_in_pieces(CLIENT_STREAM, cuts) == EXPECTED


def test_large_payload_in_many_chunks() -> None:
    """A 768 kB payload arriving in 4 KiB chunks parses once, intact."""
    body = bytes(range(256)) * 3000
    data = b"PUB big 768000\r\n" + body + b"\r\nPING\r\n"
    p = NatsParser()
    for i in range(0, len(data), 4096):
        p.receive_data(data[i:i + 4096])
    evs = [norm(e) for e in p.events()]
    assert evs == [(OP_PUB, ("big", None, 768000), body), (OP_PING,)]


SERVER_STREAM = (
    b'INFO {"server_id":"x","version":"2.10.0","headers":true,"max_payload":1048576} \r\n'
    b"MSG foo 1 bar.reply 2\r\nhi\r\n"
    b"MSG foo 1 0\r\n\r\n"
    b"HMSG foo 1 22 33\r\nNATS/1.0\r\nBar: Baz\r\n\r\nHello NATS!\r\n"
    b"HMSG _INBOX.x.1 1 _r 16 16\r\nNATS/1.0 503\r\n\r\n\r\n"
    b"PING\r\nPONG\r\n+OK\r\n-ERR 'Unknown Protocol Operation'\r\n"
)
SERVER_EXPECTED = [
    (OP_INFO, {"server_id": "x", "version": "2.10.0", "headers": True, "max_payload": 1048576}),
    (OP_MSG, "foo", "1", "bar.reply", b"hi"),
    (OP_MSG, "foo", "1", None, b""),
    (OP_HMSG, "foo", "1", None, b"NATS/1.0\r\nBar: Baz\r\n\r\n", b"Hello NATS!"),
    (OP_HMSG, "_INBOX.x.1", "1", "_r", b"NATS/1.0 503\r\n\r\n", b""),
    (OP_PING,), (OP_PONG,), (OP_OK,), (OP_ERR, "Unknown Protocol Operation"),
]


def test_client_side_parser_whole_and_bytewise() -> None:
    """The server-to-client direction (INFO, MSG, HMSG, -ERR) parses whole and bytewise."""
    assert feed_in_pieces(SERVER_STREAM, [], server=False) == SERVER_EXPECTED
    assert feed_in_pieces(SERVER_STREAM, list(range(len(SERVER_STREAM))),
                          server=False) == SERVER_EXPECTED


def test_headers_status_line() -> None:
    """Header blocks with status lines parse and build like nats-server's."""
    status, desc, items = codec.parse_headers(b"NATS/1.0 503\r\n\r\n")
    assert (status, desc, items) == (503, "", [])
    status, desc, items = codec.parse_headers(b"NATS/1.0 100 Idle Heartbeat\r\nA: 1\r\nA: 2\r\n\r\n")
    assert (status, desc, items) == (100, "Idle Heartbeat", [("A", "1"), ("A", "2")])
    block = codec.build_headers({"X-Test": "1"}, status=503)
    assert block == b"NATS/1.0 503\r\nX-Test: 1\r\n\r\n"
    with pytest.raises(ProtocolError):
        codec.parse_headers(b"HTTP/1.1 200\r\n\r\n")


def expect_fatal(data: bytes, code: str, **kw: Any) -> ProtocolError:
    """Feed ``data`` and return the fatal ProtocolError it must raise."""
    p = NatsParser(**kw)
    p.receive_data(data)
    with pytest.raises(ProtocolError) as info:
        while p.next_event() is not NEED_DATA:
            pass
    assert info.value.code == code
    assert info.value.fatal
    with pytest.raises(ProtocolError):   # the parser stays dead
        p.next_event()
    return info.value


def test_control_line_limit() -> None:
    """A control line over 4096 bytes is fatal, even before its newline arrives."""
    expect_fatal(b"SUB " + b"a" * 4100 + b" 1\r\n", codec.E_MAX_CONTROL)
    expect_fatal(b"PUB " + b"a" * 5000, codec.E_MAX_CONTROL)   # no newline yet, already too long
    p = NatsParser()
    p.receive_data(b"SUB " + b"a" * 1100 + b" 1\r\n")
    assert p.events()[0][0] == OP_SUB


def test_max_payload() -> None:
    """PUB/HPUB sizes over max_payload are fatal Maximum Payload Violations."""
    expect_fatal(b"PUB foo 2000000\r\n", codec.E_MAX_PAYLOAD)
    expect_fatal(b"HPUB foo 12 2000000\r\n", codec.E_MAX_PAYLOAD)
    expect_fatal(b"PUB foo 11\r\n", codec.E_MAX_PAYLOAD, max_payload=10)
    # a known subject at a new, oversized size (the head-cache path)
    expect_fatal(b"PUB foo 1\r\nx\r\nPUB foo 11\r\n", codec.E_MAX_PAYLOAD, max_payload=10)
    expect_fatal(b"HPUB foo 0 1\r\nx\r\nHPUB foo 0 11\r\n", codec.E_MAX_PAYLOAD, max_payload=10)


def test_unknown_and_bad_arguments() -> None:
    """Unknown operations, bad framing and argument errors map to the right codes."""
    expect_fatal(b"FOO bar\r\n", codec.E_UNKNOWN_OP)
    expect_fatal(b"MSG foo 1 2\r\nhi\r\n", codec.E_UNKNOWN_OP)       # clients may not send MSG
    expect_fatal(b"PUB foo 2\r\nhiXX", codec.E_UNKNOWN_OP)          # payload not followed by CRLF
    expect_fatal(b"HPUB foo 12 14\r\nNATS/1.0\r\n\r\nhiXX", codec.E_UNKNOWN_OP)
    expect_fatal(b"MSG foo 1 2\r\nhiXX", codec.E_UNKNOWN_OP, server=False)
    expect_fatal(b"HMSG foo 1 12 14\r\nNATS/1.0\r\n\r\nhiXX", codec.E_UNKNOWN_OP, server=False)
    expect_fatal(b"PUB foo\r\n", codec.E_BAD_ARGS)
    expect_fatal(b"PUB foo x\r\n", codec.E_BAD_ARGS)
    expect_fatal(b"SUB foo\r\n", codec.E_BAD_ARGS)
    expect_fatal(b"SUB a b c d\r\n", codec.E_BAD_ARGS)
    expect_fatal(b"HPUB foo 10 5\r\n", codec.E_BAD_ARGS)
    expect_fatal(b"CONNECT {nope\r\n", codec.E_BAD_CONNECT)
    expect_fatal(b"INFO {}\r\n", codec.E_UNKNOWN_OP)                # server-side parser


def test_invalid_sub_subject_is_not_fatal() -> None:
    """An invalid SUB subject is a non-fatal error and parsing continues."""
    p = NatsParser()
    p.receive_data(b"SUB foo..bar 1\r\nSUB foo.>.bar 2\r\nSUB foo.> 3\r\n")
    evs = p.events()
    assert [e[0] for e in evs] == [OP_ERROR, OP_ERROR, OP_SUB]
    assert evs[0][1].code == codec.E_INVALID_SUBJECT and not evs[0][1].fatal
    p.receive_data(b"SUB x. 4\r\n")
    with pytest.raises(ProtocolError) as info:
        p.next_event()
    assert not info.value.fatal
    assert p.next_event() is NEED_DATA


def test_subject_rules() -> None:
    """Subject and publish-subject validation follow nats-server's rules."""
    assert codec.valid_subject("foo.*.>")
    assert codec.valid_subject("ünï.cødé")
    assert codec.valid_subject("foo>")
    assert not codec.valid_subject("foo..bar")
    assert not codec.valid_subject(".foo")
    assert not codec.valid_subject("a.>.b")
    assert not codec.valid_subject("")
    assert codec.valid_publish_subject("$mq9.AI.INBOX.m1.urgent")
    assert not codec.valid_publish_subject("foo.*")
    assert not codec.valid_publish_subject("foo.>")


subjects = st.lists(st.text(alphabet="abcXYZ09_-$ü", min_size=1, max_size=8),
                    min_size=1, max_size=4).map(".".join)
payloads = st.binary(max_size=300)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(subjects, st.one_of(st.none(), subjects), payloads,
                          st.one_of(st.none(), st.dictionaries(
                              st.text(alphabet="abcdefXYZ-", min_size=1, max_size=6),
                              st.text(alphabet="abc 123", max_size=8).map(str.strip),
                              max_size=3))),
                min_size=1, max_size=8),
       st.randoms())
def test_round_trip_pub_and_msg(items: list, rnd: random.Random) -> None:
    """Encoded PUB/HPUB and MSG/HMSG streams parse back to what was encoded."""
    client_out = b""
    server_out = b""
    for subject, reply, payload, headers in items:
        if headers is None:
            client_out += codec.encode_pub(subject, payload, reply)
            server_out += codec.encode_msg(subject, "7", reply, payload)
        else:
            block = codec.build_headers(headers)
            client_out += codec.encode_hpub(subject, block, payload, reply)
            server_out += codec.encode_hmsg(subject, "7", reply, block, payload)
    cuts = [rnd.randrange(len(client_out)) for _ in range(3)]
    got = feed_in_pieces(client_out, cuts)
    cuts = [rnd.randrange(len(server_out)) for _ in range(3)]
    got_msgs = feed_in_pieces(server_out, cuts, server=False)
    assert len(got) == len(got_msgs) == len(items)
    for (subject, reply, payload, headers), ev, msg in zip(items, got, got_msgs, strict=True):
        if headers is None:
            assert ev == (OP_PUB, (subject, reply, len(payload)), payload)
            assert msg == (OP_MSG, subject, "7", reply, payload)
        else:
            assert ev[0] == OP_HPUB and ev[1][:2] == (subject, reply) and ev[3] == payload
            assert dict(codec.parse_headers(ev[2])[2]) == headers
            assert msg[0] == OP_HMSG and msg[5] == payload and msg[4] == ev[2]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600), st.booleans())
def test_fuzz_garbage_only_raises_protocol_error(data: bytes, server: bool) -> None:
    """Random bytes only ever raise ProtocolError and the parser settles."""
    p = NatsParser(server=server, max_payload=256, max_control_line=128)
    p.receive_data(data)
    for _ in range(1000):
        try:
            ev = p.next_event()
        except ProtocolError as err:
            if err.fatal:
                return
            continue
        if ev is NEED_DATA:
            return
    raise AssertionError("parser did not settle")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([b"PUB ", b"SUB ", b"HPUB ", b"UNSUB ", b"CONNECT ", b"PING",
                                 b"\r\n", b"\n", b" ", b"5", b"x.y", b"*", b">", b"{}", b"12",
                                 b"NATS/1.0", b"MSG ", b"-ERR ", b"+OK", b"\t"]), max_size=40))
def test_fuzz_protocol_like_tokens(tokens: list[bytes]) -> None:
    """Streams of protocol-like tokens only ever raise ProtocolError."""
    for server in (True, False):
        p = NatsParser(server=server)
        p.receive_data(b"".join(tokens))
        while True:
            try:
                if p.next_event() is NEED_DATA:
                    break
            except ProtocolError as err:
                if err.fatal:
                    break


def test_encoders() -> None:
    """Encoders produce nats-server's exact bytes."""
    assert codec.encode_err("Invalid Subject") == b"-ERR 'Invalid Subject'\r\n"
    assert codec.encode_info({"a": 1}) == b'INFO {"a":1} \r\n'
    assert codec.encode_sub("a", "1", "q") == b"SUB a q 1\r\n"
    assert codec.encode_unsub("1", 3) == b"UNSUB 1 3\r\n"
    assert codec.msg_prefix("a", "1", "r", 3) == b"MSG a 1 r 3\r\n"
