"""A queue's window is bounded by body bytes as well as by entry count (defect 7).

Big bodies beyond the broker's ``window_bytes`` stay in the store only and are paged back in as
the window drains; every message is still delivered once, in order.
"""

from __future__ import annotations

import pytest

from mqhub.hub import Hub
from mqhub.testing import CollectingTarget, memory_hub, restart_hub, settle

KIB = 1024
BUDGET = 1024 * KIB


def fill(hub: Hub, count: int, size: int, per_publish: int = 1) -> None:
    """Publish ``count`` numbered bodies of ``size`` bytes to address ``a`` (queue ``q``)."""
    for i in range(0, count, per_publish):
        bodies = [b"%06d|" % j + b"x" * (size - 7) for j in range(i, min(count, i + per_publish))]
        hub.broker.publish_batch("a", bodies)
        settle(hub)


def drain(hub: Hub, name: str = "q", account: list[int] | None = None) -> tuple[list[int], int]:
    """Consume queue ``name`` one message at a time; return (numbers received, peak window
    bytes); with ``account``, append the use of the broker-wide windows' account at each step."""
    q = hub.broker.queue(name)
    assert q is not None
    target = CollectingTarget()
    c = q.attach(target, ready=1)
    peak = q.window_bytes_held
    for _ in range(1000):
        settle(hub)
        peak = max(peak, q.window_bytes_held)
        if account is not None:
            account.append(hub.broker.windows.used)
        ids = [e[0] for e in target.entries if q.owner_of(e[0]) is c]
        if ids:
            q.ack(c, ids)
        elif not q.depth:
            break
    assert q.depth == 0 and q.in_flight == 0
    q.detach(c)
    return [int(b[:6]) for b in target.bodies], peak


@pytest.mark.parametrize("per_publish", [1, 7])
def test_big_bodies_stay_within_the_byte_budget(per_publish: int) -> None:
    """60 bodies of 100 KiB with a 1 MiB budget: the window holds at most the budget; the rest
    is stored only and comes back in order as the consumer drains."""
    hub = memory_hub(window_bytes=BUDGET)
    hub.broker.declare_queue("q")
    hub.broker.bind_queue("a", "q")
    fill(hub, 60, 100 * KIB, per_publish)
    q = hub.broker.queue("q")
    assert q is not None
    assert q.depth == 60
    assert q.window_bytes_held <= BUDGET
    assert q.in_memory <= BUDGET // (100 * KIB)
    got, peak = drain(hub)
    assert got == list(range(60))
    assert peak <= BUDGET


def test_a_body_bigger_than_the_budget_still_flows() -> None:
    """Bodies of 1.5 MiB with a 1 MiB budget: one at a time in the window, all delivered."""
    hub = memory_hub(window_bytes=BUDGET)
    hub.broker.declare_queue("q")
    hub.broker.bind_queue("a", "q")
    fill(hub, 6, 3 * BUDGET // 2)
    q = hub.broker.queue("q")
    assert q is not None and q.in_memory == 1
    got, peak = drain(hub)
    assert got == list(range(6))
    assert peak <= 3 * BUDGET // 2


def test_small_bodies_keep_the_count_window() -> None:
    """Small bodies: the entry-count window decides, as before."""
    hub = memory_hub(window=50, window_bytes=BUDGET)
    hub.broker.declare_queue("q")
    hub.broker.bind_queue("a", "q")
    fill(hub, 200, 100, per_publish=20)
    q = hub.broker.queue("q")
    assert q is not None and q.in_memory == 50 and q.depth == 200
    got, _ = drain(hub)
    assert got == list(range(200))


def test_after_a_restart_pages_respect_the_budget() -> None:
    """A restarted broker does not know the stored body sizes: its first page is small and the
    window stays within the budget afterwards."""
    hub = memory_hub(window_bytes=BUDGET)
    hub.broker.declare_queue("q")
    hub.broker.bind_queue("a", "q")
    fill(hub, 40, 200 * KIB, per_publish=4)
    hub = restart_hub(hub, window_bytes=BUDGET)
    settle(hub)
    q = hub.broker.queue("q")
    assert q is not None and q.depth == 40
    got, peak = drain(hub)
    assert got == list(range(40))
    assert peak <= BUDGET   # the first page (at most 64 entries) is evicted back to the budget
