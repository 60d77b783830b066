"""Bridged NATS messages the core does not keep are counted, logged (rate-limited), never silent."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from twisted.logger import globalLogPublisher

from mqhub.hub import Hub
from mqhub.protocols.nats import codec
from mqhub.protocols.nats.bridge import REFUSAL_LOG_INTERVAL
from mqhub.protocols.nats.codec import OP_HMSG, OP_MSG
from mqhub.protocols.nats.server import NatsServer
from mqhub.protocols.nats.service import build_server
from mqhub.store.codec import MAX_META
from mqhub.store.lmdb import LmdbStore
from mqhub.testing import memory_hub, refusing_hub, result_of, settle, start_clock
from tests.unit.protocols.nats.helpers import Client

#: a header block whose stored form is over an entry's meta field (NATS allows it: < max_payload)
BIG = codec.build_headers({"X-Big": "v" * (MAX_META + 100)})


def nats_on(hub: Hub) -> NatsServer:
    """A NATS server bridged to ``hub``'s core."""
    srv = build_server(hub, {})
    result_of(srv.mq9.start())
    return srv


@pytest.fixture
def lmdb_hub(tmp_path: Path) -> Iterator[Hub]:
    """A memory-clock hub over a real LmdbStore in a tmp dir."""
    clock = start_clock()
    store = LmdbStore(str(tmp_path / "store"), clock=clock, writer="inline", durability="none")
    store.open()
    hub = memory_hub(clock, store=store)
    yield hub
    hub.broker.stop()
    store.close()


@pytest.fixture
def warnings() -> Iterator[list[str]]:
    """The text of every bridge refusal log line emitted during the test."""
    seen: list[str] = []

    def observer(event: dict[str, Any]) -> None:
        if "bridge_refused" in event.get("log_format", ""):
            seen.append(event["log_format"].format(**event))

    globalLogPublisher.addObserver(observer)
    yield seen
    globalLogPublisher.removeObserver(observer)


def test_oversized_headers_are_counted_and_the_rest_of_the_read_kept(lmdb_hub: Hub,
                                                                      warnings: list[str]) -> None:
    """HPUB headers over the store's meta field: NATS subscribers get it, the durable queue
    keeps the other messages of the read, the refused one is counted and logged."""
    hub = lmdb_hub
    srv = nats_on(hub)
    q = hub.broker.declare_queue("big-q")
    hub.broker.bind_queue("big", "big-q")
    sub = Client(srv)
    sub.send(b"SUB big 1\r\n")
    pub = Client(srv)
    pub.send(codec.encode_pub("big", b"before") + codec.encode_hpub("big", BIG, b"huge")
             + codec.encode_pub("big", b"after") + codec.PING)
    settle(hub, 4)
    assert [e[0] for e in sub.events()] == [OP_MSG, OP_HMSG, OP_MSG]
    assert pub.events() == [(codec.OP_PONG,)] and not pub.closed
    assert q.depth == 2
    assert sorted(e[7] for e in q.peek(10)) == [b"after", b"before"]
    assert srv.stats["bridge_refused"] == 1
    assert len(warnings) == 1 and "1 bridged message(s)" in warnings[0] and "big" in warnings[0]


def test_request_whose_only_taker_refuses_gets_no_responders() -> None:
    """A request only a queue would take, with headers the core cannot keep: a 503 at once."""
    hub = memory_hub()
    srv = nats_on(hub)
    q = hub.broker.declare_queue("rpc-q", tier="memory")
    hub.broker.bind_queue("rpc", "rpc-q")
    pub = Client(srv)
    pub.send(b"SUB _INBOX.r.* 9\r\n" + codec.encode_hpub("rpc", BIG, b"q", "_INBOX.r.1"))
    evs = pub.events()
    assert [(e[0], e[1], e[2]) for e in evs] == [(OP_HMSG, "_INBOX.r.1", "9")]
    assert codec.parse_headers(evs[0][4])[0] == 503
    assert q.depth == 0 and srv.stats["bridge_refused"] == 1


def test_failed_commit_counts_every_message_of_the_batch() -> None:
    """The store refuses the commit (a full disk): all bridged messages of it are counted."""
    hub, store = refusing_hub()
    srv = nats_on(hub)
    hub.broker.declare_queue("disk-q")
    hub.broker.bind_queue("disk", "disk-q")
    store.refuse_puts = True
    Client(srv).send(b"".join(codec.encode_pub("disk", b"%d" % i) for i in range(3)))
    settle(hub, 4)
    assert store.refused >= 1
    assert srv.stats["bridge_refused"] == 3


def test_synchronous_refusal_is_counted_and_logging_is_rate_limited(warnings: list[str]) -> None:
    """A full ``reject`` queue refuses the batch at once: counted every time, logged once an
    interval with what was refused since the last line."""
    hub = memory_hub()
    srv = nats_on(hub)
    hub.broker.declare_queue("tiny-q", tier="memory", max_size=1, overflow="reject")
    hub.broker.bind_queue("tiny", "tiny-q")
    pub = Client(srv)
    pub.send(codec.encode_pub("tiny", b"a"))
    assert srv.stats["bridge_refused"] == 0 and warnings == []
    pub.send(codec.encode_pub("tiny", b"b") + codec.encode_pub("tiny", b"c"))
    assert srv.stats["bridge_refused"] == 2
    assert len(warnings) == 1 and "2 bridged message(s)" in warnings[0]
    pub.send(codec.encode_pub("tiny", b"d"))
    assert srv.stats["bridge_refused"] == 3 and len(warnings) == 1
    hub.clock.advance(REFUSAL_LOG_INTERVAL)
    pub.send(codec.encode_pub("tiny", b"e"))
    assert srv.stats["bridge_refused"] == 4
    assert len(warnings) == 2 and "2 bridged message(s)" in warnings[1]
    assert not pub.closed
