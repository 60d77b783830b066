"""The NSQ HTTP API (nsqd's and lookupd's queries) on a real broker, read back over TCP and /stats."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable

import pytest

from tests.interop.broker import BrokerProcess
from tests.interop.nsq_client import NsqSocket, ok, request, stats

pytestmark = pytest.mark.interop


def test_http_publish_then_consume_and_stats(make_broker: Callable[..., BrokerProcess]) -> None:
    """/pub, /mpub (text and binary) and deferred /pub reach a TCP consumer; /stats reads it back."""
    broker = make_broker(["nsq"])
    status, headers, body = request(broker, "/ping")
    assert (status, body) == (200, b"OK")
    assert headers["X-NSQ-Content-Type"] == "nsq; version=1.0"
    info = json.loads(request(broker, "/info")[2])
    assert info["tcp_port"] == broker.port("nsq", "tcp") and info["version"] == "1.3.0"
    assert info["max_heartbeat_interval"] == 60_000_000_000
    ok(broker, "/topic/create?topic=web")
    ok(broker, "/channel/create?topic=web&channel=reader")
    assert ok(broker, "/pub?topic=web", b"one") == b"OK"
    assert ok(broker, "/mpub?topic=web", b"two\n\nthree\n") == b"OK"
    binary = struct.pack(">i", 2) + struct.pack(">i", 4) + b"four" + struct.pack(">i", 5) + b"fi\nve"
    assert ok(broker, "/mpub?topic=web&binary=true", binary) == b"OK"
    assert ok(broker, "/pub?topic=web&defer=200", b"six") == b"OK"
    channel = stats(broker)["topics"][0]["channels"][0]
    assert channel["channel_name"] == "reader" and channel["depth"] == 5 and channel["deferred_count"] == 1
    client = NsqSocket(broker.port("nsq", "tcp"))
    want = {b"one", b"two", b"three", b"four", b"fi\nve", b"six"}
    got = client.consume("web", "reader", lambda bodies: want <= set(bodies))
    assert sorted(m.body for m in got) == sorted(want)
    doc = stats(broker)
    (topic,) = doc["topics"]
    assert topic["topic_name"] == "web" and topic["message_count"] == 6
    (channel,) = topic["channels"]
    assert channel["message_count"] == 6 and channel["client_count"] == 1
    (record,) = channel["clients"]
    assert record["finish_count"] == 6 and record["version"] == "V2"
    text = request(broker, "/stats")[2].decode()
    assert "[web" in text and "[reader" in text
    client.close()


def test_http_errors_match_nsqd(make_broker: Callable[..., BrokerProcess]) -> None:
    """Missing or bad arguments, wrong methods, unknown paths and oversize bodies get nsqd's codes."""
    broker = make_broker(["nsq"], extra_args=["--option", "nsq.max_msg_size=100"])
    cases = [
        ("/pub", b"x", None, 400, "MISSING_ARG_TOPIC"),
        ("/pub?topic=bad!", b"x", None, 400, "INVALID_TOPIC"),
        ("/pub?topic=t", b"", None, 400, "MSG_EMPTY"),
        ("/pub?topic=t", b"x" * 101, None, 413, "MSG_TOO_BIG"),
        ("/pub?topic=t&defer=-1", b"x", None, 400, "INVALID_DEFER"),
        ("/pub?topic=t", None, "GET", 405, "METHOD_NOT_ALLOWED"),
        ("/nope", None, "GET", 404, "NOT_FOUND"),
        ("/topic/delete?topic=absent", b"", None, 404, "TOPIC_NOT_FOUND"),
        ("/channel/create?topic=absent&channel=c", b"", None, 404, "TOPIC_NOT_FOUND"),
        ("/lookup", None, "GET", 400, "MISSING_ARG_TOPIC"),
    ]
    for path, body, method, status, message in cases:
        got_status, headers, data = request(broker, path, body, method)
        assert (got_status, json.loads(data)) == (status, {"message": message}), path
        assert headers["Content-Type"].startswith("application/json")
    ok(broker, "/topic/create?topic=t")
    status, _, data = request(broker, "/channel/delete?topic=t&channel=missing", b"")
    assert (status, json.loads(data)) == (404, {"message": "CHANNEL_NOT_FOUND"})


def test_http_admin_and_lookupd_queries(make_broker: Callable[..., BrokerProcess]) -> None:
    """Channel pause/empty, topic delete and lookupd's /lookup /topics /channels /nodes."""
    broker = make_broker(["nsq"])
    ok(broker, "/topic/create?topic=admin")
    ok(broker, "/channel/create?topic=admin&channel=c1")
    ok(broker, "/channel/create?topic=admin&channel=c2")
    ok(broker, "/channel/pause?topic=admin&channel=c1")
    ok(broker, "/mpub?topic=admin", b"a\nb\nc")
    ok(broker, "/channel/empty?topic=admin&channel=c2")
    chans = {c["channel_name"]: c for c in stats(broker)["topics"][0]["channels"]}
    assert chans["c1"]["paused"] is True and chans["c1"]["depth"] == 3
    assert chans["c2"]["depth"] == 0
    lookup = json.loads(request(broker, "/lookup?topic=admin")[2])
    assert lookup["channels"] == ["c1", "c2"]
    (producer,) = lookup["producers"]
    assert producer["broadcast_address"] == "127.0.0.1"
    assert producer["tcp_port"] == broker.port("nsq", "tcp")
    assert producer["http_port"] == broker.port("nsq", "http")
    assert json.loads(request(broker, "/topics")[2]) == {"topics": ["admin"]}
    assert json.loads(request(broker, "/channels?topic=admin")[2]) == {"channels": ["c1", "c2"]}
    nodes = json.loads(request(broker, "/nodes")[2])
    assert nodes["producers"][0]["topics"] == ["admin"]
    ok(broker, "/topic/delete?topic=admin")
    assert json.loads(request(broker, "/topics")[2]) == {"topics": []}
    # deleted topics stay deleted across a restart
    broker.restart()
    assert json.loads(request(broker, "/topics")[2]) == {"topics": []}
