"""Routing through the broker: cached routes, epochs, live targets, queue groups, cross-protocol."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from zope.interface.verify import verifyObject

from mqhub.core.address import pattern_matches
from mqhub.errors import InvalidName, NoSuchQueue
from mqhub.hub import Hub
from mqhub.interfaces import IDeliveryTarget
from mqhub.store.records import HEADERS, ORIGIN
from mqhub.testing import CollectingTarget, memory_hub, result_of
from tests.unit.core.test_address import address, patterns


def test_route_is_cached_until_bindings_change(hub: Hub) -> None:
    """The same Route object serves an address until the epoch changes."""
    b = hub.broker
    t = CollectingTarget()
    r1 = b.route("x.y")
    assert r1.empty and b.route("x.y") is r1
    e0 = b.epoch
    sub = b.subscribe("x.*", t)
    assert b.epoch != e0
    r2 = b.route("x.y")
    assert r2 is not r1 and r2.targets == (sub,)
    b.unbind(sub)
    assert b.route("x.y").targets == ()


def test_live_subscribers_with_wildcards_get_one_batch_each(hub: Hub) -> None:
    """Each matching live binding is called once per publish batch."""
    b = hub.broker
    star, full, other = CollectingTarget(), CollectingTarget(), CollectingTarget()
    b.subscribe("orders.*", star, tag="sid1")
    b.subscribe("orders.>", full)
    b.subscribe("users.>", other)
    result_of(b.publish_batch("orders.eu", [b"1", b"2"], origin="nats"))
    result_of(b.publish_batch("orders.eu.de", [b"3"], origin="nats"))
    assert star.bodies == [b"1", b"2"] and len(star.batches) == 1
    assert star.batches[0][0].tag == "sid1" and star.batches[0][1] == "orders.eu"
    assert full.bodies == [b"1", b"2", b"3"] and other.entries == []


def test_queue_group_members_compete(hub: Hub) -> None:
    """In a queue group each batch goes to exactly one member, in turn."""
    b = hub.broker
    m1, m2, solo = CollectingTarget(), CollectingTarget(), CollectingTarget()
    b.subscribe("jobs", m1, group="workers")
    b.subscribe("jobs", m2, group="workers")
    b.subscribe("jobs", solo)
    for i in range(4):
        b.publish_batch("jobs", [b"%d" % i])
    assert sorted(m1.bodies + m2.bodies) == [b"0", b"1", b"2", b"3"]
    assert len(m1.bodies) == 2 and len(m2.bodies) == 2
    assert len(solo.bodies) == 4


def test_cross_protocol_delivery_keeps_body_headers_origin(hub: Hub) -> None:
    """A message from one adapter reaches another's binding with body, headers and origin."""
    b = hub.broker
    nats_side = CollectingTarget("nats")
    verifyObject(IDeliveryTarget, nats_side)
    b.subscribe("events.>", nats_side)
    q = b.declare_queue("ch")
    b.bind_queue("events.created", "ch")
    nsq_side = CollectingTarget("nsq")
    q.attach(nsq_side, ready=10)
    result_of(b.publish_batch("events.created", [b"\x00bin\n"], origin="emqp",
                              headers={"trace": "t1"}))
    for got in (nats_side.entries[0], nsq_side.entries[0]):
        assert got[7] == b"\x00bin\n" and got[HEADERS] == {"trace": "t1"} and got[ORIGIN] == "emqp"
    assert nats_side.entries[0][0] == nsq_side.entries[0][0]


def test_per_message_headers(hub: Hub) -> None:
    """headers may be a list with one dict per body."""
    t = CollectingTarget()
    hub.broker.subscribe("h", t)
    hub.broker.publish_batch("h", [b"a", b"b"], headers=[{"n": "1"}, None])
    assert [e[HEADERS] for e in t.entries] == [{"n": "1"}, None]


def test_bad_names(hub: Hub) -> None:
    """Invalid addresses, patterns and queue names raise; unknown queues too."""
    b = hub.broker
    with pytest.raises(InvalidName):
        b.publish_batch("a..b", [b"x"])
    with pytest.raises(InvalidName):
        b.subscribe("a.>.b", CollectingTarget())
    with pytest.raises(InvalidName):
        b.declare_queue("~hidden")
    with pytest.raises(InvalidName):
        b.declare_queue("has space")
    with pytest.raises(NoSuchQueue):
        b.bind_queue("a", "missing")


def test_a_failing_target_does_not_stop_others(hub: Hub) -> None:
    """One adapter raising in deliver_batch neither breaks the publish nor other targets."""

    class Broken(CollectingTarget):
        def deliver_batch(self, binding, address, messages):  # type: ignore[no-untyped-def]
            raise RuntimeError("adapter bug")

    ok = CollectingTarget()
    hub.broker.subscribe("z", Broken())
    hub.broker.subscribe("z", ok)
    assert result_of(hub.broker.publish_batch("z", [b"1"])) is None
    assert ok.bodies == [b"1"]


def test_mq9_hash_wildcard(hub: Hub) -> None:
    """mq9's trailing ``#`` means ``>``."""
    t = CollectingTarget()
    hub.broker.subscribe("$mq9.AI.BROADCAST.#", t)
    hub.broker.publish_batch("$mq9.AI.BROADCAST.ops.alert", [b"x"])
    assert t.bodies == [b"x"]


def test_delete_queue_unbinds_and_purges(hub: Hub) -> None:
    """Deleting a queue removes its bindings, entries and dead letters."""
    b = hub.broker
    b.declare_queue("q", max_size=1, overflow="dead_letter")
    b.bind_queue("a", "q")
    b.publish_batch("a", [b"1", b"2"])
    assert hub.store.stats()["entries"] == 2
    result_of(b.delete_queue("q"))
    assert b.queue("q") is None and b.route("a").empty
    assert hub.store.stats()["entries"] == 0
    assert result_of(hub.store.scan_meta("b/")) == [] and result_of(hub.store.scan_meta("q/")) == []


def test_one_store_commit_per_publish_batch(hub: Hub) -> None:
    """A batch to three durable queues is one WriteBatch and one commit, confirmed after it."""
    from mqhub.store.memory import MemoryStore
    from mqhub.testing import memory_hub
    store = MemoryStore(clock=hub.clock)
    store.open()
    h = memory_hub(hub.clock, store=store)
    for name in ("c1", "c2", "c3"):
        h.broker.declare_queue(name)
        h.broker.bind_queue("t", name)
    h.clock.advance(0)
    before = store.commits
    d = h.broker.publish_batch("t", [b"%d" % i for i in range(200)])
    assert not d.called, "confirmed before the store commit"
    h.clock.advance(0)
    assert d.called and store.commits == before + 1
    assert store.stats()["entries"] == 600


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(patterns(), st.sampled_from(["queue", "target", "g1", "g2"])),
                min_size=0, max_size=12),
       st.lists(address, min_size=1, max_size=6))
def test_routes_match_brute_force(binds: list[tuple[str, str]], addrs: list[str]) -> None:
    """A resolved route holds exactly the bindings whose pattern matches, sorted by kind."""
    h = memory_hub()
    b = h.broker
    made = []
    for i, (pattern, kind) in enumerate(binds):
        if kind == "queue":
            b.declare_queue(f"q{i}", tier="memory")
            made.append((pattern, kind, b.bind_queue(pattern, f"q{i}")))
        else:
            group = None if kind == "target" else kind
            made.append((pattern, kind, b.subscribe(pattern, CollectingTarget(), group=group)))
    for a in addrs:
        r = b.route(a)
        want = [(p, k, x) for p, k, x in made if pattern_matches(p, a)]
        assert sorted(q.name for q in r.queues) == sorted(
            x.queue.name for _, k, x in want if k == "queue")
        assert sorted(x.id for x in r.targets) == sorted(x.id for _, k, x in want if k == "target")
        got_groups = sorted(sorted(m.id for m in g) for g in r.groups)
        want_groups = sorted(sorted(x.id for _, k, x in want if k == g)
                             for g in ("g1", "g2") if any(k == g for _, k, _ in want))
        assert got_groups == want_groups
        assert r.empty == (not want)


def test_delayed_publish_reaches_live_subscribers_when_due(hub: Hub) -> None:
    """A DPUB to an address with a live subscriber is delivered to it at deliver_at, not before."""
    t = CollectingTarget()
    hub.broker.subscribe("later", t)
    hub.broker.publish_batch("later", [b"x"], deliver_at=hub.clock.seconds() + 5)
    hub.clock.advance(4)
    assert t.entries == []
    hub.clock.advance(1.5)
    assert t.bodies == [b"x"]


def test_priority_is_clamped(hub: Hub) -> None:
    """Out-of-range priorities are clamped to 0..9 rather than reaching the store."""
    q = hub.broker.declare_queue("q")
    hub.broker.bind_queue("p", "q")
    hub.broker.publish_batch("p", [b"hi"], priority=42)
    hub.broker.publish_batch("p", [b"lo"], priority=-3)
    assert [(e[1], e[7]) for e in q.peek(5)] == [(9, b"hi"), (0, b"lo")]


def test_queue_bindings_are_indexed_per_queue_through_unbind_delete_and_restart(hub: Hub) -> None:
    """bindings(queue) lists exactly that queue's patterns after unbind, delete and re-create."""
    from mqhub.testing import restart_hub, settle

    b = hub.broker
    b.declare_queue("a")
    b.declare_queue("b")
    a1, _a2 = b.bind_queue("x.*", "a"), b.bind_queue("y.>", "a")
    b.bind_queue("x.*", "b")
    assert b.bind_queue("x.*", "a") is a1  # idempotent per pattern + queue
    assert sorted(x.pattern for x in b.bindings("a")) == ["x.*", "y.>"]
    b.unbind(a1)
    assert [x.pattern for x in b.bindings("a")] == ["y.>"]
    result_of(b.delete_queue("b"))
    assert b.bindings("b") == [] and [x.queue.name for x in b.route("x.q").queues] == []
    b.declare_queue("b")
    assert b.bindings("b") == []
    settle(hub)
    hub2 = restart_hub(hub)
    settle(hub2)
    assert [x.pattern for x in hub2.broker.bindings("a")] == ["y.>"]
    assert hub2.broker.bindings("b") == []
