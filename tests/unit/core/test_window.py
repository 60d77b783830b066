"""Per-queue in-memory window: declare_queue(window=N) and configure(window=N)."""

from __future__ import annotations

from mqhub.hub import Hub
from mqhub.testing import CollectingTarget, memory_hub, restart_hub


def _fill(hub: Hub, n: int) -> None:
    """Publish ``n`` numbered messages to address ``a`` and commit them."""
    hub.broker.publish_batch("a", [b"%d" % i for i in range(n)])
    hub.clock.advance(0)


def test_queue_window_overrides_the_broker_default() -> None:
    """A queue declared with window=3 keeps 3 ready entries in memory; the other keeps all."""
    hub = memory_hub(window=100)
    b = hub.broker
    small = b.declare_queue("small", window=3)
    big = b.declare_queue("big")
    b.bind_queue("a", "small")
    b.bind_queue("a", "big")
    _fill(hub, 10)
    assert small.stats()["in_memory"] == 3 and small.depth == 10
    assert big.stats()["in_memory"] == 10 and big.window == 100
    t = CollectingTarget()
    small.attach(t, ready=100)
    hub.clock.advance(0)
    hub.clock.advance(0)
    assert t.bodies == [b"%d" % i for i in range(10)]


def test_queue_window_survives_restart() -> None:
    """The setting is persisted with the queue; the default follows the (new) broker's."""
    hub = memory_hub(window=100)
    b = hub.broker
    b.declare_queue("small", window=4)
    b.declare_queue("dflt")
    b.bind_queue("a", "small")
    b.bind_queue("a", "dflt")
    _fill(hub, 12)
    hub2 = restart_hub(hub, window=6)
    hub2.clock.advance(0)
    small, dflt = hub2.broker.queue("small"), hub2.broker.queue("dflt")
    assert (small.window, small.window_setting, small.stats()["in_memory"]) == (4, 4, 4)
    assert (dflt.window, dflt.stats()["in_memory"]) == (6, 6)


def test_configure_window_shrinks_and_grows_keeping_order(hub: Hub) -> None:
    """Shrinking evicts the tail to the store, growing pages it back; order is kept."""
    b = hub.broker
    q = b.declare_queue("q")
    b.bind_queue("a", "q")
    _fill(hub, 20)
    q.configure(window=5)
    assert q.stats()["in_memory"] == 5 and q.depth == 20
    q.configure(window=0)   # back to the broker's default
    hub.clock.advance(0)
    assert q.window == b.window and q.stats()["in_memory"] == 20
    q.configure(window=2)
    t = CollectingTarget()
    q.attach(t, ready=100)
    for _ in range(20):
        hub.clock.advance(0)
    assert t.bodies == [b"%d" % i for i in range(20)]
