"""Edge rules: re-entrant adapters, recreated queues, memory-only entries under paging."""

from __future__ import annotations

from typing import Any

import pytest

from mqhub.errors import NoSuchQueue
from mqhub.hub import Hub
from mqhub.testing import CollectingTarget, memory_hub, result_of


class AckingTarget(CollectingTarget):
    """An adapter that acks inside deliver_batch (like a dispatcher that finishes at once)."""

    def deliver_batch(self, binding: Any, address: str, messages: list[tuple]) -> None:
        """Record, then ack synchronously."""
        super().deliver_batch(binding, address, messages)
        binding.queue.ack(binding, [m[0] for m in messages])


def test_ack_inside_deliver_batch_keeps_the_queue_flowing(hub: Hub) -> None:
    """A consumer acking re-entrantly still receives the whole backlog."""
    q = hub.broker.declare_queue("q")
    hub.broker.bind_queue("a", "q")
    hub.broker.publish_batch("a", [b"%d" % i for i in range(10)])
    t = AckingTarget()
    q.attach(t, ready=3)
    assert len(t.entries) == 10 and q.in_flight == 0 and q.depth == 0


def test_recreated_queue_does_not_get_old_deferred_messages(hub: Hub) -> None:
    """Deferred messages of a deleted queue never reach a new queue of the same name."""
    b = hub.broker
    b.declare_queue("q")
    b.bind_queue("a", "q")
    b.publish_batch("a", [b"old"], deliver_at=hub.clock.seconds() + 5)
    result_of(b.delete_queue("q"))
    q = b.declare_queue("q")
    b.bind_queue("a", "q")
    hub.clock.advance(6)
    assert q.depth == 0 and q.deferred == 0


def test_memory_only_entries_survive_window_eviction() -> None:
    """persist=False entries are never pushed out of the window (they are not in the store)."""
    h = memory_hub(window=4)
    b = h.broker
    q = b.declare_queue("box")
    b.bind_queue("box", "box")
    b.publish_batch("box", [b"note"], persist=False, priority=9)
    for i in range(3):
        b.publish_batch("box", [b"%d" % (i * 3 + j) for j in range(3)])
    t = CollectingTarget()
    c = q.attach(t, ready=100)
    for _ in range(10):
        if q.in_flight:
            q.ack(c, t.ids()[-q.in_flight:])
    assert t.bodies[0] == b"note"
    assert sorted(t.bodies[1:]) == [b"%d" % i for i in range(9)]


def test_attach_to_deleted_queue_raises(hub: Hub) -> None:
    """A deleted queue refuses new consumers."""
    q = hub.broker.declare_queue("q")
    result_of(hub.broker.delete_queue("q"))
    with pytest.raises(NoSuchQueue):
        q.attach(CollectingTarget(), ready=1)


def test_empty_publish_is_a_no_op(hub: Hub) -> None:
    """Publishing no bodies writes nothing and fires at once."""
    hub.broker.declare_queue("q")
    hub.broker.bind_queue("a", "q")
    commits = hub.store.commits
    assert result_of(hub.broker.publish_batch("a", [])) is None
    assert hub.store.commits == commits


def test_failing_due_handler_rows_are_retried_not_lost(hub: Hub) -> None:
    """Rows whose handler raised are put back for a later try."""
    calls: list[int] = []

    def flaky(rows: Any, batch: Any, now: float) -> None:
        calls.append(len(rows))
        if len(calls) == 1:
            raise RuntimeError("transient")

    hub.scheduler.register(b"f/", flaky)
    hub.scheduler.call_at(hub.clock.seconds() + 1, b"f/1", b"")
    hub.clock.advance(1.5)
    assert calls == [1] and hub.store.stats()["due"] == 1
    hub.clock.advance(61)
    assert calls == [1, 1] and hub.store.stats()["due"] == 0


def test_failed_store_commit_fails_the_publish(hub: Hub) -> None:
    """A publish whose commit fails errbacks with StoreError, so nothing is confirmed."""
    from mqhub.errors import StoreError
    hub.broker.declare_queue("q")
    hub.broker.bind_queue("a", "q")
    result_of(hub.store.close())
    d = hub.broker.publish_batch("a", [b"x"])
    with pytest.raises(StoreError):
        result_of(d)
