"""A publish whose store commit fails (a full disk) is never delivered, and nothing it put stays.

Durable queues deliver a put only once its batch is committed: before the fix the entries of a
batch sat in the queue's window and were delivered from memory while their commit was still
running, so a commit that then failed (E_PUB_FAILED to the publisher, who retries) had already
been delivered (docs/guarantees.md, defect 6).
"""

from __future__ import annotations

import pytest
from twisted.internet.defer import Deferred

from mqhub.core.queue import Queue
from mqhub.errors import StoreError
from mqhub.hub import Hub
from mqhub.store.batch import WriteBatch
from mqhub.testing import (
    CollectingTarget,
    refusing_hub,
    result_of,
    settle,
)


def bound_queue(hub: Hub) -> Queue:
    """Declare durable queue ``q``, bind it to address ``a`` and return it."""
    hub.broker.declare_queue("q")
    hub.broker.bind_queue("a", "q")
    q = hub.broker.queue("q")
    assert q is not None
    return q


def failed(d: object) -> bool:
    """True when Deferred ``d`` fired with a StoreError (and swallow it)."""
    box: list[object] = []
    d.addBoth(box.append)  # type: ignore[attr-defined]
    return bool(box) and getattr(box[0], "check", lambda *_: False)(StoreError) is not None


def consume_all(hub: Hub, queue: str, target: CollectingTarget) -> list[bytes]:
    """Attach ``target`` to ``queue``, ack everything it gets until the queue is empty."""
    q = hub.broker.queue(queue)
    assert q is not None
    c = q.attach(target, ready=100)
    for _ in range(50):
        settle(hub)
        ids = [e[0] for e in target.entries if c.queue.owner_of(e[0]) is c]
        if ids:
            q.ack(c, ids)
        if not q.depth and not q.in_flight:
            break
    return target.bodies


def test_refused_publish_is_never_delivered() -> None:
    """A consumer waiting on the queue gets nothing of a refused publish; the retry once."""
    hub, store = refusing_hub()
    broker = hub.broker
    q = bound_queue(hub)
    target = CollectingTarget()
    c = q.attach(target, ready=100)
    broker.publish_batch("a", [b"ok-1"])
    settle(hub)
    assert target.bodies == [b"ok-1"]
    store.refuse_puts = True
    d = broker.publish_batch("a", [b"refused-1", b"refused-2"])
    assert target.bodies == [b"ok-1"]          # not before the commit
    assert q.depth == 2                           # counted while it is being stored
    settle(hub)
    assert failed(d)
    assert target.bodies == [b"ok-1"]          # nor after it failed
    assert q.depth == 0 and q.in_flight == 1
    store.refuse_puts = False
    d = broker.publish_batch("a", [b"refused-1", b"refused-2"])   # the publisher's retry
    settle(hub)
    assert result_of(d) is None
    assert target.bodies == [b"ok-1", b"refused-1", b"refused-2"]
    q.ack(c, target.ids())
    settle(hub)
    assert q.depth == 0 and q.in_flight == 0


def test_committed_publish_is_delivered_after_its_commit() -> None:
    """Deliveries of a durable queue follow the commit (not the publish call), in order."""
    hub, _ = refusing_hub()
    broker = hub.broker
    target = CollectingTarget()
    bound_queue(hub).attach(target, ready=100)
    d = broker.publish_batch("a", [b"1", b"2"])
    broker.publish_batch("a", [b"3"])
    assert target.bodies == [] and not d.called
    settle(hub)
    assert d.called and target.bodies == [b"1", b"2", b"3"]


def test_memory_queue_and_volatile_puts_still_deliver_at_once() -> None:
    """Nothing to store, nothing to wait for: memory queues and persist=False deliver inline."""
    hub, _ = refusing_hub()
    broker = hub.broker
    broker.declare_queue("m", tier="memory")
    broker.declare_queue("d")
    broker.bind_queue("a", "m")
    broker.bind_queue("a", "d")
    tm, td = CollectingTarget(), CollectingTarget()
    broker.queue("m").attach(tm, ready=10)  # type: ignore[union-attr]
    broker.queue("d").attach(td, ready=10)  # type: ignore[union-attr]
    broker.publish_batch("a", [b"x"], persist=False)
    assert tm.bodies == [b"x"] and td.bodies == [b"x"]


@pytest.mark.parametrize("window", [2, 100])
def test_refused_puts_beyond_the_window_are_forgotten(window: int) -> None:
    """With a stored backlog (window 2) the refused puts go past the horizon: they are uncounted
    and never paged in; every committed message is consumed exactly once, in order."""
    hub, store = refusing_hub(window=window)
    broker = hub.broker
    broker.declare_queue("q")
    broker.bind_queue("a", "q")
    for i in range(5):
        broker.publish_batch("a", [b"c%d" % i])
    settle(hub)
    store.refuse_puts = True
    d = broker.publish_batch("a", [b"r0", b"r1", b"r2"])
    settle(hub)
    assert failed(d)
    store.refuse_puts = False
    broker.publish_batch("a", [b"c5"])
    settle(hub)
    q = broker.queue("q")
    assert q is not None and q.depth == 6
    got = consume_all(hub, "q", CollectingTarget())
    assert got == [b"c0", b"c1", b"c2", b"c3", b"c4", b"c5"]


def test_eviction_while_puts_await_their_commit() -> None:
    """The window shrinks while a batch is being stored: its puts past the new horizon go to the
    stored backlog (held from paging until committed); each message arrives once, in order."""
    hub, _ = refusing_hub(window=10)
    broker = hub.broker
    broker.declare_queue("q")
    broker.bind_queue("a", "q")
    broker.publish_batch("a", [b"%d" % i for i in range(4)])
    settle(hub)
    broker.publish_batch("a", [b"%d" % i for i in range(4, 8)])
    q = broker.queue("q")
    assert q is not None
    q.configure(window=2)                          # evicts while 4..7 await their commit
    assert q.depth == 8
    settle(hub)
    assert q.depth == 8
    got = consume_all(hub, "q", CollectingTarget())
    assert got == [b"%d" % i for i in range(8)]


def test_refused_due_slice_is_not_delivered() -> None:
    """A delayed publish coming due while the disk refuses its slice is not delivered from
    memory; the scheduler fires the slice again and it is delivered once."""
    hub, store = refusing_hub()
    broker = hub.broker
    q = bound_queue(hub)
    target = CollectingTarget()
    q.attach(target, ready=10)
    broker.publish_batch("a", [b"later"], deliver_at=hub.clock.seconds() + 1)
    settle(hub)
    store.refuse_puts, store.refuse_left = True, 1
    for _ in range(30):
        hub.clock.advance(0.1)
        assert len(target.bodies) <= 1     # never the refused slice and then its retry
    assert store.refused == 1
    assert target.bodies == [b"later"]
    assert q.in_flight == 1 and q.depth == 0


def test_parked_puts_awaiting_their_commit_are_moved_once_stored() -> None:
    """A channel created in the turn that published to its parked topic (NSQ PUB then SUB in one
    read): the parked puts still await their commit; the drain waits for it, loses nothing."""
    hub, _ = refusing_hub()
    broker = hub.broker
    broker.park("t")
    broker.publish_batch("t", [b"p0", b"p1"])
    broker.declare_queue("c")
    broker.bind_queue("t", "c")
    broker.unpark("t")
    target = CollectingTarget()
    q = broker.queue("c")
    assert q is not None
    q.attach(target, ready=10)
    settle(hub, turns=4)
    assert target.bodies == [b"p0", b"p1"]
    assert broker.parked_depth("t") == 0


def test_remembered_tail_is_not_swallowed_before_its_commit() -> None:
    """Puts past the horizon are remembered as the backlog's tail; when the tail is the whole
    backlog it moves into the window without a read, but never before its batch is committed."""
    hub, store = refusing_hub(window=4)
    broker = hub.broker
    q = bound_queue(hub)
    target = CollectingTarget()
    c = q.attach(target, ready=1)
    for i in range(6):    # c0 in flight, c1..c4 in the window, c5 the remembered tail
        broker.publish_batch("a", [b"c%d" % i])
        settle(hub)
    store.refuse_puts = True
    d = broker.publish_batch("a", [b"r0", b"r1"])   # past the horizon: the tail is c5 r0 r1
    for _ in range(8):   # the consumer drains the window while the refused batch is uncommitted
        q.ack(c, [e[0] for e in target.entries if q.owner_of(e[0]) is c])
    settle(hub)
    assert failed(d)
    store.refuse_puts = False
    got = consume_all(hub, "q", target)
    assert got == [b"c%d" % i for i in range(6)]


def test_due_puts_parked_while_their_slice_commits_are_moved_once_stored() -> None:
    """A delayed publish to a parked topic comes due, and a memory channel is bound while the
    scheduler's slice (the parked puts) is still being stored: the drain waits for that commit
    (a barrier covers the scheduler's commits too) and moves the message once it is stored."""
    hub, store = refusing_hub()
    broker = hub.broker
    broker.park("t")
    broker.publish_batch("t", [b"later"], deliver_at=hub.clock.seconds() + 1)
    settle(hub)
    broker.declare_queue("m", tier="memory")
    held: list[tuple[WriteBatch, Deferred[None]]] = []
    commit = store.commit

    def hold(batch: WriteBatch) -> Deferred[None]:
        d: Deferred[None] = Deferred()
        held.append((batch, d))
        return d
    store.commit = hold  # type: ignore[method-assign]
    hub.clock.advance(1.5)                        # the slice runs; its commit is held
    store.commit = commit  # type: ignore[method-assign]
    assert held and broker.router.parking["t"].awaiting_commit == 1
    broker.bind_queue("t", "m")
    for batch, d in held:
        commit(batch).chainDeferred(d)
    target = CollectingTarget()
    broker.queue("m").attach(target, ready=10)  # type: ignore[union-attr]
    settle(hub, turns=4)
    assert target.bodies == [b"later"]
    assert broker.parked_depth("t") == 0


def test_refused_publish_to_a_full_queue_costs_no_message() -> None:
    """A bounded queue (drop-oldest overflow) applies its overflow once a put is stored: a
    refused publish never pushes the oldest messages out; a stored one does."""
    hub, store = refusing_hub()
    broker = hub.broker
    broker.declare_queue("q", max_size=2)
    broker.bind_queue("a", "q")
    broker.publish_batch("a", [b"a", b"b"])
    settle(hub)
    store.refuse_puts = True
    d = broker.publish_batch("a", [b"c"])
    settle(hub)
    assert failed(d)
    q = broker.queue("q")
    assert q is not None and q.depth == 2
    store.refuse_puts = False
    broker.publish_batch("a", [b"c"])
    settle(hub)
    assert q.depth == 2 and q.dropped_count == 1
    assert consume_all(hub, "q", CollectingTarget()) == [b"b", b"c"]


def test_a_failing_due_handler_still_settles_its_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    """A delayed publish to two queues comes due and putting into the second one raises (a
    bug): the first queue's put still settles when the slice commits (no barrier waits for a
    hook that never runs), and the rows are retried, so both queues get the message."""
    hub, _store = refusing_hub()
    broker = hub.broker
    for name in ("a", "b"):
        broker.declare_queue(name)
        broker.bind_queue("t", name)
    broker.publish_batch("t", [b"later"], deliver_at=hub.clock.seconds() + 1)
    settle(hub)
    real_put = Queue.put
    calls: list[str] = []

    def put_once_broken(self: Queue, *args: object, **kw: object) -> object:
        if self.name == "b":
            calls.append(self.name)
            if len(calls) == 1:
                raise RuntimeError("a bug in a put")
        return real_put(self, *args, **kw)  # type: ignore[arg-type]
    monkeypatch.setattr(Queue, "put", put_once_broken)
    hub.clock.advance(1.5)
    settle(hub, turns=4)
    assert calls == ["b"]
    qa = broker.queue("a")
    assert qa is not None and qa.awaiting_commit == 0
    barrier = broker.barrier()
    settle(hub, turns=4)
    assert result_of(barrier) is None
    hub.clock.advance(1.5)                        # the retry a second later
    settle(hub, turns=4)
    assert consume_all(hub, "b", CollectingTarget()) == [b"later"]
    assert set(consume_all(hub, "a", CollectingTarget())) == {b"later"}   # at least once
