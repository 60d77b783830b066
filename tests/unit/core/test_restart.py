"""Restart: delays, schedules, in-flight messages, queues, bindings and dead letters come back.

Every test runs over the MemoryStore (kept across the restart) and over a real LmdbStore in
tmp_path that is closed and reopened.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from twisted.internet.task import Clock

from mqhub.hub import Hub
from mqhub.scheduler.spec import ScheduleSpec
from mqhub.store.memory import MemoryStore
from mqhub.testing import CollectingTarget, memory_hub, result_of, settle, start_clock


class Stores:
    """Makes a store for a kind and reopens it for a restart."""

    def __init__(self, kind: str, path: str, clock: Clock) -> None:
        """Remember where and how to make the store."""
        self.kind = kind
        self.path = path
        self.clock = clock

    def make(self) -> Any:
        """A freshly opened store of this kind over the same data."""
        store: Any
        if self.kind == "memory":
            store = MemoryStore()
        else:
            from mqhub.store.lmdb import LmdbStore
            store = LmdbStore(self.path, clock=self.clock, durability="sync")
        store.open()
        return store


@pytest.fixture(params=["memory", "lmdb"])
def env(request: Any, tmp_path: Any) -> tuple[Stores, Callable[..., Hub]]:
    """A (stores, start) pair: ``start(store=None)`` boots a hub on the shared clock."""
    clock = start_clock()
    stores = Stores(request.param, str(tmp_path / "data"), clock)

    def start(store: Any = None, **kw: Any) -> Hub:
        hub = memory_hub(clock, store=store or stores.make(), **kw)
        clock.advance(0)
        return hub
    return stores, start


def restart(stores: Stores, hub: Hub, start: Callable[..., Hub], down: float = 0.0) -> Hub:
    """Stop ``hub``, keep it down ``down`` seconds, and start a new one over the same data."""
    hub.clock.advance(0)
    hub.scheduler.stopService()
    hub.broker.stop()
    if stores.kind == "memory":
        store = hub.store
    else:
        result_of(hub.store.close())
        store = None
    hub.clock.advance(down)
    return start(store)


def test_delays_survive_restart_and_fire_on_time(env: Any) -> None:
    """A DPUB made before a restart is delivered when due, not before."""
    stores, start = env
    hub = start()
    hub.broker.declare_queue("q")
    hub.broker.bind_queue("a", "q")
    hub.broker.publish_batch("a", [b"later"], deliver_at=hub.clock.seconds() + 100)
    settle(hub)
    hub = restart(stores, hub, start, down=30)
    q = hub.broker.queue("q")
    t = CollectingTarget()
    q.attach(t, ready=10)
    hub.clock.advance(60)
    assert t.entries == []
    hub.clock.advance(11)
    settle(hub)
    assert t.bodies == [b"later"]


def test_restart_never_fires_a_backlog_early(env: Any) -> None:
    """Of 300 delays one second apart, only those due by the restart fire at once."""
    stores, start = env
    hub = start()
    hub.broker.declare_queue("q")
    hub.broker.bind_queue("a", "q")
    now = hub.clock.seconds()
    for i in range(300):
        hub.broker.publish_batch("a", [b"%d" % i], deliver_at=now + 1 + i)
    settle(hub)
    hub = restart(stores, hub, start, down=100.5)
    t = CollectingTarget()
    hub.broker.queue("q").attach(t, ready=1000)
    settle(hub)
    assert len(t.entries) == 100
    for k in range(5):
        hub.clock.advance(1.0)
        settle(hub)
        assert len(t.entries) == 101 + k
    assert t.bodies == [b"%d" % i for i in range(105)]


def test_in_flight_messages_are_ready_again_with_attempts(env: Any) -> None:
    """Messages in flight at a stop are redelivered after restart, attempts kept."""
    stores, start = env
    hub = start()
    hub.broker.declare_queue("q", max_attempts=5)
    hub.broker.bind_queue("a", "q")
    hub.broker.publish_batch("a", [b"m1", b"m2"])
    settle(hub)
    t = CollectingTarget()
    c = hub.broker.queue("q").attach(t, ready=10)
    hub.broker.queue("q").ack(c, t.ids()[:1])
    settle(hub)
    hub = restart(stores, hub, start)
    q = hub.broker.queue("q")
    assert q.depth == 1 and q.max_attempts == 5
    t2 = CollectingTarget()
    q.attach(t2, ready=10)
    assert t2.bodies == [b"m2"] and t2.entries[0][2] == 2


def test_queues_bindings_parking_and_dead_letters_survive(env: Any) -> None:
    """Settings, bindings, parked messages and dead letters are recovered."""
    stores, start = env
    hub = start()
    b = hub.broker
    b.declare_queue("q", max_size=5, overflow="dead_letter", ttl=3600.0)
    b.bind_queue("orders.*", "q")
    b.declare_queue("mem", tier="memory")
    b.bind_queue("orders.*", "mem")
    b.park("topic")
    for i in range(7):
        b.publish_batch("orders.eu", [b"%d" % i])
    b.publish_batch("topic", [b"held"])
    settle(hub)
    hub = restart(stores, hub, start)
    b = hub.broker
    q = b.queue("q")
    assert q is not None and b.queue("mem") is None
    assert (q.max_size, q.overflow, q.ttl, q.depth, q.dead_letter_count) == (
        5, "dead_letter", 3600.0, 5, 2)
    assert [x.pattern for x in b.bindings("q")] == ["orders.*"]
    b.publish_batch("orders.us", [b"new"])
    settle(hub)
    assert q.depth == 5 and q.dead_letter_count == 3
    assert b.parked_depth("topic") == 1
    b.declare_queue("ch")
    b.bind_queue("topic", "ch")
    settle(hub)
    assert b.queue("ch").depth == 1


def test_schedules_survive_restart_with_run_count(env: Any) -> None:
    """An interval schedule keeps its run count across a restart and stops after run_count."""
    stores, start = env
    hub = start()
    fired: list[tuple[float, bytes]] = []

    def handler(rows: Any, batch: Any, now: float) -> None:
        fired.extend((now, r[2]) for r in rows)

    hub.scheduler.register(b"job/", handler)
    hub.scheduler.schedule(ScheduleSpec(interval=10.0, nohaste=True, run_count=3),
                           b"job/1", b"payload")
    settle(hub)
    hub.clock.advance(10.0)
    settle(hub)
    assert len(fired) == 1
    hub = restart(stores, hub, start, down=3.0)
    hub.scheduler.register(b"job/", handler)
    settle(hub)
    assert hub.scheduler.run_counts()[b"job/1"] == 1
    for _ in range(40):
        hub.clock.advance(1.0)
        settle(hub)
    assert len(fired) == 3 and b"job/1" not in hub.scheduler.schedules()
    assert [p for _, p in fired] == [b"payload"] * 3
