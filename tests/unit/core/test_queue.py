"""Every queue rule, driven by a Clock over a MemoryStore."""

from __future__ import annotations

import pytest

from mqhub.core.queue import MAX_ATTEMPTS_HEADER
from mqhub.errors import QueueFull
from mqhub.hub import Hub
from mqhub.store.records import ATTEMPTS, BODY, PRIORITY
from mqhub.testing import CollectingTarget, result_of


def _queue(hub: Hub, name: str = "q", address: str = "a", **kw):  # type: ignore[no-untyped-def]
    """Declare ``name`` bound to ``address``."""
    q = hub.broker.declare_queue(name, **kw)
    hub.broker.bind_queue(address, name)
    return q


def _pub(hub: Hub, bodies: list[bytes], address: str = "a", **kw) -> None:  # type: ignore[no-untyped-def]
    """Publish and require the commit to have fired."""
    assert result_of(hub.broker.publish_batch(address, bodies, origin="test", **kw)) is None


def test_priority_then_arrival_order(hub: Hub) -> None:
    """Ready order is priority descending, then arrival."""
    q = _queue(hub)
    _pub(hub, [b"n1", b"n2"], priority=0)
    _pub(hub, [b"u1"], priority=9)
    _pub(hub, [b"m1"], priority=5)
    _pub(hub, [b"u2"], priority=9)
    t = CollectingTarget()
    q.attach(t, ready=10)
    assert t.bodies == [b"u1", b"u2", b"m1", b"n1", b"n2"]
    assert [e[PRIORITY] for e in t.entries] == [9, 9, 5, 0, 0]
    assert all(e[ATTEMPTS] == 1 for e in t.entries)


def test_credit_ready_window_limits_in_flight(hub: Hub) -> None:
    """A RDY-style consumer never holds more than its window; acks open room."""
    q = _queue(hub)
    _pub(hub, [b"%d" % i for i in range(10)])
    t = CollectingTarget()
    c = q.attach(t, ready=3)
    assert t.bodies == [b"0", b"1", b"2"] and q.in_flight == 3 and q.depth == 7
    assert q.ack(c, t.ids()[:2]) == []
    assert t.bodies == [b"%d" % i for i in range(5)]
    c.set_ready(0)
    q.ack(c, t.ids()[2:])
    assert len(t.entries) == 5 and q.in_flight == 0
    c.set_ready(100)
    assert len(t.entries) == 10


def test_counted_credit(hub: Hub) -> None:
    """eMQP-style credit: each delivery uses one; in flight is not limited."""
    q = _queue(hub)
    _pub(hub, [b"a", b"b", b"c"])
    t = CollectingTarget()
    c = q.attach(t)
    assert t.entries == []
    c.add_credit(1)
    assert t.bodies == [b"a"]
    c.add_credit(5)
    assert t.bodies == [b"a", b"b", b"c"] and c.credit == 3 and q.in_flight == 3


def test_competing_consumers_share_fan_out_queues_copy(hub: Hub) -> None:
    """Consumers of one queue compete; two queues bound to one address each get a copy."""
    q1 = _queue(hub, "ch1", "topic")
    q2 = _queue(hub, "ch2", "topic")
    a, b, c = CollectingTarget(), CollectingTarget(), CollectingTarget()
    q1.attach(a, ready=2)
    q1.attach(b, ready=2)
    q2.attach(c, ready=10)
    _pub(hub, [b"1", b"2"], address="topic")
    _pub(hub, [b"3", b"4"], address="topic")
    assert sorted(a.bodies + b.bodies) == [b"1", b"2", b"3", b"4"]
    assert a.bodies and b.bodies and not set(a.bodies) & set(b.bodies)
    assert c.bodies == [b"1", b"2", b"3", b"4"]


def test_ack_unknown_or_foreign_id_fails(hub: Hub) -> None:
    """Acking an id not in flight on this consumer reports it and changes nothing."""
    q = _queue(hub)
    _pub(hub, [b"x"])
    t1, t2 = CollectingTarget(), CollectingTarget()
    c1 = q.attach(t1, ready=1)
    c2 = q.attach(t2, ready=1)
    mid = t1.ids()[0]
    assert q.ack(c2, [mid]) == [mid]
    assert q.ack(c1, [12345]) == [12345]
    assert q.in_flight == 1
    assert q.ack(c1, [mid]) == [] and q.in_flight == 0
    assert hub.store.stats()["entries"] == 0


def test_ack_batches_spanning_deliveries_repeats_and_foreign_ids(hub: Hub) -> None:
    """One ack over ids of several delivered batches, with a repeated, a foreign and an
    unknown id: exactly the held ids are finished (once), the rest are reported, in order,
    and the store keeps only what is still in flight."""
    q = _queue(hub)
    _pub(hub, [b"%d" % i for i in range(6)])
    t1, t2 = CollectingTarget(), CollectingTarget()
    c1 = q.attach(t1, ready=2)
    c2 = q.attach(t2, ready=1)
    c1.set_ready(4)                       # a second delivered batch to c1
    mine, theirs = t1.ids(), t2.ids()
    assert len(mine) == 4 and len(theirs) == 1 and len(t1.batches) == 2
    assert q.ack(c1, [mine[1], mine[2]]) == []          # spans the two batches
    assert q.ack(c1, [mine[0], mine[0]]) == [mine[0]]   # repeated: finished once
    assert q.ack(c1, [mine[3], theirs[0], 999]) == [theirs[0], 999]
    # the room opened delivered the sixth message to c1: it and theirs[0] are in flight
    assert len(t1.ids()) == 5 and q.in_flight == 2 and q.depth == 0
    assert hub.store.stats()["entries"] == 2
    sixth = t1.ids()[4]
    assert q.ack(c1, [theirs[0], sixth]) == [theirs[0]]  # every id known, one foreign
    assert q.in_flight == 1 and hub.store.stats()["entries"] == 1
    assert q.ack(c2, theirs) == []
    assert q.in_flight == 0 and hub.store.stats()["entries"] == 0


def test_ack_deletes_the_rows_of_every_priority(hub: Hub) -> None:
    """Acks on a queue that holds several priorities delete each entry's own row."""
    q = _queue(hub)
    _pub(hub, [b"low"], priority=0)
    _pub(hub, [b"high"], priority=7)
    t = CollectingTarget()
    c = q.attach(t, ready=10)
    assert t.bodies == [b"high", b"low"]
    assert q.ack(c, t.ids()) == []
    assert hub.store.stats()["entries"] == 0


def test_requeue_returns_in_place_and_counts_attempts(hub: Hub) -> None:
    """A plain requeue puts the message back at its place; attempts grow per delivery."""
    q = _queue(hub)
    _pub(hub, [b"first", b"second"])
    t = CollectingTarget()
    c = q.attach(t, ready=1)
    assert t.bodies == [b"first"]
    q.requeue(c, t.ids())
    assert t.bodies == [b"first", b"first"]
    assert [e[ATTEMPTS] for e in t.entries] == [1, 2]
    assert q.requeue_count == 1


def test_requeue_with_delay(hub: Hub) -> None:
    """REQ with a delay defers the message; it comes back when due and not before."""
    q = _queue(hub)
    _pub(hub, [b"x"])
    t = CollectingTarget()
    c = q.attach(t, ready=5)
    q.requeue(c, t.ids(), delay=10.0)
    assert q.deferred == 1 and q.depth == 0 and q.in_flight == 0
    hub.clock.advance(9.5)
    assert len(t.entries) == 1
    hub.clock.advance(1.0)
    assert len(t.entries) == 2 and t.entries[1][ATTEMPTS] == 2 and q.deferred == 0


def test_delayed_publish(hub: Hub) -> None:
    """deliver_at in the future holds the batch until due (DPUB)."""
    q = _queue(hub)
    t = CollectingTarget()
    q.attach(t, ready=10)
    _pub(hub, [b"later"], deliver_at=hub.clock.seconds() + 30)
    _pub(hub, [b"now"])
    assert t.bodies == [b"now"] and q.deferred == 1
    hub.clock.advance(29)
    assert t.bodies == [b"now"]
    hub.clock.advance(1.5)
    assert t.bodies == [b"now", b"later"]


def test_timeout_and_touch(hub: Hub) -> None:
    """An unacked message times out after the consumer's timeout; touch extends it."""
    q = _queue(hub)
    _pub(hub, [b"a", b"b"])
    t = CollectingTarget()
    c = q.attach(t, ready=2, timeout=5.0)
    a_id, b_id = t.ids()
    hub.clock.advance(4.0)
    assert q.touch(c, [a_id]) == []
    hub.clock.advance(1.5)
    assert q.timeout_count == 1
    assert t.bodies == [b"a", b"b", b"b"]
    hub.clock.advance(3.0)
    assert q.timeout_count == 1
    hub.clock.advance(1.0)
    assert q.timeout_count == 2


def test_max_attempts_dead_letters_with_reason(hub: Hub) -> None:
    """After max_attempts deliveries a failed message goes to the dead letters with its reason."""
    q = _queue(hub, max_attempts=2)
    _pub(hub, [b"poison"], headers={"k": "v"})
    t = CollectingTarget()
    c = q.attach(t, ready=1)
    q.requeue(c, t.ids()[-1:], error="boom 1")
    q.requeue(c, t.ids()[-1:], error="boom 2")
    assert len(t.entries) == 2 and q.depth == 0 and q.in_flight == 0
    dead = result_of(hub.broker.dead_letters("q"))
    assert len(dead) == 1
    d = dead[0]
    assert (d.body, d.reason, d.last_error, d.attempts, d.origin, d.address, d.headers) == (
        b"poison", "max_attempts", "boom 2", 2, "test", "a", {"k": "v"})
    assert q.dead_letter_count == 1


def test_timeouts_count_towards_max_attempts(hub: Hub) -> None:
    """Timeouts are failed attempts too; the last error says so."""
    q = _queue(hub, max_attempts=1)
    _pub(hub, [b"slow"])
    t = CollectingTarget()
    q.attach(t, ready=1, timeout=2.0)
    hub.clock.advance(3.0)
    dead = result_of(hub.broker.dead_letters("q"))
    assert [(x.body, x.reason, x.last_error) for x in dead] == [(b"slow", "max_attempts", "timeout")]


def test_per_message_max_attempts_header(hub: Hub) -> None:
    """A message may carry its own attempt limit (eMQP retry-count)."""
    q = _queue(hub)
    _pub(hub, [b"j"], headers={MAX_ATTEMPTS_HEADER: "1"})
    t = CollectingTarget()
    c = q.attach(t, ready=1)
    q.requeue(c, t.ids())
    assert q.dead_letter_count == 1 and len(t.entries) == 1


def test_reject_dead_letters_now(hub: Hub) -> None:
    """reject moves in-flight messages straight to the dead letters."""
    q = _queue(hub)
    _pub(hub, [b"bad"])
    t = CollectingTarget()
    c = q.attach(t, ready=1)
    assert q.reject(c, t.ids(), error="cannot parse") == []
    dead = result_of(hub.broker.dead_letters("q"))
    assert [(x.reason, x.last_error) for x in dead] == [("rejected", "cannot parse")]


def test_message_ttl_and_queue_ttl(hub: Hub) -> None:
    """Expired messages are never delivered: per-message expiry and the queue TTL."""
    q = _queue(hub, ttl=100.0)
    _pub(hub, [b"short"], ttl=5.0)
    _pub(hub, [b"old"])
    hub.clock.advance(50)
    _pub(hub, [b"young"])
    hub.clock.advance(60)
    t = CollectingTarget()
    q.attach(t, ready=10)
    assert t.bodies == [b"young"]
    assert q.expired_count == 2
    assert hub.store.stats()["entries"] == 1


def test_ttl_sweep_drops_expired_without_consumers(hub: Hub) -> None:
    """The scheduler's TTL sweep removes expired messages from idle queues."""
    q = _queue(hub, expire_to_dead_letters=True)
    _pub(hub, [b"a", b"b"], ttl=2.0)
    _pub(hub, [b"c"])
    assert q.depth == 3
    hub.clock.advance(3.5)
    assert q.depth == 1 and q.expired_count == 2
    assert [d.reason for d in result_of(hub.broker.dead_letters("q"))] == ["expired", "expired"]


def test_overflow_drop_oldest_latest(hub: Hub) -> None:
    """max_size 1 with drop_oldest keeps only the newest (mq9 ``latest``)."""
    q = _queue(hub, max_size=1, overflow="drop_oldest")
    _pub(hub, [b"1"])
    _pub(hub, [b"2", b"3"])
    assert q.depth == 1 and q.dropped_count == 2
    assert [e[BODY] for e in q.peek(10)] == [b"3"]
    assert hub.store.stats()["entries"] == 1


def test_overflow_reject_is_atomic(hub: Hub) -> None:
    """reject refuses the whole batch before any write, for every bound queue."""
    q = _queue(hub, "small", "t", max_size=2, overflow="reject")
    other = _queue(hub, "big", "t")
    _pub(hub, [b"1"], address="t")
    with pytest.raises(QueueFull):
        hub.broker.publish_batch("t", [b"2", b"3"])
    assert q.depth == 1 and other.depth == 1
    _pub(hub, [b"2"], address="t")
    assert q.depth == 2


def test_overflow_dead_letter(hub: Hub) -> None:
    """dead_letter policy moves the oldest into the dead letters with reason overflow."""
    q = _queue(hub, max_size=2, overflow="dead_letter")
    _pub(hub, [b"1", b"2", b"3"])
    assert [e[BODY] for e in q.peek(5)] == [b"2", b"3"]
    dead = result_of(hub.broker.dead_letters("q"))
    assert [(d.body, d.reason) for d in dead] == [(b"1", "overflow")]


def test_overflow_drops_lowest_priority_first(hub: Hub) -> None:
    """With priorities, the oldest message of the lowest priority is dropped."""
    q = _queue(hub, max_size=2)
    _pub(hub, [b"urgent"], priority=9)
    _pub(hub, [b"normal"], priority=5)
    _pub(hub, [b"urgent2"], priority=9)
    assert [e[BODY] for e in q.peek(5)] == [b"urgent", b"urgent2"]


def test_detach_requeues_in_flight(hub: Hub) -> None:
    """Messages in flight on a consumer that goes away are delivered to another."""
    q = _queue(hub)
    _pub(hub, [b"a", b"b"])
    t1, t2 = CollectingTarget(), CollectingTarget()
    c1 = q.attach(t1, ready=5)
    q.attach(t2, ready=5)
    q.detach(c1)
    assert t2.bodies == [b"a", b"b"]
    assert [e[ATTEMPTS] for e in t2.entries] == [2, 2]


def test_ephemeral_queue_deleted_with_last_consumer(hub: Hub) -> None:
    """A memory-tier auto-delete queue goes away with its last consumer and never hits the store."""
    q = _queue(hub, "ch#ephemeral", "t", tier="memory", auto_delete=True)
    t = CollectingTarget()
    c = q.attach(t, ready=5)
    _pub(hub, [b"x"], address="t")
    assert t.bodies == [b"x"] and hub.store.stats()["entries"] == 0
    q.detach(c)
    assert hub.broker.queue("ch#ephemeral") is None
    assert hub.broker.route("t").queues == ()


def test_pause_unpause_and_empty(hub: Hub) -> None:
    """A paused queue delivers nothing; empty drops stored, in-flight and deferred messages."""
    q = _queue(hub)
    t = CollectingTarget()
    c = q.attach(t, ready=1)
    q.pause()
    _pub(hub, [b"a", b"b"])
    assert t.entries == []
    q.unpause()
    assert t.bodies == [b"a"]
    q.requeue(c, t.ids(), delay=5.0)
    assert t.bodies == [b"a", b"b"] and q.deferred == 1
    result_of(q.empty())
    assert (q.depth, q.in_flight, q.deferred, c.in_flight) == (0, 0, 0, 0)
    assert hub.store.stats()["entries"] == 0
    hub.clock.advance(6)
    assert t.bodies == [b"a", b"b"] and q.depth == 0


def test_take_and_peek_without_consumer(hub: Hub) -> None:
    """peek reads without change; take reads and marks consumed (mq9 QUERY)."""
    q = _queue(hub)
    _pub(hub, [b"n"], priority=5)
    _pub(hub, [b"u"], priority=9)
    assert [e[BODY] for e in q.peek(10)] == [b"u", b"n"]
    assert [e[BODY] for e in q.take(1)] == [b"u"]
    assert q.depth == 1 and hub.store.stats()["entries"] == 1
    t = CollectingTarget()
    q.attach(t, ready=5)
    assert t.bodies == [b"n"]


def test_memory_only_entries_on_durable_queue(hub: Hub) -> None:
    """persist=False (mq9 notify) is delivered but never written."""
    q = _queue(hub)
    _pub(hub, [b"note"], persist=False)
    assert q.depth == 1 and hub.store.stats()["entries"] == 0
    t = CollectingTarget()
    c = q.attach(t, ready=5)
    q.ack(c, t.ids())
    assert t.bodies == [b"note"]


def test_paging_keeps_a_bounded_window(hub: Hub) -> None:
    """Beyond the window a durable queue's backlog stays in the store and is paged in order."""
    from mqhub.testing import memory_hub
    h = memory_hub(window=10)
    q = h.broker.declare_queue("big")
    h.broker.bind_queue("a", "big")
    for i in range(5):
        result_of(h.broker.publish_batch("a", [b"%02d" % (i * 10 + j) for j in range(10)]))
    result_of(h.broker.publish_batch("a", [b"hi"], priority=9))
    assert q.depth == 51 and q.in_memory <= 11
    t = CollectingTarget()
    c = q.attach(t, ready=7)
    got: list[bytes] = []
    while len(got) < 51:
        ids = t.ids()[len(got):]
        assert ids, "delivery stalled"
        got.extend(t.bodies[len(got):])
        q.ack(c, ids)
        assert q.in_memory <= 11
    assert got == [b"hi"] + [b"%02d" % i for i in range(50)]
    assert h.store.stats()["entries"] == 0


def test_mass_requeue_keeps_ready_order(hub: Hub) -> None:
    """Many messages returned at once (consumer gone) merge back into ready order."""
    q = _queue(hub)
    _pub(hub, [b"%03d" % i for i in range(60)], priority=1)
    _pub(hub, [b"%03d" % i for i in range(60, 100)])
    first = CollectingTarget()
    c = q.attach(first, ready=70)
    q.requeue(c, first.ids()[10:40][::-1])
    q.detach(c)
    second = CollectingTarget()
    q.attach(second, ready=1000)
    assert second.bodies == [b"%03d" % i for i in range(100)]


def test_deadline_bookkeeping_stays_bounded(hub: Hub) -> None:
    """Acked batches do not pile up in the timeout heap of a busy queue."""
    q = _queue(hub, tier="memory")
    t = CollectingTarget()
    c = q.attach(t, ready=100, timeout=3600.0)
    for _ in range(500):
        hub.broker.publish_batch("a", [b"x"] * 100)
        q.ack(c, t.ids()[-100:])
    assert q.in_flight == 0 and len(t.entries) == 50_000
    assert q.inflight is not None and q.inflight.heap_ids <= 4096 + 100
