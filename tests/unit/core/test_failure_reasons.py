"""Why an ack/requeue/touch failed: Queue.owner_of and Queue.failure_reasons."""

from __future__ import annotations

from mqhub.core.queue import NOT_IN_FLIGHT, NOT_OWNER
from mqhub.hub import Hub
from mqhub.testing import CollectingTarget


def test_fin_of_another_clients_message_is_not_owner(hub: Hub) -> None:
    """Two consumers: acking the other's message fails with not_owner, a bogus id with
    not_in_flight, a ready one with not_in_flight; owner_of names the holder."""
    b = hub.broker
    q = b.declare_queue("q")
    b.bind_queue("a", "q")
    b.publish_batch("a", [b"1", b"2", b"3"])
    ids = list(b.last_ids)
    t1, t2 = CollectingTarget(), CollectingTarget()
    c1 = q.attach(t1, ready=1)
    c2 = q.attach(t2, ready=1)
    mine, theirs = t1.ids()[0], t2.ids()[0]
    ready = next(i for i in ids if i not in (mine, theirs))
    failed = q.ack(c1, [theirs, 999, ready])
    assert failed == [theirs, 999, ready]
    assert q.failure_reasons(c1, failed) == [(theirs, NOT_OWNER), (999, NOT_IN_FLIGHT),
                                             (ready, NOT_IN_FLIGHT)]
    assert q.owner_of(theirs) is c2 and q.owner_of(mine) is c1 and q.owner_of(ready) is None
    assert q.touch(c1, [theirs]) == [theirs] and q.requeue(c1, [theirs]) == [theirs]
    assert q.owner_of(theirs) is c2   # the failed calls changed nothing
    assert q.failure_reasons(c2, [theirs]) == [(theirs, "ok")]


def test_reasons_on_a_fanout_queue(hub: Hub) -> None:
    """Fan-out subscribers each hold their own copy: another subscriber's copy is not_in_flight
    for this one (it has its own), and owner_of on the parent finds a holder."""
    b = hub.broker
    q = b.declare_queue("f", mode="fanout")
    b.bind_queue("a", "f")
    t1, t2 = CollectingTarget(), CollectingTarget()
    c1 = q.attach(t1, credit=10)
    c2 = q.attach(t2, credit=10)
    b.publish_batch("a", [b"x"])
    mid = b.last_ids[0]
    assert q.ack(c1, [mid]) == []
    assert q.failure_reasons(c1, [mid]) == [(mid, NOT_IN_FLIGHT)]
    assert q.owner_of(mid) is c2
