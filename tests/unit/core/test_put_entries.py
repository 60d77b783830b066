"""Broker.put_entries: prebuilt entries into one queue only, at their id's place, durable."""

from __future__ import annotations

from typing import Any

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


def test_publish_batch_marks_its_puts_as_one_run_unless_headers_differ() -> None:
    """The store batch of a plain publish marks each durable queue's put as one run (every
    field but id and body shared, ``WriteBatch.put_entries(run=True)``); a publish with one
    headers dict per message, and a prebuilt-entries publish, do not."""
    from mqhub.store.memory import MemoryStore

    runs: list[set[str]] = []

    class Recording(MemoryStore):
        """A MemoryStore noting each committed batch's runs."""

        def commit(self, batch: Any) -> Any:
            """Note ``batch.publish_runs`` (of batches with puts), then commit."""
            if batch.puts:
                runs.append(set(batch.publish_runs))
            return super().commit(batch)

    store = Recording()
    store.open()
    hub = memory_hub(store=store)
    broker = hub.broker
    for name in ("a", "b"):
        broker.declare_queue(name)
        broker.bind_queue("ev", name)
    broker.publish_batch("ev", [b"one", b"two"], headers={"k": "v"})
    settle(hub)
    broker.publish_batch("ev", [b"one", b"two"], headers=[{"k": "1"}, {"k": "2"}])
    settle(hub)
    broker.publish_batch("ev", [b"one"], headers=[{"k": "1"}])
    settle(hub)
    result_of(broker.publish_entries("ev", list(broker.queue("a").peek(2))))
    settle(hub)
    assert runs == [{"a", "b"}, set(), {"a", "b"}, set()]
