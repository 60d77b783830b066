"""Registries keep in step with records another node of the hub wrote (``IAdapterState.watch``).

The embedded core has no other node, so these tests call each registry's ``record_changed``
the way a cluster backend's watch does: the core already holds what the other node declared
(its queues and bindings), and the record arrives afterwards.
"""

from __future__ import annotations

import json

from mqhub.protocols.mqks.queues import META_PREFIX as MQKS_META
from mqhub.protocols.mqks.queues import QUEUE_PREFIX as MQKS_QUEUES
from mqhub.protocols.mqks.queues import MqksRegistry
from mqhub.protocols.nats.mailbox import Mailbox, mailbox_queues
from mqhub.protocols.nats.mq9 import META_MAILBOX
from mqhub.protocols.nsq.topics import META_PREFIX as NSQ_META
from mqhub.protocols.nsq.topics import TopicRegistry, queue_name
from mqhub.protocols.vibemq.options import QueueOptions
from mqhub.protocols.vibemq.queues import META_PREFIX as VIBE_META
from mqhub.protocols.vibemq.queues import QueueRegistry
from mqhub.testing import memory_hub, result_of
from tests.unit.protocols.nats.helpers import make_mq9_server


def test_nsq_topics_follow_the_records_of_other_nodes() -> None:
    """A topic another node created is known with its channels and pause; a deleted one goes
    and the clients of its channels are told."""
    hub = memory_hub()
    registry = TopicRegistry(hub.broker, hub.broker.state)
    result_of(registry.load())
    deleted: list[tuple[str, str]] = []
    registry.on_channel_deleted.append(lambda t, c: deleted.append((t, c)))
    queue = hub.broker.declare_queue(queue_name("orders", "audit"))
    hub.broker.bind_queue("orders", queue.name)
    registry.record_changed(NSQ_META + "orders", b"paused")
    topic = registry.get_topic("orders")
    assert topic is not None and topic.paused and topic.channels == {"audit": queue}
    registry.record_changed(NSQ_META + "orders", b"")
    assert not topic.paused and registry.get_channel("orders", "audit") is queue
    registry.record_changed(NSQ_META + "orders", None)
    assert registry.get_topic("orders") is None and deleted == [("orders", "audit")]


def test_mqks_queues_follow_the_settings_of_other_nodes() -> None:
    """A queue another node made is known with its events and its delete-when-unused."""
    hub = memory_hub()
    registry = MqksRegistry(hub.broker, hub.broker.state, hub.clock)
    result_of(registry.load())
    core = hub.broker.declare_queue(MQKS_QUEUES + "jobs")
    hub.broker.bind_queue("job.created", core.name)
    registry.record_changed(MQKS_META + "nowhere", json.dumps({"delete_when_unused": 5}).encode())
    assert "nowhere" not in registry.queues      # not in the core: learned when used here
    registry.record_changed(MQKS_META + "jobs", json.dumps({"delete_when_unused": 5}).encode())
    q = registry.queues["jobs"]
    assert q.core is core and q.events == {"job.created"} and q.delete_when_unused == 5
    registry.record_changed(MQKS_META + "jobs", None)
    assert registry.queues["jobs"].delete_when_unused is None


def test_vibemq_queues_follow_the_records_of_other_nodes() -> None:
    """A queue another node created is declared and bound here; a deleted one is forgotten."""
    hub = memory_hub()
    registry = QueueRegistry(hub.broker, hub.broker.state, hub.clock)
    result_of(registry.load())
    record = json.dumps({"options": QueueOptions().to_record(), "created_at": 12.5}).encode()
    registry.record_changed(VIBE_META + "orders", record)
    q = registry.get("orders")
    assert q is not None and q.created_at == 12.5 and hub.broker.queue("orders") is q.core
    assert [b.pattern for b in hub.broker.bindings("orders")] == ["orders"]
    registry.record_changed(VIBE_META + "orders", None)
    assert "orders" not in registry.queues


def test_mq9_mailboxes_follow_the_records_of_other_nodes() -> None:
    """A mailbox another node created takes messages here; a removed one is gone."""
    srv = make_mq9_server()
    mq9 = srv.mq9
    box = Mailbox("mremote0000000000000000", "tok-x", "standard", 600, srv.hub.clock.seconds())
    mq9.record_changed(META_MAILBOX + box.mail_id, box.record())
    assert mq9.live(box.mail_id) is not None
    assert all(mq9.broker.queue(name) is not None for name in mailbox_queues(box.mail_id))
    mq9.record_changed(META_MAILBOX + box.mail_id, None)
    assert mq9.live(box.mail_id) is None and box.mail_id not in mq9.mailboxes
