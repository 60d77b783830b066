"""The MQKS server over a memory hub on a Clock: commit-ordered confirms, flow control, timers."""

from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock

from mqhub.protocols.mqks.config import MqksConfig
from mqhub.protocols.mqks.service import MqksService
from mqhub.store.memory import MemoryStore
from mqhub.testing import connect, memory_hub, restart_hub, settle, take_output


class Harness:
    """A memory hub (grouped commits) with the MQKS service built, and fake connections."""

    def __init__(self, prefetch: int = 1000) -> None:
        """Build the hub and service and recover (nothing to recover at first)."""
        self.clock = Clock()
        self.clock.advance(1_700_000_000)
        self.store = MemoryStore(clock=self.clock)
        self.store.open()
        self.hub = memory_hub(clock=self.clock, store=self.store)
        self.prefetch = prefetch
        self._service()

    def _service(self) -> None:
        """(Re)build the service over the current hub and load its queues."""
        self.service = MqksService(self.hub, {"tcp": "tcp:0"}, MqksConfig(prefetch=self.prefetch))
        self.service.registry.load()
        settle(self.hub)

    def restart(self) -> None:
        """Restart broker and scheduler over the same store, and the service."""
        self.hub = restart_hub(self.hub)
        self._service()

    def client(self) -> tuple[Any, Any]:
        """(protocol, transport) of a new connection."""
        return connect(self.service.factory)

    def lines(self, transport: Any) -> list[bytes]:
        """Settle commits and return the lines written since the last call."""
        settle(self.hub)
        return take_output(transport).split(b"\n")[:-1]


def test_publish_confirm_only_after_the_commit() -> None:
    """``ok `` leaves only once the batch is stored; replies stay in request order."""
    h = Harness()
    proto, t = h.client()
    proto.dataReceived(b"rb rebind --confirm q e\n")
    assert h.lines(t) == [b"rb ok "]
    proto.dataReceived(b"m1 publish --confirm e one\nm2 publish e two\np ping x\n")
    assert take_output(t) == b""  # the commit has not happened yet: nothing, not even the ping
    assert h.lines(t) == [b"m1 ok ", b"p ok x"]
    assert h.service.registry.queues["q"].core.depth == 2
    assert h.service.registry.queues["q"].core.window_setting == 50_000  # mqks.window


def test_auto_ack_consumer_stops_while_writes_are_paused() -> None:
    """A full write buffer holds an auto-ack consumer at its prefetch; resuming acks and goes on."""
    h = Harness(prefetch=2)
    proto, t = h.client()
    proto.dataReceived(b"c consume q e\n")
    proto.pauseProducing()
    assert t.producerState == "paused"  # requests are not read while replies cannot leave
    proto.dataReceived(b"".join(b"m%d publish e x\n" % i for i in range(5)))
    assert len([x for x in h.lines(t) if b"event=e" in x]) == 2
    proto.resumeProducing()
    settle(h.hub)
    proto.resumeProducing()
    assert t.producerState == "producing"
    assert len([x for x in h.lines(t) if b"event=e" in x]) == 3


def test_manual_ack_prefetch_limit() -> None:
    """At most ``prefetch`` unacked messages; each ack lets one more through."""
    h = Harness(prefetch=3)
    proto, t = h.client()
    proto.dataReceived(b"c consume q e --manual-ack\n" +
                       b"".join(b"m%d publish e x\n" % i for i in range(10)))
    got = [x for x in h.lines(t) if b"event=e" in x]
    assert [x.split(b" ")[2] for x in got] == [b"m0", b"m1", b"m2"]
    proto.dataReceived(b"a ack c m1\n")
    assert [x.split(b" ")[2] for x in h.lines(t)] == [b"m3"]


def test_delete_when_unused_on_the_clock_and_after_restart() -> None:
    """The timer starts when the last consumer leaves; a restart re-arms it for unused queues."""
    h = Harness()
    proto, t = h.client()
    proto.dataReceived(b"c consume --confirm q e --delete-queue-when-unused=3\n")
    assert h.lines(t) == [b"c ok "]
    t.loseConnection()
    h.clock.advance(2.9)
    assert "q" in h.service.registry.queues
    h.clock.advance(0.2)
    assert "q" not in h.service.registry.queues
    assert h.hub.broker.queue("mqks/q") is None
    proto, t = h.client()
    proto.dataReceived(b"c2 consume --confirm q2 e --delete-queue-when-unused=5\n")
    assert h.lines(t) == [b"c2 ok "]
    h.restart()
    assert h.service.registry.queues["q2"].events == {"e"}
    h.clock.advance(4.9)
    assert "q2" in h.service.registry.queues
    h.clock.advance(0.2)
    assert "q2" not in h.service.registry.queues


def test_foreign_messages_get_a_safe_id_and_rendered_bodies() -> None:
    """Another protocol's message: a usable mqks-id header is kept, anything else gives the
    core id; a body MQKS cannot carry is rendered (never an exception in delivery)."""
    h = Harness()
    proto, t = h.client()
    proto.dataReceived(b"c consume --confirm q e\n")
    h.lines(t)
    broker = h.hub.broker
    headers = [{"mqks-id": "ok-id"}, {"mqks-id": "has space"}, {"mqks-id": "caf\u00e9"}, None]
    broker.publish_batch("e", [b"a", b"b\nc", b"\xff", b""], origin="nats", headers=headers)
    lines = h.lines(t)
    first = broker.last_ids[0]
    assert lines[0] == b"c ok ok-id event=e a"
    assert lines[1] == b"c ok %016x event=e,enc=json \"b\\nc\"" % (first + 1)
    assert lines[2] == b"c ok %016x event=e,enc=base64 /w==" % (first + 2)
    assert lines[3] == b"c ok %016x event=e " % (first + 3)


def test_same_consumer_id_twice_replaces_the_first() -> None:
    """A second ``consume`` with a known consumer id deletes the first one (no double delivery)."""
    h = Harness()
    proto, t = h.client()
    proto.dataReceived(b"c consume q e\nc consume q\nm publish e x\n")
    assert [x for x in h.lines(t) if b"event=e" in x] == [b"c ok m event=e x"]
    assert len(h.service.registry.queues["q"].consumers) == 1


# -- server-level fuzzing -----------------------------------------------------------------------

import re  # noqa: E402

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mqhub.testing import property_examples  # noqa: E402

_TOKENS = [b"publish", b"consume", b"rebind", b"ack", b"reject", b"delete_consumer",
           b"delete_queue", b"ping", b"_eval", b"--confirm", b"--add", b"--remove",
           b"--remove-mask", b"--manual-ack", b"--delete-queue-when-unused",
           b"--delete-queue-when-unused=0", b"--delete-queue-when-unused=0.5", b"--all", b"q1",
           b"q2", b"e1", b"e.*", b"a.b", b"c1", b"c2", b"m1", b"", b"\xff", b"*", b"~mqks.x",
           b"a..b", b"len(state.queues)", b"\r"]
_REPLY = re.compile(rb"[^ \n]* (ok .*|error \d{20}[0-9A-Za-z]{4})", re.DOTALL)
_line = st.lists(st.one_of(st.sampled_from(_TOKENS), st.binary(max_size=6).filter(
    lambda b: b"\n" not in b and b"\t" not in b)), max_size=7).map(b" ".join)


@settings(max_examples=property_examples(150), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.lists(_line, max_size=6)), max_size=8))
def test_any_request_sequence_is_answered_and_never_crashes(
        script: list[tuple[int, list[bytes]]]) -> None:
    """Three connections send random requests (and drop at random): every reply is well formed,
    no connection is closed (no TAB or over-long line here), and the registry stays consistent."""
    h = Harness(prefetch=3)
    conns = [h.client() for _ in range(3)]
    for who, lines in script:
        proto, t = conns[who]
        if lines == [b"q1 q1"]:  # a rare drop-and-reconnect
            t.loseConnection()
            conns[who] = h.client()
            continue
        proto.dataReceived(b"".join(line + b"\n" for line in lines))
        h.clock.advance(1.0)
        for line in h.lines(t):
            assert _REPLY.fullmatch(line), line
        assert t.connected
    registry = h.service.registry
    for cid, consumer in registry.consumers.items():
        assert registry.queues[consumer.queue.name] is consumer.queue
        assert consumer.queue.consumers[cid] is consumer
        assert len(consumer.unacked) <= 3
    for name, q in registry.queues.items():
        assert h.hub.broker.queue("mqks/" + name) is q.core
        assert {b.pattern for b in h.hub.broker.bindings(q.core.name)} >= q.events


def test_consumers_per_connection_are_capped(monkeypatch: Any) -> None:
    """Beyond the cap a consume is an error; re-consuming a known id still works."""
    from mqhub.protocols.mqks import server

    monkeypatch.setattr(server, "MAX_CONSUMERS", 2)
    h = Harness()
    proto, t = h.client()
    proto.dataReceived(b"c1 consume q e\nc2 consume q\nc3 consume q\nc2 consume q\n")
    lines = h.lines(t)
    assert len(lines) == 1 and lines[0].startswith(b"c3 error ")
    assert sorted(h.service.registry.consumers) == [b"c1", b"c2"]


def test_fatal_line_closes_only_after_pending_confirms() -> None:
    """A TAB or over-long line after a confirmed publish: the confirm still goes out, then the
    connection closes; nothing after the bad line runs."""
    h = Harness()
    proto, t = h.client()
    proto.dataReceived(b"rb rebind --confirm q e\n")
    assert h.lines(t) == [b"rb ok "]
    proto.dataReceived(b"m1 publish --confirm e one\nbad\tline\nm2 publish e never\n")
    assert t.connected  # waiting for the commit of m1
    assert h.lines(t) == [b"m1 ok "]
    assert not t.connected
    assert h.service.registry.queues["q"].core.depth == 1
    proto2, t2 = h.client()
    proto2.dataReceived(b"m3 publish --confirm e x\n" + b"y" * (2 << 20))
    lines = h.lines(t2)
    assert lines[0] == b"m3 ok " and lines[1].startswith(b"None error ") and not t2.connected


def test_shared_queue_is_served_message_by_message() -> None:
    """A burst published in one read is spread over two consumers one message at a time; alone
    again, a consumer takes batches without a credit limit."""
    h = Harness()
    a, ta = h.client()
    b, tb = h.client()
    a.dataReceived(b"ca consume q e\n")
    b.dataReceived(b"cb consume q\n")
    h.lines(ta)
    h.lines(tb)
    a.dataReceived(b"".join(b"m%d publish e x\n" % i for i in range(10)))
    got_a = [x.split(b" ")[2] for x in h.lines(ta)]
    got_b = [x.split(b" ")[2] for x in h.lines(tb)]
    assert len(got_a) == len(got_b) == 5 and sorted(got_a + got_b) == sorted(
        b"m%d" % i for i in range(10))
    b.dataReceived(b"d delete_consumer cb\n")
    a.dataReceived(b"".join(b"n%d publish e x\n" % i for i in range(10)))
    assert len(h.lines(ta)) == 10
    consumer = h.service.registry.consumers[b"ca"]
    assert not consumer.metered and consumer.core.credit > 10**12


def test_duplicate_message_ids_are_acked_one_by_one() -> None:
    """Two publishers reusing a request id: each ``ack`` of that id settles one of the copies."""
    h = Harness()
    proto, t = h.client()
    proto.dataReceived(b"c consume q e --manual-ack\nm publish e one\nm publish e two\n")
    assert [x.split(b" ", 4)[4] for x in h.lines(t)] == [b"one", b"two"]
    core = h.service.registry.queues["q"].core
    proto.dataReceived(b"a ack c m\n")
    settle(h.hub)
    assert core.in_flight == 1
    proto.dataReceived(b"a ack c m\n")
    settle(h.hub)
    assert core.in_flight == 0 and core.depth == 0


def test_an_unreadable_settings_row_is_logged_and_the_queue_still_recovers() -> None:
    """A corrupt ``delete_when_unused`` row must not fail recovery: the queue and its bindings
    come back without the setting, and the row is named in a warning (never silently)."""
    from twisted.logger import capturedLogs

    from mqhub.protocols.mqks.queues import META_PREFIX
    from mqhub.store.batch import WriteBatch

    h = Harness()
    proto, t = h.client()
    proto.dataReceived(b"c consume --confirm q e --delete-queue-when-unused=5\n"
                       b"c2 consume --confirm q2 e2\n")
    assert h.lines(t) == [b"c ok ", b"c2 ok "]
    batch = WriteBatch()
    batch.put_meta(META_PREFIX + "q", b"{not json")
    batch.put_meta(META_PREFIX + "q2", b'{"delete_when_unused": "soon"}')
    h.store.commit(batch)
    settle(h.hub)
    with capturedLogs() as events:
        h.restart()
    registry = h.service.registry
    assert registry.queues["q"].events == {"e"}
    assert registry.queues["q"].delete_when_unused is None
    assert registry.queues["q2"].delete_when_unused is None
    warned = [e for e in events if "unreadable settings row" in e.get("log_format", "")]
    assert sorted(e["name"] for e in warned) == ["q", "q2"]
