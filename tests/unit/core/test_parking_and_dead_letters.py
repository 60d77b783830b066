"""Parked and paused addresses (NSQ topics), and dead-letter list/replay/purge."""

from __future__ import annotations

from mqhub.hub import Hub
from mqhub.testing import CollectingTarget, result_of


def test_topic_without_channel_keeps_messages_for_the_first_one(hub: Hub) -> None:
    """A parked address holds publishes until a queue binds; then they move in order."""
    b = hub.broker
    b.park("topic")
    result_of(b.publish_batch("topic", [b"1", b"2"]))
    assert b.parked_depth("topic") == 2
    b.declare_queue("ch")
    b.bind_queue("topic", "ch")
    assert b.parked_depth("topic") == 0
    t = CollectingTarget()
    b.queue("ch").attach(t, ready=10)
    result_of(b.publish_batch("topic", [b"3"]))
    assert t.bodies == [b"1", b"2", b"3"]
    assert hub.store.stats()["entries"] == 3


def test_pause_and_resume_address(hub: Hub) -> None:
    """A paused topic holds messages even with channels; resume delivers them to every channel."""
    b = hub.broker
    for name in ("c1", "c2"):
        b.declare_queue(name)
        b.bind_queue("t", name)
    b.pause_address("t")
    b.publish_batch("t", [b"a", b"b"])
    assert b.queue("c1").depth == 0 and b.parked_depth("t") == 2
    result_of(b.resume_address("t"))
    assert b.queue("c1").depth == 2 and b.queue("c2").depth == 2
    assert b.parked_depth("t") == 0


def test_parked_backlog_larger_than_window_moves_whole(hub: Hub) -> None:
    """A parked backlog beyond the window is paged from the store when it moves."""
    from mqhub.testing import memory_hub
    h = memory_hub(window=8)
    b = h.broker
    b.park("big")
    for i in range(5):
        result_of(b.publish_batch("big", [b"%02d" % (i * 10 + j) for j in range(10)]))
    assert b.parked_depth("big") == 50
    b.declare_queue("ch", max_size=0)
    b.bind_queue("big", "ch")
    q = b.queue("ch")
    assert q.depth == 50 and b.parked_depth("big") == 0
    t = CollectingTarget()
    c = q.attach(t, ready=100)
    while q.in_flight:
        q.ack(c, t.ids()[-q.in_flight:])
    assert t.bodies == [b"%02d" % i for i in range(50)]


def test_dead_letters_replay_and_purge(hub: Hub) -> None:
    """List, replay (back to the queue, attempts reset) and purge."""
    b = hub.broker
    q = b.declare_queue("q")
    b.bind_queue("a", "q")
    b.publish_batch("a", [b"1", b"2", b"3"], origin="nsq", priority=4)
    t = CollectingTarget()
    c = q.attach(t, ready=3)
    ids = t.ids()
    q.reject(c, ids, error="bad")
    dead = result_of(b.dead_letters("q"))
    assert [d.body for d in dead] == [b"1", b"2", b"3"]
    assert result_of(b.dead_letters("q", after=ids[0], limit=1))[0].body == b"2"
    assert result_of(b.replay_dead_letters("q", [ids[1]])) == 1
    assert t.bodies[-1] == b"2" and t.entries[-1][2] == 1 and t.entries[-1][1] == 4
    assert t.entries[-1][6] is None
    assert result_of(b.purge_dead_letters("q", [ids[0]])) == 1
    assert [d.body for d in result_of(b.dead_letters("q"))] == [b"3"]
    assert result_of(b.purge_dead_letters("q")) == 1
    assert result_of(b.dead_letters("q")) == [] and q.dead_letter_count == 0


def test_memory_tier_dead_letters(hub: Hub) -> None:
    """Memory-tier queues keep their dead letters in memory, with the same operations."""
    b = hub.broker
    q = b.declare_queue("m", tier="memory", max_attempts=1)
    b.bind_queue("m", "m")
    b.publish_batch("m", [b"x"])
    t = CollectingTarget()
    c = q.attach(t, ready=1)
    q.requeue(c, t.ids(), error="nope")
    assert [(d.reason, d.last_error) for d in result_of(b.dead_letters("m"))] == [
        ("max_attempts", "nope")]
    assert result_of(b.replay_dead_letters("m")) == 1
    assert t.bodies == [b"x", b"x"] and hub.store.stats()["entries"] == 0


def test_empty_parked_drops_held_messages_only(hub: Hub) -> None:
    """empty_parked clears the held backlog and keeps the address parked."""
    b = hub.broker
    b.park("t")
    result_of(b.publish_batch("t", [b"1", b"2"]))
    result_of(b.empty_parked("t"))
    assert b.parked_depth("t") == 0 and hub.store.stats()["entries"] == 0
    result_of(b.publish_batch("t", [b"3"]))
    assert b.parked_depth("t") == 1
