"""The Redis example plugin in-process: RESP codec (whole, byte by byte, limits) and the adapter
over a memory hub with StringTransport and a Clock."""

from __future__ import annotations

import random
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransportWithDisconnection

from mqhub.discovery import load_plugins
from mqhub.testing import CollectingTarget, memory_hub
from tests.plugins import EXAMPLE_PLUGINS, isolated_plugin_path


@pytest.fixture(scope="module")
def redis_modules() -> Iterator[tuple[ModuleType, ModuleType]]:
    """The example's ``resp`` and ``server`` modules, loaded through the plugin path."""
    with isolated_plugin_path():
        load_plugins([str(EXAMPLE_PLUGINS)])
        from mqhub.plugins._redis_example import resp, server

        yield resp, server


@pytest.fixture
def resp(redis_modules: tuple[ModuleType, ModuleType]) -> ModuleType:
    """The sans-IO codec module."""
    return redis_modules[0]


@pytest.fixture
def server(redis_modules: tuple[ModuleType, ModuleType]) -> ModuleType:
    """The Twisted adapter module."""
    return redis_modules[1]


def events(resp: ModuleType, chunks: list[bytes]) -> list[Any]:
    """Feed ``chunks`` one by one and collect every command."""
    codec = resp.RespCodec()
    out = []
    for chunk in chunks:
        codec.receive_data(chunk)
        while (event := codec.next_event()) is not resp.NEED_DATA:
            out.append(event)
    return out


STREAM = (
    b"*1\r\n$4\r\nPING\r\n"
    b"*3\r\n$7\r\nPUBLISH\r\n$4\r\nnews\r\n$6\r\na\r\nb\r\n\r\n"
    b"PING inline\r\n"
    b"\r\n"
    b"*0\r\n"
    b"*2\r\n$9\r\nSUBSCRIBE\r\n$0\r\n\r\n"
)
EXPECTED = [[b"PING"], [b"PUBLISH", b"news", b"a\r\nb\r\n"], [b"PING", b"inline"], [b"SUBSCRIBE", b""]]


def test_codec_whole_bytewise_and_random_splits(resp: ModuleType) -> None:
    """The same commands come out whether the stream arrives whole, byte by byte or split anyhow."""
    assert events(resp, [STREAM]) == EXPECTED
    assert events(resp, [STREAM[i : i + 1] for i in range(len(STREAM))]) == EXPECTED
    rng = random.Random(7)
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(STREAM)), 6))
        pieces = [STREAM[a:b] for a, b in zip([0, *cuts], [*cuts, len(STREAM)], strict=True)]
        assert events(resp, pieces) == EXPECTED


def test_codec_resumes_a_split_command_instead_of_reparsing_it(resp: ModuleType) -> None:
    """A 20,000-argument command arriving in 1 KiB reads parses each header line about once
    (re-parsing from the start on every read would cost about 2,000,000 header parses)."""
    n = 20_000
    data = b"*%d\r\n" % n + b"".join(b"$%d\r\n%d\r\n" % (len(b"%d" % i), i) for i in range(n))
    data += b"*1\r\n$4\r\nPING\r\n"
    codec = resp.RespCodec()
    parsed_lines = 0
    line = codec._line

    def counting_line(start: int) -> Any:
        """Count header-line parses."""
        nonlocal parsed_lines
        parsed_lines += 1
        return line(start)

    codec._line = counting_line
    out = []
    reads = 0
    for i in range(0, len(data), 1024):
        codec.receive_data(data[i : i + 1024])
        reads += 1
        while (event := codec.next_event()) is not resp.NEED_DATA:
            out.append(event)
    assert out == [[b"%d" % i for i in range(n)], [b"PING"]]
    assert parsed_lines <= n + 1 + 2 + 2 * reads


def test_codec_skips_many_empty_multibulks_without_recursing(resp: ModuleType) -> None:
    """Thousands of ``*0`` in one read are skipped in a loop (no RecursionError out of the codec)."""
    codec = resp.RespCodec()
    codec.receive_data(b"*0\r\n" * 5000 + b"*1\r\n$4\r\nPING\r\n")
    assert codec.next_event() == [b"PING"]
    assert codec.next_event() is resp.NEED_DATA


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"*x\r\n", "Protocol error: invalid multibulk length"),
        (b"*1\r\n:5\r\n", "Protocol error: expected '$', got ':'"),
        (b"*1\r\n$-3\r\n", "Protocol error: invalid bulk length"),
        (b"*1\r\n$2\r\nabcd\r\n", "Protocol error: bulk string not terminated by CRLF"),
        (b"*1\r\n$99\r\n", "Protocol error: invalid bulk length"),
        (b"x" * 70, "Protocol error: too big inline request"),
    ],
)
def test_codec_errors_are_fatal_with_redis_wording(resp: ModuleType, data: bytes, message: str) -> None:
    """Broken framing and exceeded limits raise fatal ProtocolErrors worded like redis-server."""
    codec = resp.RespCodec(max_bulk=10, max_inline=64)
    codec.receive_data(data)
    with pytest.raises(resp.ProtocolError) as info:
        codec.next_event()
    assert info.value.message == message
    assert info.value.code == "ERR" and info.value.fatal


def test_encode_resp2_and_resp3(resp: ModuleType) -> None:
    """Replies encode per protocol version: pushes, maps and nulls differ between RESP2 and RESP3."""
    assert resp.encode(resp.SimpleString("OK")) == b"+OK\r\n"
    assert resp.encode(resp.ErrorReply("ERR no")) == b"-ERR no\r\n"
    assert resp.encode(3) == b":3\r\n"
    assert resp.encode(None, 2) == b"$-1\r\n" and resp.encode(None, 3) == b"_\r\n"
    push = [b"message", b"c", b"x"]
    assert resp.encode(push, 2, push=True) == b"*3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$1\r\nx\r\n"
    assert resp.encode(push, 3, push=True).startswith(b">3\r\n")
    assert resp.encode({"proto": 3}, 3) == b"%1\r\n$5\r\nproto\r\n:3\r\n"
    assert resp.encode({"proto": 2}, 2) == b"*2\r\n$5\r\nproto\r\n:2\r\n"


def test_glob_translation(server: ModuleType) -> None:
    """Redis globs map onto hub patterns; unsupported glob syntax is refused."""
    assert server.glob_to_pattern("news.*") == "news.>"
    assert server.glob_to_pattern("*") == ">"
    assert server.glob_to_pattern("a.*.c") == "a.*.c"
    assert server.glob_to_pattern("user*.x") == "user*.x"
    from mqhub.errors import InvalidName

    with pytest.raises(InvalidName):
        server.glob_to_pattern("news.?")


class Conn:
    """One adapter connection over a StringTransport, with helpers."""

    def __init__(self, server: ModuleType, hub: Any) -> None:
        """Connect a new protocol instance."""
        self.proto = server.RespFactory(hub).buildProtocol(IPv4Address("TCP", "127.0.0.1", 5555))
        self.transport = StringTransportWithDisconnection()
        self.transport.protocol = self.proto
        self.proto.makeConnection(self.transport)

    def send(self, *commands: list[bytes]) -> bytes:
        """Send commands as RESP arrays; return (and clear) what the server wrote."""
        data = b"".join(
            b"*%d\r\n" % len(c) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in c) for c in commands
        )
        self.proto.dataReceived(data)
        out = self.transport.value()
        self.transport.clear()
        return out


@pytest.fixture
def hub() -> Any:
    """A started memory hub (MemoryStore, Clock, real Broker)."""
    return memory_hub()


def test_hello_3_then_ping(server: ModuleType, hub: Any) -> None:
    """HELLO 3 answers a RESP3 map with proto 3; later replies use RESP3."""
    conn = Conn(server, hub)
    out = conn.send([b"HELLO", b"3"])
    assert out.startswith(b"%7\r\n") and b"$5\r\nproto\r\n:3\r\n" in out
    assert conn.send([b"PING"]) == b"+PONG\r\n"
    assert conn.send([b"HELLO", b"4"]) == b"-NOPROTO unsupported protocol version\r\n"


def test_publish_reaches_other_protocols_and_back(server: ModuleType, hub: Any) -> None:
    """A Redis PUBLISH is routed through the address space, and any publish reaches a SUBSCRIBEr."""
    other = CollectingTarget("nats")
    hub.broker.subscribe("orders.*", other)
    pub = Conn(server, hub)
    assert pub.send([b"PUBLISH", b"orders.new", b"o1"]) == b":1\r\n"
    assert other.bodies == [b"o1"]
    assert other.entries[0][8] == "redis"  # origin protocol recorded

    sub = Conn(server, hub)
    assert sub.send([b"SUBSCRIBE", b"orders.new"]) == (
        b"*3\r\n$9\r\nsubscribe\r\n$10\r\norders.new\r\n:1\r\n"
    )
    hub.broker.publish_batch("orders.new", [b"from-nsq"], origin="nsq")
    assert sub.transport.value() == b"*3\r\n$7\r\nmessage\r\n$10\r\norders.new\r\n$8\r\nfrom-nsq\r\n"


def test_pipelined_publishes_are_one_core_batch(server: ModuleType, hub: Any) -> None:
    """Consecutive PUBLISHes to one channel in a read become one publish_batch call."""
    target = CollectingTarget()
    hub.broker.subscribe("bulk", target)
    conn = Conn(server, hub)
    out = conn.send(*[[b"PUBLISH", b"bulk", b"m%d" % n] for n in range(5)], [b"PING"])
    assert out == b":1\r\n" * 5 + b"+PONG\r\n"
    assert len(target.batches) == 1 and target.bodies == [b"m%d" % n for n in range(5)]


def test_subscribed_resp2_connection_refuses_other_commands(server: ModuleType, hub: Any) -> None:
    """In RESP2 subscriber mode only (P)(UN)SUBSCRIBE, PING, QUIT and RESET are allowed."""
    conn = Conn(server, hub)
    conn.send([b"SUBSCRIBE", b"a"])
    out = conn.send([b"PUBLISH", b"a", b"x"])
    assert out.startswith(b"-ERR Can't execute 'publish'")
    assert conn.send([b"PING"]) == b"*2\r\n$4\r\npong\r\n$0\r\n\r\n"
    assert conn.send([b"UNSUBSCRIBE"]) == b"*3\r\n$11\r\nunsubscribe\r\n$1\r\na\r\n:0\r\n"
    assert conn.send([b"UNSUBSCRIBE"]) == b"*3\r\n$11\r\nunsubscribe\r\n$-1\r\n:0\r\n"


def test_connection_lost_removes_bindings(server: ModuleType, hub: Any) -> None:
    """A closed connection leaves no binding behind in the core."""
    conn = Conn(server, hub)
    conn.send([b"SUBSCRIBE", b"x.y"], [b"PSUBSCRIBE", b"x.*"])
    assert len(hub.broker.bindings()) == 2
    conn.transport.loseConnection()
    assert hub.broker.bindings() == []


def test_protocol_error_replies_then_closes_only_that_connection(server: ModuleType, hub: Any) -> None:
    """Broken framing gets the redis error and closes that connection; commands before it ran."""
    conn = Conn(server, hub)
    other = Conn(server, hub)
    conn.proto.dataReceived(b"*1\r\n$4\r\nPING\r\n*1\r\n:9\r\n")
    assert conn.transport.value() == b"+PONG\r\n-ERR Protocol error: expected '$', got ':'\r\n"
    assert not conn.transport.connected
    assert other.send([b"PING"]) == b"+PONG\r\n"


def test_unknown_command_and_bad_channel(server: ModuleType, hub: Any) -> None:
    """Unknown verbs and invalid addresses get redis-style errors, not a crash."""
    conn = Conn(server, hub)
    assert conn.send([b"GET", b"k"]).startswith(b"-ERR unknown command 'GET'")
    assert conn.send([b"PUBLISH", b"a..b", b"x"]).startswith(b"-ERR invalid address")
    assert conn.send([b"PSUBSCRIBE", b"a.[bc]"]).startswith(b"-ERR pattern")
    assert conn.send([b"PUBLISH", b"\xff", b"x"]) == b"-ERR channel names must be UTF-8\r\n"
    assert conn.send([b"PING"]) == b"+PONG\r\n"


def test_publish_waits_for_the_store_before_replying(server: ModuleType) -> None:
    """With a grouping store the reply (and later commands) wait for the commit."""
    from twisted.internet.task import Clock

    from mqhub.store.memory import MemoryStore

    clock = Clock()
    store = MemoryStore(clock=clock)
    store.open()
    hub = memory_hub(clock, store=store)
    hub.broker.declare_queue("keep")
    hub.broker.bind_queue("kept", "keep")
    conn = Conn(server, hub)
    assert conn.send([b"PUBLISH", b"kept", b"x"], [b"PING"]) == b""
    assert conn.transport.producerState == "paused"
    clock.advance(0)
    assert conn.transport.value() == b":1\r\n+PONG\r\n"
    assert conn.transport.producerState == "producing"


def test_random_input_never_escapes_the_connection(server: ModuleType) -> None:
    """Arbitrary bytes (and mangled valid commands) never raise out of dataReceived."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    hub = memory_hub()
    valid = [b"*1\r\n$4\r\nPING\r\n", b"*2\r\n$9\r\nSUBSCRIBE\r\n$3\r\na.b\r\n",
             b"*3\r\n$7\r\nPUBLISH\r\n$3\r\na.b\r\n$1\r\nx\r\n", b"*2\r\n$10\r\nPSUBSCRIBE\r\n$3\r\n*.*\r\n",
             b"*1\r\n$12\r\nPUNSUBSCRIBE\r\n", b"*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n"]
    pieces = st.one_of(st.binary(max_size=40), st.sampled_from(valid))

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(pieces, max_size=12))
    def feed(chunks: list[bytes]) -> None:
        """Feed one drawn sequence of chunks to a fresh connection, then close it."""
        conn = Conn(server, hub)
        for chunk in chunks:
            if not conn.transport.connected:
                break
            conn.proto.dataReceived(chunk)
        conn.transport.loseConnection()

    feed()
    assert hub.broker.bindings() == []  # every closed connection cleaned up after itself


def test_slow_subscriber_is_dropped_past_its_buffer_limit(server: ModuleType, hub: Any) -> None:
    """A subscriber that stops reading is dropped once unread pushes pass the limit; others live."""
    slow = Conn(server, hub)
    slow.proto.max_pubsub_buffer = 1000
    fast = Conn(server, hub)
    slow.send([b"SUBSCRIBE", b"firehose"])
    fast.send([b"SUBSCRIBE", b"firehose"])
    assert slow.transport.producer is slow.proto  # registered for flow control
    slow.proto.pauseProducing()  # what the reactor does when the client's socket buffer is full
    hub.broker.publish_batch("firehose", [b"x" * 400], origin="test")
    hub.broker.publish_batch("firehose", [b"x" * 400], origin="test")
    assert slow.transport.connected
    hub.broker.publish_batch("firehose", [b"x" * 400], origin="test")
    assert not slow.transport.connected and not slow.proto.channels
    assert fast.transport.value().count(b"message") == 3  # the fast one got everything
    assert len(hub.broker.bindings()) == 1


def test_resumed_subscriber_starts_counting_again(server: ModuleType, hub: Any) -> None:
    """Once the client reads again its unread-bytes count resets."""
    conn = Conn(server, hub)
    conn.proto.max_pubsub_buffer = 1000
    conn.send([b"SUBSCRIBE", b"t"])
    for _ in range(5):
        conn.proto.pauseProducing()
        hub.broker.publish_batch("t", [b"y" * 600], origin="test")
        conn.proto.resumeProducing()
    assert conn.transport.connected and not conn.transport.disconnecting
