"""Acks, rejects and requeues an adapter makes inside ``deliver_batch`` reach the store after the
put of the messages they settle, so nothing acked comes back after a restart.

Runs over a MemoryStore that applies each commit at once, a MemoryStore that groups a turn's
commits on a Clock, and a real LmdbStore in tmp_path that is closed and reopened.
"""

from __future__ import annotations

from typing import Any

import pytest

from mqhub.core.consumer import Consumer
from mqhub.core.queue import Queue
from mqhub.hub import Hub
from mqhub.store.memory import MemoryStore
from mqhub.testing import CollectingTarget, memory_hub, result_of, start_clock


class Settler(CollectingTarget):
    """A target that settles every delivered message inside ``deliver_batch``.

    ``how`` is ``"ack"``, ``"reject"`` or ``"requeue"`` (delayed by ``delay`` seconds).
    """

    def __init__(self, how: str = "ack", delay: float = 0.0) -> None:
        """Settle with ``how``."""
        super().__init__()
        self.how = how
        self.delay = delay

    def deliver_batch(self, binding: Any, address: str, messages: list[tuple]) -> None:
        """Record, then settle the batch before returning."""
        super().deliver_batch(binding, address, messages)
        assert isinstance(binding, Consumer)
        ids = [e[0] for e in messages]
        if self.how == "ack":
            assert binding.queue.ack(binding, ids) == []
        elif self.how == "reject":
            assert binding.queue.reject(binding, ids) == []
        else:
            assert binding.queue.requeue(binding, ids, delay=self.delay) == []


class Env:
    """Boots hubs over one store kind and restarts them over the same data."""

    def __init__(self, kind: str, path: str) -> None:
        """Remember the store kind and where an LMDB store lives."""
        self.kind = kind
        self.path = path
        self.clock = start_clock()
        self.memory: MemoryStore | None = None

    def _store(self) -> Any:
        """A freshly opened store of this kind over the same data."""
        if self.kind == "lmdb":
            from mqhub.store.lmdb import LmdbStore
            store = LmdbStore(self.path, clock=self.clock, durability="sync")
            store.open()
            return store
        if self.memory is None:
            self.memory = MemoryStore(self.clock if self.kind == "memory-grouped" else None)
            self.memory.open()
        return self.memory

    def start(self) -> Hub:
        """A started hub over the store."""
        hub = memory_hub(self.clock, store=self._store())
        self.settle()
        return hub

    def settle(self) -> None:
        """Run the grouped commits of this turn (and the ones they cause)."""
        for _ in range(3):
            self.clock.advance(0)

    def restart(self, hub: Hub) -> Hub:
        """Stop ``hub`` and boot a new one over the same data."""
        self.settle()
        hub.scheduler.stopService()
        result_of(hub.broker.stop())
        if self.kind == "lmdb":
            result_of(hub.store.close())
        return self.start()


@pytest.fixture(params=["memory", "memory-grouped", "lmdb"])
def env(request: Any, tmp_path: Any) -> Env:
    """An Env for each store kind."""
    return Env(request.param, str(tmp_path / "data"))


def count(hub: Hub, queue: str) -> int:
    """Entries the store holds for ``queue``."""
    return int(result_of(hub.store.count_entries(queue)))


def redelivered(env: Env, hub: Hub, queue: str = "q") -> list[bytes]:
    """Restart and return what a fresh consumer of ``queue`` gets."""
    hub = env.restart(hub)
    t = CollectingTarget()
    hub.broker.queue(queue).attach(t, ready=100)
    env.settle()
    return t.bodies


def settled_queue(hub: Hub, target: Settler, ready: int = 100) -> Queue:
    """Queue ``q`` bound to address ``a`` with ``target`` attached."""
    q = hub.broker.declare_queue("q")
    hub.broker.bind_queue("a", "q")
    q.attach(target, ready=ready)
    return q


def test_ack_inside_delivery_of_a_publish_is_not_redelivered(env: Env) -> None:
    """A consumer that acks in deliver_batch during publish_batch leaves nothing stored."""
    hub = env.start()
    t = Settler("ack")
    q = settled_queue(hub, t)
    d = hub.broker.publish_batch("a", [b"one", b"two", b"three"])
    env.settle()
    assert result_of(d) is None
    assert t.bodies == [b"one", b"two", b"three"]
    assert q.in_flight == 0 and q.depth == 0
    assert count(hub, "q") == 0
    assert redelivered(env, hub) == []


def test_ack_inside_delivery_is_one_commit_with_the_publish(tmp_path: Any) -> None:
    """The ack joins the publish's own store commit (one commit per read)."""
    env = Env("memory-grouped", str(tmp_path))
    hub = env.start()
    settled_queue(hub, Settler("ack"))
    env.settle()
    store = hub.store
    before = len(store._pending), store.commits
    hub.broker.publish_batch("a", [b"x", b"y"])
    assert len(store._pending) - before[0] == 1
    env.settle()
    assert count(hub, "q") == 0


def test_barrier_inside_the_window_waits_for_the_joined_ack(env: Env) -> None:
    """barrier() fires once the publish and the ack made during its delivery are stored."""
    hub = env.start()
    settled_queue(hub, Settler("ack"))
    hub.broker.publish_batch("a", [b"x"])
    fired: list[Any] = []
    hub.broker.barrier().addBoth(fired.append)
    env.settle()
    assert fired == [None]
    assert count(hub, "q") == 0


def test_reject_inside_delivery_keeps_only_the_dead_letter(env: Env) -> None:
    """A reject in deliver_batch stores the dead letter and removes the entry."""
    hub = env.start()
    q = settled_queue(hub, Settler("reject"))
    hub.broker.publish_batch("a", [b"bad"])
    env.settle()
    assert count(hub, "q") == 0
    assert [x.body for x in result_of(hub.broker.dead_letters("q"))] == [b"bad"]
    assert redelivered(env, hub) == []
    assert q.dead_letter_count == 1


def test_delayed_requeue_inside_delivery_survives_restart_once(env: Env) -> None:
    """A requeue with delay in deliver_batch moves the entry to a due row: it comes back once."""
    hub = env.start()
    settled_queue(hub, Settler("requeue", delay=50.0))
    hub.broker.publish_batch("a", [b"later"])
    env.settle()
    assert count(hub, "q") == 0
    hub = env.restart(hub)
    t = CollectingTarget()
    hub.broker.queue("q").attach(t, ready=100)
    env.settle()
    assert t.bodies == []
    hub.clock.advance(51)
    env.settle()
    assert t.bodies == [b"later"]
    assert [e[2] for e in t.entries] == [2]


def test_ack_inside_delivery_of_a_due_message_is_not_redelivered(env: Env) -> None:
    """A delayed publish acked in deliver_batch when it comes due stays gone after a restart."""
    hub = env.start()
    t = Settler("ack")
    settled_queue(hub, t)
    hub.broker.publish_batch("a", [b"due"], deliver_at=hub.clock.seconds() + 5)
    env.settle()
    hub.clock.advance(6)
    env.settle()
    assert t.bodies == [b"due"]
    assert count(hub, "q") == 0
    assert redelivered(env, hub) == []


def test_publish_from_inside_delivery_joins_the_outer_batch(env: Env) -> None:
    """A consumer that republishes and acks inside deliver_batch loses and repeats nothing."""
    hub = env.start()
    src = hub.broker.declare_queue("src")
    hub.broker.bind_queue("src", "src")
    hub.broker.declare_queue("dst")
    hub.broker.bind_queue("dst", "dst")
    broker = hub.broker

    class Forwarder(CollectingTarget):
        """Moves each message to ``dst`` and acks it, all inside deliver_batch."""

        def deliver_batch(self, binding: Any, address: str, messages: list[tuple]) -> None:
            """Forward, then ack."""
            super().deliver_batch(binding, address, messages)
            broker.publish_batch("dst", [e[7] for e in messages])
            binding.queue.ack(binding, [e[0] for e in messages])

    src.attach(Forwarder(), ready=100)
    hub.broker.publish_batch("src", [b"m1", b"m2"])
    env.settle()
    assert count(hub, "src") == 0
    assert count(hub, "dst") == 2
    hub = env.restart(hub)
    assert hub.broker.queue("src").depth == 0
    t = CollectingTarget()
    hub.broker.queue("dst").attach(t, ready=10)
    env.settle()
    assert t.bodies == [b"m1", b"m2"]


def test_ack_of_a_fanout_copy_inside_delivery(env: Env) -> None:
    """Fan-out: the last subscriber acking in deliver_batch releases the stored entry."""
    hub = env.start()
    q = hub.broker.declare_queue("q", mode="fanout")
    hub.broker.bind_queue("a", "q")
    a, b = Settler("ack"), Settler("ack")
    q.attach(a, ready=10)
    q.attach(b, ready=10)
    hub.broker.publish_batch("a", [b"all"])
    env.settle()
    assert a.bodies == b.bodies == [b"all"]
    assert count(hub, "q") == 0


def test_reject_inside_delivery_of_a_due_message_follows_the_scheduler_commit(env: Env) -> None:
    """A reject made while a due slice is delivered is stored after the slice's put."""
    hub = env.start()
    settled_queue(hub, Settler("reject"))
    hub.broker.publish_batch("a", [b"due"], deliver_at=hub.clock.seconds() + 5)
    env.settle()
    hub.clock.advance(6)
    env.settle()
    assert count(hub, "q") == 0
    assert [x.body for x in result_of(hub.broker.dead_letters("q"))] == [b"due"]
    fired: list[Any] = []
    hub.broker.barrier().addBoth(fired.append)
    env.settle()
    assert fired == [None]
    assert redelivered(env, hub) == []


def test_nested_publish_into_a_memory_only_delivery_fires(env: Env) -> None:
    """A publish made while a memory queue's batch is delivered fires, and barrier() too."""
    hub = env.start()
    broker = hub.broker
    mem = broker.declare_queue("mem", tier="memory")
    broker.bind_queue("mem", "mem")
    broker.declare_queue("plain", tier="memory")
    broker.bind_queue("plain", "plain")
    inner: list[Any] = []

    class Republisher(CollectingTarget):
        """Publishes each batch on to ``plain`` from inside deliver_batch, then acks."""

        def deliver_batch(self, binding: Any, address: str, messages: list[tuple]) -> None:
            """Republish, then ack."""
            super().deliver_batch(binding, address, messages)
            broker.publish_batch("plain", [e[7] for e in messages]).addBoth(inner.append)
            binding.queue.ack(binding, [e[0] for e in messages])

    mem.attach(Republisher(), ready=10)
    outer: list[Any] = []
    broker.publish_batch("mem", [b"x"]).addBoth(outer.append)
    fired: list[Any] = []
    broker.barrier().addBoth(fired.append)
    env.settle()
    assert inner == [None] and outer == [None] and fired == [None]
    assert broker.queue("plain").depth == 1


def test_large_body_acked_inside_delivery_is_gone_after_restart(env: Env) -> None:
    """A body above the segment threshold, put and deleted in one commit, does not come back."""
    hub = env.start()
    settled_queue(hub, Settler("ack"), ready=10)
    big = bytes(range(256)) * 400
    hub.broker.publish_batch("a", [big, b"small"])
    env.settle()
    assert count(hub, "q") == 0
    hub = env.restart(hub)
    t = CollectingTarget()
    hub.broker.queue("q").attach(t, ready=10)
    hub.broker.publish_batch("a", [big])
    env.settle()
    assert t.bodies == [big]
