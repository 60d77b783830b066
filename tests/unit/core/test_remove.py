"""Queue.remove(msg_ids): drop ready entries by id, with their store entries."""

from __future__ import annotations

from mqhub.hub import Hub
from mqhub.testing import CollectingTarget, memory_hub, restart_hub


def test_remove_drops_ready_entries_and_reports_the_rest(hub: Hub) -> None:
    """Ready ids go (also from the store); in-flight and unknown ids are returned untouched."""
    b = hub.broker
    q = b.declare_queue("q")
    b.bind_queue("a", "q")
    b.publish_batch("a", [b"0", b"1", b"2", b"3"])
    ids = list(b.last_ids)
    t = CollectingTarget()
    c = q.attach(t, ready=1)
    assert t.ids() == [ids[0]]
    failed = q.remove([ids[0], ids[2], 12345])
    assert failed == [ids[0], 12345]
    assert q.depth == 2 and q.in_flight == 1
    assert hub.store.stats()["entries"] == 3
    q.ack(c, [ids[0]])
    c.set_ready(10)
    assert t.bodies == [b"0", b"1", b"3"]


def test_removed_entry_does_not_come_back_after_restart(hub: Hub) -> None:
    """The removal is durable: a restart does not redeliver it."""
    b = hub.broker
    b.declare_queue("q")
    b.bind_queue("a", "q")
    b.publish_batch("a", [b"x", b"y"])
    first = b.last_ids[0]
    assert b.queue("q").remove([first]) == []
    hub2 = restart_hub(hub)
    t = CollectingTarget()
    hub2.broker.queue("q").attach(t, ready=10)
    assert t.bodies == [b"y"]


def test_remove_across_priorities_keeps_order() -> None:
    """Entries of several priorities: only the named ones go; ready order is unchanged."""
    hub = memory_hub()
    b = hub.broker
    q = b.declare_queue("q")
    b.bind_queue("a", "q")
    b.publish_batch("a", [b"lo1", b"lo2"], priority=1)
    lo = list(b.last_ids)
    b.publish_batch("a", [b"hi1", b"hi2"], priority=5)
    hi = list(b.last_ids)
    assert q.remove([lo[0], hi[1]]) == []
    t = CollectingTarget()
    q.attach(t, ready=10)
    assert t.bodies == [b"hi1", b"lo2"]


def test_remove_in_a_paged_queue_lets_the_backlog_flow() -> None:
    """With a window smaller than the backlog, removing window entries pages the rest in."""
    hub = memory_hub(window=4)
    b = hub.broker
    q = b.declare_queue("q")
    b.bind_queue("a", "q")
    b.publish_batch("a", [b"%d" % i for i in range(10)])
    ids = list(b.last_ids)
    hub.clock.advance(0)
    assert q.remove(ids[:3]) == []
    assert q.remove([ids[8]]) == [ids[8]]   # beyond the window: not searched
    t = CollectingTarget()
    q.attach(t, ready=100)
    hub.clock.advance(0)
    assert t.bodies == [b"%d" % i for i in range(3, 10)]
    assert q.depth == 0


def test_remove_on_a_fanout_queue_backlog(hub: Hub) -> None:
    """A fan-out queue's waiting message (no subscriber yet) can be removed."""
    b = hub.broker
    q = b.declare_queue("f", mode="fanout")
    b.bind_queue("a", "f")
    b.publish_batch("a", [b"1", b"2"])
    assert q.remove([b.last_ids[0]]) == []
    t = CollectingTarget()
    q.attach(t, credit=10)
    assert t.bodies == [b"2"]
    assert hub.store.stats()["entries"] == 1
