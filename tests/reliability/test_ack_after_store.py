"""Regression: an eMQP dispatch acknowledgement is sent only after its job is stored.

Found by the eMQP crash cycles (588 confirmed jobs lost over 100 kill -9 cycles, always the
last ones acknowledged before the kill, always with the store's writer thread on): the router
took one ``broker.barrier()`` and let every acknowledgement of later turns ride on it while it
was outstanding, so a job published after that barrier was taken was acknowledged as soon as
the *earlier* commits were durable. Now the acknowledgements of a turn wait on a barrier taken
at the end of that turn.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred

from mqhub.store.memory import MemoryStore
from mqhub.testing import memory_hub, start_clock
from tests.unit.protocols.emqp.helpers import Rig, V, job


class HeldStore(MemoryStore):
    """A MemoryStore whose commits become durable only when the test says so."""

    def __init__(self) -> None:
        """No held commits yet."""
        super().__init__()
        self.held: list[Deferred[None]] = []

    def commit(self, batch: Any) -> Deferred[None]:
        """Apply at once, confirm later (:meth:`release`)."""
        super().commit(batch)
        d: Deferred[None] = Deferred()
        self.held.append(d)
        return d

    def release(self, i: int) -> None:
        """Make commit ``i`` durable."""
        if not self.held[i].called:
            self.held[i].callback(None)

    def release_all(self) -> None:
        """Make every commit so far durable."""
        for i in range(len(self.held)):
            self.release(i)


def acks(rig: Rig) -> list[bytes]:
    """Request ids of the dispatch acknowledgements sent so far."""
    return [f[-1] for f in rig.front if f[3] == b"REPLY" and len(f) == 6]


def held_rig(queues: list[list[object]], ready: int) -> tuple[Any, HeldStore, Rig]:
    """(clock, store, rig) with worker ``w1`` serving ``queues``, its setup already durable."""
    clock = start_clock()
    store = HeldStore()
    store.open()
    rig = Rig(memory_hub(clock, store=store))
    rig.worker(b"w1", queues, ready=ready)
    store.release_all()
    return clock, store, rig


def test_ack_of_a_later_turn_waits_for_its_own_commit() -> None:
    """m1's barrier is outstanding when m2 is published: m1's durability must not release m2's ack."""
    clock, store, rig = held_rig([[10, "q"]], 2)
    first = len(store.held)
    rig.request(b"client", b"m1", b"q", b"guarantee")
    clock.advance(0)
    rig.request(b"client", b"m2", b"q", b"guarantee")
    clock.advance(0)
    assert rig.jobs_to(b"w1") == []  # a job is dispatched once it is stored
    assert acks(rig) == []
    store.release(first)  # m1's job is durable, m2's is not
    clock.advance(0)
    assert rig.jobs_to(b"w1") == [b"m1"]
    assert b"m2" not in acks(rig)  # (m1's ack, sealed in this turn, waits for m2's commit too)
    for i in range(first + 1, len(store.held)):
        store.release(i)
    clock.advance(0)
    for i in range(first + 1, len(store.held)):
        store.release(i)
    assert rig.jobs_to(b"w1") == [b"m1", b"m2"]
    assert acks(rig) == [b"m1", b"m2"]


def test_acks_of_one_turn_wait_for_every_commit_of_that_turn() -> None:
    """Two queues in one read: the first dispatch's ack waits for the second queue's commit too."""
    clock, store, rig = held_rig([[10, "a"], [10, "b"]], 2)
    first = len(store.held)
    rig.router.frontend_received([[b"client", b"", V, b"REQUEST", b"ma", b"a", b"guarantee", job()],
                                  [b"client", b"", V, b"REQUEST", b"mb", b"b", b"guarantee", job()]])
    clock.advance(0)
    assert rig.jobs_to(b"w1") == []  # dispatched once stored
    store.release(first)
    assert acks(rig) == []  # the second queue's job is not durable yet
    for i in range(first + 1, len(store.held)):
        store.release(i)
    clock.advance(0)
    store.release_all()
    assert sorted(rig.jobs_to(b"w1")) == [b"ma", b"mb"]
    assert sorted(acks(rig)) == [b"ma", b"mb"]


def test_no_ack_when_the_jobs_commit_fails() -> None:
    """A job whose commit fails is never acknowledged as dispatched (no confirmation unstored)."""
    from mqhub.errors import StoreError

    clock, store, rig = held_rig([[10, "q"]], 1)
    first = len(store.held)
    rig.request(b"client", b"m1", b"q", b"guarantee")
    clock.advance(0)
    store.held[first].errback(StoreError("disk full"))
    store.release_all()
    clock.advance(0)
    assert acks(rig) == []
