"""The VibeMQ server on a memory hub, driven by the .NET-like test client over a loopback."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from mqhub.protocols.vibemq import codec as c
from mqhub.protocols.vibemq.options import QueueOptions
from tests.interop.vibemq_client import ConnectionFailed, VibeError, new_id
from tests.unit.protocols.vibemq.harness import Harness, write_users


@pytest.fixture
def h() -> Harness:
    return Harness()


# connect, compression, auth ---------------------------------------------------------------------

def test_connect_ack_has_random_id_and_negotiates_in_client_order(h: Harness) -> None:
    a = h.client(connect=False)
    ack = a.connect(compression="gzip,brotli")
    assert ack.type == c.CONNECT_ACK and len(ack.id) == 32 and ack.queue is None
    assert ack.headers == {"negotiated-compression": "gzip"}
    assert h.client(compression=" LZ4 , Brotli").negotiated == "brotli"
    assert h.client(compression="zstd").negotiated is None
    assert h.client(compression=None).negotiated is None


def test_ping_before_connect_and_pong_id(h: Harness) -> None:
    a = h.client(connect=False)
    pong = a.ping()
    assert pong.type == c.PONG


def test_auth_failure_then_success_on_same_socket(tmp_path: Path) -> None:
    h = Harness(users_file=write_users(tmp_path / "users.json"))
    a = h.client(connect=False)
    rid = new_id()
    a.send_frame(c.Frame(c.PUBLISH, rid, "orders", b"1"))
    err = a.wait_reply(rid)
    assert (err.type, err.error_code) == (c.ERROR, "NOT_AUTHENTICATED")
    with pytest.raises(ConnectionFailed) as exc:
        a.connect("admin", "wrong")
    assert exc.value.code == "AUTH_FAILED"
    with pytest.raises(ConnectionFailed) as exc:
        a.connect("admin")
    assert exc.value.code == "AUTH_REQUIRED"
    assert not a.disconnected
    assert a.connect("admin", "secret").type == c.CONNECT_ACK
    assert a.publish("orders", {"ok": 1}).type == c.PUBLISH_ACK


def test_acl_denies_with_request_id(tmp_path: Path) -> None:
    h = Harness(users_file=write_users(tmp_path / "users.json"))
    app = h.client(username="app", password="pw")
    app.publish("orders.eu", 1)
    with pytest.raises(VibeError) as exc:
        app.publish("payments", 1)
    assert exc.value.code == "NOT_AUTHORIZED"
    with pytest.raises(VibeError) as exc:  # admin commands are for superusers
        app.request(c.ADMIN_LIST_USERS)
    assert exc.value.code == "NOT_AUTHORIZED"
    assert app.list_queues() == ["orders.eu"]


def test_admin_commands(tmp_path: Path) -> None:
    users = write_users(tmp_path / "users.json")
    h = Harness(users_file=users)
    admin = h.client(username="admin", password="secret")
    admin.request(c.ADMIN_CREATE_USER, payload=b'{"username":"bob","password":"pw1"}')
    with pytest.raises(VibeError) as exc:
        admin.request(c.ADMIN_CREATE_USER, payload=b'{"username":"bob","password":"x"}')
    assert exc.value.code == "USER_EXISTS"
    admin.request(c.ADMIN_GRANT_PERMISSION,
                  payload=b'{"username":"bob","queuePattern":"jobs.*","operations":["Publish"]}')
    perms = admin.request(c.ADMIN_GET_USER_PERMISSIONS, payload=b'{"username":"bob"}').json()
    assert perms == [{"queuePattern": "jobs.*", "operations": ["Publish"]}]
    bob = h.client(username="bob", password="pw1")
    bob.publish("jobs.a", 1)
    admin.request(c.ADMIN_CHANGE_PASSWORD, payload=b'{"username":"bob","newPassword":"pw2"}')
    with pytest.raises(ConnectionFailed):
        h.client(username="bob", password="pw1")
    h.client(username="bob", password="pw2")
    admin.request(c.ADMIN_REVOKE_PERMISSION, payload=b'{"username":"bob","queuePattern":"jobs.*"}')
    names = [u["username"] for u in admin.request(c.ADMIN_LIST_USERS).json()]
    assert names == ["admin", "app", "bob"]
    with pytest.raises(VibeError) as exc:
        admin.request(c.ADMIN_DELETE_USER, payload=b'{"username":"nobody"}')
    assert exc.value.code == "USER_NOT_FOUND"
    with pytest.raises(VibeError) as exc:
        admin.request(c.ADMIN_DELETE_USER, payload=b"{bad json")
    assert exc.value.code == "INVALID_PAYLOAD"
    admin.request(c.ADMIN_DELETE_USER, payload=b'{"username":"bob"}')
    saved = json.loads(users.read_text())
    assert [u["username"] for u in saved["users"]] == ["admin", "app"]


def test_admin_commands_unknown_without_users_file(h: Harness) -> None:
    with pytest.raises(VibeError) as exc:
        h.client().request(c.ADMIN_LIST_USERS)
    assert exc.value.code == "UNKNOWN_COMMAND"


# errors -------------------------------------------------------------------------------------------

def test_errors_carry_the_request_id_and_keep_the_connection(h: Harness) -> None:
    a = h.client()
    for type_, queue, payload, code in [
        (c.PUBLISH, None, b"1", "INVALID_QUEUE"),
        (c.PUBLISH, "bad name!", b"1", "INVALID_QUEUE"),
        (c.PUBLISH, "orders", b"{not json", "INVALID_MESSAGE"),
        (c.PUBLISH, "orders", b'"\xff"', "INVALID_MESSAGE"),
        (c.PUBLISH, "orders", b'{"a":"\xc3"}', "INVALID_MESSAGE"),
        (c.PUBLISH, "orders", b"[" * 100_000 + b"]" * 100_000, "INVALID_MESSAGE"),
        (c.PUBLISH, "orders", b'{"a":1,}', "INVALID_MESSAGE"),
        (c.CREATE_QUEUE, "q", b'{"mode":"FanOutWithAck"}', "INVALID_PAYLOAD"),
        (c.CREATE_QUEUE, "q", b'{"mode":7}', "INVALID_PAYLOAD"),
        (c.CREATE_QUEUE, "q", b'{"messageTtl":"forever"}', "INVALID_PAYLOAD"),
        (c.CREATE_QUEUE, "q", b"[1,", "INVALID_PAYLOAD"),
        (c.SUBSCRIBE, None, None, "INVALID_QUEUE"),
        (77, None, None, "UNKNOWN_COMMAND"),
        (c.DELIVER, "q", None, "UNKNOWN_COMMAND"),
    ]:
        with pytest.raises(VibeError) as exc:
            a.request(type_, queue, payload)
        assert exc.value.code == code, (type_, queue, payload)
        assert exc.value.frame.id  # matched by id: request() would have timed out otherwise
    assert a.publish("orders", {"still": "open"}).type == c.PUBLISH_ACK


def test_too_many_headers_refused(h: Harness) -> None:
    with pytest.raises(VibeError) as exc:
        h.client().publish("q", 1, {f"h{i}": "v" for i in range(51)})
    assert exc.value.code == "INVALID_MESSAGE"


def test_framing_error_closes_only_that_connection(h: Harness) -> None:
    a, b = h.client(), h.client()
    rid = new_id()
    a.send_raw(c.encode(c.Frame(c.PING, rid)) + struct.pack(">IB", 10, 7) + b"x" * 10)
    assert a.wait_reply(rid).type == c.PONG
    err = a.next_frame()
    assert err.error_code == "INVALID_MESSAGE"
    assert a.disconnected
    assert b.publish("q", 1).type == c.PUBLISH_ACK


def test_rate_limit_configurable() -> None:
    h = Harness(frame_rate=3)
    a = h.client()  # Connect is frame 1
    ids = [new_id() for _ in range(4)]
    a.send_raw(b"".join(c.encode(c.Frame(c.PING, i)) for i in ids))
    replies = [a.wait_reply(i) for i in ids]
    assert [r.type for r in replies] == [c.PONG, c.PONG, c.ERROR, c.ERROR]
    assert replies[2].error_code == "RATE_LIMITED"
    h.advance(1.0)
    assert a.ping().type == c.PONG


def test_connection_limit() -> None:
    h = Harness(max_connections=1)
    h.client()
    b = h.client(connect=False)
    assert b.next_frame().error_code == "CONNECTION_LIMIT" and b.disconnected


# commands -----------------------------------------------------------------------------------------

def test_every_queue_command(h: Harness) -> None:
    a = h.client()
    opts = QueueOptions(mode=0, max_queue_size=500, message_ttl=3600.0,
                        enable_dead_letter_queue=True, dead_letter_queue_name="orders.dead",
                        overflow_strategy=1, max_retry_attempts=5)
    assert a.create_queue("orders", opts).type == c.CREATE_QUEUE
    assert a.create_queue("orders", QueueOptions(mode=1)).type == c.CREATE_QUEUE  # no-op
    info = a.queue_info("orders")
    assert info is not None
    created = info.pop("createdAt")
    assert created.endswith("Z") and created.startswith("2026-01-01T")
    assert info == {"name": "orders", "messageCount": 0, "subscriberCount": 0,
                    "deliveryMode": 0, "maxSize": 500, "messageTtl": "01:00:00",
                    "enableDeadLetterQueue": True, "deadLetterQueueName": "orders.dead",
                    "overflowStrategy": 1, "maxRetryAttempts": 5}
    ack = a.publish("orders", {"n": 1})
    assert (ack.type, ack.queue, ack.headers, ack.payload) == (c.PUBLISH_ACK, "orders", None, None)
    assert a.queue_info("orders")["messageCount"] == 1  # type: ignore[index]
    assert sorted(a.list_queues()) == ["orders", "orders.dead"]
    sub = a.subscribe("orders")
    assert (sub.type, sub.queue) == (c.SUBSCRIBE_ACK, "orders")
    (d,) = a.receive(1)
    assert a.queue_info("orders")["subscriberCount"] == 1  # type: ignore[index]
    a.ack(d)
    h.advance(0)
    assert h.queue("orders").in_flight == 0
    assert a.unsubscribe("orders").type == c.UNSUBSCRIBE_ACK
    assert a.delete_queue("orders").type == c.DELETE_QUEUE
    assert a.queue_info("orders") is None
    assert a.delete_queue("never-existed").type == c.DELETE_QUEUE
    a.disconnect()
    assert a.disconnected


def test_publish_ack_only_after_commit(h: Harness) -> None:
    a = h.client()
    rid = new_id()
    a.send_frame(c.Frame(c.PUBLISH, rid, "q", b"1"))
    from mqhub.testing import take_output
    assert take_output(a.transport) == b""  # not stored yet: no PublishAck
    assert a.wait_reply(rid).type == c.PUBLISH_ACK


def test_deliver_frame_fields(h: Harness) -> None:
    a = h.client()
    a.publish("orders", {"title": "Hello"}, {"correlationId": "c-9"})
    a.publish("orders")  # no payload
    a.subscribe("orders")
    d1, d2 = a.receive(2)
    assert d1.queue == "orders" and json.loads(d1.payload) == {"title": "Hello"}
    assert d1.headers == {"correlationId": "c-9", "deliveryAttempts": "1"}
    assert len(d1.id) == 16 and d1.id != d2.id
    assert d2.payload is None and d2.headers == {"deliveryAttempts": "1"}


def test_backlog_delivered_on_subscribe(h: Harness) -> None:
    a = h.client()
    for i in range(5):
        a.publish("orders", {"n": i})
    b = h.client()
    b.subscribe("orders")
    got = b.receive(5)
    assert [json.loads(d.payload)["n"] for d in got] == [0, 1, 2, 3, 4]


def test_unacked_redelivered_after_disconnect_without_new_publish(h: Harness) -> None:
    a = h.client()
    a.publish("orders", {"n": 1})
    b = h.client()
    b.subscribe("orders")
    b.receive(1)
    other = h.client()
    other.subscribe("orders")
    b.transport.loseConnection()
    (d,) = other.receive(1)
    assert json.loads(d.payload) == {"n": 1}


def test_unsubscribe_requeues_in_flight(h: Harness) -> None:
    a = h.client()
    a.publish("orders", 1)
    a.subscribe("orders")
    a.receive(1)
    a.unsubscribe("orders")
    assert h.queue("orders").depth == 1


# delivery modes -----------------------------------------------------------------------------------

def test_round_robin_shares_messages(h: Harness) -> None:
    pub, s1, s2 = h.client(), h.client(), h.client()
    s1.subscribe("rr")
    s2.subscribe("rr")
    for i in range(10):  # one read each: the core hands each read's batch to the next subscriber
        pub.publish("rr", i)
    got1 = s1.receive(5)
    got2 = s2.receive(5)
    vals = sorted(json.loads(d.payload) for d in got1 + got2)
    assert vals == list(range(10))
    assert not s1.deliveries and not s2.deliveries


def test_fanout_with_ack_retries_only_the_subscriber_that_did_not_ack(h: Harness) -> None:
    pub, good, lazy = h.client(), h.client(), h.client()
    pub.create_queue("fan", QueueOptions(mode=1))
    good.subscribe("fan")
    lazy.subscribe("fan")
    pub.publish("fan", {"n": 1})
    (g,) = good.receive(1, ack=True)
    (lz,) = lazy.receive(1)
    assert g.id == lz.id
    h.advance(31)
    (again,) = lazy.receive(1)
    assert again.id == lz.id and again.headers["deliveryAttempts"] == "2"
    assert not good.deliveries
    with pytest.raises(TimeoutError):
        good.receive(1, timeout=0)
    lazy.ack(again)
    h.advance(0)
    assert h.queue("fan").depth == 0


def test_fanout_without_ack(h: Harness) -> None:
    pub, s1, s2 = h.client(), h.client(), h.client()
    pub.create_queue("news", QueueOptions(mode=2))
    s1.subscribe("news")
    s2.subscribe("news")
    pub.publish("news", {"headline": 1})
    assert json.loads(s1.receive(1)[0].payload) == {"headline": 1}
    assert json.loads(s2.receive(1)[0].payload) == {"headline": 1}
    h.advance(60)
    assert not s1.deliveries and not s2.deliveries
    with pytest.raises(TimeoutError):
        s1.receive(1, timeout=0)
    assert h.queue("news").depth == 0 and h.queue("news").in_flight == 0


def test_priority_order_with_fifo_inside_a_priority(h: Harness) -> None:
    pub = h.client()
    pub.create_queue("jobs", QueueOptions(mode=3))
    plan = [("Low", "l1"), ("High", "h1"), ("normal", "n1"), ("Critical", "c1"), ("High", "h2"),
            ("bogus", "n2"), ("7", "p7"), (None, "n3"), ("high", "h3"), ("0", "l2")]
    for prio, name in plan:
        pub.publish("jobs", name, {"priority": prio} if prio else None)
    sub = h.client()
    sub.subscribe("jobs")
    got = [json.loads(d.payload) for d in sub.receive(len(plan))]
    assert got == ["p7", "c1", "h1", "h2", "h3", "n1", "n2", "n3", "l1", "l2"]


def test_priority_ignored_outside_priority_mode(h: Harness) -> None:
    pub = h.client()
    pub.publish("plain", "a", {"priority": "Low"})
    pub.publish("plain", "b", {"priority": "Critical"})
    sub = h.client()
    sub.subscribe("plain")
    assert [json.loads(d.payload) for d in sub.receive(2)] == ["a", "b"]


# TTL, retries, dead letters ------------------------------------------------------------------------

def test_message_ttl_enforced(h: Harness) -> None:
    pub = h.client()
    pub.create_queue("short", QueueOptions(message_ttl=5.0))
    pub.publish("short", "old")
    h.advance(6)
    pub.publish("short", "new")
    sub = h.client()
    sub.subscribe("short")
    assert [json.loads(d.payload) for d in sub.receive(1)] == ["new"]
    h.advance(0)
    assert not sub.deliveries
    assert h.queue("short").expired_count == 1


def test_ack_timeout_backoff_then_dead_letter_queue_then_replay(h: Harness) -> None:
    pub, worker, reader = h.client(), h.client(), h.client()
    pub.create_queue("orders", QueueOptions(enable_dead_letter_queue=True, max_retry_attempts=3))
    worker.subscribe("orders")
    pub.publish("orders", {"id": 42}, {"traceId": "t"})
    (d1,) = worker.receive(1)
    h.advance(29)
    assert not worker.deliveries
    h.advance(1.5)  # 30 s ack timeout
    (d2,) = worker.receive(1)
    assert d2.headers["deliveryAttempts"] == "2"
    h.advance(4.5)  # back-off 2 * 2^1 = 4 s
    (d3,) = worker.receive(1)
    assert d3.headers["deliveryAttempts"] == "3"
    h.advance(8.5)  # back-off 8 s, then attempts exhausted
    assert not worker.deliveries
    assert h.queue("orders").dead_letter_count == 1
    dead = h.result(h.hub.broker.dead_letters("orders"))
    assert [d.reason for d in dead] == ["max_attempts"]
    assert "orders.dlq" in pub.list_queues()
    assert pub.queue_info("orders.dlq")["messageCount"] == 1  # type: ignore[index]
    reader.subscribe("orders.dlq")
    (dl,) = reader.receive(1)
    assert dl.queue == "orders.dlq" and json.loads(dl.payload) == {"id": 42}
    assert dl.headers["dead-letter-reason"] == "max_attempts"
    assert dl.headers["dead-letter-queue"] == "orders" and dl.headers["traceId"] == "t"
    assert h.result(h.hub.broker.replay_dead_letters("orders")) == 1
    (back,) = worker.receive(1)
    assert back.id == d1.id and back.headers["deliveryAttempts"] == "1"
    worker.ack(back)
    reader.ack(dl)  # already replayed: nothing to purge
    h.advance(1)
    assert h.queue("orders").dead_letter_count == 0 and h.queue("orders").depth == 0


def test_dead_letter_ack_purges_and_new_dead_letters_arrive(h: Harness) -> None:
    pub, worker, reader = h.client(), h.client(), h.client()
    pub.create_queue("jobs", QueueOptions(max_retry_attempts=0, enable_dead_letter_queue=True,
                                          dead_letter_queue_name="jobs-failed"))
    reader.subscribe("jobs-failed")
    worker.subscribe("jobs")
    pub.publish("jobs", "x")
    worker.receive(1)
    h.advance(31)
    (dl,) = reader.receive(1)
    assert dl.queue == "jobs-failed"
    reader.ack(dl)
    h.advance(0.1)
    assert h.result(h.hub.broker.dead_letters("jobs")) == []


def test_overflow_drop_oldest(h: Harness) -> None:
    a = h.client()
    a.create_queue("q", QueueOptions(max_queue_size=2, overflow_strategy=0))
    for i in range(3):
        a.publish("q", i)
    a.subscribe("q")
    assert [json.loads(d.payload) for d in a.receive(2)] == [1, 2]
    assert h.queue("q").dropped_count == 1


def test_overflow_drop_newest(h: Harness) -> None:
    a = h.client()
    a.create_queue("q", QueueOptions(max_queue_size=2, overflow_strategy=1))
    acks = [a.publish("q", i) for i in range(3)]
    assert acks[2].headers == {"overflow": "dropped"} and acks[0].headers is None
    assert h.factory.counters["dropped_newest"] == 1
    a.subscribe("q")
    assert [json.loads(d.payload) for d in a.receive(2)] == [0, 1]


def test_overflow_redirect_to_dlq(h: Harness) -> None:
    """As the original: the incoming message is dead-lettered (reason overflow), acknowledged
    once stored, and the queue keeps the messages it had."""
    a = h.client()
    a.create_queue("q", QueueOptions(max_queue_size=2, overflow_strategy=3,
                                     enable_dead_letter_queue=True))
    acks = [a.publish("q", i) for i in range(4)]
    assert [ack.type for ack in acks] == [c.PUBLISH_ACK] * 4
    dead = h.result(h.hub.broker.dead_letters("q"))
    assert [(json.loads(d.body), d.reason) for d in dead] == [(2, "overflow"), (3, "overflow")]
    a.subscribe("q")
    assert [json.loads(d.payload) for d in a.receive(2, ack=True)] == [0, 1]


def test_overflow_block_publisher_withholds_ack_without_blocking_others(h: Harness) -> None:
    pub, other, sub = h.client(), h.client(), h.client()
    pub.create_queue("q", QueueOptions(max_queue_size=2, overflow_strategy=2))
    ids = pub.publish_many("q", [0, 1, 2, 3])
    pub.wait_acks(ids[:2])
    with pytest.raises(TimeoutError):
        pub.wait_reply(ids[2], timeout=0)
    assert other.publish("elsewhere", 1).type == c.PUBLISH_ACK  # others are not blocked
    assert pub.ping().type == c.PONG  # nor is the publisher's own connection
    sub.subscribe("q")
    first = sub.receive(2, ack=True)
    h.advance(0.2)
    assert [a.type for a in pub.wait_acks(ids[2:])] == [c.PUBLISH_ACK] * 2
    rest = sub.receive(2, ack=True)
    assert [json.loads(d.payload) for d in first + rest] == [0, 1, 2, 3]


# cross-protocol rendering --------------------------------------------------------------------------

def test_other_protocols_bodies_rendered_as_json(h: Harness) -> None:
    sub = h.client()
    sub.subscribe("mixed")
    broker = h.hub.broker
    broker.publish_batch("mixed", [b'{"a":1}', b"plain text", b"\xff\x00\x01", b""],
                         origin="nsq", headers={"k": "v"})
    got = sub.receive(4)
    assert json.loads(got[0].payload) == {"a": 1} and "payload-encoding" not in got[0].headers
    assert json.loads(got[1].payload) == "plain text"
    assert got[1].headers["payload-encoding"] == "text" and got[1].headers["k"] == "v"
    import base64
    assert base64.b64decode(json.loads(got[2].payload)) == b"\xff\x00\x01"
    assert got[2].headers["payload-encoding"] == "base64"
    assert got[3].payload is None


def test_compressed_deliveries_and_publishes(h: Harness) -> None:
    pub = h.client(compression="gzip")
    sub = h.client(compression="brotli")
    sub.subscribe("big")
    payload = {"text": "lorem ipsum " * 200}
    pub.publish("big", payload)
    (d,) = sub.receive(1)
    assert json.loads(d.payload) == payload and d.flags == c.FLAG_BROTLI


def test_queue_options_survive_a_restart(h: Harness) -> None:
    from mqhub.protocols.vibemq.queues import QueueRegistry
    from mqhub.testing import restart_hub

    a = h.client()
    a.create_queue("kept", QueueOptions(mode=3, max_queue_size=7, message_ttl=90.0,
                                        enable_dead_letter_queue=True))
    a.publish("kept", "x", {"priority": "High"})
    hub = restart_hub(h.hub)
    registry = QueueRegistry(hub.broker, hub.store, hub.clock)
    d = registry.load()
    h.hub = hub
    h.result(d)
    vq = registry.get("kept")
    assert vq is not None and vq.options == QueueOptions(
        mode=3, max_queue_size=7, message_ttl=90.0, enable_dead_letter_queue=True)
    assert vq.core.depth == 1 and registry.dead_letter_source("kept.dlq") is vq


def test_an_unreadable_queue_row_is_logged_and_skipped(h: Harness) -> None:
    """A corrupt metadata row does not stop recovery of the other queues, and is named in a
    warning rather than skipped silently."""
    from twisted.logger import capturedLogs

    from mqhub.protocols.vibemq.queues import META_PREFIX, QueueRegistry
    from mqhub.store.batch import WriteBatch
    from mqhub.testing import restart_hub

    h.client().create_queue("good", QueueOptions(mode=3, max_queue_size=7))
    batch = WriteBatch()
    batch.put_meta(META_PREFIX + "bad", b"[1, 2")
    h.result(h.hub.store.commit(batch))
    hub = restart_hub(h.hub)
    registry = QueueRegistry(hub.broker, hub.store, hub.clock)
    h.hub = hub
    with capturedLogs() as events:
        h.result(registry.load())
    assert registry.get("good") is not None and registry.get("bad") is None
    assert [e["key"] for e in events if "unreadable metadata row" in e.get("log_format", "")] \
        == [META_PREFIX + "bad"]


def test_gzip_brotli_and_plain_frames_mixed_on_one_connection(h: Harness) -> None:
    pub = h.client(compression="gzip")
    ids = [new_id() for _ in range(3)]
    big = b'{"pad":"' + b"p" * 3000 + b'"}'
    pub.send_raw(b"".join(c.encode(c.Frame(c.PUBLISH, i, "mix", big), flag, 0)
                          for i, flag in zip(ids, (c.FLAG_BROTLI, c.FLAG_NONE, c.FLAG_GZIP),
                                             strict=True)))
    assert [r.type for r in pub.wait_acks(ids)] == [c.PUBLISH_ACK] * 3
    pub.subscribe("mix")
    got = pub.receive(3)
    assert [d.payload for d in got] == [big] * 3
    assert {d.flags for d in got} == {c.FLAG_GZIP}


def test_fanout_subscriber_that_never_acks_dead_letters_only_its_copy(h: Harness) -> None:
    pub, good, lazy = h.client(), h.client(), h.client()
    pub.create_queue("fan", QueueOptions(mode=1, max_retry_attempts=2,
                                         enable_dead_letter_queue=True))
    good.subscribe("fan")
    lazy.subscribe("fan")
    pub.publish("fan", {"n": 1})
    good.receive(1, ack=True)
    lazy.receive(1)
    h.advance(30.5)
    lazy.receive(1)  # attempt 2
    h.advance(4.5)   # its back-off passes: the copy is dead-lettered
    dead = h.result(h.hub.broker.dead_letters("fan"))
    assert [d.reason for d in dead] == ["max_attempts"]
    assert not good.deliveries and h.queue("fan").in_flight == 0


@pytest.mark.parametrize("name", ["a..b", ".lead", "trail."])
def test_names_that_are_not_hub_addresses_are_refused_without_leaking_a_queue(
        h: Harness, name: str) -> None:
    a = h.client()
    for call in (lambda: a.publish(name, 1), lambda: a.subscribe(name),
                 lambda: a.create_queue(name)):
        with pytest.raises(VibeError) as exc:
            call()
        assert exc.value.code == "INVALID_QUEUE"
    assert h.hub.broker.queue(name) is None


def test_full_write_buffer_pauses_reading_and_delivering(h: Harness) -> None:
    pub, sub = h.client(), h.client()
    sub.subscribe("slow")
    sub.proto.pauseProducing()  # what the transport does when the client stops reading
    assert sub.transport.producerState == "paused"
    pub.publish("slow", 1)
    h.advance(0)
    with pytest.raises(TimeoutError):
        sub.receive(1, timeout=0)
    sub.proto.resumeProducing()
    assert sub.transport.producerState == "producing"
    assert json.loads(sub.receive(1)[0].payload) == 1


def test_ack_before_unsubscribe_in_one_read_is_settled_first(h: Harness) -> None:
    a = h.client()
    a.publish("q", 1)
    a.subscribe("q")
    (d,) = a.receive(1)
    rid = new_id()
    a.send_raw(c.encode(c.Frame(c.ACK, d.id)) + c.encode(c.Frame(c.UNSUBSCRIBE, rid, "q")))
    assert a.wait_reply(rid).type == c.UNSUBSCRIBE_ACK
    h.advance(0)
    assert h.queue("q").depth == 0 and h.queue("q").in_flight == 0


def test_connection_rate_limit_per_ip() -> None:
    h = Harness(connection_rate=2)
    h.client()
    h.client()
    third = h.client(connect=False)
    err = third.next_frame()
    assert err.error_code == "RATE_LIMITED" and third.disconnected
    h.advance(61)
    h.client()


def test_connection_rate_map_forgets_stale_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the sweep size, hosts whose accepts left the 60 s window are forgotten."""
    from mqhub.protocols.vibemq import server as vserver

    monkeypatch.setattr(vserver, "ACCEPT_HOSTS_SWEEP", 3)
    h = Harness(connection_rate=5)
    for i in range(4):
        assert h.factory.allow_connection(f"10.0.0.{i}") is None
    assert len(h.factory.accepts) == 4
    h.advance(61)
    assert h.factory.allow_connection("10.0.0.9") is None
    assert list(h.factory.accepts) == ["10.0.0.9"]


def test_config_from_twistd_options() -> None:
    from mqhub.errors import PluginError
    from mqhub.protocols.vibemq.config import VibeMQConfig

    cfg = VibeMQConfig.from_options({"vibemq-users": "u.json", "plugin_options": {"vibemq": {
        "frame-rate": "1000", "ack_timeout": "5", "validate_json": "false"}}})
    assert (cfg.users, cfg.frame_rate, cfg.ack_timeout, cfg.validate_json) == (
        "u.json", 1000, 5.0, False)
    with pytest.raises(PluginError):
        VibeMQConfig.from_options({"plugin_options": {"vibemq": {"tier": "disk"}}})


def test_messages_too_large_for_the_client_are_refused_or_dead_lettered(h: Harness) -> None:
    a = h.client(compression=None)
    rid = new_id()
    huge = b'"' + b"z" * (2 << 20) + b'"'  # compresses to a few KiB, inflates past 1 MiB
    a.send_raw(c.encode(c.Frame(c.PUBLISH, rid, "big", huge), c.FLAG_GZIP, 0))
    assert a.wait_reply(rid).error_code == "INVALID_MESSAGE"
    a.subscribe("big")
    h.hub.broker.publish_batch("big", [b"y" * (1 << 20), b"small"], origin="nsq")
    (d,) = a.receive(1)
    assert json.loads(d.payload) == "small"
    h.advance(0)
    dead = h.result(h.hub.broker.dead_letters("big"))
    assert [(len(x.body), x.reason) for x in dead] == [(1 << 20, "rejected")]


def test_unconfirmed_publishes_pause_reading_until_commits_catch_up(
        h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (reliability suite): reads never paused for publishes awaiting their commit,
    so a producer faster than the commits grew the broker without bound (1.9 GiB in 30 s)."""
    from mqhub.protocols.vibemq import publishing

    monkeypatch.setattr(publishing, "MAX_UNCONFIRMED", 100)
    pub = h.client()
    ids = [new_id() for _ in range(150)]
    pub.send_raw(b"".join(c.encode(c.Frame(c.PUBLISH, i, "fast", b"1")) for i in ids))
    assert pub.transport.producerState == "paused"  # 150 > 100 unconfirmed: reads stop
    assert [f.type for f in pub.wait_acks(ids)] == [c.PUBLISH_ACK] * 150  # commits land
    assert pub.transport.producerState == "producing"
