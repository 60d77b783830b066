"""Broker.put_entries: prebuilt entries into one queue only, at their id's place, durable."""

from __future__ import annotations

import pytest

from mqhub.errors import NoSuchQueue
from mqhub.store.records import ATTEMPTS, BODY, MSG_ID
from mqhub.testing import CollectingTarget, memory_hub, restart_hub, result_of, settle


def test_put_entries_reaches_one_queue_only_and_survives_restart() -> None:
    """Other queues bound to the address and live subscribers see nothing; attempts are kept."""
    hub = memory_hub()
    broker = hub.broker
    for name in ("a", "b"):
        broker.declare_queue(name)
        broker.bind_queue("ev", name)
    live = CollectingTarget()
    broker.subscribe(">", live)
    broker.publish_batch("ev", [b"one", b"two"])
    settle(hub)
    first = broker.ids.reserve(1)
    entry = (first, 0, 3, 0.0, 0.0, "ev", {"k": "v"}, b"again", "test")
    result_of(broker.put_entries("a", [entry]))
    assert [e[BODY] for e in broker.queue("a").peek(10)] == [b"one", b"two", b"again"]
    assert [e[BODY] for e in broker.queue("b").peek(10)] == [b"one", b"two"]
    assert [e[BODY] for e in live.entries] == [b"one", b"two"]
    hub = restart_hub(hub)
    settle(hub)
    got = hub.broker.queue("a").peek(10)
    assert [(e[MSG_ID], e[ATTEMPTS], e[BODY]) for e in got][-1] == (first, 3, b"again")
    with pytest.raises(NoSuchQueue):
        hub.broker.put_entries("nope", [entry])
