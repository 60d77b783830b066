"""Bad input, parametrized over every protocol (DESIGN.md §8).

Each case sends one kind of bad input on a fresh raw connection of one protocol and checks the
protocol's own error (NSQ error frame, NSQ HTTP JSON ``{"message": CODE}``, NATS ``-ERR``,
mq9 JSON ``{"error": ...}`` reply and never ``-ERR``, Redis ``-ERR``, eMQP: dropped with a
logged code, as eMQP has no error frame; MQKS ``{id} error {error_id}``, and a TAB closes the
connection without a reply, as the original server does). A fatal error closes that connection; a non-fatal one
leaves it answering a probe. Either way, clients of the SAME protocol and of ANOTHER protocol
that were connected before still publish and receive afterwards.
"""

from __future__ import annotations

import random
import socket
import struct
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import zmq

from tests.behaviour.clients import HOST, EmqpPublisher
from tests.behaviour.conftest import Drivers
from tests.interop.broker import BrokerProcess, wait_until

#: The healthy "other protocol" paired with each protocol under test.
OTHER = {"nsq": "nats", "nsq-http": "redis", "nats": "redis", "mq9": "nsq", "redis": "nsq",
         "emqp": "nsq", "mqks": "nsq"}
#: The consumer and publisher drivers standing for the protocol under test.
SAME_CONSUMER = {"nsq": "nsq", "nsq-http": "nsq", "nats": "nats", "mq9": "nats", "redis": "redis",
                 "mqks": "mqks"}
SAME_PUBLISHER = {"mq9": "nats"}
TCP_PORTS = {"nsq": ("nsq", "tcp"), "nats": ("mq9", "tcp"), "mq9": ("mq9", "tcp"),
             "redis": ("redis", "tcp"), "mqks": ("mqks", "tcp")}

NATS_PING, REDIS_PING = b"PING\r\n", b"*1\r\n$4\r\nPING\r\n"
MQKS_PING = b"probe ping pong\n"


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
    Case("mq9", "create-bad-json",
         b"SUB _INBOX.r 1\r\nPUB $mq9.AI.MAILBOX.CREATE _INBOX.r 5\r\n{bad}\r\n",
         b'{"error":"invalid JSON request', False),
    Case("mq9", "query-unknown-mailbox",
         b'SUB _INBOX.r 1\r\nPUB $mq9.AI.MAILBOX.QUERY.m000000000000000000000000 _INBOX.r 13\r\n'
         b'{"token":"x"}\r\n', b'{"error":', False),
    Case("nsq-http", "invalid-topic", b"POST /pub?topic=bad!", b'{"message":"INVALID_TOPIC"}', False),
    Case("nsq-http", "empty-body", b"POST /pub?topic=fine", b'{"message":"MSG_EMPTY"}', False),
    Case("nsq-http", "missing-topic", b"POST /pub", b'{"message":"MISSING_ARG_TOPIC"}', False),
    Case("nsq-http", "unknown-path", b"GET /nope", b'{"message":"NOT_FOUND"}', False),
    Case("redis", "bad-multibulk", b"*abc\r\n", b"-ERR Protocol error: invalid multibulk length",
         True),
    Case("redis", "bad-bulk", b"*1\r\n$x\r\n", b"-ERR Protocol error: invalid bulk length", True),
    Case("redis", "unknown-command", b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n",
         b"-ERR unknown command 'GET'", False),
    Case("mqks", "unsplittable", b"x ping\n", b"None error ", False),
    Case("mqks", "unknown-action", b"x bogus data\n", b"x error ", False),
    Case("mqks", "unknown-flag", b"x consume q --nope\n", b"x error ", False),
    Case("mqks", "missing-data", b"x publish e1\n", b"x error ", False),
    Case("mqks", "tab", b"x ping a\tb\n", b"", True),  # closed without a reply, as the original
    Case("mqks", "endless-line", b"x publish e " + b"x" * (1 << 20), b"None error ", True),
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
    with socket.create_connection((HOST, broker.port(*TCP_PORTS[case.protocol])), timeout=10) as sock:
        prefix, probe, answer = b"", b"", b""
        if case.protocol in ("nats", "mq9"):
            read_until(sock, lambda d: d.endswith(b"\r\n"))  # INFO
            prefix = b'CONNECT {"verbose":false,"pedantic":false}\r\n'
            probe, answer = NATS_PING, b"PONG\r\n"
        elif case.protocol == "redis":
            probe, answer = REDIS_PING, b"+PONG\r\n"
        elif case.protocol == "mqks":
            probe, answer = MQKS_PING, b"probe ok pong\n"
        sock.sendall(prefix + case.payload + (b"" if case.fatal else probe))
        return read_until(sock, lambda d: not case.fatal and d.endswith(answer))


def send_bad_http(broker: BrokerProcess, case: Case) -> tuple[int, bytes]:
    """Send ``METHOD PATH`` (empty body) to the NSQ HTTP port; return (status, JSON body)."""
    assert isinstance(case.payload, bytes)
    method, path = case.payload.decode().split(" ", 1)
    url = f"http://{HOST}:{broker.port('nsq', 'http')}{path}"
    request = urllib.request.Request(url, data=b"" if method == "POST" else None, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def send_bad_emqp(broker: BrokerProcess, case: Case) -> bytes:
    """Send the frames on a new DEALER to pub-in; wait for the logged code; return any reply."""
    assert isinstance(case.payload, list)
    bad = EmqpPublisher(broker.url("emqp", "pub-in"))
    try:
        code = case.error.decode()
        before = broker.output().count(code)
        bad.send(case.payload)
        wait_until(lambda: broker.output().count(code) > before, f"{code!r} logged")
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
    if case.protocol in SAME_CONSUMER:
        consumers.append(drivers.consumer(SAME_CONSUMER[case.protocol], address))
    same_publisher = drivers.publisher(SAME_PUBLISHER.get(case.protocol, case.protocol))
    other_publisher = drivers.publisher(other)
    other_publisher.publish(address, [b"before"])
    for consumer in consumers:
        assert consumer.take(1) == [b"before"]

    if case.protocol == "emqp":
        assert send_bad_emqp(broker, case) == b"", "eMQP has no error frame: nothing is sent back"
    elif case.protocol == "nsq-http":
        status, body = send_bad_http(broker, case)
        assert status in (400, 404), (status, body)
        assert body.replace(b" ", b"") == case.error, body
    else:
        reply, closed = send_bad_tcp(broker, case)
        assert closed == case.fatal, f"closed={closed} for {reply[:300]!r}"
        if case.protocol == "nsq":
            frames = nsq_frames(reply)
            assert frames and frames[-1][0] == 1, f"no NSQ error frame in {reply[:300]!r}"
            assert frames[-1][1].startswith(case.error), frames
        elif case.protocol == "mqks" and not case.error:
            assert reply == b"", reply[:300]
        else:
            assert reply.count(case.error) == 1, reply[:300]
        if case.protocol == "mq9":
            assert b"-ERR" not in reply, reply

    bodies = [b"same protocol after " + case.name.encode(), b"other protocol \x00\n\xff"]
    same_publisher.publish(address, bodies[:1])
    other_publisher.publish(address, bodies[1:])
    for consumer in consumers:
        assert sorted(consumer.take(2)) == sorted(bodies)
    assert broker.running


#: Valid traffic per protocol, mutated by the garbage test.
SAMPLES: dict[str, list[bytes]] = {
    "nsq": [b"  V2PUB t\n\x00\x00\x00\x02hi", b"  V2SUB t c\nRDY 5\nFIN 0123456789abcdef\n",
            b"  V2MPUB t\n\x00\x00\x00\x0b\x00\x00\x00\x01\x00\x00\x00\x03abc",
            b'  V2IDENTIFY\n\x00\x00\x00\x02{}'],
    "nats": [b'CONNECT {"verbose":false,"headers":true}\r\nPUB a 2\r\nhi\r\n',
             b"SUB a.> q 1\r\nUNSUB 1 5\r\nPING\r\n",
             b"HPUB a 12 14\r\nNATS/1.0\r\n\r\nhi\r\n"],
    "redis": [b"*3\r\n$7\r\nPUBLISH\r\n$1\r\na\r\n$2\r\nhi\r\n", b"*2\r\n$9\r\nSUBSCRIBE\r\n$1\r\na\r\n",
              b"HELLO 3\r\nPING\r\n"],
    "mqks": [b"c1 consume --confirm q1 e1 e.*.x --manual-ack\nm1 publish e1 hi\n",
             b"r rebind q1 e2 --remove-mask e* --add a.b\na ack c1 --all\nj reject c1 m1\n",
             b"p ping x\ne _eval len(state.queues)\nd delete_queue q1\n"],
    "nsq-http": [b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi",
                 b"POST /mpub?topic=t&binary=true HTTP/1.1\r\nContent-Length: 9\r\n\r\n"
                 b"\x00\x00\x00\x01\x00\x00\x00\x01x"],
}


def mutations(rng: random.Random, samples: list[bytes], count: int) -> list[bytes]:
    """``count`` blobs: samples with bytes flipped, cut, repeated or spliced, and pure noise."""
    blobs = []
    for n in range(count):
        blob = bytearray(rng.choice(samples))
        kind = n % 4
        if kind == 0:
            for _ in range(rng.randint(1, 4)):
                blob[rng.randrange(len(blob))] = rng.randrange(256)
        elif kind == 1:
            blob = blob[: rng.randrange(1, len(blob))] + rng.choice(samples)
        elif kind == 2:
            blob = blob * rng.randint(2, 50)
        else:
            blob = bytearray(rng.randbytes(rng.randint(1, 3000)))
        blobs.append(bytes(blob))
    return blobs


@pytest.mark.parametrize("protocol", ["nsq", "nsq-http", "nats", "redis", "emqp", "mqks"])
def test_mutated_and_random_input_never_hurts_the_broker(
    broker: BrokerProcess, drivers: Drivers, protocol: str
) -> None:
    """60 mutated or random inputs (fixed seed), each on its own connection, crash nothing and
    log no traceback; afterwards NSQ, NATS and Redis clients still publish and receive."""
    rng = random.Random(f"behaviour-{protocol}")
    tracebacks = broker.output().count("Traceback")
    if protocol == "emqp":
        frames = [b"", b"eMQP/1.0", b"PUBLISH", b"id", b"t", b"m", b"REQUEST", b"INFORM", b"READY"]
        for _ in range(60):
            dealer = EmqpPublisher(broker.url("emqp", rng.choice(["pub-in", "frontend", "backend"])))
            dealer.send([rng.choice(frames + [rng.randbytes(rng.randint(0, 300))])
                         for _ in range(rng.randint(1, 12))])
            dealer.close()
    else:
        port = broker.port(*TCP_PORTS.get(protocol, ("nsq", "http")))
        for blob in mutations(rng, SAMPLES[protocol], 60):
            with socket.create_connection((HOST, port), timeout=10) as sock:
                try:
                    sock.sendall(blob)
                    sock.shutdown(socket.SHUT_WR)
                except (BrokenPipeError, ConnectionResetError):
                    continue  # the broker already refused it and closed
                _, closed = read_until(sock, lambda data: False)  # the broker saw it all
                assert closed
    address = f"garbage.{protocol}"
    consumers = [drivers.consumer(name, address) for name in ("nsq", "nats", "redis")]
    for name in ("nsq", "nats", "redis"):
        drivers.publisher(name).publish(address, [name.encode()])
    for consumer in consumers:
        assert sorted(consumer.take(3)) == [b"nats", b"nsq", b"redis"]
    assert broker.running
    assert broker.output().count("Traceback") == tracebacks, broker.output()[-5000:]
