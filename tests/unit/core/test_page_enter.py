"""Pages read back from the store enter the window in order, counted once (NSQ part 6).

A page of one priority is in id order (``IStore.read_entries`` reads in ready order), so when
it sorts after its priority's deque it is appended as it is; a page that shares no id with the
in-flight map is kept without an entry-by-entry filter. These tests hold the window's counters
(entries and body bytes) to the entries really there at every step, and the delivery order to
ready order, across many pages, in-flight overlap, requeues and mixed priorities.
"""

from __future__ import annotations

from typing import Any

from mqhub.core.queue import Queue
from mqhub.hub import Hub
from mqhub.testing import CollectingTarget, memory_hub

SIZE = 8  # every body of these tests is SIZE bytes: the window's bytes are in_memory * SIZE


def _hub(window: int) -> tuple[Hub, Queue]:
    """A memory hub with queue ``q`` (window ``window``) bound to address ``a``."""
    hub = memory_hub(window=window)
    q = hub.broker.declare_queue("q", window=window)
    hub.broker.bind_queue("a", "q")
    return hub, q


def _bodies(first: int, count: int) -> list[bytes]:
    """``count`` numbered bodies of SIZE bytes from ``first`` on."""
    return [b"m-%06d" % i for i in range(first, first + count)]


def _check_counts(q: Queue, window: int) -> None:
    """The window's counters agree with each other and with the window size."""
    held = q.stats()["in_memory"]
    assert 0 <= held <= window
    assert q.window_bytes_held == held * SIZE


def _drain(hub: Hub, q: Queue, t: CollectingTarget, consumer: Any, window: int,
           steps: int = 400) -> None:
    """Ack what ``consumer`` holds, step by step, until nothing is ready or in flight."""
    for _ in range(steps):
        hub.clock.advance(0)
        _check_counts(q, window)
        ids = [e[0] for e in t.entries if q.owner_of(e[0]) is consumer]
        if ids:
            assert q.ack(consumer, ids) == []
        if not q.depth and not q.stats()["in_flight"]:
            break
    assert q.stats()["in_flight"] == 0
    assert q.depth == 0 and q.stats()["in_memory"] == 0 and q.window_bytes_held == 0


def test_many_single_priority_pages_arrive_in_order_counted_once() -> None:
    """120 messages through a window of 10 (eleven pages of one priority) while a consumer with
    RDY 4 keeps entries in flight: each arrives once, in publish order, and the window's entry
    and byte counts match at every step (a page appended without being counted, or counted
    twice, drives them apart and leaves them non-zero at the end)."""
    hub, q = _hub(10)
    hub.broker.publish_batch("a", _bodies(0, 120))
    hub.clock.advance(0)
    assert q.depth == 120
    _check_counts(q, 10)
    t = CollectingTarget()
    c = q.attach(t, ready=4)
    _drain(hub, q, t, c, 10)
    assert t.bodies == _bodies(0, 120)


def test_requeued_entries_and_pages_keep_ready_order() -> None:
    """Requeueing the oldest in-flight messages while pages keep arriving: every message is
    delivered, the requeued ones again, and each delivery run is in id order within the
    queue's ready order (no page overtakes an older requeued entry)."""
    hub, q = _hub(10)
    hub.broker.publish_batch("a", _bodies(0, 60))
    hub.clock.advance(0)
    t = CollectingTarget()
    c = q.attach(t, ready=5)
    hub.clock.advance(0)
    first = [e[0] for e in t.entries]
    bodies = [e[7] for e in t.entries]
    assert len(first) == 5
    t.clear()
    q.requeue(c, first[:2])
    assert q.ack(c, first[2:]) == []
    seen: list[int] = []
    for _ in range(400):
        hub.clock.advance(0)
        _check_counts(q, 10)
        held = [e[0] for e in t.entries if q.owner_of(e[0]) is c]
        seen.extend(e[0] for e in t.entries)
        bodies.extend(e[7] for e in t.entries)
        t.clear()
        if held:
            assert q.ack(c, held) == []
        if not q.depth and not q.stats()["in_flight"]:
            break
    assert q.depth == 0 and q.stats()["in_flight"] == 0 and q.window_bytes_held == 0
    ids = first + seen
    assert sorted(set(bodies)) == _bodies(0, 60) and len(set(ids)) == 60
    assert len(ids) == 62  # the two requeued ones twice
    after = seen[seen.index(first[0]):]
    assert after[:2] == first[:2]  # the requeued pair goes out before anything newer


def test_a_page_of_mixed_priorities_is_merged_in_ready_order() -> None:
    """Two priorities in the stored backlog: pages that cross from one to the other take the
    merging path; the consumer gets every high-priority message before the low ones that were
    stored-only, each priority in id order, each once."""
    hub, q = _hub(10)
    hub.broker.publish_batch("a", _bodies(0, 40), priority=0)
    hub.broker.publish_batch("a", _bodies(100, 40), priority=5)
    hub.clock.advance(0)
    assert q.depth == 80
    t = CollectingTarget()
    c = q.attach(t, ready=3)
    _drain(hub, q, t, c, 10)
    got = t.bodies
    assert sorted(got) == sorted(_bodies(0, 40) + _bodies(100, 40))
    high = [b for b in got if b >= b"m-000100"]
    low = [b for b in got if b < b"m-000100"]
    assert high == _bodies(100, 40) and low == _bodies(0, 40)
    # the stored-only low-priority messages (beyond the first window) all follow the high ones
    assert max(got.index(b) for b in high) < min(got.index(b) for b in _bodies(10, 30))
