"""The admin JSON API and /metrics against a real broker (NSQ and NATS clients on raw sockets)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mqhub.protocols.nsq import codec as wire
from tests.interop.admin_client import call, get, queue_row, wait_for
from tests.interop.nsq_client import NsqSocket, ok

pytestmark = pytest.mark.interop

QUEUE = "nsq/orders/archive"
QUOTED = "nsq%2Forders%2Farchive"


def metric_totals(broker: Any, name: str) -> dict[str, float]:
    """``{protocol: value}`` of one ``*_total`` counter family in /metrics."""
    status, text = call(broker, "/metrics")
    assert status == 200
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return {s.labels.get("protocol", s.labels.get("reason", "")): s.value
                    for s in family.samples if s.name.endswith("_total")}
    return {}


def nats_pubsub(port: int, count: int) -> None:
    """One NATS subscriber and publisher on raw sockets; wait until all ``count`` MSGs arrive."""
    sub = socket.create_connection(("127.0.0.1", port), timeout=5)
    pub = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        for s in (sub, pub):
            s.recv(4096)  # INFO
            s.sendall(b'CONNECT {"verbose":false}\r\n')
        sub.sendall(b"SUB natsload 1\r\nPING\r\n")
        got = b""
        while b"PONG" not in got:
            got += sub.recv(4096)
        pub.sendall(b"PUB natsload 5\r\nhello\r\n" * count)
        got = b""
        while got.count(b"MSG natsload 1 5") < count:
            chunk = sub.recv(1 << 16)
            assert chunk, "subscriber closed"
            got += chunk
    finally:
        sub.close()
        pub.close()


def test_endpoints_settings_dead_letters_and_replay(make_broker: Any) -> None:
    """healthz, stats, queues (URL-encoded name), PATCH max_attempts, REQ → dead letter, replay."""
    broker = make_broker(["nsq", "mq9"], extra_args=["--durability", "none"])
    health = get(broker, "/healthz")
    assert health["status"] == "ok" and all(health["listeners"].values())
    ok(broker, "/topic/create?topic=orders")
    ok(broker, "/channel/create?topic=orders&channel=archive")
    ok(broker, "/pub?topic=orders", b"poison")
    row = wait_for(lambda: (r := queue_row(broker, QUEUE)) and r["depth"] == 1 and r, "depth 1")
    assert row["dead"] == 0
    detail = get(broker, f"/api/queues/{QUOTED}")
    assert detail["name"] == QUEUE and detail["bindings"] == ["orders"]

    assert call(broker, f"/api/queues/{QUOTED}", "PATCH", {"max_attempts": 1})[0] == 200
    assert get(broker, f"/api/queues/{QUOTED}")["settings"]["max_attempts"] == 1
    status, err = call(broker, f"/api/queues/{QUOTED}", "PATCH", {"tier": "memory"})
    assert status == 400 and "cannot be changed" in err["error"]
    status, err = call(broker, f"/api/queues/{QUOTED}", "PATCH", raw=b'{"max_attempts": 2}',
                       headers={"Content-Type": "text/plain"})
    assert status == 415
    assert call(broker, "/api/queues/nsq%2Fnope", "PATCH", {"max_attempts": 1})[0] == 404

    consumer = NsqSocket(broker.port("nsq", "tcp"))
    consumer.send(wire.encode_sub("orders", "archive") + wire.encode_rdy(1))
    (msg,) = consumer.messages_until(1, "the poison message")
    consumer.send(wire.encode_rdy(0) + b"REQ " + msg.msg_id + b" 0\n")
    wait_for(lambda: (r := queue_row(broker, QUEUE)) and r["dead"] == 1, "a dead letter")
    dlq = get(broker, "/api/dlq")
    assert dlq["queues"][0]["queue"] == QUEUE
    assert dlq["queues"][0]["reasons"] == {"max_attempts": 1}
    letters = get(broker, f"/api/dlq/{QUOTED}")["dead_letters"]
    assert [(d["reason"], d["origin"], d["address"], d["attempts"], d["preview"])
            for d in letters] == [("max_attempts", "nsq", "orders", 1, "poison")]
    assert metric_totals(broker, "mqhub_messages_dead_lettered") == {"max_attempts": 1.0}
    consumer.close()

    status, answer = call(broker, f"/api/dlq/{QUOTED}/replay", "POST", {"ids": [letters[0]["id"]]})
    assert (status, answer) == (200, {"queue": QUEUE, "replayed": 1})
    row = wait_for(lambda: (r := queue_row(broker, QUEUE)) and r["depth"] == 1 and r, "replayed")
    assert row["dead"] == 0

    assert call(broker, f"/api/queues/{QUOTED}/pause", "POST", {})[1]["paused"] is True
    assert call(broker, f"/api/queues/{QUOTED}/resume", "POST", {})[1]["paused"] is False
    assert call(broker, f"/api/queues/{QUOTED}/purge", "POST", {})[0] == 200
    wait_for(lambda: queue_row(broker, QUEUE)["depth"] == 0, "purged")

    addresses = get(broker, "/api/addresses")["addresses"]
    assert {"address": "orders", "queues": [QUEUE], "subscribers": {}} in addresses
    assert get(broker, "/api/mailboxes")["total"] == 0
    assert "schedules" in get(broker, "/api/schedules")
    status, err = call(broker, "/api/nothing")
    assert status == 404 and "error" in err
    assert call(broker, "/api/stats", "POST", {})[0] == 405
    status, err = call(broker, "/api/queues?sort=colour")
    assert status == 400 and "unknown sort" in err["error"]


def test_metrics_counters_move_under_load(make_broker: Any) -> None:
    """NSQ and NATS traffic moves the per-protocol counters; connections are listed."""
    broker = make_broker(["nsq", "mq9"], extra_args=["--durability", "none"])
    before = metric_totals(broker, "mqhub_messages_published")
    nsq = NsqSocket(broker.port("nsq", "tcp"))
    body = wire.encode_mpub("load", [b"x" * 16] * 500)
    nsq.send(body * 4)
    nsq.read_until(lambda fs: sum(f == wire.Response(b"OK") for f in fs) >= 4, "4 MPUB OKs")
    got = nsq.consume("load", "c", lambda bodies: len(bodies) >= 2000)
    assert len(got) == 2000
    conns = get(broker, "/api/connections")
    assert conns["by_protocol"]["nsq"] == 1
    assert conns["connections"][0]["protocol"] == "nsq" and conns["connections"][0]["since"]
    nats_pubsub(broker.port("mq9", "tcp"), 1000)

    published = metric_totals(broker, "mqhub_messages_published")
    delivered = metric_totals(broker, "mqhub_messages_delivered")
    acked = wait_for(lambda: (a := metric_totals(broker, "mqhub_messages_acked"))
                     and a.get("nsq") == 2000 and a, "2000 NSQ acks")
    assert before.get("nsq", 0) == 0
    assert published["nsq"] == 2000 and delivered["nsq"] == 2000 and acked["nsq"] == 2000
    assert published["mq9"] == 1000 and delivered["mq9"] == 1000  # plugin mq9, alias nats
    stats = get(broker, "/api/stats")
    assert stats["protocols"]["nsq"]["published"] == 2000
    assert stats["protocols"]["mq9"]["delivered"] == 1000
    assert stats["store"]["kind"] == "lmdb"
    _, text = call(broker, "/metrics")
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
               if not s.labels or "le" not in s.labels}
    assert samples["mqhub_store_commit_seconds_count"] > 0  # the store reports every commit
    assert samples["mqhub_connections"] >= 0 and "process_cpu_seconds_total" in samples
    nsq.close()


def test_token_guards_state_changes_only(make_broker: Any, tmp_path: Path) -> None:
    """With --admin-token, reads stay open and a change needs ``Authorization: Bearer``."""
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    broker = make_broker(["nsq"], extra_args=["--durability", "none", "--admin-token", str(token)])
    ok(broker, "/topic/create?topic=t")
    ok(broker, "/channel/create?topic=t&channel=c")
    assert get(broker, "/api/queues")["total"] == 1
    path = "/api/queues/nsq%2Ft%2Fc"
    assert call(broker, path, "PATCH", {"max_attempts": 2})[0] == 401
    assert call(broker, path, "PATCH", {"max_attempts": 2},
                headers={"Authorization": "Bearer wrong"})[0] == 401
    status, detail = call(broker, path, "PATCH", {"max_attempts": 2},
                          headers={"Authorization": "Bearer s3cret"})
    assert status == 200 and detail["max_attempts"] == 2
    status, _ = call(broker, path, "PATCH", {"max_attempts": 3},
                     headers={"Authorization": "Bearer s3cret", "Origin": "http://evil.example"})
    assert status == 403


def test_no_admin_and_listen_override(make_broker: Any) -> None:
    """--no-admin serves nothing on the admin port; the override port is used otherwise."""
    broker = make_broker(["nsq"], extra_args=["--durability", "none", "--no-admin"])
    assert ("admin", "http") not in broker.ports
    assert "admin" not in broker.output()
