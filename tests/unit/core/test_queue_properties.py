"""Property test: random publish/ack/requeue/timeout sequences never lose or duplicate a message."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from mqhub.store.memory import MemoryStore
from mqhub.testing import CollectingTarget, memory_hub, property_examples, result_of, start_clock

op = st.one_of(
    st.tuples(st.just("pub"), st.integers(1, 6), st.integers(0, 3)),
    st.tuples(st.just("ack"), st.integers(0, 5), st.just(0)),
    st.tuples(st.just("req"), st.integers(0, 5), st.integers(0, 2)),
    st.tuples(st.just("rdy"), st.integers(0, 4), st.just(0)),
    st.tuples(st.just("tick"), st.integers(1, 4), st.just(0)),
    st.tuples(st.just("take"), st.integers(0, 3), st.just(0)),
    st.tuples(st.just("touch"), st.integers(0, 3), st.just(0)),
)


@settings(max_examples=property_examples(120), deadline=None)
@given(st.lists(op, max_size=40), st.booleans())
def test_every_message_is_delivered_until_acked_exactly_once(ops: list[Any], grouped: bool) -> None:
    """Whatever the interleaving, each published message is acked once and the store ends empty."""
    clock = start_clock()
    store = MemoryStore(clock=clock if grouped else None)
    store.open()
    hub = memory_hub(clock, store=store, window=4)
    b = hub.broker
    q = b.declare_queue("q")
    b.bind_queue("a", "q")
    t = CollectingTarget()
    c = q.attach(t, ready=3, timeout=2.0)
    published: list[bytes] = []
    acked: list[bytes] = []
    seq = 0
    for kind, n, m in ops:
        inflight = list(q.in_flight_by_id)
        if kind == "pub":
            bodies = [b"%d" % (seq + i) for i in range(n)]
            seq += n
            published.extend(bodies)
            b.publish_batch("a", bodies, priority=m)
        elif kind == "ack":
            ids = inflight[:n]
            acked.extend(q.in_flight_by_id[i][7] for i in ids)
            assert q.ack(c, ids) == []
        elif kind == "req":
            assert q.requeue(c, inflight[:n], delay=float(m)) == []
        elif kind == "rdy":
            c.set_ready(n)
        elif kind == "take":
            acked.extend(e[7] for e in q.take(n))
        elif kind == "touch":
            assert q.touch(c, inflight[:n]) == []
        else:
            clock.advance(n)
        clock.advance(0)
    c.set_ready(1000)
    for _ in range(200):
        clock.advance(0.5)
        if q.in_flight:
            ids = list(q.in_flight_by_id)
            acked.extend(q.in_flight_by_id[i][7] for i in ids)
            q.ack(c, ids)
        if not (q.depth or q.in_flight or q.deferred):
            clock.advance(0)
            break
    assert sorted(acked) == sorted(published)
    assert len(set(acked)) == len(acked)
    assert result_of(store.count_entries("q")) == 0
