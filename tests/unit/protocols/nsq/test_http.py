"""The NSQ HTTP resource over DummyRequest, a memory hub and a Clock (no reactor, no sockets)."""

from __future__ import annotations

import io
import json
import struct
from typing import Any

from twisted.web.server import NOT_DONE_YET
from twisted.web.test.requesthelper import DummyRequest

from mqhub.protocols.nsq import codec as w
from mqhub.protocols.nsq.http import NsqHttpResource
from mqhub.testing import advance
from tests.unit.protocols.nsq.harness import Harness


def call(h: Harness, method: bytes, path: bytes, args: dict[str, str] | None = None,
         body: bytes = b"") -> tuple[int, bytes, Any]:
    """Render one request; return (status, body, request) once it finished (commits settled)."""
    resource = NsqHttpResource(h.service)
    req = DummyRequest([])
    req.method = method
    req.path = path
    req.content = io.BytesIO(body)
    for key, value in (args or {}).items():
        req.addArg(key.encode(), value.encode())
    result = resource.render(req)
    if result is NOT_DONE_YET:
        h.settle()
        assert req.finished
        data = b"".join(req.written)
    else:
        data = result
    return req.responseCode or 200, data, req


def test_pub_answers_ok_only_after_commit() -> None:
    """/pub finishes with OK once the store commit happened, and the message reaches a channel."""
    h = Harness()
    c = h.consumer("t", "c", rdy=5)
    resource = NsqHttpResource(h.service)
    req = DummyRequest([])
    req.method, req.path, req.content = b"POST", b"/pub", io.BytesIO(b"hello")
    req.addArg(b"topic", b"t")
    assert resource.render(req) is NOT_DONE_YET
    assert not req.finished  # not confirmed before the commit
    h.settle()
    assert req.finished and b"".join(req.written) == b"OK"
    assert [f.body for f in c.frames()] == [b"hello"]
    assert req.responseHeaders.getRawHeaders(b"X-NSQ-Content-Type") == [b"nsq; version=1.0"]


def test_mpub_text_and_binary_and_deferred_pub() -> None:
    """/mpub splits lines (dropping empty ones) or binary frames; /pub defer waits its delay."""
    h = Harness()
    c = h.consumer("t", "c", rdy=50)
    assert call(h, b"POST", b"/mpub", {"topic": "t"}, b"a\n\nb\n")[:2] == (200, b"OK")
    binary = struct.pack(">i", 2) + struct.pack(">i", 1) + b"x" + struct.pack(">i", 2) + b"\ny"
    assert call(h, b"POST", b"/mpub", {"topic": "t", "binary": "true"}, binary)[:2] == (200, b"OK")
    assert [f.body for f in c.frames()] == [b"a", b"b", b"x", b"\ny"]
    assert call(h, b"POST", b"/pub", {"topic": "t", "defer": "500"}, b"late")[:2] == (200, b"OK")
    assert c.frames() == []
    advance(h.clock, 1.0)
    assert [f.body for f in c.frames()] == [b"late"]


def test_errors() -> None:
    """Argument, method, size and existence errors carry nsqd's codes and statuses."""
    h = Harness()
    h.config.max_msg_size = 4
    for method, path, args, body, status, code in [
        (b"POST", b"/pub", {}, b"x", 400, "MISSING_ARG_TOPIC"),
        (b"POST", b"/pub", {"topic": "a#b"}, b"x", 400, "INVALID_TOPIC"),
        (b"POST", b"/pub", {"topic": "t"}, b"", 400, "MSG_EMPTY"),
        (b"POST", b"/pub", {"topic": "t"}, b"12345", 413, "MSG_TOO_BIG"),
        (b"POST", b"/pub", {"topic": "t", "defer": "x"}, b"1", 400, "INVALID_DEFER"),
        (b"GET", b"/pub", {"topic": "t"}, b"", 405, "METHOD_NOT_ALLOWED"),
        (b"GET", b"/missing", {}, b"", 404, "NOT_FOUND"),
        (b"POST", b"/mpub", {"topic": "t", "binary": "true"}, b"\x00\x00\x00\x01", 400, "BAD_BODY"),
        (b"POST", b"/topic/pause", {"topic": "nope"}, b"", 404, "TOPIC_NOT_FOUND"),
        (b"POST", b"/channel/create", {"topic": "nope", "channel": "c"}, b"", 404, "TOPIC_NOT_FOUND"),
    ]:
        got_status, data, _ = call(h, method, path, args, body)
        assert (got_status, json.loads(data)) == (status, {"message": code}), path
    call(h, b"POST", b"/topic/create", {"topic": "t"})
    for args, status, code in [({"topic": "t"}, 400, "MISSING_ARG_CHANNEL"),
                               ({"topic": "t", "channel": "a b"}, 400, "INVALID_ARG_CHANNEL"),
                               ({"topic": "a b", "channel": "c"}, 400, "INVALID_ARG_TOPIC")]:
        got_status, data, _ = call(h, b"POST", b"/channel/create", args)
        assert (got_status, json.loads(data)) == (status, {"message": code}), args
    assert json.loads(call(h, b"POST", b"/channel/pause", {"topic": "t", "channel": "zz"})[1]) == {
        "message": "CHANNEL_NOT_FOUND"}


def test_stats_json_shape_and_lookup() -> None:
    """/stats?format=json has nsqd's keys; /lookup lists this broker; /info has ns timeouts."""
    h = Harness()
    c = h.consumer("t", "c", rdy=1, identify={"client_id": "cons"})
    p = h.client()
    p.send(w.encode_pub("t", b"x"))
    h.settle()
    assert len(c.frames()) == 1
    _, data, _ = call(h, b"GET", b"/stats", {"format": "json"})
    stats = json.loads(data)
    assert set(stats) == {"version", "health", "start_time", "topics", "memory", "producers"}
    (topic,) = stats["topics"]
    assert set(topic) == {"topic_name", "channels", "depth", "backend_depth", "message_count",
                          "message_bytes", "paused", "e2e_processing_latency"}
    (channel,) = topic["channels"]
    assert channel["in_flight_count"] == 1 and channel["client_count"] == 1
    (client,) = channel["clients"]
    assert client["client_id"] == "cons" and client["in_flight_count"] == 1 and client["ready_count"] == 1
    (producer,) = stats["producers"]
    assert producer["pub_counts"] == [{"topic": "t", "count": 1}]
    lookup = json.loads(call(h, b"GET", b"/lookup", {"topic": "t"})[1])
    assert lookup["channels"] == ["c"] and lookup["producers"][0]["tcp_port"] == 4150
    info = json.loads(call(h, b"GET", b"/info")[1])
    assert info["max_output_buffer_timeout"] == 30_000_000_000
    text = call(h, b"GET", b"/stats")[1].decode()
    assert "[t " in text and "[c " in text
