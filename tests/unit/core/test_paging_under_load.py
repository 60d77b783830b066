"""A durable queue whose backlog outgrew its window keeps delivering while publishes continue.

Paging used to wait until none of the queue's own store batches was uncommitted; under
continuous publishing that is nearly always, so the window drained and the consumer starved
(issue 10). These tests drive grouped commits on a Clock: a MemoryStore given the clock applies
a batch only on ``clock.advance(0)``, so a publish of the queue is uncommitted at every step
between two commit cycles.
"""

from __future__ import annotations

from typing import Any

from mqhub.core.queue import Queue
from mqhub.core.tail import ENTRY_COST, tail_limit
from mqhub.hub import Hub
from mqhub.store.memory import MemoryStore
from mqhub.testing import CollectingTarget, memory_hub, result_of, start_clock

from .pipelined import PipelinedStore


def _pipelined_hub(window: int = 8, **broker_kw: Any) -> tuple[Hub, Queue, PipelinedStore]:
    """A hub over a :class:`PipelinedStore`, with queue ``q`` bound to ``a`` (``broker_kw`` go
    to the Broker)."""
    store = PipelinedStore()
    store.open()
    hub = memory_hub(start_clock(), store=store, **broker_kw)
    q = hub.broker.declare_queue("q", window=window)
    hub.broker.bind_queue("a", "q")
    return hub, q, store


def _grouped_hub(window: int = 8) -> tuple[Hub, Queue]:
    """A hub over a MemoryStore whose commits land on the clock, with queue ``q`` bound to ``a``."""
    clock = start_clock()
    store = MemoryStore(clock=clock)
    store.open()
    hub = memory_hub(clock, store=store)
    q = hub.broker.declare_queue("q", window=window)
    hub.broker.bind_queue("a", "q")
    return hub, q


def _ack_all(q: Queue, consumer: Any) -> int:
    """Ack every message ``consumer`` holds in flight; return how many."""
    ids = [e[0] for e in consumer.target.entries if q.owner_of(e[0]) is consumer]
    assert q.ack(consumer, ids) == []
    return len(ids)


def _drain(q: Queue, consumer: Any, store: PipelinedStore, rounds: int) -> None:
    """Acknowledge and commit until ``q`` holds nothing (at most ``rounds`` rounds)."""
    for _ in range(rounds):
        _ack_all(q, consumer)
        store.step()
        if not (q.depth or q.in_flight):
            break


def _publish(hub: Hub, store: PipelinedStore, address: str, bodies: list[bytes], per: int) -> None:
    """Publish ``bodies`` to ``address`` ``per`` at a time, committing each batch."""
    for k in range(0, len(bodies), per):
        hub.broker.publish_batch(address, bodies[k:k + per])
        store.step()


def _count_reads(store: PipelinedStore) -> list[int]:
    """Count the entries each page read of ``store`` returns (the list is filled as it reads)."""
    read: list[int] = []
    real = store.read_entries

    def counted(*a: Any) -> Any:
        return real(*a).addCallback(lambda page: read.append(len(page)) or page)
    store.read_entries = counted   # type: ignore[method-assign]
    return read


def test_deliveries_never_pause_while_a_producer_commits_continuously() -> None:
    """A backlog far beyond the window, a producer publishing a batch every step, commits landing
    one step late (so one of the queue's batches is always uncommitted), a consumer acking what
    it holds every step: it gets its whole RDY every step, never pausing for more than one
    commit cycle. On the old code it starved for good once the window was empty (nothing was
    paged until every batch of the queue was committed, which under this load never happens)."""
    hub, q, store = _pipelined_hub(window=8)
    hub.broker.publish_batch("a", [b"old-%d" % i for i in range(200)])
    store.step()
    store.step()
    assert q.depth == 200 and q.stats()["in_memory"] == 8
    t = CollectingTarget()
    c = q.attach(t, ready=4)
    seq = 0
    gap = longest = 0
    for _ in range(120):
        hub.broker.publish_batch("a", [b"new-%d" % (seq + i) for i in range(3)])
        seq += 3
        before = len(t.entries)
        _ack_all(q, c)
        gap = 0 if len(t.entries) > before else gap + 1
        longest = max(longest, gap)
        store.step()
    assert longest <= 1, f"the consumer went {longest} steps without a delivery"
    assert len(t.entries) >= 4 * 120 - 8
    assert t.bodies[:200] == [b"old-%d" % i for i in range(200)]
    assert t.bodies[200:] == [b"new-%d" % i for i in range(len(t.entries) - 200)]
    _drain(q, c, store, 200)
    store.step()
    store.step()
    assert q.depth == 0 and q.in_flight == 0
    assert len(t.entries) == len(set(t.ids())) == 200 + seq
    assert result_of(store.count_entries("q")) == 0


def test_paging_reaches_the_end_with_one_batch_uncommitted() -> None:
    """One priority, fresh ids: the committed backlog is read from the store; the uncommitted
    batch after it (the remembered tail of the backlog) follows once it commits (never before:
    a put is delivered only once stored), in order; nothing is delivered twice."""
    hub, q, store = _pipelined_hub(window=8)
    hub.broker.publish_batch("a", [b"%d" % i for i in range(20)])
    store.step()
    store.step()
    t = CollectingTarget()
    c = q.attach(t, ready=4)
    hub.broker.publish_batch("a", [b"late-%d" % i for i in range(5)])   # stays uncommitted
    for _ in range(10):
        _ack_all(q, c)
    expected = [b"%d" % i for i in range(20)] + [b"late-%d" % i for i in range(5)]
    assert t.bodies == expected[:20]
    assert store.incoming or store.staged
    for _ in range(5):
        store.step()
        _ack_all(q, c)
    assert t.bodies == expected
    assert q.depth == 0 and q.in_flight == 0
    assert result_of(store.count_entries("q")) == 0


def test_a_backlog_bigger_than_the_tail_is_read_back_in_order() -> None:
    """More is published beyond the window than the remembered tail holds (its byte budget
    here holds 4 entries): the older part is read from the store, then the tail follows from
    memory, in order."""
    hub, q, store = _pipelined_hub(window=4, window_bytes=4 * (ENTRY_COST + 2) + 1)
    t = CollectingTarget()
    c = q.attach(t, ready=2)
    for k in range(10):
        hub.broker.publish_batch("a", [b"%d" % (k * 3 + i) for i in range(3)])
    reads = []
    real = store.read_entries
    store.read_entries = lambda *a: reads.append(a) or real(*a)   # type: ignore[method-assign]
    for _ in range(40):
        _ack_all(q, c)
        store.step()
    assert t.bodies == [b"%d" % i for i in range(30)]
    assert reads, "the part of the backlog beyond the tail was read from the store"
    assert q.depth == 0 and q.in_flight == 0


def test_an_uncommitted_entry_before_committed_ones_holds_the_page() -> None:
    """A stored-only entry sorting before committed ones is waited for, never skipped."""
    hub, q = _grouped_hub(window=4)
    hub.broker.publish_batch("a", [b"p1-%d" % i for i in range(6)], priority=1)
    hub.broker.publish_batch("a", [b"p0-%d" % i for i in range(6)], priority=0)
    hub.clock.advance(0)
    t = CollectingTarget()
    c = q.attach(t, ready=2)
    assert t.bodies == [b"p1-0", b"p1-1"]
    # the window ends at p1-3; a new priority-1 entry sorts after the horizon but before every
    # committed priority-0 entry, and its batch stays uncommitted while the window drains
    hub.broker.publish_batch("a", [b"p1-new"], priority=1)
    for _ in range(6):
        _ack_all(q, c)
    assert t.bodies == [b"p1-%d" % i for i in range(6)]
    for _ in range(10):
        hub.clock.advance(0)
        _ack_all(q, c)
    assert t.bodies == ([b"p1-%d" % i for i in range(6)] + [b"p1-new"]
                        + [b"p0-%d" % i for i in range(6)])


def test_a_backlog_of_many_windows_is_fed_from_the_tail_without_reads() -> None:
    """A producer far ahead of its consumer (50 windows' worth beyond the window, within the
    byte budget): the messages come from the remembered tail, not read back from the store,
    in order, once each; each move takes only what fits the window."""
    hub, q, store = _pipelined_hub(window=8)
    t = CollectingTarget()
    c = q.attach(t, ready=3)
    bodies = [b"m%d" % i for i in range(400)]
    _publish(hub, store, "a", bodies, 10)
    assert q.depth + q.in_flight == 400
    read = _count_reads(store)
    for _ in range(400):
        _ack_all(q, c)
        store.step()
        assert not q.over_window()
        if not (q.depth or q.in_flight):
            break
    assert t.bodies == bodies
    # only what the window evicted when it first overflowed is read back (the first two
    # batches entered it together: 12 entries); the other 388 come from the tail (with a tail
    # of a window's worth, as before, nearly all of them were read back)
    assert sum(read) == 0
    store.step()
    store.step()
    assert result_of(store.count_entries("q")) == 0


def test_the_tail_is_bounded_by_the_byte_budget_counting_each_entry() -> None:
    """The remembered tail keeps at most the budget's worth of entries (body plus ENTRY_COST
    each); what it forgot is read back from the store, in order."""
    budget = 20 * (ENTRY_COST + 4)
    assert tail_limit(budget, 4) == 20
    hub, q, store = _pipelined_hub(window=4, window_bytes=budget)
    t = CollectingTarget()
    c = q.attach(t, ready=1)
    bodies = [b"%04d" % i for i in range(200)]
    _publish(hub, store, "a", bodies, 20)
    read = _count_reads(store)
    _drain(q, c, store, 600)
    assert t.bodies == bodies
    # the tail remembered only the newest 20 entries at a time: most were read back, not all
    assert 100 <= sum(read) < 200
    store.step()
    store.step()
    assert result_of(store.count_entries("q")) == 0


def test_a_publish_sorting_before_the_tail_is_read_back_in_ready_order() -> None:
    """The tail stays in ready order: a priority-3 batch that sorts after the window (priority
    5) but before the remembered priority-0 entries is not remembered; it is read back from
    the store and delivered between them; nothing is lost or repeated."""
    hub, q, store = _pipelined_hub(window=4)
    t = CollectingTarget()
    c = q.attach(t, ready=1)
    high = [b"p5-%d" % i for i in range(8)]
    low = [b"p0-%d" % i for i in range(32)]
    hub.broker.publish_batch("a", high, priority=5)
    store.step()
    store.step()
    for k in range(0, 32, 8):
        hub.broker.publish_batch("a", low[k:k + 8])
        store.step()
    hub.broker.publish_batch("a", [b"p3-0", b"p3-1"], priority=3)
    store.step()
    store.step()
    read = _count_reads(store)
    _drain(q, c, store, 200)
    assert t.bodies == high + [b"p3-0", b"p3-1"] + low
    assert sum(read) >= 2
    store.step()
    store.step()
    assert result_of(store.count_entries("q")) == 0


def test_all_tails_together_stay_within_the_broker_wide_account() -> None:
    """Two lagging queues share the broker-wide account of the tails (``broker.tails``): the
    first one's tail takes the room, the second remembers nothing beyond it and reads its
    backlog back from the store; the account never passes its limit, both deliver everything
    in order, and the account returns to zero when the backlogs are gone."""
    hub, q, store = _pipelined_hub(window=4)
    q2 = hub.broker.declare_queue("q2", window=4)
    hub.broker.bind_queue("b", "q2")
    tails = hub.broker.tails
    tails.limit = 30 * (ENTRY_COST + 4)
    t, t2 = CollectingTarget(), CollectingTarget()
    c, c2 = q.attach(t, ready=1), q2.attach(t2, ready=1)
    bodies = [b"%04d" % i for i in range(60)]
    for k in range(0, 60, 10):
        hub.broker.publish_batch("a", bodies[k:k + 10])
        store.step()
        assert tails.used <= tails.limit
    held_by_first = tails.used
    assert held_by_first > 0
    read = _count_reads(store)
    for k in range(0, 60, 10):
        hub.broker.publish_batch("b", bodies[k:k + 10])
        store.step()
        assert tails.used <= tails.limit
    for _ in range(400):
        _ack_all(q, c)
        _ack_all(q2, c2)
        store.step()
        assert tails.used <= tails.limit
        if not (q.depth or q.in_flight or q2.depth or q2.in_flight):
            break
    assert t.bodies == bodies and t2.bodies == bodies
    assert sum(read) >= 60 - 4 - 30, "the second queue read its backlog back from the store"
    assert tails.used == 0


def test_a_deleted_queue_gives_its_tail_back_to_the_account() -> None:
    """Deleting a queue whose tail holds entries frees its share of the broker-wide account."""
    hub, q, store = _pipelined_hub(window=4)
    q.attach(CollectingTarget(), ready=1)
    for k in range(5):
        hub.broker.publish_batch("a", [b"%d-%d" % (k, i) for i in range(10)])
        store.step()
    assert hub.broker.tails.used > 0
    d = hub.broker.delete_queue("q")
    store.step()
    store.step()
    result_of(d)
    assert hub.broker.tails.used == 0
