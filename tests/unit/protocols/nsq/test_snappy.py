"""The snappy framing-format stream used by NSQ's snappy upgrade."""

from __future__ import annotations

import random

import cramjam
import pytest

from mqhub.protocols.nsq.codec import ProtocolError
from mqhub.protocols.nsq.snappy import STREAM_IDENTIFIER, SnappyDecoder, SnappyEncoder


def test_encoder_output_is_a_valid_framed_stream_across_writes() -> None:
    """Consecutive writes concatenate into one stream a standard framed decoder reads."""
    enc = SnappyEncoder()
    parts = [b"hello " * 50, b"", b"x", bytes(range(256)) * 300]
    stream = b"".join(enc.encode(p) for p in parts)
    assert stream.startswith(STREAM_IDENTIFIER) and stream.count(STREAM_IDENTIFIER) == 1
    assert bytes(cramjam.snappy.decompress(stream)) == b"".join(parts)


@pytest.mark.parametrize("seed", range(10))
def test_decoder_handles_any_split(seed: int) -> None:
    """A framed stream split at random points decodes to the original bytes."""
    rng = random.Random(seed)
    payload = bytes(rng.getrandbits(8) for _ in range(3000)) + b"a" * 200_000
    stream = bytes(cramjam.snappy.compress(payload))
    dec = SnappyDecoder()
    out = []
    pos = 0
    while pos < len(stream):
        step = rng.randint(1, 5000)
        out.append(dec.decode(stream[pos:pos + step]))
        pos += step
    assert b"".join(out) == payload


def test_uncompressed_and_skippable_chunks() -> None:
    """Type 0x01 chunks pass through; 0x80-0xfe chunks are skipped."""
    dec = SnappyDecoder()
    body = b"plain"
    chunk = b"\x01" + (len(body) + 4).to_bytes(3, "little") + b"\x00" * 4 + body
    skip = b"\x99" + (3).to_bytes(3, "little") + b"abc"
    assert dec.decode(STREAM_IDENTIFIER + skip + chunk) == b"plain"


@pytest.mark.parametrize(
    "data",
    [b"\x00\x05\x00\x00\x00\x00\x00\x00z",  # data before the identifier
     b"\xff\x06\x00\x00sNaPpX",  # wrong identifier
     STREAM_IDENTIFIER + b"\x05\x01\x00\x00z",  # reserved unskippable type
     STREAM_IDENTIFIER + b"\x00\x06\x00\x00\x00\x00\x00\x00\xff\xff",  # corrupt compressed data
     STREAM_IDENTIFIER + b"\x00\xff\xff\xff"],  # chunk longer than the format allows
)
def test_malformed_streams_are_protocol_errors(data: bytes) -> None:
    """Every malformed stream is a fatal E_BAD_BODY."""
    with pytest.raises(ProtocolError) as info:
        SnappyDecoder().decode(data)
    assert info.value.code == "E_BAD_BODY" and info.value.fatal
