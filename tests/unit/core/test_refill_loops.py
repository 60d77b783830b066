"""Refilling a window from its stored backlog never recurses once per refill, and never takes
an entry its byte budget would evict right back (both grew the stack until RecursionError).

A window squeezed by the broker-wide account of the windows (``windows_bytes``) is often only
one entry, so both cases are ordinary there; they could already happen with a small ``window``
or with bodies of very different sizes.
"""

from __future__ import annotations

from mqhub.testing import CollectingTarget, memory_hub, settle

KIB = 1024


def test_a_consumer_with_more_credit_than_the_window_drains_a_long_tail() -> None:
    """Window of 1 entry, 3,000 messages in the remembered tail, a consumer with credit for all:
    every message is delivered in order in one dispatch loop (it used to recurse per entry)."""
    hub = memory_hub(window=1)
    hub.broker.declare_queue("q")
    hub.broker.bind_queue("a", "q")
    hub.broker.publish_batch("a", [b"%d" % i for i in range(3000)])
    settle(hub)
    q = hub.broker.queue("q")
    assert q is not None and q.in_memory == 1 and q.depth == 3000
    target = CollectingTarget()
    q.attach(target, ready=5000)
    settle(hub)
    assert [int(b) for b in target.bodies] == list(range(3000))
    assert q.depth == 0


def test_a_body_that_does_not_fit_waits_instead_of_bouncing() -> None:
    """Budget 1 MiB, a 400 KiB body in the window and a 700 KiB one in the backlog: the second
    is not taken while the first is there (it would be evicted at once, again and again); both
    are delivered in order once a consumer comes."""
    hub = memory_hub(window_bytes=1024 * KIB)
    hub.broker.declare_queue("q")
    hub.broker.bind_queue("a", "q")
    hub.broker.publish_batch("a", [b"a" * (400 * KIB)])
    hub.broker.publish_batch("a", [b"b" * (700 * KIB)])
    settle(hub)
    q = hub.broker.queue("q")
    assert q is not None and q.depth == 2
    assert q.in_memory == 1 and q.window_bytes_held == 400 * KIB
    q.maybe_page()      # the window is at its low-water mark, but the next body does not fit
    assert q.in_memory == 1 and q.window_bytes_held == 400 * KIB
    target = CollectingTarget()
    c = q.attach(target, ready=1)
    for _ in range(10):
        settle(hub)
        ids = [e[0] for e in target.entries if q.owner_of(e[0]) is c]
        if not ids:
            break
        assert q.window_bytes_held <= 1024 * KIB
        q.ack(c, ids)
    assert [b[:1] for b in target.bodies] == [b"a", b"b"]
    assert q.depth == 0
