"""Fan-out queues: every consumer gets its own copy, acked independently (VibeMQ-style)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from mqhub.hub import Hub
from mqhub.testing import CollectingTarget, memory_hub, property_examples, result_of


def _fan(hub: Hub, **kw):  # type: ignore[no-untyped-def]
    """A durable fan-out queue bound to ``f``."""
    q = hub.broker.declare_queue("fan", mode="fanout", **kw)
    hub.broker.bind_queue("f", "fan")
    return q


def test_every_consumer_gets_every_message_and_acks_alone(hub: Hub) -> None:
    """Two consumers each receive both messages; the stored entry goes when both acked."""
    q = _fan(hub)
    a, b = CollectingTarget(), CollectingTarget()
    ca = q.attach(a, ready=10)
    cb = q.attach(b, ready=10)
    hub.broker.publish_batch("f", [b"1", b"2"])
    assert a.bodies == [b"1", b"2"] and b.bodies == [b"1", b"2"]
    assert q.in_flight == 4 and q.stats()["consumers"] == 2
    assert q.ack(ca, a.ids()) == []
    assert hub.store.stats()["entries"] == 2
    assert q.ack(cb, b.ids()[:1]) == []
    assert hub.store.stats()["entries"] == 1
    assert q.ack(cb, a.ids()[:1]) == [a.ids()[0]]
    q.ack(cb, b.ids()[1:])
    assert hub.store.stats()["entries"] == 0 and q.in_flight == 0


def test_backlog_goes_to_the_first_subscriber(hub: Hub) -> None:
    """Messages published with nobody subscribed are delivered on subscribe."""
    q = _fan(hub)
    hub.broker.publish_batch("f", [b"early"])
    assert q.depth == 1
    t = CollectingTarget()
    q.attach(t, ready=5)
    assert t.bodies == [b"early"] and q.depth == 0


def test_per_subscriber_redelivery_and_dead_letters(hub: Hub) -> None:
    """A timeout redelivers only to the slow subscriber; its dead letter does not touch the other."""
    q = _fan(hub, max_attempts=2)
    fast, slow = CollectingTarget(), CollectingTarget()
    cf = q.attach(fast, ready=5, timeout=10.0)
    q.attach(slow, ready=5, timeout=2.0)
    hub.broker.publish_batch("f", [b"m"])
    q.ack(cf, fast.ids())
    hub.clock.advance(2.5)
    assert slow.bodies == [b"m", b"m"] and fast.bodies == [b"m"]
    hub.clock.advance(2.5)
    dead = result_of(hub.broker.dead_letters("fan"))
    assert [(d.body, d.reason, d.last_error) for d in dead] == [(b"m", "max_attempts", "timeout")]
    assert hub.store.stats()["entries"] == 1          # only the dead letter is left


def test_leaving_subscribers(hub: Hub) -> None:
    """A subscriber that leaves forfeits its copies; the last one leaving returns them to the backlog."""
    q = _fan(hub)
    a, b = CollectingTarget(), CollectingTarget()
    ca = q.attach(a, ready=5)
    cb = q.attach(b, ready=5)
    hub.broker.publish_batch("f", [b"x"])
    q.ack(ca, a.ids())
    q.detach(cb)
    assert hub.store.stats()["entries"] == 0 and q.depth == 0
    hub.broker.publish_batch("f", [b"y"])
    q.detach(ca)
    assert q.depth == 1 and hub.store.stats()["entries"] == 1
    c = CollectingTarget()
    q.attach(c, ready=5)
    assert c.bodies == [b"y"]


def test_unacked_fanout_messages_survive_restart() -> None:
    """After a restart, messages not acked by every subscriber are the new backlog."""
    hub = memory_hub()
    q = _fan(hub)
    a = CollectingTarget()
    ca = q.attach(a, ready=5)
    hub.broker.publish_batch("f", [b"1", b"2"])
    q.ack(ca, a.ids()[:1])
    hub.scheduler.stopService()
    hub.broker.stop()
    fresh = memory_hub(hub.clock, store=hub.store)
    q2 = fresh.broker.queue("fan")
    assert q2 is not None and q2.mode == "fanout" and q2.depth == 1
    t = CollectingTarget()
    q2.attach(t, ready=5)
    assert t.bodies == [b"2"]


_op = st.one_of(
    st.tuples(st.just("pub"), st.integers(0, 1), st.integers(1, 5)),
    st.tuples(st.just("ack"), st.integers(0, 1), st.integers(0, 4)),
    st.tuples(st.just("req"), st.integers(0, 1), st.integers(0, 4)),
    st.tuples(st.just("tick"), st.integers(0, 1), st.integers(1, 3)),
)


@settings(max_examples=property_examples(100), deadline=None)
@given(st.lists(_op, max_size=30))
def test_each_subscriber_acks_each_message_once(ops: list[Any]) -> None:
    """Whatever the interleaving, every subscriber ends with exactly one ack per message."""
    hub = memory_hub(window=4)
    q = _fan(hub)
    targets = [CollectingTarget(), CollectingTarget()]
    cons = [q.attach(t, ready=3, timeout=2.0) for t in targets]
    published: list[bytes] = []
    acked: list[list[bytes]] = [[], []]
    seq = 0
    for kind, who, n in ops:
        sub = cons[who].queue
        held = list(sub.in_flight_by_id)
        if kind == "pub":
            bodies = [b"%d" % (seq + i) for i in range(n)]
            seq += n
            published.extend(bodies)
            hub.broker.publish_batch("f", bodies, priority=n % 2)
        elif kind == "ack":
            acked[who].extend(sub.in_flight_by_id[i][7] for i in held[:n])
            assert q.ack(cons[who], held[:n]) == []
        elif kind == "req":
            assert q.requeue(cons[who], held[:n]) == []
        else:
            hub.clock.advance(n)
    for c in cons:
        c.set_ready(1000)
    for _ in range(50):
        hub.clock.advance(0.5)
        for who, c in enumerate(cons):
            sub = c.queue
            ids = list(sub.in_flight_by_id)
            acked[who].extend(sub.in_flight_by_id[i][7] for i in ids)
            q.ack(c, ids)
    for who in (0, 1):
        assert sorted(acked[who]) == sorted(published)
    assert hub.store.stats()["entries"] == 0
