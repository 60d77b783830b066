"""A refused publish is not delivered on any route it shares with a durable queue (issue 27
item 7): the publisher gets its error (NSQ E_PUB_FAILED) and retries, so a memory-tier queue
or a live subscriber on the same address that got the first copy would get the message twice.

Durable queues deliver a put only after its commit (``test_refused_publish.py``); the
memory-tier queues and live subscribers of a stored publish get their copies from the same
commit's callback (``Broker._publish``), and none when it fails."""

from __future__ import annotations

from mqhub.errors import StoreError
from mqhub.testing import CollectingTarget, refusing_hub, settle


def refused(d: object) -> bool:
    """True when Deferred ``d`` failed with StoreError (swallowed)."""
    box: list[object] = []
    d.addBoth(box.append)  # type: ignore[attr-defined]
    return bool(box) and getattr(box[0], "check", lambda *_: False)(StoreError) is not None


def test_a_memory_queue_beside_a_durable_one_gets_no_refused_copy() -> None:
    """NSQ: a durable channel and an ephemeral one on one topic; the store refuses the
    publish: the ephemeral channel's consumer gets nothing of it, and the retry once."""
    hub, store = refusing_hub()
    broker = hub.broker
    broker.declare_queue("durable")
    broker.bind_queue("t", "durable")
    memory = broker.declare_queue("ephemeral", tier="memory")
    broker.bind_queue("t", "ephemeral")
    target = CollectingTarget()
    memory.attach(target, ready=100)
    store.refuse_puts = True
    d = broker.publish_batch("t", [b"refused"])
    settle(hub)
    assert refused(d)
    store.refuse_puts = False
    broker.publish_batch("t", [b"refused"])  # the publisher's retry
    settle(hub)
    assert target.bodies == [b"refused"]


def test_a_live_subscriber_beside_a_durable_queue_gets_no_refused_copy() -> None:
    """NATS/mq9 style: a live subscriber and a durable queue on one address; a refused
    publish reaches neither, its retry reaches each once."""
    hub, store = refusing_hub()
    broker = hub.broker
    broker.declare_queue("durable")
    broker.bind_queue("t", "durable")
    live = CollectingTarget()
    broker.subscribe("t", live)
    store.refuse_puts = True
    d = broker.publish_batch("t", [b"refused"])
    settle(hub)
    assert refused(d)
    store.refuse_puts = False
    broker.publish_batch("t", [b"refused"])
    settle(hub)
    assert live.bodies == [b"refused"]
