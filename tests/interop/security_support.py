"""Shared pieces of the security interop tests: the users files, CURVE keys, one broker per
protocol set, and small helpers around the real clients (pynsq, nats-py, eventmq, and the MQKS
and VibeMQ test clients)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import nsq
import zmq
import zmq.auth

from tests.interop.broker import BrokerProcess

PROTOCOLS = ["nsq", "nats", "mqks", "vibemq", "emqp"]

#: the users of every security test. alice may use orders.*, bob (an admin) everything,
#: anonymous clients public.* — whatever else they try is refused. drop.* is write-only for
#: alice and anonymous clients: they may publish there, only bob may read it (the leak tests).
USERS = """
[[user]]
name = "alice"
password = "alice-pw"
token = "alice-token"
curve_key = "ALICE_KEY"
publish = ["orders.>", "drop.>", "emqp.jobs.orders", "_INBOX.>"]
subscribe = ["orders.>", "emqp.jobs.orders", "_INBOX.>"]

[[user]]
name = "bob"
password = "bob-pw"
token = "bob-token"
curve_key = "BOB_KEY"
publish = [">"]
subscribe = [">"]
admin = true
"""
ANONYMOUS = """
[anonymous]
publish = ["public.>", "drop.>", "emqp.jobs.public"]
subscribe = ["public.>", "emqp.jobs.public", "_INBOX.>"]
"""


class Keys:
    """CURVE certificates: the server's, alice's and bob's (ZeroMQ's own file format)."""

    def __init__(self, root: Path) -> None:
        """Create them under ``root``."""
        root.mkdir(parents=True, exist_ok=True)
        self.paths: dict[str, Path] = {}
        self.public: dict[str, bytes] = {}
        self.secret: dict[str, bytes] = {}
        for name in ("server", "alice", "bob"):
            _, secret_path = zmq.auth.create_certificates(str(root), name)
            public, secret = zmq.auth.load_certificate(secret_path)
            self.paths[name] = Path(secret_path)
            self.public[name], self.secret[name] = public, secret or b""

    def users(self, anonymous: bool) -> str:
        """The users file text with these keys (and the [anonymous] section when asked)."""
        text = USERS.replace("ALICE_KEY", self.public["alice"].decode()).replace(
            "BOB_KEY", self.public["bob"].decode())
        return text + (ANONYMOUS if anonymous else "")

    def curve(self, sock: zmq.Socket, who: str) -> zmq.Socket:
        """Make ``sock`` a CURVE client with ``who``'s keys for this server."""
        sock.curve_publickey = self.public[who]
        sock.curve_secretkey = self.secret[who]
        sock.curve_serverkey = self.public["server"]
        return sock


def start_broker(root: Path, users: str, *extra: str) -> BrokerProcess:
    """A broker of every protocol with ``users`` as its users file (memory-speed commits)."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "users.toml"
    path.write_text(users)
    broker = BrokerProcess(PROTOCOLS, data_dir=root / "data", log_dir=root,
                           extra_args=["--users", str(path), "--durability", "none", *extra])
    return broker.start()


def run(scenario: Callable[[], Awaitable[Any]], timeout: float = 60.0) -> Any:
    """Run an async scenario (pynsq and nats-py) on a fresh loop, under a deadline."""
    async def bounded() -> Any:
        return await asyncio.wait_for(scenario(), timeout)

    return asyncio.run(bounded())


async def until(predicate: Callable[[], Any], what: str, timeout: float = 15.0) -> None:
    """Poll ``predicate`` until true or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def quiet(seconds: float = 0.3) -> None:
    """Give a message that must not arrive the time it would have taken."""
    await asyncio.sleep(seconds)


# NSQ (pynsq) ---------------------------------------------------------------------------------


async def nsq_call(method: Callable[..., None], *args: Any) -> Any:
    """Call a pynsq Writer publish and await what its callback gets (b"OK" or an Error)."""
    fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    method(*args, callback=lambda conn, data: fut.done() or fut.set_result(data))
    return await fut


async def nsq_writer(broker: BrokerProcess, secret: str | None) -> nsq.Writer:
    """A connected pynsq Writer (AUTHed with ``secret`` when given)."""
    writer = nsq.Writer([f"127.0.0.1:{broker.port('nsq', 'tcp')}"], auth_secret=secret)
    await until(lambda: bool(writer.conns) and all(
        c.state == "CONNECTED" if hasattr(c, "state") else True for c in writer.conns.values()),
        "pynsq writer connection")
    return writer


def nsq_close(writer: nsq.Writer) -> None:
    """Close a pynsq Writer's connections (it has no close of its own)."""
    for conn in list(writer.conns.values()):
        conn.close()


class RecordingReader(nsq.Reader):
    """pynsq's Reader, keeping the error frames its connections get and what it receives."""

    def __init__(self, broker: BrokerProcess, topic: str, secret: str | None) -> None:
        """SUB ``topic``/``ch`` (AUTHed with ``secret`` when given)."""
        self.errors: list[str] = []
        self.bodies: list[bytes] = []
        super().__init__(topic=topic, channel="ch", message_handler=self._got,
                         nsqd_tcp_addresses=[f"127.0.0.1:{broker.port('nsq', 'tcp')}"],
                         auth_secret=secret, max_in_flight=10)

    def _got(self, message: nsq.Message) -> bool:
        self.bodies.append(bytes(message.body))
        return True

    def _on_connection_error(self, conn: Any, error: Any, **kwargs: Any) -> None:
        self.errors.append(str(error))
        super()._on_connection_error(conn, error, **kwargs)


# NATS (nats-py) ------------------------------------------------------------------------------


class NatsErrors:
    """An async error callback for nats-py (``.cb``) keeping each error's text."""

    def __init__(self) -> None:
        """Nothing yet."""
        self.texts: list[str] = []

        async def cb(error: Exception) -> None:
            self.texts.append(str(error))

        self.cb = cb


def collector(store: list[Any]) -> Callable[[Any], Awaitable[None]]:
    """A nats-py subscription callback appending each message."""
    async def cb(msg: Any) -> None:
        store.append(msg)
    return cb


# MQKS (the test client's socket) -------------------------------------------------------------


def mqks_refused(sock: Any, rid: bytes) -> bool:
    """True when ``{rid} error ...`` arrived on ``sock``."""
    sock.pump()
    return any(line.startswith(rid + b" error ") for line in sock.lines)


# eMQP ----------------------------------------------------------------------------------------

V = b"eMQP/1.0"


def dealer(address: str, keys: Keys | None = None, who: str | None = None) -> zmq.Socket:
    """A DEALER to an eMQP role (a CURVE client as ``who`` when given)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if keys is not None and who is not None:
        keys.curve(sock, who)
    sock.connect(address)
    return sock


def inform(address: str, queue: str, keys: Keys | None = None,
           who: str | None = None) -> tuple[zmq.Socket, bool]:
    """A worker INFORMs ``queue``: (its socket, whether the broker ACKed)."""
    sock = dealer(address, keys, who)
    sock.send_multipart([b"", V, b"INFORM", b"inf-1", json.dumps([[10, queue]]).encode(),
                         b"worker"])
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        if not sock.poll(200):
            continue
        if sock.recv_multipart()[2] == b"ACK":
            return sock, True
    return sock, False


def next_request(worker: zmq.Socket, timeout: float = 10.0) -> list[bytes] | None:
    """The next REQUEST a worker socket gets (heartbeats skipped), READY sent first."""
    worker.send_multipart([b"", V, b"READY", b"r-%d" % time.monotonic_ns()])
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if worker.poll(100):
            msg = worker.recv_multipart()
            if msg[2] == b"REQUEST":
                return msg
    return None
