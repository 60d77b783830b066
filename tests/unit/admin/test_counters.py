"""The core's batch-level counters (mqhub/core/counters.py) on a memory hub."""

from __future__ import annotations

from mqhub.core.counters import Counters
from mqhub.testing import CollectingTarget, memory_hub, settle


def test_publish_deliver_ack_and_dead_letters_are_counted_per_protocol() -> None:
    """One publish batch, one delivery, one ack call and a max_attempts dead letter."""
    hub = memory_hub()
    broker = hub.broker
    q = broker.declare_queue("orders", max_attempts=1)
    broker.bind_queue("orders", "orders")
    broker.publish_batch("orders", [b"a", b"b", b"c"], origin="nsq")
    settle(hub)
    target = CollectingTarget(protocol_name="emqp")
    consumer = q.attach(target, ready=3)
    settle(hub)
    assert len(target.entries) == 3
    ids = [e[0] for e in target.entries]
    q.ack(consumer, ids[:2])
    q.requeue(consumer, ids[2:])
    settle(hub)
    snap = broker.counters.snapshot()
    assert snap["nsq"]["published"] == 3
    assert snap["emqp"]["delivered"] == 3
    assert snap["emqp"]["acked"] == 2
    assert broker.counters.dead == {"max_attempts": 1}
    assert q.dead_letter_count == 1


def test_live_subscribers_are_counted_and_sources_are_not_counted_twice() -> None:
    """A protocol that registers a source reports its own traffic; the core skips it."""
    hub = memory_hub()
    broker = hub.broker
    plain = CollectingTarget(protocol_name="vibemq")
    native = CollectingTarget(protocol_name="nats")
    broker.subscribe("news.>", plain)
    broker.subscribe("news.>", native)
    broker.counters.register_source("nats", lambda: {"published": 7, "delivered": 9})
    broker.publish_batch("news.eu", [b"x", b"y"], origin="nsq")
    broker.publish_batch("news.us", [b"z"], origin="nats")
    snap = broker.counters.snapshot()
    assert snap["nsq"]["published"] == 2
    assert snap["vibemq"]["delivered"] == 3
    assert snap["nats"] == {"published": 7, "delivered": 9, "acked": 0}
    assert len(native.entries) == 3  # delivered all the same, just not counted by the core


def test_snapshot_of_empty_counters() -> None:
    """Nothing moved: nothing reported."""
    assert Counters().snapshot() == {}
