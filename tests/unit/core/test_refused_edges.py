"""Edges of a refused commit the core once lost track of (docs/guarantees.md, "Known gaps").

A parked message moved by a refused commit, a memory-held delay whose commit is refused when it
comes due, and a removal racing a put's commit: each is delivered (or removed) exactly as if
the commit had not failed, with no restart needed, and nothing is dropped silently.
"""

from __future__ import annotations

import pytest
from twisted.internet.task import Clock

from mqhub.core.broker import Broker
from mqhub.core.queue import Queue
from mqhub.hub import Hub
from mqhub.testing import (
    CollectingTarget,
    RefusingStore,
    advance,
    refusing_hub,
    restart_hub,
    result_of,
    settle,
    start_clock,
)
from tests.unit.core.test_refused_publish import consume_all


def queue_of(hub: Hub, name: str) -> Queue:
    """The queue called ``name``."""
    q = hub.broker.queue(name)
    assert q is not None
    return q


# -- parked messages moved by a refused commit ---------------------------------------------------

def test_parked_messages_moved_by_a_refused_commit_stay_deliverable() -> None:
    """A topic parks two stored messages; a channel is bound while the disk refuses the move:
    the messages go back to the parking queue (still stored there), the move is tried again a
    second later and the channel gets each once, without a restart."""
    hub, store = refusing_hub()
    broker = hub.broker
    broker.park("t")
    broker.publish_batch("t", [b"p0", b"p1"])
    settle(hub)
    assert broker.parked_depth("t") == 2
    broker.declare_queue("c")
    target = CollectingTarget()
    queue_of(hub, "c").attach(target, ready=10)
    store.refuse_puts, store.refuse_left = True, 1
    broker.bind_queue("t", "c")                   # drains the parking queue into c
    settle(hub, turns=4)
    assert store.refused == 1
    assert target.bodies == []
    assert broker.parked_depth("t") == 2          # back where they are stored
    assert queue_of(hub, "c").depth == 0
    assert broker.stats()["refused_retried"] == {"park": 2}
    advance(hub.clock, 1.5)
    settle(hub, turns=4)
    assert target.bodies == [b"p0", b"p1"]
    assert broker.parked_depth("t") == 0
    result_of(broker.unpark("t"))
    assert "t" not in broker.router.parking


def test_a_release_waiting_for_a_refused_move_moves_its_messages_once() -> None:
    """NSQ binds a channel and unparks its topic in one go: the release waits for the drain
    the binding started; that move is refused, so the release moves the messages itself, once,
    and only then forgets the parking queue."""
    hub, store = refusing_hub()
    broker = hub.broker
    broker.park("t")
    broker.publish_batch("t", [b"p0", b"p1"])
    settle(hub)
    broker.declare_queue("c")
    store.refuse_puts, store.refuse_left = True, 1
    broker.bind_queue("t", "c")
    released = broker.unpark("t")
    settle(hub, turns=4)
    assert store.refused == 1
    assert result_of(released) is None
    assert "t" not in broker.router.parking
    advance(hub.clock, 1.5)                       # the armed retry finds nothing left to do
    assert consume_all(hub, "c", CollectingTarget()) == [b"p0", b"p1"]


def test_a_paused_address_resumed_while_the_disk_refuses_keeps_retrying() -> None:
    """Resuming a paused address whose moves keep being refused loses nothing: the held
    messages stay counted and deliverable, and move once the disk takes writes again."""
    hub, store = refusing_hub()
    broker = hub.broker
    broker.declare_queue("q")
    broker.bind_queue("a", "q")
    broker.pause_address("a")
    broker.publish_batch("a", [b"h0", b"h1", b"h2"])
    settle(hub)
    assert broker.parked_depth("a") == 3
    store.refuse_puts = True
    broker.resume_address("a")
    for _ in range(3):                            # three refused moves, a second apart
        advance(hub.clock, 1.0)
        settle(hub, turns=3)
        assert broker.parked_depth("a") == 3
    assert store.refused >= 3
    store.refuse_puts = False
    advance(hub.clock, 1.5)
    settle(hub, turns=4)
    assert broker.parked_depth("a") == 0
    assert consume_all(hub, "q", CollectingTarget()) == [b"h0", b"h1", b"h2"]


def test_a_refused_move_of_a_big_parking_queue_keeps_its_stored_backlog() -> None:
    """A parking queue with a stored backlog beyond its window (window 2): the first page's
    move is refused; every message still arrives once, in order."""
    hub, store = refusing_hub(window=2)
    broker = hub.broker
    broker.park("t")
    for i in range(5):
        broker.publish_batch("t", [b"m%d" % i])
        settle(hub)
    broker.declare_queue("c")
    store.refuse_puts, store.refuse_left = True, 1
    broker.bind_queue("t", "c")
    broker.unpark("t")
    settle(hub, turns=6)
    advance(hub.clock, 1.5)
    settle(hub, turns=6)
    assert broker.parked_depth("t") == 0
    assert consume_all(hub, "c", CollectingTarget()) == [b"m%d" % i for i in range(5)]


# -- memory-held delays whose commit is refused when they come due -------------------------------

def broker_without_scheduler() -> tuple[Broker, RefusingStore, Clock]:
    """A started Broker with no scheduler (every delay is clock-held) over a RefusingStore."""
    clock = start_clock()
    store = RefusingStore(clock)
    store.open()
    broker = Broker(store, clock)
    result_of(broker.start())
    broker.declare_queue("q")
    broker.bind_queue("a", "q")
    return broker, store, clock


def test_a_memory_held_delayed_publish_refused_when_due_is_retried_and_counted() -> None:
    """No scheduler: a delayed publish is held on a clock timer and stored when due. The disk
    refuses that commit twice: the message stays counted as deferred, the refusals are counted,
    and it is delivered once when the disk takes it."""
    broker, store, clock = broker_without_scheduler()
    q = broker.queue("q")
    assert q is not None
    target = CollectingTarget()
    q.attach(target, ready=10)
    broker.publish_batch("a", [b"later"], deliver_at=clock.seconds() + 1)
    clock.advance(0)
    store.refuse_puts, store.refuse_left = True, 2
    advance(clock, 1.5)
    assert store.refused == 1
    assert target.bodies == [] and q.deferred == 1
    advance(clock, 1.2)
    assert store.refused == 2 and target.bodies == [] and q.deferred == 1
    advance(clock, 1.2)
    assert target.bodies == [b"later"]
    assert q.deferred == 0 and q.in_flight == 1
    assert broker.stats()["refused_retried"] == {"delay": 2}


def test_a_memory_held_requeue_delay_refused_when_due_is_retried() -> None:
    """No scheduler: a requeue with a delay is clock-held; the commit storing it when due is
    refused, and it is put again a second later (delivered once more, not lost)."""
    broker, store, clock = broker_without_scheduler()
    q = broker.queue("q")
    assert q is not None
    target = CollectingTarget()
    c = q.attach(target, ready=10)
    broker.publish_batch("a", [b"job"])
    clock.advance(0)
    clock.advance(0)
    assert target.bodies == [b"job"]
    q.requeue(c, target.ids(), delay=1.0)
    clock.advance(0)
    store.refuse_puts, store.refuse_left = True, 1
    advance(clock, 1.5)
    assert store.refused == 1 and target.bodies == [b"job"] and q.deferred == 1
    advance(clock, 1.2)
    assert target.bodies == [b"job", b"job"]
    assert q.deferred == 0
    assert broker.counters.retried["delay"] == 1


# -- remove by id racing a put's commit ----------------------------------------------------------

def test_remove_wins_over_a_put_awaiting_its_commit() -> None:
    """An entry removed while its put still awaits the commit never enters the window: the
    consumer gets only the other one, its stored row is deleted once the put is committed, and
    a restart does not bring it back."""
    hub, _ = refusing_hub()
    broker = hub.broker
    broker.declare_queue("q")
    broker.bind_queue("a", "q")
    broker.publish_batch("a", [b"x", b"y"])
    x, _y = broker.last_ids
    q = queue_of(hub, "q")
    assert q.awaiting_commit == 2
    assert q.remove([x, 4242]) == [4242]
    assert q.depth == 1
    target = CollectingTarget()
    q.attach(target, ready=10)
    settle(hub, turns=4)
    assert target.bodies == [b"y"]
    assert hub.store.stats()["entries"] == 1
    hub2 = restart_hub(hub)
    settle(hub2, turns=4)
    assert consume_all(hub2, "q", CollectingTarget()) == [b"y"]


def test_remove_of_a_put_whose_commit_is_refused() -> None:
    """Removing a put that is then refused: nothing is delivered, nothing stored, no error."""
    hub, store = refusing_hub()
    broker = hub.broker
    broker.declare_queue("q")
    broker.bind_queue("a", "q")
    store.refuse_puts = True
    broker.publish_batch("a", [b"x", b"y"])
    x, _y = broker.last_ids
    q = queue_of(hub, "q")
    assert q.remove([x]) == []
    settle(hub, turns=4)
    assert q.depth == 0 and hub.store.stats()["entries"] == 0
    store.refuse_puts = False
    assert consume_all(hub, "q", CollectingTarget()) == []


def test_remove_a_put_awaiting_its_commit_on_a_queue_with_a_stored_backlog() -> None:
    """A queue with a small window (3): a put of a higher priority awaiting its commit sorts
    inside the window and can be removed; everything else is consumed once, in order."""
    hub, _ = refusing_hub(window=3)
    broker = hub.broker
    q = broker.declare_queue("q")
    broker.bind_queue("a", "q")
    broker.bind_queue("b", "q")
    broker.publish_batch("a", [b"c0", b"c1"])
    settle(hub)
    broker.publish_batch("b", [b"hi"], priority=5)     # sorts first: awaits inside the window
    hi = broker.last_ids[0]
    assert q.remove([hi]) == []
    settle(hub, turns=4)
    assert consume_all(hub, "q", CollectingTarget()) == [b"c0", b"c1"]
    settle(hub)
    assert hub.store.stats()["entries"] == 0


def test_a_drain_that_raises_does_not_block_the_next_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drains of an address run one at a time; one that fails with a bug (a put raising) still
    ends, so the next drain (another binding) moves the messages."""
    hub, _ = refusing_hub()
    broker = hub.broker
    broker.park("t")
    broker.publish_batch("t", [b"p0"])
    settle(hub)
    broker.declare_queue("c")
    real_put = Queue.put
    calls: list[str] = []

    def put_once_broken(self: Queue, *args: object, **kw: object) -> object:
        if self.name == "c" and not calls:
            calls.append(self.name)
            raise RuntimeError("a bug in a put")
        return real_put(self, *args, **kw)  # type: ignore[arg-type]
    monkeypatch.setattr(Queue, "put", put_once_broken)
    broker.bind_queue("t", "c")                   # its drain fails (logged)
    settle(hub, turns=4)
    assert calls == ["c"]
    broker.publish_batch("t", [b"p1"])            # reaches c directly: t has a queue now
    broker.pause_address("t")
    broker.publish_batch("t", [b"p2"])            # held while paused
    settle(hub, turns=4)
    resumed = broker.resume_address("t")          # a later drain is not stuck behind it
    settle(hub, turns=4)
    assert result_of(resumed) is None
    assert broker.parked_depth("t") == 0
    assert consume_all(hub, "c", CollectingTarget()) == [b"p1", b"p2"]
