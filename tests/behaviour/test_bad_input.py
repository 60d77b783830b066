"""Bad input, parametrized over every protocol (DESIGN.md §8).

Each case sends one kind of bad input on a fresh raw connection of one protocol and checks the
protocol's own error (NSQ error frame, NATS ``-ERR``, Redis ``-ERR``, eMQP: dropped with a
logged code, as eMQP has no error frame). A fatal error closes that connection; a non-fatal one
leaves it answering a probe. Either way, clients of the SAME protocol and of ANOTHER protocol
that were connected before still publish and receive afterwards.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import zmq

from tests.behaviour.clients import HOST, EmqpPublisher
from tests.behaviour.conftest import Drivers
from tests.interop.broker import BrokerProcess

#: The healthy "other protocol" paired with each protocol under test.
OTHER = {"nsq": "nats", "nats": "redis", "redis": "nsq", "emqp": "nsq"}
CONSUMERS = {"nsq", "nats", "redis"}

NATS_PING, REDIS_PING = b"PING\r\n", b"*1\r\n$4\r\nPING\r\n"


@dataclass(frozen=True)
class Case:
    """One bad input: what is sent, the error expected back, and whether it closes."""

    protocol: str
    name: str
    payload: bytes | list[bytes]
    error: bytes
    fatal: bool

    def __str__(self) -> str:
        """Test id."""
        return f"{self.protocol}-{self.name}"


CASES = [
    Case("nsq", "bad-magic", b"  V9PUB t\n", b"E_BAD_PROTOCOL", True),
    Case("nsq", "unknown-command", b"  V2BOGUS\n", b"E_INVALID", True),
    Case("nsq", "bad-topic", b"  V2PUB bad!topic\n\x00\x00\x00\x01x", b"E_BAD_TOPIC", True),
    Case("nsq", "empty-body", b"  V2PUB fine\n\x00\x00\x00\x00", b"E_BAD_MESSAGE", True),
    Case("nsq", "endless-line", b"  V2" + b"X" * 20000, b"E_INVALID", True),
    Case("nsq", "rdy-before-sub", b"  V2RDY 5\n", b"E_INVALID", True),
    Case("nats", "unknown-operation", b"FOO BAR\r\n", b"-ERR 'Unknown Protocol Operation'", True),
    Case("nats", "payload-overrun", b"PUB a 3\r\nabcdef\r\n", b"-ERR 'Unknown Protocol Operation'",
         True),
    Case("nats", "endless-control-line", b"SUB " + b"x" * 6000,
         b"-ERR 'maximum control line exceeded'", True),
    Case("nats", "invalid-subject", b"SUB foo..bar 1\r\n", b"-ERR 'Invalid Subject'", False),
    Case("redis", "bad-multibulk", b"*abc\r\n", b"-ERR Protocol error: invalid multibulk length",
         True),
    Case("redis", "bad-bulk", b"*1\r\n$x\r\n", b"-ERR Protocol error: invalid bulk length", True),
    Case("redis", "unknown-command", b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n",
         b"-ERR unknown command 'GET'", False),
    Case("emqp", "short-message", [b"", b"junk"], b"E_SHORT_MESSAGE", False),
    Case("emqp", "bad-version", [b"", b"eMQP/9.9", b"PUBLISH", b"id", b"t", b"m"],
         b"E_BAD_VERSION", False),
]


def read_until(sock: socket.socket, done: Callable[[bytes], bool], timeout: float = 10.0) -> tuple[bytes, bool]:
    """Read until ``done(data)`` or EOF; return (data, closed). Fails at the deadline."""
    data = b""
    deadline = time.monotonic() + timeout
    while not done(data):
        left = deadline - time.monotonic()
        assert left > 0, f"neither the expected reply nor a close arrived; got {data[:300]!r}"
        sock.settimeout(min(left, 0.5))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return data, True
        if not chunk:
            return data, True
        data += chunk
    return data, False


def nsq_frames(data: bytes) -> list[tuple[int, bytes]]:
    """Split raw NSQ server output into (frame type, data) pairs."""
    frames = []
    while len(data) >= 8:
        size, kind = struct.unpack(">II", data[:8])
        frames.append((kind, data[8:4 + size]))
        data = data[4 + size:]
    return frames


def send_bad_tcp(broker: BrokerProcess, case: Case) -> tuple[bytes, bool]:
    """Send ``case.payload`` on a new TCP connection; return what came back and whether it closed.

    A fatal case reads until the broker closes; a non-fatal one appends a PING and reads until
    its answer (so the connection demonstrably still works).
    """
    assert isinstance(case.payload, bytes)
    port = broker.port({"nsq": "nsq", "nats": "mq9", "redis": "redis"}[case.protocol], "tcp")
    with socket.create_connection((HOST, port), timeout=10) as sock:
        prefix, probe, answer = b"", b"", b""
        if case.protocol == "nats":
            read_until(sock, lambda d: d.endswith(b"\r\n"))  # INFO
            prefix = b'CONNECT {"verbose":false,"pedantic":false}\r\n'
            probe, answer = NATS_PING, b"PONG\r\n"
        elif case.protocol == "redis":
            probe, answer = REDIS_PING, b"+PONG\r\n"
        sock.sendall(prefix + case.payload + (b"" if case.fatal else probe))
        return read_until(sock, lambda d: not case.fatal and d.endswith(answer))


def send_bad_emqp(broker: BrokerProcess, case: Case) -> bytes:
    """Send the frames on a new DEALER to pub-in; wait for the logged code; return any reply."""
    assert isinstance(case.payload, list)
    bad = EmqpPublisher(broker.url("emqp", "pub-in"))
    try:
        before = broker.output().count(case.error.decode())
        bad.send(case.payload)
        deadline = time.monotonic() + 10
        while broker.output().count(case.error.decode()) <= before:
            assert time.monotonic() < deadline, f"{case.error!r} was not logged"
            time.sleep(0.01)
        if bad.sock.poll(200, zmq.POLLIN):
            return b"".join(bad.sock.recv_multipart())
        return b""
    finally:
        bad.close()


@pytest.mark.parametrize("case", CASES, ids=str)
def test_bad_input_gets_own_error_and_only_that_connection_suffers(
    broker: BrokerProcess, drivers: Drivers, case: Case
) -> None:
    """Bad input gets the protocol's own error, closes (if fatal) only its connection; others keep working."""
    address = f"bad.{case.protocol}.{case.name}"
    other = OTHER[case.protocol]
    consumers = [drivers.consumer(other, address)]
    if case.protocol in CONSUMERS:
        consumers.append(drivers.consumer(case.protocol, address))
    same_publisher = drivers.publisher(case.protocol)
    other_publisher = drivers.publisher(other)
    other_publisher.publish(address, [b"before"])
    for consumer in consumers:
        assert consumer.take(1) == [b"before"]

    if case.protocol == "emqp":
        assert send_bad_emqp(broker, case) == b"", "eMQP has no error frame: nothing is sent back"
    else:
        reply, closed = send_bad_tcp(broker, case)
        assert closed == case.fatal, f"closed={closed} for {reply[:300]!r}"
        if case.protocol == "nsq":
            frames = nsq_frames(reply)
            assert frames and frames[-1][0] == 1, f"no NSQ error frame in {reply[:300]!r}"
            assert frames[-1][1].startswith(case.error), frames
        else:
            assert reply.count(case.error) == 1, reply[:300]

    bodies = [b"same protocol after " + case.name.encode(), b"other protocol \x00\n\xff"]
    same_publisher.publish(address, bodies[:1])
    other_publisher.publish(address, bodies[1:])
    for consumer in consumers:
        assert sorted(consumer.take(2)) == sorted(bodies)
    assert broker.running
