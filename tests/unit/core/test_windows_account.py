"""One broker-wide account for the body bytes of all durable queues' windows (``windows_bytes``).

Each queue's window is bounded by its own ``window_bytes``; together they are bounded by the
account: a window's budget shrinks to what the account has left (never below its floor, and a
window always keeps one entry), the rest stays in the store and is paged back as room frees.
Deleting or emptying a queue gives its share back.
"""

from __future__ import annotations

from typing import Any

from mqhub.core.tail import ENTRY_COST
from mqhub.core.window import WINDOW_FLOOR
from mqhub.hub import Hub
from mqhub.testing import CollectingTarget, memory_hub, restart_hub, result_of, settle

from .test_window_bytes import drain as window_drain

KIB = 1024
BODY = 100 * KIB
OWN = 1024 * KIB          # each window's own budget (window_bytes)
ALL = 2 * OWN             # all windows together (windows_bytes)
QUEUES = 6


def body(i: int) -> bytes:
    """A numbered body of BODY bytes."""
    return b"%06d|" % i + b"x" * (BODY - 7)


def filled(count: int, queues: int = QUEUES, **broker_kw: Any) -> Hub:
    """A hub whose queues ``q0``.. each got ``count`` bodies through their own address."""
    kw = {"window_bytes": OWN, "windows_bytes": ALL}
    kw.update(broker_kw)
    hub = memory_hub(**kw)
    for n in range(queues):
        hub.broker.declare_queue(f"q{n}")
        hub.broker.bind_queue(f"a{n}", f"q{n}")
    for i in range(count):
        for n in range(queues):
            hub.broker.publish_batch(f"a{n}", [body(i)])
        settle(hub)
    return hub


def held(hub: Hub) -> int:
    """Body bytes the durable queues' windows hold, summed queue by queue."""
    return sum(q.window_bytes_held for q in hub.broker.queues() if q.durable)


def bound(queues: int) -> int:
    """The most the account may show: its limit plus, per queue, one floor or one body."""
    return ALL + queues * max(WINDOW_FLOOR, BODY)


def drain(hub: Hub, name: str, peaks: list[int]) -> list[int]:
    """Consume queue ``name`` one message at a time; return the numbers received in order and
    append the account's use after every step to ``peaks``."""
    return window_drain(hub, name, peaks)[0]


def fed(hub: Hub, name: str, address: str, count: int, **settings: Any) -> Any:
    """Queue ``name`` (declared with ``settings``) bound to ``address``, given ``count`` bodies
    one publish and one commit at a time."""
    hub.broker.declare_queue(name, **settings)
    hub.broker.bind_queue(address, name)
    for i in range(count):
        hub.broker.publish_batch(address, [body(i)])
        settle(hub)
    return hub.broker.queue(name)


def test_many_queues_stay_within_the_account_and_deliver_in_order() -> None:
    """Six queues of 30 bodies of 100 KiB (3 MiB each, 18 MiB in all), each window allowed
    1 MiB, all windows 2 MiB: the account holds at most its limit plus one body per queue
    (the old code held 6 MiB), matches the windows, and every queue delivers all in order."""
    hub = filled(30)
    windows = hub.broker.windows
    assert windows.used == held(hub)
    assert windows.used <= bound(QUEUES)
    assert all(q.depth == 30 for q in hub.broker.queues())
    peaks: list[int] = []
    for n in range(QUEUES):
        assert drain(hub, f"q{n}", peaks) == list(range(30))
        assert windows.used == held(hub)
    assert max(peaks) <= bound(QUEUES)
    assert windows.used == 0


def test_interleaved_drains_stay_within_the_account() -> None:
    """Consumers on every queue at once, each taking one message per turn: the account stays
    bounded all the way and every queue still delivers everything in order."""
    hub = filled(20)
    queues = [hub.broker.queue(f"q{n}") for n in range(QUEUES)]
    targets = [CollectingTarget() for _ in queues]
    consumers = [q.attach(t, ready=1) for q, t in zip(queues, targets, strict=True)]
    peak = 0
    for _ in range(1000):
        settle(hub)
        peak = max(peak, hub.broker.windows.used)
        assert hub.broker.windows.used == held(hub)
        busy = False
        for q, t, c in zip(queues, targets, consumers, strict=True):
            ids = [e[0] for e in t.entries if q.owner_of(e[0]) is c]
            if ids:
                q.ack(c, ids)
            busy = busy or bool(q.depth or q.in_flight)
        if not busy:
            break
    assert peak <= bound(QUEUES)
    for t in targets:
        assert [int(b[:6]) for b in t.bodies] == list(range(20))
    assert hub.broker.windows.used == 0


def test_deleting_and_emptying_give_the_share_back() -> None:
    """A queue's window share returns to the account when the queue is deleted or emptied;
    a queue squeezed to its floor then pages back up to its own budget as it drains."""
    hub = memory_hub(window_bytes=OWN, windows_bytes=OWN + OWN // 2)
    # one queue after the other: the first ones fill their windows
    q0, q1, q2 = (fed(hub, f"q{n}", f"a{n}", 30) for n in range(3))
    windows = hub.broker.windows
    assert q0.window_bytes_held == 10 * BODY    # its own budget
    assert q1.window_bytes_held == 5 * BODY     # what the account had left
    assert q2.window_bytes_held == BODY         # the floor: one entry
    before = windows.used
    share0 = q0.window_bytes_held
    d = hub.broker.delete_queue("q0")
    settle(hub)
    assert result_of(d) is None
    assert windows.used == before - share0 == held(hub)
    share1 = q1.window_bytes_held
    d = q1.empty()
    settle(hub)
    result_of(d)
    assert q1.depth == 0 and q1.window_bytes_held == 0
    assert windows.used == before - share0 - share1
    assert windows.used == q2.window_bytes_held
    # the room freed lets q2's window grow past what it had while the account was full
    target = CollectingTarget()
    c = q2.attach(target, ready=1)
    peak = 0
    for _ in range(200):
        settle(hub)
        peak = max(peak, q2.window_bytes_held)
        ids = [e[0] for e in target.entries if q2.owner_of(e[0]) is c]
        if not ids:
            break
        q2.ack(c, ids)
    assert peak > OWN // 2
    assert [int(b[:6]) for b in target.bodies] == list(range(30))
    hub.broker.delete_queue("q2")
    assert windows.used == 0


def test_bounded_queues_keep_their_rule_and_count_in_the_account() -> None:
    """A bounded queue (max_size) keeps its whole content in memory even when the account is
    full; its bodies count in the account, so an unbounded queue gets only its floor."""
    hub = memory_hub(window_bytes=OWN, windows_bytes=OWN)
    hub.broker.declare_queue("big", max_size=20)
    hub.broker.bind_queue("b", "big")
    hub.broker.declare_queue("q")
    hub.broker.bind_queue("a", "q")
    for i in range(15):
        hub.broker.publish_batch("b", [body(i)])
        hub.broker.publish_batch("a", [body(i)])
        settle(hub)
    big, q = hub.broker.queue("big"), hub.broker.queue("q")
    assert big.in_memory == 15 and big.window_bytes_held == 15 * BODY
    assert q.in_memory == 1 and q.depth == 15
    assert hub.broker.windows.used == 16 * BODY
    assert drain(hub, "q", []) == list(range(15))


def test_the_remembered_tail_keeps_the_queues_own_budget() -> None:
    """The account shrinks a window, not its remembered tail: with the account full, a queue's
    tail still remembers what its own ``window_bytes`` allows (bounded by ``broker.tails``)."""
    hub = memory_hub(window_bytes=OWN, windows_bytes=OWN)
    fed(hub, "first", "f", 12)
    assert hub.broker.windows.used >= OWN - BODY
    q = fed(hub, "q", "a", 8)
    assert q.in_memory == 1
    # the first queue's tail remembers 2 entries; q's at least 6 more (a shrunk budget: none)
    first_tail = 2 * (BODY + ENTRY_COST)
    assert hub.broker.tails.used - first_tail >= 6 * (BODY + ENTRY_COST)
    assert drain(hub, "q", []) == list(range(8))


def test_after_a_restart_the_account_is_rebuilt_from_the_pages() -> None:
    """A restarted broker starts its account at 0 and charges what its queues page back in:
    the same bound holds and everything is delivered in order."""
    hub = filled(15)
    hub = restart_hub(hub, window_bytes=OWN, windows_bytes=ALL)
    settle(hub)
    assert hub.broker.windows.used == held(hub) <= bound(QUEUES)
    peaks: list[int] = []
    for n in range(QUEUES):
        assert drain(hub, f"q{n}", peaks) == list(range(15))
    assert max(peaks) <= bound(QUEUES)
    assert hub.broker.windows.used == 0


def test_a_window_squeezed_at_once_keeps_its_evicted_entries_in_its_tail() -> None:
    """A full window squeezed to its floor at once (the account's limit was lowered) evicts
    all but one entry; they join its remembered tail, sized by the queue's own budget."""
    hub = memory_hub(window_bytes=OWN, windows_bytes=ALL)
    q = fed(hub, "q", "a", 9)
    assert q.in_memory == 9 and hub.broker.tails.used == 0
    hub.broker.windows.limit = 0
    hub.broker.publish_batch("a", [body(9)])
    settle(hub)
    assert q.in_memory == 1 and hub.broker.windows.used == BODY
    assert hub.broker.tails.used == 9 * (BODY + ENTRY_COST)
    assert drain(hub, "q", []) == list(range(10))
    assert hub.broker.windows.used == hub.broker.tails.used == 0


def test_expiry_and_removal_give_the_share_back() -> None:
    """Entries leaving the window by TTL expiry or by removal by id give their bytes back."""
    hub = memory_hub(window_bytes=OWN, windows_bytes=ALL)
    hub.broker.declare_queue("t", ttl=5.0)
    hub.broker.bind_queue("ta", "t")
    hub.broker.declare_queue("r")
    hub.broker.bind_queue("ra", "r")
    hub.broker.publish_batch("ta", [body(i) for i in range(4)])
    hub.broker.publish_batch("ra", [body(i) for i in range(4)])
    settle(hub)
    t, r = hub.broker.queue("t"), hub.broker.queue("r")
    assert hub.broker.windows.used == 8 * BODY
    assert r.remove([e[0] for e in r.peek(3)]) == []
    settle(hub)
    assert r.depth == 1 and hub.broker.windows.used == 5 * BODY
    hub.clock.advance(10.0)
    settle(hub)
    assert t.depth == 0 and t.expired_count == 4
    assert hub.broker.windows.used == BODY == held(hub)
