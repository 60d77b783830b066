"""Tests of the sans-IO eMQP frame codec (mqhub.protocols.emqp.frames)."""

from __future__ import annotations

import json
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqhub.protocols.emqp import frames as F

JOB = json.dumps(["run", {"callable": "work", "path": "emqjobs", "args": [99], "kwargs": {},
                          "class_args": [], "class_kwargs": {}}])


def routed(command: bytes, *body: bytes, peer: bytes = b"client-1", msgid: bytes = b"m-1"):
    """A message as a ROUTER socket receives it."""
    return [peer, b"", b"eMQP/1.0", command, msgid, *body]


# every command eventmq 0.3.13 sends, as observed on the wire
REAL_MESSAGES = [
    routed(b"INFORM", b'[[20, "email"], [10, "default"]]', b"worker"),
    routed(b"INFORM", b"", b"scheduler"),
    routed(b"READY"),
    routed(b"REQUEST", b"default", b"reply-requested,timeout:5", JOB.encode()),
    routed(b"REPLY", b'{"value": 14}', b"req-id"),
    routed(b"HEARTBEAT", b"1795364910.37878"),
    routed(b"SCHEDULE", b"default", b"guarantee", b"60", JOB.encode(), b""),
    routed(b"UNSCHEDULE", b"default", b"guarantee", b"-1", JOB.encode(), b""),
    routed(b"DISCONNECT"),
    routed(b"KBYE"),
    routed(b"PUBLISH", b"news.sport", b'{"score": 3}'),
]


@pytest.mark.parametrize("frames", REAL_MESSAGES, ids=lambda f: f[3].decode())
def test_parse_every_real_command(frames):
    """Every command the real client, jobmanager and scheduler send parses to its fields."""
    cmd = F.parse_routed(frames)
    assert cmd.peer == frames[0]
    assert cmd.name == frames[3]
    assert cmd.msgid == frames[4]
    assert cmd.body == tuple(frames[5:])


@pytest.mark.parametrize("frames", REAL_MESSAGES, ids=lambda f: f[3].decode())
def test_frame_at_a_time_equals_whole(frames):
    """Feeding frames one by one (ZMQ RCVMORE view) yields the same command as the whole message."""
    dec = F.FrameDecoder()
    for i, frame in enumerate(frames):
        assert dec.next_event() is F.NEED_DATA
        dec.receive_frame(frame, more=i < len(frames) - 1)
    assert dec.next_event() == F.parse_routed(frames)
    assert dec.next_event() is F.NEED_DATA


def test_random_splits_of_a_message_stream():
    """A stream of messages cut into frame runs at random points decodes in order."""
    rnd = random.Random(7)
    for _ in range(50):
        msgs = [rnd.choice(REAL_MESSAGES) for _ in range(20)]
        flat = [(f, i < len(m) - 1) for m in msgs for i, f in enumerate(m)]
        dec = F.FrameDecoder()
        out = []
        pos = 0
        while pos < len(flat):
            step = rnd.randint(1, 7)
            for frame, more in flat[pos:pos + step]:
                dec.receive_frame(frame, more)
            pos += step
            while (ev := dec.next_event()) is not F.NEED_DATA:
                out.append(ev)
        assert out == [F.parse_routed(m) for m in msgs]


@pytest.mark.parametrize("frames, code", [
    ([b"x", b"", b"eMQP/1.0", b"READY"], F.E_SHORT),
    (routed(b"READY", *[b"a"] * 6), F.E_TOO_MANY),
    ([b"p", b"x", b"eMQP/1.0", b"READY", b"m"], F.E_ENVELOPE),
    ([b"", b"", b"eMQP/1.0", b"READY", b"m"], F.E_ENVELOPE),
    ([b"p" * 256, b"", b"eMQP/1.0", b"READY", b"m"], F.E_ENVELOPE),
    ([b"p", b"", b"eMQP/2.0", b"READY", b"m"], F.E_VERSION),
    (routed(b"FROB"), F.E_COMMAND),
    (routed(b"ready"), F.E_COMMAND),
    (routed(b"REQUEST", b"default", b""), F.E_ARITY),
    (routed(b"SCHEDULE", b"default", b"", b"60", JOB.encode()), F.E_ARITY),
    (routed(b"READY", b"extra"), F.E_ARITY),
    (routed(b"REQUEST", b"default", b"", b"\xff\xfe"), F.E_UTF8),
    (routed(b"INFORM", b"\xc3", b"worker"), F.E_UTF8),
    (routed(b"READY", msgid=b"\xff"), F.E_UTF8),
    (routed(b"READY", msgid=b"m" * 256), F.E_TOO_LARGE),
])
def test_malformed_messages_raise_the_right_code(frames, code):
    """Each kind of malformed message is rejected with its own code and is not fatal."""
    with pytest.raises(F.ProtocolError) as info:
        F.parse_routed(frames)
    assert info.value.code == code
    assert info.value.fatal is False


def test_body_size_limit():
    """A frame above max_body is rejected; the decoder keeps working after a bad message."""
    dec = F.FrameDecoder(max_body=10)
    dec.receive_data(routed(b"REQUEST", b"default", b"", b"x" * 11))
    dec.receive_data(routed(b"READY"))
    with pytest.raises(F.ProtocolError) as info:
        dec.next_event()
    assert info.value.code == F.E_TOO_LARGE
    assert dec.next_event().name == b"READY"


def test_frame_at_a_time_overflow_is_rejected_not_stored():
    """A message with thousands of frames fed one by one is bounded and rejected."""
    dec = F.FrameDecoder()
    for i in range(5000):
        dec.receive_frame(b"a", more=i < 4999)
    assert len(dec._ready[0]) <= F.MAX_FRAMES + 2
    with pytest.raises(F.ProtocolError) as info:
        dec.next_event()
    assert info.value.code == F.E_TOO_MANY


def test_binary_identity_is_accepted_and_printable():
    """libzmq's auto-generated binary identity parses, and logs escape it rather than crash."""
    peer = b"\x00k\x8bEg"
    cmd = F.parse_routed(routed(b"REQUEST", b"default", b"", JOB.encode(), peer=peer))
    assert cmd.peer == peer
    assert F.peer_label(peer) == "0x006b8b4567"
    assert F.peer_label(b"abc-1") == "abc-1"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=14))
def test_fuzz_only_protocol_errors(frames):
    """Random garbage only ever parses or raises ProtocolError."""
    try:
        cmd = F.parse_routed(frames)
    except F.ProtocolError:
        return
    assert cmd.name in F.ARITY


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=30), max_size=6), st.sampled_from(sorted(F.ARITY)))
def test_fuzz_valid_envelope_garbage_body(body, command):
    """Garbage bodies behind a valid envelope, and the helpers on them, only raise ProtocolError."""
    try:
        cmd = F.parse_routed(routed(command, *body))
        if cmd.name == b"INFORM":
            F.parse_inform_queues(cmd.body[0])
        elif cmd.name in (b"SCHEDULE", b"UNSCHEDULE"):
            F.parse_schedule(cmd.body)
        elif cmd.name == b"REQUEST":
            F.parse_headers(cmd.body[1])
    except F.ProtocolError:
        pass


text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=255), text, text, text)
def test_request_round_trip(peer, queue, headers, body):
    """A REQUEST built for a worker parses back to the same fields."""
    msgid = F.MsgIds().next()
    frames = F.request(peer, msgid, queue.encode(), headers.encode(), body.encode())
    cmd = F.parse_routed(frames)
    assert cmd == F.Command(peer, b"REQUEST", msgid, (queue.encode(), headers.encode(),
                                                      body.encode()))


@settings(max_examples=200, deadline=None)
@given(st.booleans(), st.booleans(), st.integers(0, 10**6), st.integers(0, 10**6),
       st.booleans(), st.integers(-1, 1000))
def test_headers_round_trip(reply, guarantee, retry, timeout, nohaste, run_count):
    """Headers joined the way eventmq's client joins them parse back to the same values."""
    items = []
    if reply:
        items.append("reply-requested")
    if guarantee:
        items.append("guarantee")
    if retry:
        items.append(f"retry-count:{retry}")
    if timeout:
        items.append(f"timeout:{timeout}")
    if nohaste:
        items.append("nohaste")
    if run_count != -1:
        items.append(f"run_count:{run_count}")
    assert F.parse_headers(F.join_headers(items)) == F.Headers(reply, guarantee, retry, timeout,
                                                               nohaste, run_count)


def test_headers_edge_cases():
    """Empty, unknown and non-numeric header items behave like eventmq (ignored / default)."""
    assert F.parse_headers(b"") == F.Headers(False, False, 0, 0, False, -1)
    assert F.parse_headers(b"foo,timeout:x,retry-count:-3").timeout == 0
    assert F.parse_headers(b"retry-count:-3").retry_count == 0
    with pytest.raises(F.ProtocolError):
        F.parse_headers(b"a," * 3000)


def test_add_header():
    """add_header appends once and keeps existing items."""
    assert F.add_header(b"", b"reply-requested") == b"reply-requested"
    assert F.add_header(b"guarantee", b"reply-requested") == b"guarantee,reply-requested"
    assert F.add_header(b"reply-requested", b"reply-requested") == b"reply-requested"


def test_inform_queues():
    """INFORM queues are JSON [weight, name] pairs; '' means none; CSV is rejected."""
    assert F.parse_inform_queues(b'[[20, "email"], [10, "default"]]') == [(20, "email"),
                                                                         (10, "default")]
    assert F.parse_inform_queues(b"") == []
    assert F.parse_inform_queues(b'["a"]') == [(10, "a")]
    for bad in (b"[40, 'email']", b"{}", b'[[1, 2]]', b'[[true, "x"]]', b'[[1, ""]]', b"40,email"):
        with pytest.raises(F.ProtocolError) as info:
            F.parse_inform_queues(bad)
        assert info.value.code == F.E_BAD_VALUE


def test_schedule_id_matches_eventmq():
    """The schedule id is the sha1 eventmq computes (verified value for emqjobs.work(99))."""
    assert F.schedule_id(JOB) == "a9ab2bc8be31693f938742caa8e1853cbbc2c13a"


def test_parse_schedule():
    """SCHEDULE's 5 body frames decode; bad interval, missing cron and bad body are rejected."""
    spec = F.parse_schedule((b"", b"nohaste,run_count:2", b"4", JOB.encode(), b""))
    assert spec == F.ScheduleSpec("default", "nohaste,run_count:2", 4, JOB, "",
                                  "a9ab2bc8be31693f938742caa8e1853cbbc2c13a")
    cron = F.parse_schedule((b"q", b"", b"-1", JOB.encode(), b"* * * * *"))
    assert (cron.interval, cron.cron) == (-1, "* * * * *")
    assert F.parse_schedule((b"q", b"", b"-1", JOB.encode(), b""), unschedule=True).interval == -1
    for bad in [(b"q", b"", b"x", JOB.encode(), b""), (b"q", b"", b"-1", JOB.encode(), b""),
                (b"q", b"", b"0", JOB.encode(), b""), (b"q", b"", b"5", b"[1]", b"")]:
        with pytest.raises(F.ProtocolError):
            F.parse_schedule(bad)


def test_builders_shape():
    """Frames the broker sends have the envelope eventmq peers expect."""
    assert F.ack(b"w", b"a", b"i") == [b"w", b"", b"eMQP/1.0", b"ACK", b"a", b"i"]
    assert F.kbye(b"w", b"a") == [b"w", b"", b"eMQP/1.0", b"KBYE", b"a"]
    assert F.reply_ack(b"c", b"a", b"r")[3:] == [b"REPLY", b"a", b"r"]
    assert F.reply_result(b"c", b"a", b"{}", b"r")[3:] == [b"REPLY", b"a", b"{}", b"r"]
    hb = F.heartbeat(b"w", b"a", 1795364910.5)
    assert hb[3] == b"HEARTBEAT" and float(hb[5]) == 1795364910.5
    assert F.build_dealer(b"READY", b"x") == [b"", b"eMQP/1.0", b"READY", b"x"]


def test_msgids_unique_uuid_form():
    """Generated msgids are unique and look like uuid4 text (36 chars)."""
    ids = F.MsgIds()
    seen = {ids.next() for _ in range(5000)}
    assert len(seen) == 5000
    pattern = re.compile(rb"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
    assert all(pattern.match(i) for i in seen)


def test_is_failure():
    """Only the jobmanager's timeout result counts as a failure."""
    assert F.is_failure(b'{"value": "TimeoutError"}')
    assert not F.is_failure(b'{"value": "ok"}')
    assert not F.is_failure(b'{"value": ["TimeoutError"]}')
