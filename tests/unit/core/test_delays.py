"""Delayed publishes (deliver_at, NSQ DPUB) are routed by their address when they come due."""

from __future__ import annotations

from mqhub.hub import Hub
from mqhub.store.lmdb import LmdbStore
from mqhub.testing import CollectingTarget, memory_hub, restart_hub, result_of, settle, start_clock


def test_delay_to_a_parked_address_reaches_a_queue_bound_meanwhile(hub: Hub) -> None:
    """DPUB to a topic without channels, channel created before due: the channel gets it."""
    b = hub.broker
    b.park("t")
    b.publish_batch("t", [b"later"], deliver_at=hub.clock.seconds() + 5)
    q = b.declare_queue("t.c")
    b.bind_queue("t", "t.c")
    t = CollectingTarget()
    q.attach(t, ready=10)
    hub.clock.advance(4)
    assert t.entries == []
    hub.clock.advance(2)
    settle(hub)
    assert t.bodies == [b"later"]
    assert b.parked_depth("t") == 0


def test_delay_to_a_still_parked_address_is_held_until_a_queue_binds(hub: Hub) -> None:
    """Due while still parked with no queue: kept in the parking queue, moved on the first bind."""
    b = hub.broker
    b.park("t")
    b.publish_batch("t", [b"x", b"y"], deliver_at=hub.clock.seconds() + 5)
    assert b.router.parking["t"].deferred == 2
    hub.clock.advance(6)
    settle(hub)
    assert b.parked_depth("t") == 2
    assert b.router.parking["t"].deferred == 0   # the hidden queue's count is settled too
    q = b.declare_queue("t.c")
    b.bind_queue("t", "t.c")
    settle(hub)
    assert q.depth == 2 and b.parked_depth("t") == 0


def test_delay_reaches_every_queue_bound_at_due_time(hub: Hub) -> None:
    """A second queue bound before the due time also gets a copy; the first keeps its count."""
    b = hub.broker
    q1 = b.declare_queue("q1")
    b.bind_queue("a", "q1")
    b.publish_batch("a", [b"m"], deliver_at=hub.clock.seconds() + 3)
    assert q1.deferred == 1
    q2 = b.declare_queue("q2")
    b.bind_queue("a", "q2")
    hub.clock.advance(3)
    settle(hub)
    assert (q1.depth, q2.depth, q1.deferred) == (1, 1, 0)


def test_emptied_queue_does_not_get_an_earlier_delay(hub: Hub) -> None:
    """Emptying a queue drops the delays counted for it (NSQ channel empty)."""
    b = hub.broker
    q = b.declare_queue("q")
    b.bind_queue("a", "q")
    b.publish_batch("a", [b"old"], deliver_at=hub.clock.seconds() + 3)
    result_of(q.empty())
    b.publish_batch("a", [b"new"], deliver_at=hub.clock.seconds() + 3)
    hub.clock.advance(3)
    settle(hub)
    t = CollectingTarget()
    q.attach(t, ready=10)
    assert t.bodies == [b"new"]


def test_empty_parked_drops_delays_held_for_the_address(hub: Hub) -> None:
    """/topic/empty on a topic without channels also drops its DPUBs not yet due."""
    b = hub.broker
    b.park("t")
    b.publish_batch("t", [b"held"])
    assert b.parked_depth("t") == 1
    b.publish_batch("t", [b"old"], deliver_at=hub.clock.seconds() + 5)
    result_of(b.empty_parked("t"))
    assert b.parked_depth("t") == 0
    b.publish_batch("t", [b"new"], deliver_at=hub.clock.seconds() + 5)
    q = b.declare_queue("t.c")
    b.bind_queue("t", "t.c")
    hub.clock.advance(6)
    settle(hub)
    t = CollectingTarget()
    q.attach(t, ready=10)
    assert t.bodies == [b"new"]


def test_delay_to_a_paused_address_waits_for_resume(hub: Hub) -> None:
    """Due while the address is paused: held; resume hands it to the bound queue."""
    b = hub.broker
    q = b.declare_queue("q")
    b.bind_queue("a", "q")
    b.pause_address("a")
    b.publish_batch("a", [b"m"], deliver_at=hub.clock.seconds() + 2)
    hub.clock.advance(3)
    settle(hub)
    assert (q.depth, b.parked_depth("a")) == (0, 1)
    result_of(b.resume_address("a"))
    assert q.depth == 1


def test_memory_tier_delay_is_routed_at_due_time(hub: Hub) -> None:
    """Without durable queues the delay is clock-held but still routed when due."""
    b = hub.broker
    b.declare_queue("m1", tier="memory")
    b.bind_queue("a", "m1")
    b.publish_batch("a", [b"m"], deliver_at=hub.clock.seconds() + 2)
    m2 = b.declare_queue("m2", tier="memory")
    b.bind_queue("a", "m2")
    hub.clock.advance(2)
    settle(hub)
    assert m2.depth == 1 and b.queue("m1").depth == 1
    assert hub.store.stats()["entries"] == 0


def test_parked_delay_survives_restart_and_reaches_the_new_channel(tmp_path: object) -> None:
    """Over LMDB: DPUB to a parked topic, restart, channel created, due -> delivered once."""
    clock = start_clock()
    store = LmdbStore(str(tmp_path), clock=clock, durability="none", writer="inline")
    store.open()
    hub = memory_hub(clock, store=store)
    hub.broker.park("t")
    hub.broker.publish_batch("t", [b"later"], deliver_at=clock.seconds() + 10)
    settle(hub)
    hub = restart_hub(hub)
    settle(hub)
    b = hub.broker
    q = b.declare_queue("t.c")
    b.bind_queue("t", "t.c")
    t = CollectingTarget()
    q.attach(t, ready=10)
    clock.advance(11)
    settle(hub)
    assert t.bodies == [b"later"] and b.parked_depth("t") == 0
    result_of(hub.broker.stop())
    hub.scheduler.stopService()
    settle(hub)
    result_of(store.close())
