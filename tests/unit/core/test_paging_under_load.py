"""A durable queue whose backlog outgrew its window keeps delivering while publishes continue.

Paging used to wait until none of the queue's store batches was uncommitted; under continuous
publishing that never happens and the consumers starved. These tests drive grouped commits on a
Clock (a commit lands only on ``clock.advance(0)``), so a batch is uncommitted at every step.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from mqhub.core.queue import Queue
from mqhub.hub import Hub
from mqhub.store.memory import MemoryStore
from mqhub.testing import CollectingTarget, memory_hub, result_of, start_clock


def _grouped_hub(window: int = 8) -> tuple[Hub, Queue]:
    """A hub over a MemoryStore whose commits fire on the clock, with queue ``q`` bound to ``a``."""
    clock = start_clock()
    store = MemoryStore(clock=clock)
    store.open()
    hub = memory_hub(clock, store=store)
    q = hub.broker.declare_queue("q", window=window)
    hub.broker.bind_queue("a", "q")
    return hub, q


def _ack_all(q: Queue, consumer: Any) -> int:
    """Ack every in-flight message of ``consumer``; return how many."""
    ids = list(q._inflight)
    assert q.ack(consumer, ids) == []
    return len(ids)


def test_deliveries_keep_flowing_while_publishing_continues() -> None:
    """Each turn publishes a batch and acks what arrived; commits land only every fifth turn, so
    a publish of the queue is uncommitted whenever its window drains. The consumer still gets a
    full RDY's worth every turn (it used to get nothing once the window was empty)."""
    hub, q = _grouped_hub(window=8)
    hub.broker.publish_batch("a", [b"old-%d" % i for i in range(200)])
    hub.clock.advance(0)
    assert q.depth == 200 and q.stats()["in_memory"] == 8
    t = CollectingTarget()
    c = q.attach(t, ready=4)
    seq = 0
    per_turn: list[int] = []
    for turn in range(60):
        hub.broker.publish_batch("a", [b"new-%d" % (seq + i) for i in range(3)])
        seq += 3
        before = len(t.entries)
        _ack_all(q, c)
        per_turn.append(len(t.entries) - before)
        assert q._unsettled
        if turn % 5 == 4:
            hub.clock.advance(0)
    assert per_turn == [4] * 60
    assert t.bodies[:200] == [b"old-%d" % i for i in range(200)]
    assert t.bodies[200:] == [b"new-%d" % i for i in range(len(t.entries) - 200)]
    assert len(set(t.ids())) == len(t.entries)
    for _ in range(100):
        _ack_all(q, c)
        hub.clock.advance(0)
    assert q.depth == 0 and q.in_flight == 0
    assert len(t.entries) == 200 + seq
    assert result_of(hub.store.count_entries("q")) == 0


def test_paging_reaches_the_committed_end_with_one_batch_uncommitted() -> None:
    """One priority, fresh ids: the page reads every committed entry though a batch is pending."""
    hub, q = _grouped_hub(window=8)
    hub.broker.publish_batch("a", [b"%d" % i for i in range(20)])
    hub.clock.advance(0)
    t = CollectingTarget()
    c = q.attach(t, ready=4)
    got = len(t.entries)
    hub.broker.publish_batch("a", [b"late-%d" % i for i in range(5)])   # stays uncommitted
    while True:
        _ack_all(q, c)
        if len(t.entries) == got:
            break
        got = len(t.entries)
    # all 20 committed entries arrived with the late batch still uncommitted, in order
    assert t.bodies[:20] == [b"%d" % i for i in range(20)]
    for _ in range(5):
        hub.clock.advance(0)
        _ack_all(q, c)
    assert t.bodies == [b"%d" % i for i in range(20)] + [b"late-%d" % i for i in range(5)]
    assert q.depth == 0 and q.in_flight == 0


def test_an_uncommitted_entry_before_committed_ones_caps_the_page() -> None:
    """A stored-only entry that sorts before committed ones is read, never skipped."""
    hub, q = _grouped_hub(window=4)
    hub.broker.publish_batch("a", [b"p1-%d" % i for i in range(6)], priority=1)
    hub.broker.publish_batch("a", [b"p0-%d" % i for i in range(6)], priority=0)
    hub.clock.advance(0)
    t = CollectingTarget()
    c = q.attach(t, ready=2)
    assert t.bodies == [b"p1-0", b"p1-1"]
    # the window ends at p1-5; a new priority-1 entry sorts after the horizon yet before every
    # committed priority-0 entry, and its batch stays uncommitted while the window drains
    hub.broker.publish_batch("a", [b"p1-new"], priority=1)
    for _ in range(6):
        _ack_all(q, c)
    assert b"p1-new" not in t.bodies and b"p0-0" not in t.bodies
    assert t.bodies == [b"p1-%d" % i for i in range(6)]
    for _ in range(10):
        hub.clock.advance(0)
        _ack_all(q, c)
    assert t.bodies == ([b"p1-%d" % i for i in range(6)] + [b"p1-new"]
                        + [b"p0-%d" % i for i in range(6)])


def _run_mixed(seed: int, path: str) -> None:
    """Random publishes (mixed priorities), acks, requeues and commits; then restart on LMDB."""
    from mqhub.store.lmdb import LmdbStore
    rnd = random.Random(seed)
    clock = start_clock()
    store = LmdbStore(path, clock=clock, durability="sync")
    store.open()
    hub = memory_hub(clock, store=store)
    q = hub.broker.declare_queue("q", window=rnd.choice([2, 4, 8]))
    hub.broker.bind_queue("a", "q")
    t = CollectingTarget()
    c = q.attach(t, ready=rnd.randint(1, 4))
    published: list[bytes] = []
    acked: set[bytes] = set()
    requeued: set[bytes] = set()
    seq = 0
    for _ in range(rnd.randint(20, 80)):
        op = rnd.random()
        if op < 0.45:
            n = rnd.randint(1, 6)
            bodies = [b"%d" % (seq + i) for i in range(n)]
            seq += n
            published.extend(bodies)
            hub.broker.publish_batch("a", bodies, priority=rnd.randint(0, 3))
        elif op < 0.75:
            ids = list(q._inflight)[:rnd.randint(0, 4)]
            acked.update(q._inflight[i][7] for i in ids)
            assert q.ack(c, ids) == []
        elif op < 0.85:
            ids = list(q._inflight)[:rnd.randint(0, 2)]
            requeued.update(q._inflight[i][7] for i in ids)
            assert q.requeue(c, ids) == []
        else:
            clock.advance(0)
    # drain: ack everything, commit, repeat
    for _ in range(400):
        ids = list(q._inflight)
        acked.update(q._inflight[i][7] for i in ids)
        q.ack(c, ids)
        clock.advance(0)
        if not (q.depth or q.in_flight):
            break
    clock.advance(0)
    assert acked == set(published), f"seed {seed}: skipped {sorted(set(published) - acked)[:5]}"
    assert not q.depth and not q.in_flight
    # nothing is delivered twice unless it was requeued (deleted entries never come back)
    once = [body for body in t.bodies if body not in requeued]
    assert sorted(once) == sorted(set(published) - requeued)
    # restart over the same LMDB data: nothing is left over or comes back
    clock.advance(0)
    hub.scheduler.stopService()
    result_of(hub.broker.stop())
    result_of(store.close())
    store2 = LmdbStore(path, clock=clock, durability="sync")
    store2.open()
    hub2 = memory_hub(clock, store=store2)
    clock.advance(0)
    t2 = CollectingTarget()
    hub2.broker.queue("q").attach(t2, ready=100)
    clock.advance(0)
    assert t2.bodies == []
    assert result_of(store2.count_entries("q")) == 0
    result_of(store2.close())


@pytest.mark.parametrize("seed", range(40))
def test_mixed_priorities_never_skip_an_entry(seed: int, tmp_path: Any) -> None:
    """Seeded random op sequences: every published message is delivered and acked, none lost."""
    _run_mixed(seed, str(tmp_path / "data"))
