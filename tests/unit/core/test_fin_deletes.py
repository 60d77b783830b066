"""A FIN'd batch (``QueueDelivery.ack``) deletes exactly its stored entries, on a MemoryStore
that groups a turn's commits and on a real LmdbStore: a queue of one priority (the columnar
``delete_ids`` path), one of several priorities, and acks made inside ``deliver_batch`` (merged
into the open publish batch by ``commits``). A FIN whose delete is not committed yet, or is
committed while a page read is in flight, keeps its entry out of the pages that still see it."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.defer import Deferred

from mqhub.core.consumer import Consumer
from mqhub.hub import Hub
from mqhub.store.memory import MemoryStore
from mqhub.testing import CollectingTarget, memory_hub, result_of, start_clock


@pytest.fixture(params=["memory-grouped", "lmdb"])
def hub(request: Any, tmp_path: Any) -> Any:
    """A started hub over a grouping MemoryStore or an LmdbStore in tmp_path."""
    clock = start_clock()
    if request.param == "lmdb":
        from mqhub.store.lmdb import LmdbStore
        store: Any = LmdbStore(str(tmp_path / "data"), clock=clock, durability="sync")
    else:
        store = MemoryStore(clock)
    store.open()
    h = memory_hub(clock, store=store)
    settle(h)
    yield h
    settle(h)
    result_of(h.broker.stop())
    if request.param == "lmdb":
        result_of(store.close())


def settle(hub: Hub) -> None:
    """Run this turn's grouped commits and the ones they cause."""
    for _ in range(4):
        hub.clock.advance(0)


def stored(hub: Hub, queue: str = "q") -> list[tuple[int, int]]:
    """The ``(priority, msg_id)`` keys the store holds for ``queue``, in ready order."""
    return [(e[1], e[0]) for e in result_of(hub.store.read_entries(queue, None, 10_000))]


class Acker(CollectingTarget):
    """A live subscriber that FINs ``fins`` (one ack call each) of consumer ``consumer``'s
    in-flight messages inside its ``deliver_batch``, while the publish's batch is open."""

    def __init__(self, consumer: Consumer, fins: list[list[int]]) -> None:
        """FIN each list of ``fins`` on ``consumer``'s queue when a batch arrives."""
        super().__init__()
        self.consumer = consumer
        self.fins = fins
        self.failed: list[list[int]] = []

    def deliver_batch(self, binding: Any, address: str, messages: list[tuple]) -> None:
        """Record, then FIN before returning."""
        super().deliver_batch(binding, address, messages)
        c = self.consumer
        self.failed += [c.queue.ack(c, ids) for ids in self.fins]
        self.fins = []


def publish(hub: Hub, priorities: list[int], n: int) -> None:
    """Publish ``n`` messages at each of ``priorities`` to ``q`` and commit them."""
    for prio in priorities:
        d = hub.broker.publish_batch("a", [b"m%d" % i for i in range(n)], priority=prio)
        settle(hub)
        assert result_of(d) is None


def delivered(hub: Hub, priorities: list[int], n: int) -> tuple[Any, CollectingTarget, Any]:
    """Queue ``q`` bound to ``a``, ``n`` messages published at each of ``priorities``, all
    delivered to one consumer at RDY 1000 (and still stored); returns (queue, target, consumer)."""
    q = hub.broker.declare_queue("q")
    hub.broker.bind_queue("a", "q")
    publish(hub, priorities, n)
    t = CollectingTarget()
    c = q.attach(t, ready=1000)
    settle(hub)
    assert len(t.entries) == len(stored(hub)) == n * len(priorities)
    return q, t, c


@pytest.mark.parametrize("priorities", [[0], [3, 0, 7]])
def test_fin_deletes_exactly_the_acked_entries(hub: Hub, priorities: list[int]) -> None:
    """FINs of delivered messages (every other one, then some with an unknown id, then the
    rest): after each commit the store keeps exactly the entries not FIN'd."""
    q, t, c = delivered(hub, priorities, 60)
    left = stored(hub)
    assert len(t.batches) == 1   # one delivery: a FIN of it spans every priority
    odd = t.entries[1::2]
    for fin, unknown in ((t.entries[::2], []), (odd[:10], [12345]), (odd[10:], [])):
        assert q.ack(c, [e[0] for e in fin] + unknown) == unknown
        settle(hub)
        gone = {(e[1], e[0]) for e in fin}
        left = [k for k in left if k not in gone]
        assert stored(hub) == left
        assert result_of(hub.store.count_entries("q")) == len(left)
    assert left == []


@pytest.mark.parametrize("priorities", [[0], [3, 0, 7]])
def test_fin_inside_delivery_is_merged_and_deletes_exactly(hub: Hub,
                                                           priorities: list[int]) -> None:
    """FINs made while a publish's batch is open (by a live subscriber of its address) join
    that batch (``commits`` merges their delete runs): exactly those entries go."""
    q, t, c = delivered(hub, priorities, 45)
    everything = stored(hub)
    fins = [[e[0] for e in t.entries[::3]], [e[0] for e in t.entries[1::6]]]
    hub.broker.declare_queue("other")
    hub.broker.bind_queue("b", "other")   # a stored copy: the publish opens a batch
    commits = hub.broker.commits
    joined_before = commits.filling
    acker = Acker(c, fins)
    hub.broker.subscribe("b", acker)
    seen: list[Any] = []
    real_join = commits._join
    commits._join = lambda batch: seen.append(batch) or real_join(batch)  # type: ignore
    d = hub.broker.publish_batch("b", [b"go"])
    settle(hub)
    assert result_of(d) is None and joined_before is None
    assert acker.bodies == [b"go"] and acker.failed == [[], []]
    assert len(seen) == 2   # both FINs went through the merge
    gone = {(e[1], e[0]) for e in t.entries if e[0] in set(fins[0]) | set(fins[1])}
    assert stored(hub) == [k for k in everything if k not in gone]
    assert result_of(hub.store.count_entries("q")) == len(everything) - len(gone)
    assert result_of(hub.store.count_entries("other")) == 1


def _paging_hub(tails_bytes: int) -> tuple[Hub, Any]:
    """A grouping MemoryStore hub with queue ``q`` (window 4) bound to ``a``."""
    clock = start_clock()
    store = MemoryStore(clock)
    store.open()
    h = memory_hub(clock, store=store, tails_bytes=tails_bytes)
    q = h.broker.declare_queue("q", window=4)
    h.broker.bind_queue("a", "q")
    return h, q


@pytest.mark.parametrize("tails_bytes", [0, 1 << 20])
def test_a_fin_not_yet_committed_is_not_paged_back(tails_bytes: int) -> None:
    """Higher-priority puts move the horizon back before an in-flight entry; it is FIN'd (its
    delete run not committed yet) and the pages that still find it in the store drop it.
    Without a remembered tail (``tails_bytes=0``) every page is read from the store; with one
    (this test replaced test_paging_under_load's version of it) none is."""
    h, q = _paging_hub(tails_bytes)
    reads: list[int] = []
    real = h.store.read_entries
    h.store.read_entries = lambda *a: real(*a).addCallback(  # type: ignore[method-assign]
        lambda page: reads.append(len(page)) or page)
    h.broker.publish_batch("a", [b"low-%d" % i for i in range(10)])
    h.clock.advance(0)
    t = CollectingTarget()
    c = q.attach(t, ready=1)
    assert t.bodies == [b"low-0"]
    h.broker.publish_batch("a", [b"hi-%d" % i for i in range(4)], priority=5)
    h.clock.advance(0)

    def fin_all() -> None:
        ids = [e[0] for e in t.entries if q.owner_of(e[0]) is c]
        assert q.ack(c, ids) == []
    for _ in range(12):
        fin_all()                  # low-0's delete is uncommitted until the clock turns
    for _ in range(10):
        h.clock.advance(0)
        fin_all()
    assert t.bodies.count(b"low-0") == 1
    assert sorted(t.bodies) == sorted([b"low-%d" % i for i in range(10)]
                                      + [b"hi-%d" % i for i in range(4)])
    assert q.depth == 0 and q.in_flight == 0
    assert (sum(reads) > 0) == (tails_bytes == 0)


class HeldReads(MemoryStore):
    """A grouping MemoryStore whose page reads see the store when asked but answer only on
    :meth:`release` (a read in flight while commits land, like the LMDB reader)."""

    def __init__(self, clock: Any) -> None:
        """No read held yet."""
        super().__init__(clock)
        self.held: list[tuple[Any, Any]] = []
        self.reads = 0

    def read_entries(self, queue: str, after: Any, limit: int) -> Any:
        """Read now, answer later."""
        page = result_of(super().read_entries(queue, after, limit))
        self.reads += 1
        d: Any = Deferred()
        self.held.append((d, page))
        return d

    def release(self) -> None:
        """Answer every held read."""
        held, self.held = self.held, []
        for d, page in held:
            d.callback(page)


def test_a_fin_committed_while_its_page_is_read_is_dropped_from_the_page() -> None:
    """Higher-priority puts move the horizon back before an entry in flight on one consumer;
    another consumer drains them, so a page read starts that still sees that entry. It is
    FIN'd and the FIN commits before the read answers: the settled batch's delete runs (noted
    for the read in progress) drop it from the page, so it is not delivered again."""
    clock = start_clock()
    store = HeldReads(clock)
    store.open()
    h = memory_hub(clock, store=store, tails_bytes=0)
    q = h.broker.declare_queue("q", window=4)
    h.broker.bind_queue("a", "q")
    h.broker.publish_batch("a", [b"low-%d" % i for i in range(10)])
    clock.advance(0)
    t1 = CollectingTarget()
    c1 = q.attach(t1, ready=1)
    assert t1.bodies == [b"low-0"]
    h.broker.publish_batch("a", [b"hi-%d" % i for i in range(4)], priority=5)
    clock.advance(0)
    t2 = CollectingTarget()
    c2 = q.attach(t2, ready=4)
    assert t2.bodies == [b"hi-%d" % i for i in range(4)]
    assert store.held                  # the window is empty: a page read is in flight
    assert q.ack(c1, [t1.entries[0][0]]) == []
    clock.advance(0)                   # low-0's FIN is committed before the read answers
    for _ in range(10):
        store.release()
        for c, t in ((c1, t1), (c2, t2)):
            assert q.ack(c, [e[0] for e in t.entries if q.owner_of(e[0]) is c]) == []
        clock.advance(0)
    bodies = t1.bodies + t2.bodies
    assert bodies.count(b"low-0") == 1
    assert sorted(bodies) == sorted([b"low-%d" % i for i in range(10)]
                                    + [b"hi-%d" % i for i in range(4)])
    assert q.depth == 0 and q.in_flight == 0
