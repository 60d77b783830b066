"""Tests of the sans-IO NSQ codec: whole, byte-wise, random splits, round trips and limits."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqhub.protocols.nsq import codec as c
from mqhub.protocols.nsq.codec import NEED_DATA, ProtocolError, ServerCodec

ID = b"0123456789abcdef"

VECTOR: list[tuple[bytes, object]] = [
    (c.encode_identify({"client_id": "x", "feature_negotiation": True}),
     c.Identify(b'{"client_id": "x", "feature_negotiation": true}')),
    (c.encode_auth(b"s3cret"), c.Auth(b"s3cret")),
    (b"SUB orders archive#ephemeral\n", c.Sub("orders", "archive#ephemeral")),
    (b"RDY 100\n", c.Rdy(100)),
    (b"RDY\n", c.Rdy(1)),
    (c.encode_pub("orders", b"hello\nworld"), c.Pub("orders", b"hello\nworld")),
    (b"PUB orders\r\n\x00\x00\x00\x01z", c.Pub("orders", b"z")),
    (c.encode_mpub("t.x", [b"a", b"bc", b"\x00" * 10]), c.Mpub("t.x", [b"a", b"bc", b"\x00" * 10])),
    (c.encode_dpub("t", 1500, b"later"), c.Dpub("t", 1500, b"later")),
    (b"FIN " + ID + b"\n", c.Fin(ID)),
    (b"REQ " + ID + b" 250\n", c.Req(ID, 250)),
    (b"REQ " + ID + b" -5\n", c.Req(ID, 0)),
    (b"REQ " + ID + b" 99999999\n", c.Req(ID, 3_600_000)),
    (b"TOUCH " + ID + b"\n", c.Touch(ID)),
    (b"NOP\n", c.Nop()),
    (b"CLS\n", c.Cls()),
]
STREAM = c.MAGIC_V2 + b"".join(raw for raw, _ in VECTOR)
EXPECTED = [ev for _, ev in VECTOR]


def feed(chunks: list[bytes], **limits: int) -> list[object]:
    """Feed chunks to a fresh codec, collecting every event after each chunk."""
    codec = ServerCodec(**limits)
    out: list[object] = []
    for chunk in chunks:
        codec.receive_data(chunk)
        out.extend(codec.events())
    return out


def fail(data: bytes, **limits: int) -> ProtocolError:
    """Feed ``data`` (after the magic) whole and return the ProtocolError it must raise."""
    codec = ServerCodec(**limits)
    codec.receive_data(c.MAGIC_V2 + data)
    with pytest.raises(ProtocolError) as info:
        codec.events()
    # a failed codec keeps failing, so no later bytes can be misread as commands
    codec.receive_data(b"NOP\n")
    with pytest.raises(ProtocolError):
        codec.next_event()
    return info.value


def test_whole_stream() -> None:
    """Every command of the vector decodes from one read."""
    assert feed([STREAM]) == EXPECTED


def test_one_byte_at_a_time() -> None:
    """The same stream fed byte by byte gives the same events."""
    assert feed([STREAM[i:i + 1] for i in range(len(STREAM))]) == EXPECTED


@pytest.mark.parametrize("seed", range(25))
def test_random_splits(seed: int) -> None:
    """Random chunkings give the same events."""
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(STREAM)), rng.randint(1, 40)))
    chunks = [STREAM[a:b] for a, b in zip([0, *cuts], [*cuts, len(STREAM)], strict=True)]
    assert feed(chunks) == EXPECTED


def test_need_data_until_body_complete() -> None:
    """A PUB whose body is still arriving yields NEED_DATA, then the event once complete."""
    codec = ServerCodec()
    raw = c.MAGIC_V2 + c.encode_pub("t", b"x" * 100_000)
    codec.receive_data(raw[:50_000])
    assert codec.next_event() is NEED_DATA
    codec.receive_data(raw[50_000:70_000])
    assert codec.next_event() is NEED_DATA
    codec.receive_data(raw[70_000:])
    assert codec.next_event() == c.Pub("t", b"x" * 100_000)
    assert codec.next_event() is NEED_DATA
    assert codec.buffered == 0


def test_large_mpub_in_small_reads() -> None:
    """A 5 MiB-class MPUB arriving in 64 KiB reads decodes once, in order."""
    bodies = [bytes([i % 256]) * 1000 for i in range(4000)]
    raw = c.MAGIC_V2 + c.encode_mpub("bulk", bodies) + b"NOP\n"
    chunks = [raw[i:i + 65536] for i in range(0, len(raw), 65536)]
    assert feed(chunks) == [c.Mpub("bulk", bodies), c.Nop()]


def test_mpub_body_size_not_cross_checked() -> None:
    """Like nsqd, a bogus (larger) declared MPUB body size is accepted if within the limit."""
    payload = struct.pack(">i", 1) + struct.pack(">i", 2) + b"hi"
    raw = b"MPUB t\n" + struct.pack(">i", 99999) + payload
    assert feed([c.MAGIC_V2 + raw]) == [c.Mpub("t", [b"hi"])]


def test_bad_magic() -> None:
    """Anything but the V2 magic is E_BAD_PROTOCOL."""
    codec = ServerCodec()
    codec.receive_data(b"  V1PING\n")
    with pytest.raises(ProtocolError) as info:
        codec.next_event()
    assert info.value.wire_text == b"E_BAD_PROTOCOL"
    assert info.value.fatal


@pytest.mark.parametrize(
    ("data", "text"),
    [
        (b"FOO\n", "E_INVALID invalid command FOO"),
        (b"\n", "E_INVALID invalid command "),
        (b"PUB\n", "E_INVALID PUB insufficient number of parameters"),
        (b"PUB bad!topic\n", 'E_BAD_TOPIC PUB topic name "bad!topic" is not valid'),
        (b"PUB " + b"a" * 65 + b"\n", 'E_BAD_TOPIC PUB topic name "' + "a" * 65 + '" is not valid'),
        (b"PUB a#b\n", 'E_BAD_TOPIC PUB topic name "a#b" is not valid'),
        (b"PUB t\n\x00\x00\x00\x00", "E_BAD_MESSAGE PUB invalid message body size 0"),
        (b"PUB t\n\x00\x20\x00\x00", "E_BAD_MESSAGE PUB message too big 2097152 > 1048576"),
        (b"PUB t\n\xff\xff\xff\xff", "E_BAD_MESSAGE PUB invalid message body size -1"),
        (b"MPUB x!\n", 'E_BAD_TOPIC E_BAD_TOPIC MPUB topic name "x!" is not valid'),
        (b"MPUB t\n\x00\x00\x00\x08\x00\x00\x00\x00", "E_BAD_BODY MPUB invalid message count 0"),
        (b"MPUB t\n\x00\x00\x00\x00", "E_BAD_BODY MPUB invalid body size 0"),
        (b"MPUB t\n\x01\x00\x00\x00", "E_BAD_BODY MPUB body too big 16777216 > 5242880"),
        (b"MPUB t\n\x00\x00\x00\x10\x00\x00\x00\x01\x00\x00\x00\x00",
         "E_BAD_MESSAGE MPUB invalid message(0) body size 0"),
        (b"MPUB t\n\x00\x00\x00\x10\x00\x00\x00\x01\x00\x20\x00\x00",
         "E_BAD_MESSAGE MPUB message too big 2097152 > 1048576"),
        (b"DPUB t 99999999\n", "E_INVALID DPUB timeout 99999999 out of range 0-3600000"),
        (b"DPUB t abc\n", "E_INVALID DPUB could not parse timeout abc"),
        (b"DPUB t\n", "E_INVALID DPUB insufficient number of parameters"),
        (b"SUB t\n", "E_INVALID SUB insufficient number of parameters"),
        (b"SUB t bad!ch\n", 'E_BAD_CHANNEL SUB channel name "bad!ch" is not valid'),
        (b"SUB t! c\n", 'E_BAD_TOPIC SUB topic name "t!" is not valid'),
        (b"RDY x\n", "E_INVALID RDY could not parse count x"),
        (b"FIN abc\n", "E_INVALID invalid message ID"),
        (b"FIN\n", "E_INVALID FIN insufficient number of params"),
        (b"REQ " + ID + b" abc\n", "E_INVALID REQ could not parse timeout abc"),
        (b"REQ " + ID + b"\n", "E_INVALID REQ insufficient number of params"),
        (b"TOUCH 12\n", "E_INVALID invalid message ID"),
        (b"IDENTIFY\n\x00\x60\x00\x01", "E_BAD_BODY IDENTIFY body too big 6291457 > 5242880"),
        (b"IDENTIFY\n\x00\x00\x00\x00", "E_BAD_BODY IDENTIFY invalid body size 0"),
        (b"AUTH x\n", "E_INVALID AUTH invalid number of parameters"),
        (b"AUTH\n\x00\x00\x00\x00", "E_BAD_BODY AUTH invalid body size 0"),
    ],
)
def test_errors_match_nsqd(data: bytes, text: str) -> None:
    """Each malformed command raises nsqd's fatal error code and description."""
    err = fail(data)
    assert err.wire_text.decode() == text
    assert err.fatal


def test_sixty_four_char_name_ok() -> None:
    """64-character names are valid, 65 are not (checked above)."""
    assert feed([c.MAGIC_V2 + c.encode_pub("a" * 64, b"x")]) == [c.Pub("a" * 64, b"x")]


def test_configured_limits() -> None:
    """max_msg_size and max_body_size are constructor limits, enforced one byte over."""
    assert feed([c.MAGIC_V2 + c.encode_pub("t", b"x" * 10)], max_msg_size=10) == [c.Pub("t", b"x" * 10)]
    err = fail(c.encode_pub("t", b"x" * 11), max_msg_size=10)
    assert err.wire_text == b"E_BAD_MESSAGE PUB message too big 11 > 10"
    err = fail(c.encode_mpub("t", [b"x" * 60, b"y" * 60]), max_body_size=100)
    assert err.code == "E_BAD_BODY"


def test_mpub_real_bytes_bounded_by_body_limit() -> None:
    """An MPUB that lies about its size cannot push more than max_body_size of messages."""
    payload = struct.pack(">i", 3) + b"".join(struct.pack(">i", 40) + b"z" * 40 for _ in range(3))
    err = fail(b"MPUB t\n" + struct.pack(">i", 50) + payload, max_body_size=100)
    assert err.code == "E_BAD_BODY"


def test_line_too_long() -> None:
    """A line longer than max_line without a newline is refused, not buffered forever."""
    codec = ServerCodec(max_line=64)
    codec.receive_data(c.MAGIC_V2 + b"PUB " + b"a" * 100)
    with pytest.raises(ProtocolError) as info:
        codec.next_event()
    assert info.value.code == "E_INVALID"


def test_events_stop_before_error() -> None:
    """next_event yields the good commands before a bad one, then raises."""
    codec = ServerCodec()
    codec.receive_data(c.MAGIC_V2 + b"NOP\nBAD\nNOP\n")
    assert codec.next_event() == c.Nop()
    with pytest.raises(ProtocolError):
        codec.next_event()


def test_ids_render_and_parse() -> None:
    """Hub ids render as 16 lowercase hex bytes and parse back; junk parses to None."""
    raw = c.render_id(0x18A4877A9CA69000)
    assert raw == b"18a4877a9ca69000"
    assert c.parse_id(raw) == 0x18A4877A9CA69000
    assert c.parse_id(b"zzzzzzzzzzzzzzzz") is None
    assert c.parse_id(b"12") is None


def test_client_codec_decodes_server_frames() -> None:
    """Response, error and message frames decode on the client side, split anyhow."""
    stream = (c.OK_FRAME + c.HEARTBEAT_FRAME + c.encode_error(b"E_FIN_FAILED FIN x failed")
              + c.encode_message(123, 2, ID, b"body") + c.CLOSE_WAIT_FRAME)
    client = c.ClientCodec()
    frames = []
    for i in range(len(stream)):
        client.receive_data(stream[i:i + 1])
        frames.extend(client.frames())
    assert frames == [c.Response(b"OK"), c.Response(b"_heartbeat_"),
                      c.ErrorFrame("E_FIN_FAILED", "FIN x failed"),
                      c.Message(123, 2, ID, b"body"), c.Response(b"CLOSE_WAIT")]


names = st.from_regex(r"\A[.a-zA-Z0-9_-]{1,54}(#ephemeral)?\Z")
bodies = st.binary(min_size=1, max_size=300)
ids = st.text(alphabet="0123456789abcdef", min_size=16, max_size=16).map(str.encode)
commands = st.one_of(
    st.builds(c.Pub, names, bodies),
    st.builds(c.Mpub, names, st.lists(bodies, min_size=1, max_size=8)),
    st.builds(c.Dpub, names, st.integers(0, 3_600_000), bodies),
    st.builds(c.Sub, names, names),
    st.builds(c.Rdy, st.integers(0, 10_000)),
    st.builds(c.Fin, ids),
    st.builds(c.Req, ids, st.integers(0, 3_600_000)),
    st.builds(c.Touch, ids),
    st.builds(c.Identify, bodies),
    st.builds(c.Auth, bodies),
    st.just(c.Cls()),
    st.just(c.Nop()),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(commands, min_size=1, max_size=12), st.randoms(use_true_random=False))
def test_round_trip(events: list[c.Command], rng: random.Random) -> None:
    """encode_command then decode in random splits gives the same events."""
    stream = c.MAGIC_V2 + b"".join(c.encode_command(e) for e in events)
    cuts = sorted(rng.sample(range(1, len(stream)), min(len(stream) - 1, rng.randint(0, 10))))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    assert feed(chunks) == events


@settings(max_examples=400, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=10), st.booleans())
def test_fuzz_garbage_only_raises_protocol_error(chunks: list[bytes], with_magic: bool) -> None:
    """Random garbage yields events or ProtocolError, never another exception, and stays bounded."""
    codec = ServerCodec(max_line=128, max_body_size=4096, max_msg_size=1024)
    if with_magic:
        codec.receive_data(c.MAGIC_V2)
    for chunk in chunks:
        codec.receive_data(chunk)
        try:
            codec.events()
        except ProtocolError as exc:
            assert exc.fatal and exc.code.startswith("E_")
            return
        assert codec.buffered <= 4096 + 256


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([raw for raw, _ in VECTOR]), st.integers(0, 60), st.binary(min_size=1, max_size=8))
def test_fuzz_mutated_commands(raw: bytes, at: int, junk: bytes) -> None:
    """Valid commands with bytes overwritten only ever decode or raise ProtocolError."""
    at = min(at, len(raw) - 1)
    mutated = raw[:at] + junk + raw[at + len(junk):]
    codec = ServerCodec(max_body_size=1 << 16, max_msg_size=1 << 14)
    codec.receive_data(c.MAGIC_V2 + mutated + b"NOP\n")
    try:
        codec.events()
    except ProtocolError as exc:
        assert exc.fatal


def fast_events(codec: ServerCodec, fin_ids: bool) -> list[object]:
    """Drain ``codec`` the way the server does: PUB/FIN fast paths first, then next_event.

    FIN runs through ``read_fin_ids`` (ids rendered back) when ``fin_ids``, else ``read_fins``.
    """
    out: list[object] = []
    while True:
        topic, got = codec.read_pubs()
        if got:
            out.extend(c.Pub(topic, b) for b in got)
            continue
        fins = [c.render_id(i) for i in codec.read_fin_ids()] if fin_ids else codec.read_fins()
        if fins:
            out.extend(c.Fin(f) for f in fins)
            continue
        ev = codec.next_event()
        if ev is NEED_DATA:
            return out
        out.append(ev)


@pytest.mark.parametrize("fin_ids", [False, True], ids=["read_fins", "read_fin_ids"])
@settings(max_examples=200, deadline=None)
@given(st.lists(commands, min_size=1, max_size=12), st.randoms(use_true_random=False))
def test_fast_paths_match_events(fin_ids: bool, events: list[c.Command], rng: random.Random) -> None:
    """The fast paths (read_pubs, then read_fins or read_fin_ids) plus next_event decode exactly
    what next_event alone decodes (the strategy's ids are lower-case, so render_id round-trips)."""
    stream = c.MAGIC_V2 + b"".join(c.encode_command(e) for e in events)
    cuts = sorted(rng.sample(range(1, len(stream)), min(len(stream) - 1, rng.randint(0, 10))))
    codec = ServerCodec()
    out: list[object] = []
    for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        codec.receive_data(stream[a:b])
        out.extend(fast_events(codec, fin_ids))
    assert out == events


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["t", "topic.b"]), st.integers(1, 300),
                          st.sampled_from([1, 16, 17]), st.booleans()), min_size=1, max_size=4),
       st.randoms(use_true_random=False))
def test_runs_of_equal_pubs_match_events(runs: list[tuple[str, int, int, bool]],
                                         rng: random.Random) -> None:
    """Long runs of PUBs with one topic and body size (read by strided column checks and
    chunked Struct cuts), with an odd size inside, split at random, decode exactly as
    next_event decodes them."""
    events: list[c.Command] = []
    for topic, count, size, odd in runs:
        for i in range(count):
            body = bytes([i % 251]) * (size + (odd and i == count // 2))
            events.append(c.Pub(topic, body))
    events.append(c.Nop())
    stream = b"".join(c.encode_command(e) for e in events)
    cuts = sorted(rng.sample(range(1, len(stream)), min(len(stream) - 1, rng.randint(0, 4))))
    codec = ServerCodec(expect_magic=False)
    out: list[object] = []
    for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        codec.receive_data(stream[a:b])
        out.extend(fast_events(codec, True))
    assert out == events


def test_fast_paths_leave_bad_input_to_next_event() -> None:
    """A bad PUB size or a FIN with a space is not taken by the fast paths; next_event raises."""
    codec = ServerCodec(expect_magic=False)
    codec.receive_data(c.encode_pub("t", b"ok") + b"PUB t\n\x00\x00\x00\x00")
    assert codec.read_pubs() == ("t", [b"ok"])
    assert codec.read_pubs() == ("", [])
    with pytest.raises(ProtocolError) as info:
        codec.next_event()
    assert info.value.wire_text == b"E_BAD_MESSAGE PUB invalid message body size 0"
    codec = ServerCodec(expect_magic=False)
    codec.receive_data(b"FIN 0123456789abcdef\nFIN 0123456 89abcdef\n")
    assert codec.read_fins() == [b"0123456789abcdef"]
    assert codec.read_fins() == []
    with pytest.raises(ProtocolError):
        codec.next_event()
    assert c.parse_ids([b"00000000000000ff", b"0000 00000000fff"]) == ([255], [b"0000 00000000fff"])


@pytest.mark.parametrize("bad_line", [
    b"FIN 0123456 89abcdef\n",   # a space inside the id
    b"FIN 0123456789abcdeg\n",   # a non-hex digit
    b"FIN 0123456789abcdef\r\n",  # CRLF is left to next_event
    b"FIN 0123456789ab\xe9def\n",  # not ASCII
    b"RDY 1\nFIN 01234567890\n",  # not a FIN line at all
    b"FIN 0123456I89abcdef\n",   # a byte the fast path deletes (I) inside the id
    b"FIN 0123456\n89abcdef\n",  # a newline inside a 21-byte line
    b"FIN 0123456N89abcdFF\n",   # deleted bytes (N, F) and an upper-case id: 16 digits left
])
def test_fin_id_fast_path_stops_before_an_odd_line(bad_line: bytes) -> None:
    """Good lines before an odd one are taken (upper case too); the odd one goes to next_event."""
    codec = ServerCodec(expect_magic=False)
    good = b"FIN 00000000000000FF\nFIN 0000000000000100\n"
    codec.receive_data(good + bad_line + b"FIN 0000000000000001\n")
    assert codec.read_fin_ids() == [255, 256]
    assert codec.read_fin_ids() == []
    try:
        ev = codec.next_event()
    except ProtocolError:
        return
    assert ev is not NEED_DATA and not (isinstance(ev, c.Fin) and ev.msg_id == b"0000000000000001")


def test_fin_id_fast_path_reads_upper_case_ids() -> None:
    """Ids with upper-case hex digits (``F`` among them, a byte the fast path deletes) are read
    as their values, the same as ``read_fins``."""
    ids = [0xFFFFFFFFFFFFFFFF, 0xABCDEF0123456789, 0xF, 1 << 63]
    lines = b"".join(b"FIN %016X\n" % i for i in ids) + b"FIN %016x\n" % ids[1]
    codec = ServerCodec(expect_magic=False)
    codec.receive_data(lines)
    assert codec.read_fin_ids() == [*ids, ids[1]]
    assert codec.read_fin_ids() == [] and codec.next_event() is NEED_DATA


def test_fin_id_fast_path_waits_for_a_whole_line() -> None:
    """A partial FIN line stays buffered until its newline arrives."""
    codec = ServerCodec(expect_magic=False)
    codec.receive_data(b"FIN 000000000000000a\nFIN 00000000")
    assert codec.read_fin_ids() == [10]
    assert codec.read_fin_ids() == []
    codec.receive_data(b"0000000b\n")
    assert codec.read_fin_ids() == [11]


def test_uniform_mpub_fast_path_and_its_fallbacks() -> None:
    """Equal-size MPUB bodies are cut in one go; a differing or oversized one takes the checked loop."""
    m = c.MAGIC_V2
    same = [bytes([i]) * 16 for i in range(200)]
    assert feed([m + c.encode_mpub("t", same)]) == [c.Mpub("t", same)]
    for odd in (b"y" * 15, b"y" * (16 + 256), b"y" * (16 + 65536)):  # prefix differs in byte 3, 2, 1
        mixed = same[:100] + [odd] + same[101:]
        assert feed([m + c.encode_mpub("t", mixed)]) == [c.Mpub("t", mixed)]
    err = fail(c.encode_mpub("t", [b"q" * 20] * 3), max_msg_size=10)
    assert err.wire_text == b"E_BAD_MESSAGE MPUB message too big 20 > 10"
    err = fail(c.encode_mpub("t", [b"q" * 20] * 30), max_body_size=300, max_msg_size=100)
    assert err.wire_text.startswith(b"E_BAD_BODY MPUB body too big")
    whole = m + c.encode_mpub("t", same)  # split reads: the rest of the MPUB comes later
    assert feed([whole[:500], whole[500:]]) == [c.Mpub("t", same)]


def test_render_ids_matches_render_id() -> None:
    """The batch id renderer is the per-id one, for any ids in range."""
    ids = [0, 1, 255, (1 << 63) - 1, 0x0123456789ABCDEF, 123 << 22]
    assert list(c.render_ids(ids)) == [c.render_id(i) for i in ids]
    assert c.render_ids([]) == ()

