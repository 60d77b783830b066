"""Queue lifetimes (mailbox TTL), paging over a grouped LMDB store, and broker start order."""

from __future__ import annotations

from typing import Any

from mqhub.hub import Hub
from mqhub.store.lmdb import LmdbStore
from mqhub.testing import CollectingTarget, memory_hub, result_of, start_clock


def test_durable_queue_expires_at_its_ttl(hub: Hub) -> None:
    """A queue with expires_at (mq9 mailbox TTL) is deleted with its messages when it runs out."""
    b = hub.broker
    b.declare_queue("mailbox", expires_at=hub.clock.seconds() + 60)
    b.bind_queue("inbox.1", "mailbox")
    b.publish_batch("inbox.1", [b"hello"])
    hub.clock.advance(59)
    assert b.queue("mailbox") is not None
    hub.clock.advance(2)
    assert b.queue("mailbox") is None and b.route("inbox.1").empty
    assert hub.store.stats()["entries"] == 0


def test_memory_queue_expires_at_its_ttl(hub: Hub) -> None:
    """Memory-tier queues expire on a plain clock timer."""
    b = hub.broker
    b.declare_queue("m", tier="memory", expires_at=hub.clock.seconds() + 5)
    hub.clock.advance(6)
    assert b.queue("m") is None


def test_paging_over_grouped_lmdb_commits(tmp_path: Any) -> None:
    """With a real LMDB store (commits grouped per turn) a paged backlog is delivered whole, in order."""
    clock = start_clock()
    store = LmdbStore(str(tmp_path / "d"), clock=clock, durability="none")
    store.open()
    hub = memory_hub(clock, store=store, window=16)
    b = hub.broker
    q = b.declare_queue("q")
    b.bind_queue("a", "q")
    for i in range(20):
        b.publish_batch("a", [b"%03d" % (i * 5 + j) for j in range(5)])
    t = CollectingTarget()
    c = q.attach(t, ready=7)
    for _ in range(200):
        clock.advance(0.05)
        if t.entries:
            q.ack(c, [e[0] for e in t.entries[-q.in_flight:]] if q.in_flight else [])
        if len(t.entries) == 100 and not q.in_flight:
            break
    assert t.bodies == [b"%03d" % i for i in range(100)]
    clock.advance(0)
    assert result_of(store.count_entries("q")) == 0
    hub.scheduler.stopService()
    result_of(store.close())


def test_due_rows_wait_for_the_broker(hub: Hub) -> None:
    """A due row fired before the broker recovered is retried, not lost (HubService starts the scheduler first)."""
    b = hub.broker
    b.declare_queue("q")
    b.bind_queue("a", "q")
    b.publish_batch("a", [b"x"], deliver_at=hub.clock.seconds() + 1)
    hub.scheduler.stopService()
    b.stop()
    fresh = memory_hub(hub.clock, store=hub.store, start=False)
    fresh.scheduler.startService()
    fresh.clock.advance(2)
    assert fresh.store.stats()["due"] == 1
    result_of(fresh.broker.start())
    fresh.clock.advance(1.5)
    assert fresh.broker.queue("q").depth == 1 and fresh.store.stats()["due"] == 0


def test_unpark_hands_over_or_drops(hub: Hub) -> None:
    """unpark moves held messages to bound queues and forgets the parking queue."""
    b = hub.broker
    b.park("t")
    b.publish_batch("t", [b"1"])
    b.declare_queue("ch")
    b.bind_queue("t", "ch")
    b.publish_batch("t", [b"2"])
    result_of(b.unpark("t"))
    assert b.queue("ch").depth == 2 and b.parked_depth("t") == 0
    assert result_of(hub.store.scan_meta("park/")) == []


def test_configure_moves_the_queue_expiry(hub: Hub) -> None:
    """Changing expires_at re-arms the queue's deletion; 0 cancels it."""
    b = hub.broker
    q = b.declare_queue("box", expires_at=hub.clock.seconds() + 10)
    q.configure(expires_at=hub.clock.seconds() + 100)
    hub.clock.advance(50)
    assert b.queue("box") is q
    hub.clock.advance(51)
    assert b.queue("box") is None
    q2 = b.declare_queue("keep", expires_at=hub.clock.seconds() + 10)
    q2.configure(expires_at=0.0)
    hub.clock.advance(20)
    assert b.queue("keep") is q2


def test_entries_without_queue_metadata_are_recovered(hub: Hub) -> None:
    """A queue whose settings are missing but whose entries are stored comes back with defaults."""
    from mqhub.store.batch import WriteBatch
    from mqhub.store.records import make_entry
    b = WriteBatch()
    b.put_entries("orphan", [make_entry(1, b"kept", "x")])
    b.put_entries("~park/held", [make_entry(2, b"parked", "held")])
    result_of(hub.store.commit(b))
    fresh = memory_hub(hub.clock, store=hub.store)
    q = fresh.broker.queue("orphan")
    assert q is not None and q.depth == 1 and q.durable
    assert fresh.broker.parked_depth("held") == 1
    assert result_of(hub.store.get_meta("q/orphan")) is not None
