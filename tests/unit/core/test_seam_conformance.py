"""The core seam's conformance suite: what every backend of ``ICore`` must do.

Written against the seam only (``mqhub.interfaces``, ``mqhub.records``, ``mqhub.errors``) and
the harness of :mod:`tests.unit.core.seam`, so any backend listed in its ``BACKENDS`` runs it
(the embedded core over a MemoryStore and over an LmdbStore today). docs/core-api.md is the
contract these tests hold it to.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from zope.interface.verify import verifyObject

from mqhub.errors import InvalidName, NoSuchQueue, QueueFull
from mqhub.interfaces import (
    IAdapterState,
    IBinding,
    IConsumer,
    ICore,
    ICounters,
    IIdSource,
    IQueue,
    IRoute,
    IStateBatch,
)
from mqhub.records import (
    NOT_IN_FLIGHT,
    NOT_OWNER,
    REASON_MAX_ATTEMPTS,
    REASON_REJECTED,
    DeadLetter,
    Peer,
    make_entry,
)
from mqhub.testing import CollectingTarget
from tests.unit.core.seam import BACKENDS, SeamHarness


@pytest.fixture(params=sorted(BACKENDS))
def seam(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SeamHarness]:
    """A started core of each backend."""
    harness = BACKENDS[request.param](tmp_path)
    yield harness
    harness.close()


def work_queue(seam: SeamHarness, name: str = "jobs", address: str = "jobs.new",
               **settings: object) -> IQueue:
    """A durable queue bound to ``address``."""
    q = seam.core.declare_queue(name, **settings)  # type: ignore[arg-type]
    seam.core.bind_queue(address, name)
    return q


def bodies(target: CollectingTarget) -> list[bytes]:
    """What ``target`` received, by body."""
    return [e[7] for e in target.entries]


def test_every_handle_provides_its_interface(seam: SeamHarness) -> None:
    """The core, a session, and every handle the seam returns provide their interfaces."""
    core = seam.core
    assert verifyObject(ICore, core)
    assert verifyObject(ICore, core.session(None))
    q = work_queue(seam)
    assert verifyObject(IQueue, q)
    assert verifyObject(IConsumer, core.attach(q, CollectingTarget()))
    assert verifyObject(IBinding, core.bindings("jobs")[0])
    assert verifyObject(IBinding, core.subscribe("live.>", CollectingTarget()))
    assert verifyObject(IRoute, core.route("jobs.new"))
    assert verifyObject(IIdSource, core.ids)
    assert verifyObject(ICounters, core.counters)
    assert verifyObject(IAdapterState, core.state)
    assert verifyObject(IStateBatch, core.state.batch())


def test_a_publish_is_delivered_with_its_fields_and_finished_by_an_ack(seam: SeamHarness) -> None:
    """One publish reaches the bound queue's consumer with every field; an ack finishes it."""
    core = seam.core
    q = work_queue(seam)
    target = CollectingTarget()
    consumer = core.attach(q, target, ready=10)
    d = core.publish_batch("jobs.new", [b"a", b"b"], origin="nsq", headers={"k": "v"},
                           priority=3)
    assert seam.wait(d) is None
    assert bodies(target) == [b"a", b"b"]
    first = target.entries[0]
    assert (first[1], first[2], first[5], first[6], first[8]) == (3, 1, "jobs.new", {"k": "v"},
                                                                 "nsq")
    binding, address, _ = target.batches[0]
    assert binding is consumer and address == "jobs"
    assert q.in_flight == 2 and consumer.in_flight == 2
    assert q.ack(consumer, [e[0] for e in target.entries]) == []
    seam.wait(core.barrier())
    assert (q.depth, q.in_flight, consumer.in_flight) == (0, 0, 0)


def test_ids_grow_and_bad_publishes_are_refused_before_anything_is_written(
        seam: SeamHarness) -> None:
    """Ids only grow; an invalid address and a full ``reject`` queue raise at once."""
    core = seam.core
    first = core.ids.reserve(3)
    assert core.ids.next_id() == first + 3 == core.ids.last
    with pytest.raises(InvalidName):
        core.publish_batch("bad address", [b"x"])
    q = work_queue(seam, "small", "small", max_size=2, overflow="reject")
    seam.wait(core.publish_batch("small", [b"1", b"2"]))
    with pytest.raises(QueueFull):
        core.publish_batch("small", [b"3"])
    assert q.depth == 2 and q.room() == 0


def test_competing_consumers_share_and_fanout_consumers_each_get_a_copy(
        seam: SeamHarness) -> None:
    """A competing queue gives each message to one consumer; a fan-out queue to every one."""
    core = seam.core
    work = work_queue(seam)
    a, b = CollectingTarget(), CollectingTarget()
    core.attach(work, a, ready=100)
    core.attach(work, b, ready=100)
    fan = work_queue(seam, "fan", "jobs.new", mode="fanout")
    c, d = CollectingTarget(), CollectingTarget()
    core.attach(fan, c, ready=100)
    core.attach(fan, d, ready=100)
    seam.wait(core.publish_batch("jobs.new", [b"%d" % i for i in range(6)]))
    seam.settle()
    assert sorted(bodies(a) + bodies(b)) == sorted(b"%d" % i for i in range(6))
    assert bodies(c) == bodies(d) == [b"%d" % i for i in range(6)]


def test_credit_limits_what_a_consumer_is_given(seam: SeamHarness) -> None:
    """``ready`` bounds the in-flight count; credit counts deliveries; 0 stops them."""
    core = seam.core
    q = work_queue(seam)
    target = CollectingTarget()
    consumer = core.attach(q, target, ready=0)
    seam.wait(core.publish_batch("jobs.new", [b"%d" % i for i in range(5)]))
    assert target.entries == [] and q.depth == 5
    consumer.set_ready(2)
    seam.settle()
    assert len(target.entries) == 2
    q.ack(consumer, [e[0] for e in target.entries])
    seam.settle()
    assert len(target.entries) == 4
    credited = CollectingTarget()
    other = core.attach(q, credited, credit=1)
    assert other.credit >= 0
    q.ack(consumer, [e[0] for e in target.entries[2:]])
    consumer.set_ready(0)
    seam.settle()
    assert len(credited.entries) == 1 and q.depth == 0


def test_requeue_redelivers_and_max_attempts_dead_letters(seam: SeamHarness) -> None:
    """A requeued message comes back with attempts + 1; at max attempts it is dead-lettered,
    listable, replayable and purgeable."""
    core = seam.core
    q = work_queue(seam, max_attempts=2)
    target = CollectingTarget()
    consumer = core.attach(q, target, ready=1)
    seam.wait(core.publish_batch("jobs.new", [b"x"]))
    mid = target.entries[0][0]
    assert q.requeue(consumer, [mid], error="boom") == []
    seam.settle()
    assert [e[2] for e in target.entries] == [1, 2] and q.requeue_count == 1
    assert q.requeue(consumer, [mid], error="again") == []
    seam.wait(core.barrier())
    assert q.depth == 0 and q.dead_letter_count == 1
    dead = seam.wait(core.dead_letters("jobs"))
    assert len(dead) == 1 and isinstance(dead[0], DeadLetter)
    assert (dead[0].msg_id, dead[0].reason, dead[0].last_error, dead[0].body) == (
        mid, REASON_MAX_ATTEMPTS, "again", b"x")
    assert seam.wait(core.replay_dead_letters("jobs")) == 1
    seam.settle()
    assert target.entries[-1][0] == mid and target.entries[-1][2] == 1
    q.reject(consumer, [mid], error="no")
    seam.wait(core.barrier())
    assert [d.reason for d in seam.wait(core.dead_letters("jobs"))] == [REASON_REJECTED]
    assert seam.wait(core.purge_dead_letters("jobs")) == 1
    assert seam.wait(core.dead_letters("jobs")) == []


def test_requeue_with_a_delay_and_a_delayed_publish_wait_their_time(seam: SeamHarness) -> None:
    """A requeue with a delay and a publish with ``deliver_at`` are deferred, then delivered."""
    core = seam.core
    q = work_queue(seam)
    target = CollectingTarget()
    consumer = core.attach(q, target, ready=10)
    now = core.clock.seconds()
    seam.wait(core.publish_batch("jobs.new", [b"later"], deliver_at=now + 5))
    assert target.entries == [] and q.deferred == 1
    seam.advance(6)
    assert bodies(target) == [b"later"] and q.deferred == 0
    q.requeue(consumer, [target.entries[0][0]], delay=3)
    seam.settle()
    assert q.deferred == 1 and q.in_flight == 0
    seam.advance(4)
    assert bodies(target) == [b"later", b"later"]


def test_touch_extends_and_a_timeout_requeues(seam: SeamHarness) -> None:
    """An in-flight message times out after the consumer's timeout unless touched."""
    core = seam.core
    q = work_queue(seam)
    target = CollectingTarget()
    consumer = core.attach(q, target, ready=10, timeout=10)
    seam.wait(core.publish_batch("jobs.new", [b"x"]))
    mid = target.entries[0][0]
    seam.advance(8)
    assert q.touch(consumer, [mid]) == []
    seam.advance(8)
    assert len(target.entries) == 1 and q.timeout_count == 0
    seam.advance(4)
    assert len(target.entries) == 2 and q.timeout_count == 1


def test_refused_ids_are_returned_with_their_reason(seam: SeamHarness) -> None:
    """An id not in flight, or in flight on another consumer, is returned and explained."""
    core = seam.core
    q = work_queue(seam)
    mine, theirs = CollectingTarget(), CollectingTarget()
    me = core.attach(q, mine, ready=1)
    other = core.attach(q, theirs, ready=1)
    seam.wait(core.publish_batch("jobs.new", [b"1", b"2"]))
    held = theirs.entries[0][0]
    assert q.ack(me, [held, 12345]) == [held, 12345]
    assert dict(q.failure_reasons(me, [held, 12345])) == {held: NOT_OWNER, 12345: NOT_IN_FLIGHT}
    assert q.ack(other, [held]) == []


def test_live_subscribers_groups_and_routes(seam: SeamHarness) -> None:
    """Live subscribers each get a copy, one member of a group gets each batch, routes say so,
    the epoch moves with bindings, and unbind stops deliveries."""
    core = seam.core
    live = CollectingTarget()
    g1, g2 = CollectingTarget(), CollectingTarget()
    epoch = core.epoch
    b = core.subscribe("news.*", live, tag="t")
    core.subscribe("news.>", g1, group="g")
    core.subscribe("news.>", g2, group="g")
    assert core.epoch != epoch
    route = core.route("news.x")
    assert [t.target for t in route.targets] == [live] and len(route.groups) == 1
    assert not route.queues and route.park is None and not route.empty
    assert core.route("other").empty
    for i in range(2):
        seam.wait(core.publish_batch("news.x", [b"%d" % i], origin="nats"))
    assert bodies(live) == [b"0", b"1"] and live.batches[0][0].tag == "t"
    assert sorted(bodies(g1) + bodies(g2)) == [b"0", b"1"] and bodies(g1) and bodies(g2)
    core.unbind(b)
    seam.wait(core.publish_batch("news.x", [b"2"]))
    assert bodies(live) == [b"0", b"1"]


def test_parked_and_paused_addresses_hold_publishes(seam: SeamHarness) -> None:
    """A parked address keeps publishes until a queue is bound; a paused one until resumed;
    ``empty_parked`` drops what is held."""
    core = seam.core
    seam.wait(core.park("topic"))
    seam.wait(core.publish_batch("topic", [b"held"]))
    assert core.parked_depth("topic") == 1 and core.route("topic").park is not None
    q = work_queue(seam, "chan", "topic")
    seam.wait(core.barrier())
    assert q.depth == 1 and core.parked_depth("topic") == 0
    seam.wait(core.pause_address("topic"))
    seam.wait(core.publish_batch("topic", [b"p1", b"p2"]))
    assert core.parked_depth("topic") == 2 and q.depth == 1
    seam.wait(core.resume_address("topic"))
    seam.wait(core.barrier())
    assert q.depth == 3
    seam.wait(core.pause_address("topic"))
    seam.wait(core.publish_batch("topic", [b"gone"]))
    seam.wait(core.empty_parked("topic"))
    assert core.parked_depth("topic") == 0
    seam.wait(core.unpark("topic"))


def test_message_ttl_drops_unconsumed_messages(seam: SeamHarness) -> None:
    """A message past its TTL is never delivered and leaves the depth."""
    core = seam.core
    q = work_queue(seam)
    seam.wait(core.publish_batch("jobs.new", [b"short"], ttl=2))
    seam.wait(core.publish_batch("jobs.new", [b"long"]))
    seam.advance(5)
    target = CollectingTarget()
    core.attach(q, target, ready=10)
    seam.settle()
    assert bodies(target) == [b"long"]


def test_queues_are_declared_once_listed_and_deleted(seam: SeamHarness) -> None:
    """``declare_queue`` is idempotent, ``queue``/``queues`` find it, ``delete_queue`` removes
    it with its messages, and attaching to a deleted queue raises NoSuchQueue."""
    core = seam.core
    q = work_queue(seam, "jobs", ttl=30.0)
    assert core.declare_queue("jobs", ttl=99.0) is q and q.ttl == 30.0
    assert core.queue("jobs") is q and q in core.queues() and core.queue("nope") is None
    seam.wait(core.publish_batch("jobs.new", [b"x"]))
    seam.wait(core.delete_queue("jobs"))
    assert core.queue("jobs") is None and q.deleted and core.route("jobs.new").empty
    with pytest.raises(NoSuchQueue):
        core.attach(q, CollectingTarget())
    with pytest.raises(InvalidName):
        core.declare_queue("")


def test_durable_queues_bindings_and_adapter_state_survive_a_restart(seam: SeamHarness) -> None:
    """After a restart durable queues keep their messages and bindings, memory queues are
    gone, and adapter records and entry lists are as committed."""
    core = seam.core
    work_queue(seam)
    core.declare_queue("mem", tier="memory")
    seam.wait(core.publish_batch("jobs.new", [b"kept"]))
    batch = core.state.batch()
    batch.put_meta("test/a", b"1")
    batch.put_meta("test/b", b"2")
    batch.put_entries("~test/list", [make_entry(7, b"e", "x")])
    assert batch
    seam.wait(core.state.commit(batch))
    gone = core.state.batch()
    gone.delete_meta("test/b")
    seam.wait(core.state.commit(gone))
    seam.restart()
    core = seam.core
    q = core.queue("jobs")
    assert q is not None and q.depth == 1 and core.queue("mem") is None
    assert [b.pattern for b in core.bindings("jobs")] == ["jobs.new"]
    assert seam.wait(core.state.scan_meta("test/")) == [("test/a", b"1")]
    assert [e[0] for e in seam.wait(core.state.read_entries("~test/list", None, 10))] == [7]
    target = CollectingTarget()
    core.attach(q, target, ready=1)
    seam.settle()
    assert bodies(target) == [b"kept"]


def test_prebuilt_entries_peek_take_and_remove(seam: SeamHarness) -> None:
    """Prebuilt entries publish or go into one queue; ready entries can be peeked, taken and
    removed by id."""
    core = seam.core
    q = work_queue(seam)
    other = work_queue(seam, "other", "jobs.new")
    first = core.ids.reserve(3)
    entries = [make_entry(first + i, b"%d" % i, "jobs.new", origin="mqks") for i in range(3)]
    seam.wait(core.publish_entries("jobs.new", entries[:2]))
    seam.wait(core.put_entries("jobs", entries[2:]))
    assert (q.depth, other.depth) == (3, 2)
    assert [e[0] for e in q.peek(10)] == [first, first + 1, first + 2]
    assert q.remove([first + 1, 999]) == [999]
    assert [e[7] for e in q.take(1)] == [b"0"]
    seam.wait(core.barrier())
    assert q.depth == 1


def test_a_session_acts_as_the_core_and_entry_limits_are_told(seam: SeamHarness) -> None:
    """A connection's session publishes and subscribes like the core; ``entry_fits`` tells
    an entry the backend can hold from one it cannot."""
    core = seam.core
    session = core.session(None)
    q = work_queue(seam)
    target = CollectingTarget()
    session.attach(q, target, ready=5)
    seam.wait(session.publish_batch("jobs.new", [b"s"], origin="vibemq"))
    assert bodies(target) == [b"s"]
    assert core.counters.snapshot()["vibemq"]["published"] == 1
    assert core.entry_fits("a.b", {"k": "v"}, "nats")
    assert not core.entry_fits("a.b", {"k": "v" * (1 << 20)}, "nats")


def test_handles_are_settled_peers_are_listed_and_records_are_watched(seam: SeamHarness) -> None:
    """``settled`` fires for a queue, a binding and a consumer the core returned; ``peers`` lists
    the other nodes of a protocol as Peers; ``state.watch`` takes a callback that this node's own
    commits never call (it is for records other nodes write)."""
    core = seam.core
    q = work_queue(seam)
    binding = core.bindings("jobs")[0]
    consumer = core.attach(q, CollectingTarget(), ready=1)
    for handle in (q, binding, consumer):
        assert seam.wait(core.settled(handle)) is None
    peers = core.peers("nsq")
    assert isinstance(peers, list) and all(isinstance(p, Peer) for p in peers)
    changes: list[tuple[str, bytes | None]] = []
    core.state.watch("test/", lambda key, value: changes.append((key, value)))
    batch = core.state.batch()
    batch.put_meta("test/own", b"1")
    seam.wait(core.state.commit(batch))
    seam.settle()
    assert changes == []
