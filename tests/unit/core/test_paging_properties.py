"""Property tests of a small-window durable queue under interleaved publish, deliver, ack, requeue,
commit and restart, over a pipelined MemoryStore and over LmdbStore (issue 10).

Whatever the interleaving: every message is delivered and acked, first deliveries come in ready
order within a priority, and a message is delivered twice only when it was requeued or was in
flight at a restart. The window (3 entries) is far smaller than the backlog, so most of these
runs page while some batch of the queue is uncommitted.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from mqhub.core.tail import ENTRY_COST, tail_limit
from mqhub.hub import Hub
from mqhub.store.lmdb import LmdbStore
from mqhub.testing import CollectingTarget, memory_hub, property_examples, result_of, start_clock

from .pipelined import PipelinedStore

op = st.one_of(
    st.tuples(st.just("pub"), st.integers(1, 8), st.integers(0, 2)),
    st.tuples(st.just("ack"), st.integers(0, 6), st.just(0)),
    st.tuples(st.just("req"), st.integers(0, 3), st.just(0)),
    st.tuples(st.just("rdy"), st.integers(0, 5), st.just(0)),
    st.tuples(st.just("step"), st.just(0), st.just(0)),
    st.tuples(st.just("restart"), st.just(0), st.just(0)),
)


class Harness:
    """One hub over a store that can be committed step by step and restarted."""

    def __init__(self, kind: str, path: str, other: bool = False, **broker_kw: Any) -> None:
        """Open the store (``memory``: PipelinedStore; ``early``: one whose batches are readable
        before they are confirmed; ``lmdb``: LmdbStore in ``path``); ``broker_kw`` go to the
        Broker (``window_bytes``...). ``other``: a second queue ``q2`` bound to ``a`` with no
        consumer shares the broker-wide account of the windows, whose floor is 0."""
        self.kind = kind
        self.other = other
        self.broker_kw = broker_kw
        self.path = path
        self.clock = start_clock()
        self.mem = PipelinedStore(kind == "early") if kind != "lmdb" else None
        self.hub = self._open()
        self.target = CollectingTarget()
        self.deliveries: list[bytes] = []
        self.redeliverable: set[bytes] = set()
        self.consumer = self._attach(2)

    def _open(self) -> Hub:
        """A started hub over the (re)opened store, queue ``q`` (window 3) bound to ``a``."""
        if self.mem is not None:
            self.mem.open()
            store: Any = self.mem
        else:
            store = LmdbStore(self.path, clock=self.clock, durability="none", writer="inline")
            store.open()
        hub = memory_hub(self.clock, store=store, **self.broker_kw)
        hub.broker.declare_queue("q", window=3)
        hub.broker.bind_queue("a", "q")
        if self.other:
            hub.broker.declare_queue("q2")
            hub.broker.bind_queue("a", "q2")
            hub.broker.windows.floor = 0
        return hub

    def _attach(self, ready: int) -> Any:
        """A fresh consumer on ``q``."""
        self.target = CollectingTarget()
        return self.hub.broker.queue("q").attach(self.target, ready=ready)

    @property
    def queue(self) -> Any:
        """The live queue ``q``."""
        return self.hub.broker.queue("q")

    def held(self) -> list[int]:
        """Ids the consumer holds in flight, in delivery order."""
        q, c = self.queue, self.consumer
        return list(dict.fromkeys(e[0] for e in self.target.entries if q.owner_of(e[0]) is c))

    def bodies_of(self, ids: list[int]) -> list[bytes]:
        """The bodies of delivered ids."""
        by_id = {e[0]: e[7] for e in self.target.entries}
        return [by_id[i] for i in ids]

    def step(self) -> None:
        """One commit cycle (and one reactor turn)."""
        if self.mem is not None:
            self.mem.step()
        self.clock.advance(0)

    def restart(self) -> None:
        """Commit everything, stop the broker and start a new one over the same data."""
        self.redeliverable.update(self.bodies_of(self.held()))
        self.deliveries.extend(e[7] for e in self.target.entries)
        if self.mem is not None:
            self.mem.drain()
        else:
            self.clock.advance(0)
        self.hub.scheduler.stopService()
        result_of(self.hub.broker.stop())
        if self.mem is None:
            result_of(self.hub.store.close())
        ready = self.consumer.ready
        # message ids come from the clock: a restart takes time, so new ids sort after old ones
        self.clock.advance(1.0)
        self.hub = self._open()
        self.consumer = self._attach(ready)

    def finish(self) -> list[bytes]:
        """Deliver and ack everything left; return every delivery in order."""
        self.consumer.set_ready(50)
        for _ in range(500):
            self.queue.ack(self.consumer, self.held())
            self.step()
            if not (self.queue.depth or self.queue.in_flight):
                break
        for _ in range(3):
            self.step()
        self.deliveries.extend(e[7] for e in self.target.entries)
        return self.deliveries


def _run(kind: str, ops: list[Any], path: str, other: bool = False, **broker_kw: Any) -> None:
    """Apply ``ops`` and check the properties."""
    h = Harness(kind, path, other, **broker_kw)
    published: list[bytes] = []
    seq = 0
    for name, n, m in ops:
        if name == "pub":
            bodies = [b"%d:%d" % (m, seq + i) for i in range(n)]
            seq += n
            published.extend(bodies)
            h.hub.broker.publish_batch("a", bodies, priority=m)
        elif name == "ack":
            assert h.queue.ack(h.consumer, h.held()[:n]) == []
        elif name == "req":
            ids = h.held()[:n]
            h.redeliverable.update(h.bodies_of(ids))
            assert h.queue.requeue(h.consumer, ids) == []
        elif name == "rdy":
            h.consumer.set_ready(n)
        elif name == "step":
            h.step()
        else:
            h.restart()
    delivered = h.finish()
    assert h.queue.depth == 0 and h.queue.in_flight == 0
    assert set(delivered) == set(published), "a message was never delivered"
    twice = {b for b, k in Counter(delivered).items() if k > 1}
    assert twice <= h.redeliverable, f"delivered twice without a redelivery: {sorted(twice)[:5]}"
    first: dict[bytes, list[int]] = {}
    seen: set[bytes] = set()
    for body in delivered:
        if body not in seen:
            seen.add(body)
            prio, _, n = body.partition(b":")
            first.setdefault(prio, []).append(int(n))
    for prio, order in first.items():
        assert order == sorted(order), f"priority {prio!r} delivered out of order: {order}"
    assert result_of(h.hub.store.count_entries("q")) == 0
    windows = h.hub.broker.windows
    q2 = h.hub.broker.queue("q2")
    assert windows.used == (q2.window_bytes_held if q2 else 0), "the windows' account drifted"
    if q2 is not None:
        assert q2.depth == len(published)
        h.hub.broker.delete_queue("q2")
    assert h.hub.broker.tails.used == 0, "the broker-wide tail account is out of balance"
    assert windows.used == 0, "the broker-wide account of the windows is out of balance"


@settings(max_examples=property_examples(150), deadline=None)
@given(st.lists(op, max_size=60))
def test_small_window_over_a_pipelined_memory_store(ops: list[Any]) -> None:
    """MemoryStore whose commits land one step late (one batch always pending when publishing)."""
    _run("memory", ops, "")


@settings(max_examples=property_examples(100), deadline=None)
@given(st.lists(op, max_size=60))
def test_small_window_over_a_store_that_shows_batches_before_confirming(ops: list[Any]) -> None:
    """Commits readable a step before their callbacks (the LMDB writer thread's case)."""
    _run("early", ops, "")


@settings(max_examples=property_examples(40), deadline=None)
@given(st.lists(op, max_size=60))
def test_small_window_over_lmdb_with_restarts(ops: list[Any]) -> None:
    """LmdbStore grouping commits per clock turn; restarts reopen the same files."""
    with tempfile.TemporaryDirectory() as path:
        _run("lmdb", ops, path)


#: a byte budget whose remembered tail holds 4 entries of these bodies (at most 6 bytes): the
#: backlog outgrows it, so pages are read from the store and the tail is trimmed (the default
#: budget remembers every entry of these runs)
SHORT_TAIL = 4 * (ENTRY_COST + 6) + 3


def test_short_tail_budget_holds_four_entries() -> None:
    """The budget used below does make the tail that short."""
    assert [tail_limit(SHORT_TAIL, n) for n in (3, 6)] == [4, 4]


@settings(max_examples=property_examples(100), deadline=None)
@given(st.lists(op, max_size=60))
def test_small_window_and_short_tail_over_a_pipelined_memory_store(ops: list[Any]) -> None:
    """As above with a 4-entry remembered tail: paging alternates store reads and the tail."""
    _run("memory", ops, "", window_bytes=SHORT_TAIL)


@settings(max_examples=property_examples(60), deadline=None)
@given(st.lists(op, max_size=60))
def test_small_window_and_short_tail_over_an_early_store(ops: list[Any]) -> None:
    """The 4-entry tail over commits readable a step before their callbacks."""
    _run("early", ops, "", window_bytes=SHORT_TAIL)


@settings(max_examples=property_examples(60), deadline=None)
@given(st.lists(op, max_size=60))
def test_small_window_and_a_full_broker_wide_tail_account(ops: list[Any]) -> None:
    """The broker-wide account of all tails leaves room for 3 entries: the queue's own budget
    would remember more, the account refuses, and what is not remembered is read back."""
    _run("memory", ops, "", tails_bytes=3 * (ENTRY_COST + 6))


#: the broker-wide account of the windows holds about two of these bodies (at most 6 bytes):
#: with the queue ``q2`` holding its window, ``q``'s budget is cut to what is left (floor 0),
#: often to its one entry, while ``q2``'s own puts evict it back as ``q`` takes room
TWO_BODIES = 10


@settings(max_examples=property_examples(100), deadline=None)
@given(st.lists(op, max_size=60))
def test_small_window_and_a_full_windows_account_over_a_pipelined_memory_store(
        ops: list[Any]) -> None:
    """Two queues share a windows account of ~2 bodies: budgets shrink and grow with what the
    other window holds; nothing is lost, reordered or delivered twice."""
    _run("memory", ops, "", other=True, windows_bytes=TWO_BODIES)


@settings(max_examples=property_examples(60), deadline=None)
@given(st.lists(op, max_size=60))
def test_small_window_and_a_full_windows_account_over_an_early_store(ops: list[Any]) -> None:
    """The shared windows account over commits readable a step before their callbacks, with a
    4-entry remembered tail."""
    _run("early", ops, "", other=True, windows_bytes=TWO_BODIES, window_bytes=SHORT_TAIL)


@settings(max_examples=property_examples(30), deadline=None)
@given(st.lists(op, max_size=60))
def test_small_window_and_a_full_windows_account_over_lmdb_with_restarts(ops: list[Any]) -> None:
    """The shared windows account over LmdbStore with restarts (the account starts at 0 and
    is charged by what the queues page back in)."""
    with tempfile.TemporaryDirectory() as path:
        _run("lmdb", ops, path, other=True, windows_bytes=TWO_BODIES)
