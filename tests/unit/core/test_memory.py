"""Memory of idle queues: slotted, containers made on first use, one expiry timer for all.

The byte bounds are measured with tracemalloc over many declare_queue calls (the figures in
docs/core-api.md come from the same measurement); they fail if an idle queue grows back.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable

from mqhub.core import empty as empty_module
from mqhub.core.address import AddressTrie
from mqhub.hub import Hub
from mqhub.testing import CollectingTarget, result_of


def bytes_per_call(hub: Hub, n: int, make: Callable[[int], None]) -> float:
    """Bytes still allocated after ``make(i)`` for i in range(n), per call."""
    make(-1)
    hub.clock.advance(0)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for i in range(n):
            make(i)
        hub.clock.advance(0)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    return sum(s.size_diff for s in after.compare_to(before, "filename")) / n


def test_an_idle_durable_queue_costs_under_1200_bytes(hub: Hub) -> None:
    """Queue object, name, settings record (kept by the MemoryStore) and index: < 1.2 KB."""
    cost = bytes_per_call(hub, 3000, lambda i: hub.broker.declare_queue(f"idle.{i:08d}"))
    assert cost < 1200, cost


def test_an_idle_memory_queue_with_expiry_costs_under_800_bytes(hub: Hub) -> None:
    """A memory queue with its own expiry adds one heap item, not a timer of its own."""
    at = hub.clock.seconds() + 3600
    before = len(hub.clock.getDelayedCalls())
    cost = bytes_per_call(hub, 3000, lambda i: hub.broker.declare_queue(
        f"mem.{i:08d}", tier="memory", expires_at=at + i))
    assert cost < 800, cost
    assert len(hub.clock.getDelayedCalls()) - before <= 1


def test_a_mailbox_shaped_trio_costs_under_6000_bytes(hub: Hub) -> None:
    """Three queues with an expiry and one binding each (an mq9 mailbox) stay under 6 KB."""
    at = hub.clock.seconds() + 86400

    def mailbox(i: int) -> None:
        for prio, tier in (("urgent", "durable"), ("normal", "memory"), ("low", "memory")):
            name = f"mb/m{i:010d}/{prio}"
            hub.broker.declare_queue(name, tier=tier, expires_at=at)
            hub.broker.bind_queue(f"inbox.m{i:010d}.{prio}", name)
    cost = bytes_per_call(hub, 2000, mailbox)
    assert cost < 6000, cost


def test_queues_are_slotted_and_idle_ones_share_empty_stand_ins(hub: Hub) -> None:
    """No instance dict; two idle queues hold the same immutable empty containers."""
    a = hub.broker.declare_queue("a")
    b = hub.broker.declare_queue("b")
    for obj in (a, a.ready, a.backlog, a.delivery):
        assert not hasattr(obj, "__dict__"), obj
    assert a.inflight is None and b.inflight is None    # made at the first delivery
    for name, get in (("prios", lambda q: q.ready.prios),
                      ("volatile", lambda q: q.ready.volatile),
                      ("consumers", lambda q: q.consumers),
                      ("in flight", lambda q: q.in_flight_by_id)):
        assert get(a) is get(b), name
        assert len(get(a)) == 0, name


def test_using_one_queue_never_writes_into_the_shared_stand_ins(hub: Hub) -> None:
    """Every path that fills a container gives the queue its own; idle queues stay empty."""
    broker = hub.broker
    idle = broker.declare_queue("idle", tier="memory")
    used = broker.declare_queue("used", tier="memory", max_attempts=1)
    broker.bind_queue("used", "used")
    fan = broker.declare_queue("fan", mode="fanout")
    broker.bind_queue("used", "fan")
    dur = broker.declare_queue("dur")
    broker.bind_queue("used", "dur")
    broker.publish_batch("used", [b"a", b"b", b"c", b"d", b"e", b"f"], persist=False)
    t = CollectingTarget()
    c = used.attach(t, ready=2)
    assert len(t.entries) == 2
    used.ack(c, [t.entries[0][0]])
    used.requeue(c, [t.entries[1][0]])
    assert used.remove([used.peek(1)[0][0]]) == []
    assert used.dead_letter_count == 1
    f1, f2 = CollectingTarget(), CollectingTarget()
    fan.attach(f1, ready=10)
    fc = fan.attach(f2, ready=10)
    fan.detach(fc)
    d = CollectingTarget()
    dc = dur.attach(d, ready=1)
    dur.reject(dc, [d.entries[0][0]])
    dur.detach(dc)
    used.detach(c)
    used.empty()
    hub.clock.advance(61)
    assert idle.inflight is None and idle.depth == 0
    for name, part in (("prios", idle.ready.prios), ("volatile", idle.ready.volatile),
                       ("consumers", idle.consumers), ("in flight", idle.in_flight_by_id),
                       ("memory dead letters", idle.memory_dead_letters())):
        assert len(part) == 0, name
    assert len(empty_module.NO_MAP) == 0 and len(empty_module.NO_IDS) == 0
    assert empty_module.NO_LIST == ()
    assert [x.body for x in result_of(broker.dead_letters("dur"))] == [b"a"]


def test_memory_queue_expiries_fire_in_order_from_one_timer(hub: Hub) -> None:
    """100 memory queues expiring a second apart are deleted on time; changes re-arm."""
    broker = hub.broker
    now = hub.clock.seconds()
    for i in range(100):
        broker.declare_queue(f"x{i}", tier="memory", expires_at=now + 100 - i)
    later = broker.declare_queue("later", tier="memory", expires_at=now + 5)
    later.configure(expires_at=now + 500)
    hub.clock.advance(50.5)
    assert sorted(q.name for q in broker.queues()) == sorted(
        [f"x{i}" for i in range(50)] + ["later"])
    hub.clock.advance(50)
    assert [q.name for q in broker.queues()] == ["later"]
    hub.clock.advance(400)
    assert broker.queues() == []


def test_trie_nodes_give_up_nothing_when_patterns_come_and_go() -> None:
    """Adding and removing patterns through empty (shared) node containers keeps matches right."""
    trie = AddressTrie()
    trie.add("a.b.c", 1)
    trie.add("a.*.c", 2)
    trie.add("a.b*.c", 3)
    trie.add("a.>", 4)
    assert sorted(trie.match("a.b.c")) == [1, 2, 3, 4]
    assert trie.remove("a.b*.c", 3) and trie.remove("a.>", 4)
    assert sorted(trie.match("a.b.c")) == [1, 2]
    assert trie.remove("a.*.c", 2) and trie.remove("a.b.c", 1)
    assert trie.match("a.b.c") == [] and len(trie) == 0
    trie.add("a.b.c", 5)
    assert trie.match("a.b.c") == [5]
