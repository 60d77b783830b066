"""Decompression bombs: NSQ's deflate and snappy upgrades never expand a read without bound.

Regression tests for the deflate bomb found by this suite: the server inflated a whole read at
once, so 64 KiB of zeros from a client became 64 MiB in one allocation. Memory is measured with
tracemalloc (bytes objects are traced), on the real server over a StringTransport.
"""

from __future__ import annotations

import json
import tracemalloc
import zlib
from typing import Any

import pytest

from mqhub.protocols.nsq import codec as w
from mqhub.protocols.nsq import snappy
from tests.unit.protocols.nsq.harness import Harness


def deflate_client(h: Harness) -> tuple[Any, Any, Any]:
    """A client that negotiated deflate: (client, its compressor, an inflater past the OK)."""
    c = h.client()
    c.send(w.encode_identify({"feature_negotiation": True, "deflate": True, "deflate_level": 6}))
    raw = c.transport.value()
    c.transport.clear()
    inflate = zlib.decompressobj(-15)
    inflate.decompress(raw[4 + int.from_bytes(raw[:4], "big"):])  # the upgrade's OK
    return c, zlib.compressobj(9, zlib.DEFLATED, -15), inflate


def test_deflate_bomb_is_inflated_in_bounded_steps() -> None:
    """64 MiB of zeros deflated (~64 KiB) closes the connection with peak memory far below 64 MiB."""
    h = Harness()
    c, deflate, _ = deflate_client(h)
    bomb = deflate.compress(b"\0" * (64 << 20)) + deflate.flush(zlib.Z_SYNC_FLUSH)
    assert len(bomb) < 100_000
    tracemalloc.start()
    try:
        c.send(bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"peak {peak >> 20} MiB while inflating"
    assert c.closed  # zeros are no NSQ command: the protocol's fatal error, this connection only


def test_deflated_pubs_past_one_step_are_all_published() -> None:
    """Valid commands that inflate to more than one step are all read (nothing is cut)."""
    h = Harness()
    consumer = h.consumer("bomb", "c", rdy=2500)
    c, deflate, inflate = deflate_client(h)
    body = b"x" * 1000
    stream = b"".join(w.encode_pub("bomb", body) for _ in range(2000))  # ~2 MiB inflated
    c.send(deflate.compress(stream) + deflate.flush(zlib.Z_SYNC_FLUSH))
    h.settle()
    codec = w.ClientCodec()
    codec.receive_data(inflate.decompress(c.transport.value()))
    assert codec.frames() == [w.Response(b"OK")] * 2000
    got = [f for f in consumer.frames() if isinstance(f, w.Message)]
    assert len(got) == 2000 and {m.body for m in got} == {body}


@pytest.mark.skipif(not snappy.available(), reason="cramjam is a dev dependency; always there in CI")
def test_snappy_chunk_claiming_more_than_64k_is_refused() -> None:
    """A compressed chunk whose length preamble exceeds the format's 65536 is E_BAD_BODY, unread."""
    decoder = snappy.SnappyDecoder()
    decoder.decode(snappy.STREAM_IDENTIFIER)
    import cramjam

    payload = bytes(cramjam.snappy.compress_raw(b"\0" * (1 << 20)))  # valid, 1 MiB in one chunk
    assert len(payload) < snappy.MAX_CHUNK
    chunk = b"\x00" + (4 + len(payload)).to_bytes(3, "little") + b"\0\0\0\0" + payload
    with pytest.raises(w.ProtocolError) as err:
        decoder.decode(chunk)
    assert err.value.code == "E_BAD_BODY"


def test_identify_answer_is_json() -> None:
    """Sanity: the negotiation these tests rely on answers the feature JSON (deflate on)."""
    h = Harness()
    c = h.client()
    c.send(w.encode_identify({"feature_negotiation": True, "deflate": True}))
    size = int.from_bytes(c.transport.value()[:4], "big")
    assert json.loads(c.transport.value()[8:4 + size])["deflate"] is True


def test_http_body_past_the_limit_is_neither_kept_nor_spooled() -> None:
    """A declared or chunked body over the limit is dropped as it arrives (Twisted would spool it
    to a temporary file without bound); the resource then answers nsqd's 413."""
    from twisted.web.test.requesthelper import DummyChannel

    from mqhub.protocols.nsq.http import request_factory

    cls = request_factory(1000)
    declared = cls(DummyChannel())
    declared.gotLength(50 << 20)
    assert declared.body_too_big and declared.content.getvalue() == b""
    chunked = cls(DummyChannel())
    chunked.gotLength(None)
    for _ in range(50):
        chunked.handleContentChunk(b"x" * 100)
    assert chunked.body_too_big and chunked.content.getvalue() == b""
    fits = cls(DummyChannel())
    fits.gotLength(None)
    fits.handleContentChunk(b"y" * 1000)
    assert not fits.body_too_big
    fits.content.seek(0)
    assert fits.content.read() == b"y" * 1000


def test_too_big_request_gets_413_with_nsqds_codes() -> None:
    """/pub answers MSG_TOO_BIG and /mpub BODY_TOO_BIG for a dropped body."""
    from twisted.web.test.requesthelper import DummyRequest

    from mqhub.protocols.nsq.http import NsqHttpResource

    h = Harness()
    resource = NsqHttpResource(h.service)
    for path, code in ((b"/pub", "MSG_TOO_BIG"), (b"/mpub", "BODY_TOO_BIG")):
        request = DummyRequest([path.strip(b"/")])
        request.method = b"POST"
        request.path = path
        request.args = {b"topic": [b"t"]}
        request.body_too_big = True
        body = resource.render(request)
        assert request.responseCode == 413 and json.loads(body) == {"message": code}
