"""Broker.barrier() (durability of every write so far) and Consumer.set_credit (set, not add)."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.defer import Deferred, fail

from mqhub.errors import StoreError
from mqhub.hub import Hub
from mqhub.store.batch import WriteBatch
from mqhub.store.memory import MemoryStore
from mqhub.testing import CollectingTarget, memory_hub, result_of, start_clock


def grouped_hub() -> Hub:
    """A hub whose MemoryStore commits once per reactor turn (like LMDB's group commit)."""
    clock = start_clock()
    store = MemoryStore(clock)
    store.open()
    return memory_hub(clock, store=store)


class FailingDeletes(MemoryStore):
    """A MemoryStore whose commits that delete entries fail (a full disk, say)."""

    def commit(self, batch: WriteBatch) -> Deferred[None]:
        """Fail batches with deletes, commit the rest."""
        if batch.deletes:
            return fail(StoreError("disk full"))
        return super().commit(batch)


def test_barrier_fires_after_the_ack_is_durable() -> None:
    """An ack issued this turn is not durable until the group commit; the barrier waits for it."""
    hub = grouped_hub()
    b = hub.broker
    q = b.declare_queue("q")
    b.bind_queue("a", "q")
    b.publish_batch("a", [b"1", b"2"])
    hub.clock.advance(0)
    t = CollectingTarget()
    c = q.attach(t, ready=10)
    assert q.ack(c, t.ids()) == []
    fired: list[Any] = []
    b.barrier().addBoth(fired.append)
    assert fired == [] and hub.store.stats()["entries"] == 2
    hub.clock.advance(0)
    assert fired == [None] and hub.store.stats()["entries"] == 0


def test_barrier_with_nothing_pending_fires_at_once() -> None:
    """No outstanding write: the barrier has already fired, and nothing was committed for it."""
    hub = grouped_hub()
    hub.clock.advance(0)
    commits = hub.store.commits
    assert result_of(hub.broker.barrier()) is None
    hub.clock.advance(0)
    assert hub.store.commits == commits


def test_barrier_waits_for_requeues_and_publishes_of_several_queues() -> None:
    """Writes of different queues in one turn: the barrier waits for all of them."""
    hub = grouped_hub()
    b = hub.broker
    for name in ("q1", "q2"):
        b.declare_queue(name, max_attempts=5)
        b.bind_queue(name, name)
    hub.clock.advance(0)
    t = CollectingTarget()
    c = b.queue("q1").attach(t, ready=1)
    b.publish_batch("q1", [b"x"])
    hub.clock.advance(0)
    b.queue("q1").requeue(c, t.ids())
    b.publish_batch("q2", [b"y"])
    fired: list[Any] = []
    b.barrier().addBoth(fired.append)
    assert fired == []
    hub.clock.advance(0)
    assert fired == [None]
    assert hub.store.stats()["entries"] == 2


def test_barrier_reports_a_failed_write() -> None:
    """If an ack's commit failed, the barrier errbacks (the ack is not durable)."""
    clock = start_clock()
    store = FailingDeletes()
    store.open()
    hub = memory_hub(clock, store=store)
    b = hub.broker
    q = b.declare_queue("q")
    b.bind_queue("a", "q")
    b.publish_batch("a", [b"1"])
    t = CollectingTarget()
    c = q.attach(t, ready=1)
    held: Deferred[None] = Deferred()
    store.commit = lambda batch: held  # type: ignore[method-assign]
    q.ack(c, t.ids())
    out: list[Any] = []
    b.barrier().addBoth(out.append)
    assert out == []
    held.errback(StoreError("disk full"))
    assert len(out) == 1 and out[0].check(StoreError)


def test_set_credit_sets_instead_of_adding(hub: Hub) -> None:
    """set_credit(0) withdraws unused credit; set_credit(n) allows exactly n more deliveries."""
    q = hub.broker.declare_queue("q")
    hub.broker.bind_queue("a", "q")
    t = CollectingTarget()
    c = q.attach(t, credit=5)
    c.set_credit(0)
    hub.broker.publish_batch("a", [b"%d" % i for i in range(6)])
    assert t.entries == [] and c.credit == 0
    c.set_credit(2)
    assert t.bodies == [b"0", b"1"] and c.credit == 0
    c.add_credit(1)
    assert t.bodies == [b"0", b"1", b"2"]
    c.set_credit(1)
    assert t.bodies == [b"0", b"1", b"2", b"3"]
    c.set_credit(-3)
    assert c.credit == 0 and q.depth == 2


@pytest.mark.parametrize("mode", ["competing", "fanout"])
def test_set_credit_on_a_consumer_attached_without_limits(hub: Hub, mode: str) -> None:
    """A consumer attached with neither ready nor credit starts receiving on set_credit."""
    q = hub.broker.declare_queue("q", mode=mode)
    hub.broker.bind_queue("a", "q")
    t = CollectingTarget()
    c = q.attach(t)
    hub.broker.publish_batch("a", [b"a", b"b", b"c"])
    assert t.entries == []
    c.set_credit(2)
    assert t.bodies == [b"a", b"b"]
