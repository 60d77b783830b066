"""NATS subscriptions live in the core's address space: other protocols reach them and back."""

from __future__ import annotations

from typing import Any

from mqhub.hub import Hub
from mqhub.protocols.nats import codec
from mqhub.protocols.nats.codec import OP_HMSG, OP_MSG
from mqhub.protocols.nats.service import build_server
from mqhub.store.records import HEADERS, ORIGIN
from mqhub.testing import CollectingTarget, memory_hub, result_of
from tests.unit.protocols.nats.helpers import Client


def make() -> tuple:
    """A memory hub with a started core and a NATS server bridged to it."""
    hub = memory_hub()
    srv = build_server(hub, {})
    result_of(srv.mq9.start())
    return hub, srv


def spy_publish_batch(hub: Hub) -> list[tuple]:
    """Record the positional arguments of every ``hub.broker.publish_batch`` call."""
    calls: list[tuple] = []
    orig = hub.broker.publish_batch

    def spy(*a: Any, **k: Any) -> Any:
        calls.append(a)
        return orig(*a, **k)

    hub.broker.publish_batch = spy
    return calls


def test_foreign_publish_reaches_nats_subscribers_with_headers() -> None:
    """Other protocols' publishes reach NATS subscribers, headers as HMSG."""
    hub, srv = make()
    sub = Client(srv)
    plain = Client(srv, {"headers": False, "no_responders": False})
    sub.send(b"SUB orders.* 1\r\nSUB orders.> q 2\r\n")
    plain.send(b"SUB orders.new 4\r\n")
    result_of(hub.broker.publish_batch("orders.new", [b"o1", b"o2"], origin="nsq",
                                       headers={"X-Id": "7"}))
    evs = sub.events()
    assert sorted((e[0], e[2], e[5]) for e in evs) == sorted(
        [(OP_HMSG, "1", b"o1"), (OP_HMSG, "1", b"o2"), (OP_HMSG, "2", b"o1"),
         (OP_HMSG, "2", b"o2")])
    assert codec.parse_headers(evs[0][4])[2] == [("X-Id", "7")]
    assert plain.events() == [(OP_MSG, "orders.new", "4", None, b"o1"),
                              (OP_MSG, "orders.new", "4", None, b"o2")]


def test_reply_subject_crosses_the_core_as_reserved_header() -> None:
    """A NATS reply subject rides the core as ``mqhub-reply`` and comes back as MSG's reply."""
    hub, srv = make()
    target = CollectingTarget("nsq")
    hub.broker.subscribe("ask", target)
    Client(srv).send(codec.encode_pub("ask", b"q", "_INBOX.r1"))
    assert target.entries[0][HEADERS] == {"mqhub-reply": "_INBOX.r1"}
    sub = Client(srv)
    sub.send(b"SUB ask2 7\r\n")
    result_of(hub.broker.publish_batch("ask2", [b"q2"], origin="nsq",
                                       headers={"mqhub-reply": "_INBOX.r2"}))
    assert sub.events() == [(OP_MSG, "ask2", "7", "_INBOX.r2", b"q2")]


def test_nats_publish_reaches_foreign_bindings_once() -> None:
    """NATS publishes reach foreign subscribers and queues once, NATS ones once."""
    hub, srv = make()
    target = CollectingTarget("nsq")
    hub.broker.subscribe("metrics.>", target)
    q = hub.broker.declare_queue("metrics-q", tier="memory")
    hub.broker.bind_queue("metrics.cpu", "metrics-q")
    nats_sub = Client(srv)
    nats_sub.send(b"SUB metrics.cpu 1\r\n")
    pub = Client(srv)
    pub.send(codec.encode_pub("metrics.cpu", b"42") + codec.encode_pub("metrics.cpu", b"43")
             + codec.encode_hpub("metrics.cpu", codec.build_headers({"u": "pct"}), b"44"))
    assert target.bodies == [b"42", b"43", b"44"]
    assert target.entries[2][HEADERS] == {"u": "pct"} and target.entries[0][ORIGIN] == "nats"
    assert q.depth == 3
    assert [e[4] if e[0] == OP_MSG else e[5] for e in nats_sub.events()] == [b"42", b"43", b"44"]


def test_no_foreign_binding_means_no_core_publish() -> None:
    """Without foreign bindings NATS traffic never calls the core."""
    hub, srv = make()
    calls = spy_publish_batch(hub)
    s = Client(srv)
    s.send(b"SUB local 1\r\n")
    Client(srv).send(codec.encode_pub("local", b"x"))
    assert len(s.events()) == 1 and calls == []


def test_unsubscribe_removes_core_binding() -> None:
    """UNSUB and disconnect remove the core bindings."""
    hub, srv = make()
    s = Client(srv)
    s.send(b"SUB gone 1\r\n")
    assert len(hub.broker.route("gone").targets) == 1
    s.send(b"UNSUB 1\r\n")
    assert hub.broker.route("gone").empty
    s.send(b"SUB gone 2\r\n")
    s.transport.loseConnection()
    assert hub.broker.route("gone").empty


def test_one_core_call_per_subject_per_read() -> None:
    """Foreign delivery is one publish_batch per subject per read, order kept."""
    hub, srv = make()
    target = CollectingTarget("vibemq")
    hub.broker.subscribe("feed.*", target)
    calls = spy_publish_batch(hub)
    pub = Client(srv)
    pub.send(b"".join(codec.encode_pub("feed.a" if i % 2 else "feed.b", b"%d" % i)
                      for i in range(100)))
    assert sorted(a[0] for a in calls) == ["feed.a", "feed.b"]
    assert sorted(target.bodies) == sorted(b"%d" % i for i in range(100))
    assert [b for b in target.bodies if int(b) % 2] == [b"%d" % i for i in range(1, 100, 2)]


def test_persisted_broadcast_reaches_foreign_bindings() -> None:
    """A persisted broadcast also reaches other protocols' subscribers."""
    hub, srv = make()
    target = CollectingTarget("mqks")
    hub.broker.subscribe("$mq9.AI.BROADCAST.>", target)
    pub = Client(srv)
    pub.send(codec.encode_hpub("$mq9.AI.BROADCAST.sys.up", codec.build_headers(
        {"mq9-persist": "true"}), b"up"))
    assert target.bodies == [b"up"]
