"""The VibeMQ codec: golden bytes (reference §8), round trips in any split, compression, fuzz."""

from __future__ import annotations

import gzip
import struct

import brotli
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqhub.protocols.vibemq import codec as c
from mqhub.testing import property_examples


def hx(text: str) -> bytes:
    """Bytes from spaced hex."""
    return bytes.fromhex(text.replace("\n", " "))


PING = hx("00 00 00 0e 00 01 0a 00 02 70 31 00 00 00 00 00 00 00 00")
CONNECT = hx("""00 00 00 5d 00 01 00 00 02 63 31 00 00 00 00 00 00 00 03
00 0c 61 75 74 68 55 73 65 72 6e 61 6d 65 00 05 61 64 6d 69 6e
00 0c 61 75 74 68 50 61 73 73 77 6f 72 64 00 06 73 65 63 72 65 74
00 15 73 75 70 70 6f 72 74 65 64 2d 63 6f 6d 70 72 65 73 73 69 6f 6e 00 0b 62 72 6f 74 6c 69 2c 67 7a 69 70""")
CONNECT_ACK = hx("""00 00 00 4c 00 01 01 00 20 30 31 32 33 34 35 36 37 38 39 61 62 63 64 65 66 30 31 32 33 34 35 36 37 38 39 61 62 63 64 65 66
00 00 00 00 00 00 00 01 00 16 6e 65 67 6f 74 69 61 74 65 64 2d 63 6f 6d 70 72 65 73 73 69 6f 6e 00 06 62 72 6f 74 6c 69""")
PUBLISH = hx("""00 00 00 58 00 01 14 00 02 6d 31 00 06 6f 72 64 65 72 73
00 00 00 20 7b 22 74 69 74 6c 65 22 3a 22 48 65 6c 6c 6f 22 2c 22 62 6f 64 79 22 3a 22 57 6f 72 6c 64 22 7d
00 02 00 08 70 72 69 6f 72 69 74 79 00 04 48 69 67 68 00 0d 63 6f 72 72 65 6c 61 74 69 6f 6e 49 64 00 03 63 2d 39""")
PUBLISH_ACK = hx("00 00 00 14 00 01 15 00 02 6d 31 00 06 6f 72 64 65 72 73 00 00 00 00 00 00")
ACK = hx("00 00 00 0e 00 01 1e 00 02 6d 31 00 00 00 00 00 00 00 00")
ERROR = hx("""00 00 00 42 00 01 63 00 02 6d 31 00 00 00 00 00 00 00 00
00 0d 49 4e 56 41 4c 49 44 5f 51 55 45 55 45
00 23 51 75 65 75 65 20 6e 61 6d 65 20 69 73 20 72 65 71 75 69 72 65 64 20 66 6f 72 20 70 75 62 6c 69 73 68 2e""")

GOLDEN = [
    (PING, c.Frame(c.PING, "p1")),
    (CONNECT, c.Frame(c.CONNECT, "c1", headers={
        "authUsername": "admin", "authPassword": "secret",
        "supported-compression": "brotli,gzip"})),
    (CONNECT_ACK, c.Frame(c.CONNECT_ACK, "0123456789abcdef0123456789abcdef",
                          headers={"negotiated-compression": "brotli"})),
    (PUBLISH, c.Frame(c.PUBLISH, "m1", "orders", b'{"title":"Hello","body":"World"}',
                      {"priority": "High", "correlationId": "c-9"})),
    (PUBLISH[:5] + b"\x01\x1a" + PUBLISH[7:],
     c.Frame(c.DELIVER, "m1", "orders", b'{"title":"Hello","body":"World"}',
             {"priority": "High", "correlationId": "c-9"})),
    (PUBLISH_ACK, c.Frame(c.PUBLISH_ACK, "m1", "orders")),
    (ACK, c.Frame(c.ACK, "m1")),
    (ERROR, c.Frame(c.ERROR, "m1", error_code="INVALID_QUEUE",
                    error_message="Queue name is required for publish.")),
]


@pytest.mark.parametrize(("wire", "frame"), GOLDEN)
def test_golden_encode(wire: bytes, frame: c.Frame) -> None:
    assert c.encode(frame) == wire


@pytest.mark.parametrize(("wire", "frame"), GOLDEN)
def test_golden_decode_whole_and_byte_at_a_time(wire: bytes, frame: c.Frame) -> None:
    assert c.FrameDecoder().feed(wire) == [frame]
    dec = c.FrameDecoder()
    got = []
    for i in range(len(wire)):
        got += dec.feed(wire[i:i + 1])
        if i < len(wire) - 1:
            assert got == []
    assert got == [frame] and dec.buffered == 0


def test_golden_stream_of_all_vectors() -> None:
    wire = b"".join(w for w, _ in GOLDEN)
    assert c.FrameDecoder().feed(wire) == [f for _, f in GOLDEN]


def test_server_publish_ack_renderer_matches_golden() -> None:
    from mqhub.protocols.vibemq.render import publish_acks

    assert publish_acks(["m1"], "orders") == PUBLISH_ACK
    assert publish_acks(["m1", "m1"], "orders") == PUBLISH_ACK * 2


def test_error_fields_only_for_type_99() -> None:
    body = c.encode_body(c.PONG, "x", error_code="E", error_message="m")
    assert body.endswith(b"\x00\x00\x00\x00\x00\x00") and b"E" not in body[4:]


def test_empty_header_entries_dropped_but_counted() -> None:
    body = (bytes((1, c.PUBLISH)) + b"\x00\x01a\x00\x00\x00\x00\x00\x00"
            + b"\x00\x02" + b"\x00\x00\x00\x01v" + b"\x00\x01k\x00\x01v")
    f = c.decode_body(body)
    assert isinstance(f, c.Frame) and f.headers == {"k": "v"}
    only_empty = bytes((1, c.PUBLISH)) + b"\x00\x01a\x00\x00\x00\x00\x00\x00\x00\x01\x00\x01k\x00\x00"
    assert c.decode_body(only_empty).headers is None  # type: ignore[union-attr]


def test_trailing_bytes_ignored() -> None:
    assert c.decode_body(c.encode_body(c.PING, "p") + b"junk") == c.Frame(c.PING, "p")


def test_long_strings_refused_on_encode() -> None:
    with pytest.raises(ValueError):
        c.encode_body(c.PUBLISH, "x" * 65536)
    with pytest.raises(ValueError):
        c.encode_body(c.PUBLISH, "")


@pytest.mark.parametrize("flag", [c.FLAG_GZIP, c.FLAG_BROTLI])
def test_compression_threshold(flag: int) -> None:
    small = c.Frame(c.PUBLISH, "s", "q", b'"x"')
    assert c.encode(small, flag)[4] == 0
    big = c.Frame(c.PUBLISH, "b", "q", b'"' + b"y" * 2000 + b'"')
    wire = c.encode(big, flag)
    assert wire[4] == flag and len(wire) < 300
    assert c.FrameDecoder().feed(wire) == [big]


def test_gzip_and_brotli_mixed_on_one_stream() -> None:
    frames = [c.Frame(c.PUBLISH, f"id{i}", "q", b'"' + b"z" * (500 * i) + b'"') for i in range(6)]
    wire = b"".join(c.encode(f, (c.FLAG_NONE, c.FLAG_GZIP, c.FLAG_BROTLI)[i % 3], 0)
                    for i, f in enumerate(frames))
    dec = c.FrameDecoder()
    got = dec.feed(wire)
    assert got == frames
    assert [g.flags for g in got] == [0, 1, 2, 0, 1, 2]  # type: ignore[union-attr]


def test_standard_gzip_stream_accepted() -> None:
    body = c.encode_body(c.PING, "g")
    data = gzip.compress(body, 9)
    assert c.FrameDecoder().feed(struct.pack(">IB", len(data), 1) + data) == [c.Frame(c.PING, "g")]


@pytest.mark.parametrize("length", [0, 1, (1 << 20) + 1, 0xFFFFFFFF])
def test_bad_lengths_are_fatal(length: int) -> None:
    with pytest.raises(c.ProtocolError):
        c.FrameDecoder().feed(struct.pack(">IB", length, 0) + b"\x01\x0a")


def test_frame_limit_configurable() -> None:
    wire = c.encode(c.Frame(c.PUBLISH, "x", "q", b'"' + b"a" * 200 + b'"'))
    with pytest.raises(c.ProtocolError):
        c.FrameDecoder(max_frame=100).feed(wire)
    assert len(c.FrameDecoder(max_frame=1000).feed(wire)) == 1


@pytest.mark.parametrize("flags", [3, 4, 0x80, 0xFF])
def test_bad_flags_are_fatal(flags: int) -> None:
    with pytest.raises(c.ProtocolError):
        c.FrameDecoder().feed(struct.pack(">IB", 2, flags) + b"\x01\x0a")


@pytest.mark.parametrize("flag", [c.FLAG_GZIP, c.FLAG_BROTLI])
def test_decompression_bomb_is_fatal(flag: int) -> None:
    raw = b"\x01\x14\x00\x01a" + b"\x00" * (2 << 20)
    data = gzip.compress(raw) if flag == c.FLAG_GZIP else brotli.compress(raw)
    dec = c.FrameDecoder(max_decompressed=1 << 20)
    with pytest.raises(c.ProtocolError):
        dec.feed(struct.pack(">IB", len(data), flag) + data)


@pytest.mark.parametrize("flag", [c.FLAG_GZIP, c.FLAG_BROTLI])
def test_corrupt_compressed_body_is_fatal(flag: int) -> None:
    with pytest.raises(c.ProtocolError):
        c.FrameDecoder().feed(struct.pack(">IB", 5, flag) + b"\xff\x00\xff\x00\xff")


def test_frames_before_a_fatal_error_are_salvaged() -> None:
    dec = c.FrameDecoder()
    with pytest.raises(c.ProtocolError):
        dec.feed(PING + struct.pack(">IB", 2, 9) + b"\x01\x0a")
    assert dec.salvage() == [c.Frame(c.PING, "p1")]


@pytest.mark.parametrize("body", [
    b"\x01\x14\x00\x00",                      # empty id
    b"\x01\x14\x00\x05ab",                    # id longer than the body
    b"\x01\x14\x00\x01a\x00\x00\x00\x00\x10",  # payload length past the end
    b"\x01\x14\x00\x01a\x00\x00\x00\x00\x00\x00\x00\x01\x00\x01k",  # header value missing
    b"\x01\x63\x00\x01a\x00\x00\x00\x00\x00\x00\x00\x00",  # Error without its fields
])
def test_malformed_bodies_give_bad_frames(body: bytes) -> None:
    got = c.FrameDecoder().feed(struct.pack(">IB", len(body), 0) + body)
    assert len(got) == 1 and isinstance(got[0], c.BadFrame)
    assert got[0].code == "INVALID_MESSAGE"


def test_invalid_utf8_keeps_the_request_id() -> None:
    body = b"\x01\x14\x00\x02m1\x00\x02\xff\xfe\x00\x00\x00\x00\x00\x00"
    (bad,) = c.FrameDecoder().feed(struct.pack(">IB", len(body), 0) + body)
    assert isinstance(bad, c.BadFrame) and bad.id == "m1"


# property tests --------------------------------------------------------------------------------

text = st.text(min_size=1, max_size=20)
frames = st.builds(
    c.Frame,
    type=st.sampled_from([0, 1, 2, 10, 11, 20, 21, 22, 23, 24, 25, 26, 30, 40, 41, 42, 43, 99]),
    id=text,
    queue=st.none() | text,
    payload=st.none() | st.binary(min_size=1, max_size=3000),
    headers=st.none() | st.dictionaries(text, text, min_size=1, max_size=5),
)


def _norm(f: c.Frame) -> c.Frame:
    """What decoding gives back (error fields only for type 99)."""
    if f.type == c.ERROR:
        f.error_code, f.error_message = "CODE", "msg"
    return f


@settings(max_examples=property_examples(150), deadline=None)
@given(st.lists(frames, min_size=1, max_size=6),
       st.lists(st.sampled_from([0, 1, 2]), min_size=6, max_size=6),
       st.lists(st.integers(min_value=1, max_value=400), max_size=30))
def test_round_trip_in_random_splits(msgs: list[c.Frame], flags: list[int],
                                     cuts: list[int]) -> None:
    msgs = [_norm(m) for m in msgs]
    wire = b"".join(c.encode(m, flags[i], 100) for i, m in enumerate(msgs))
    dec = c.FrameDecoder()
    got: list = []
    pos = 0
    for n in cuts:
        got += dec.feed(wire[pos:pos + n])
        pos += n
    got += dec.feed(wire[pos:])
    assert got == msgs and dec.buffered == 0


@settings(max_examples=property_examples(300), deadline=None)
@given(st.binary(max_size=600))
def test_fuzz_decoder_never_raises_anything_but_protocol_error(data: bytes) -> None:
    dec = c.FrameDecoder(max_frame=4096, max_decompressed=1 << 16)
    try:
        out = dec.feed(data)
    except c.ProtocolError:
        return
    assert all(isinstance(f, (c.Frame, c.BadFrame)) for f in out)


@settings(max_examples=property_examples(300), deadline=None)
@given(st.binary(min_size=2, max_size=300), st.sampled_from([0, 1, 2]))
def test_fuzz_bodies_inside_valid_frames(body: bytes, flag: int) -> None:
    data = c.compress(body, flag)
    try:
        out = c.FrameDecoder().feed(struct.pack(">IB", len(data), flag) + data)
    except c.ProtocolError:
        return
    assert len(out) == 1


def test_negotiate_compression_client_order_wins() -> None:
    """The client's first name the server supports is chosen; unknown or no shared name: None."""
    assert c.compression_names(" Brotli, zstd ,gzip") == ["brotli", "gzip"]
    assert c.negotiate_compression("gzip, BROTLI", ["brotli", "gzip"]) == "gzip"
    assert c.negotiate_compression("zstd,brotli", ["brotli", "gzip"]) == "brotli"
    assert c.negotiate_compression("gzip", ["brotli"]) is None
    assert c.negotiate_compression("", ["brotli", "gzip"]) is None
