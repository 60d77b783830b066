"""Operating the users file on a live broker: a reload (SIGHUP and POST /api/users/reload)
takes away rights from connections that hold subscriptions, and repeated failed logins from
one peer are slowed down while other peers are not."""

from __future__ import annotations

import json
import signal
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from mqhub.protocols.nsq import codec as w
from tests.interop.broker import BrokerProcess, wait_until
from tests.interop.mqks_client import MqksSocket
from tests.interop.nsq_client import NsqSocket
from tests.interop.security_support import (
    NatsErrors,
    collector,
    quiet,
    run,
    start_broker,
    until,
)
from tests.interop.vibemq_client import SocketClient

pytestmark = pytest.mark.interop

USERS = """
[[user]]
name = "alice"
password = "alice-pw"
token = "alice-token"
publish = ["orders.>"]
subscribe = ["orders.>", "_INBOX.>"]

[[user]]
name = "bob"
password = "bob-pw"
token = "bob-token"
publish = [">"]
subscribe = [">"]
admin = true

[anonymous]
publish = []
subscribe = ["orders.mqks"]
"""


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker of every protocol over USERS (its file at tmp_path/hub/users.toml)."""
    broker = start_broker(tmp_path / "hub", USERS)
    yield broker
    broker.close()
    print(broker.output()[-20000:])


def admin_post(broker: BrokerProcess, path: str, token: str) -> tuple[int, Any]:
    """POST to the admin API with a Bearer token."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{broker.port('admin', 'http')}{path}", data=b"{}", method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_reload_takes_rights_from_live_subscriptions(hub: BrokerProcess, tmp_path: Path) -> None:
    """alice holds subscriptions on orders.* over NATS, NSQ, VibeMQ; anonymous MQKS consumes
    orders.mqks. The users file loses those rights and is reloaded (SIGHUP): every such
    subscription is dropped with the protocol's refusal, and later messages do not arrive.
    A broken file is refused by POST /api/users/reload and the rights in force stay."""
    users = tmp_path / "hub" / "users.toml"
    nsq = NsqSocket(hub.port("nsq", "tcp"))
    nsq.send(w.encode_auth(b"alice-token"))
    nsq.send(w.encode_sub("orders.nsq", "ch") + w.encode_rdy(10))
    nsq.read_until(lambda fs: w.Response(b"OK") in fs, "SUB OK")
    vibe = SocketClient(hub.port("vibemq", "tcp"))
    vibe.connect("alice", "alice-pw")
    vibe.subscribe("orders.vibe")
    mq = MqksSocket(hub.port("mqks", "tcp"))
    mq.confirm(b"c1", b"consume", b"q1 orders.mqks")
    url = f"nats://127.0.0.1:{hub.port('mq9', 'tcp')}"
    got: list[Any] = []

    async def scenario() -> None:
        errors = NatsErrors()
        alice = await nats.connect(url, user="alice", password="alice-pw", error_cb=errors.cb)
        bob = await nats.connect(url, token="bob-token")
        await alice.subscribe("orders.>", cb=collector(got))
        await alice.flush()
        await bob.publish("orders.nats", b"before")
        await bob.flush()
        await until(lambda: [m.data for m in got] == [b"before"], "a message before")
        assert admin_post(hub, "/api/users/reload", "alice-token")[0] == 403   # not an admin
        users.write_text(USERS.replace('subscribe = ["orders.>", "_INBOX.>"]',
                                       'subscribe = ["_INBOX.>"]').replace(
            'subscribe = ["orders.mqks"]', "subscribe = []"))
        hub.process.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        await until(lambda: any('subscription to "orders.>"' in t for t in errors.texts),
                    "the dropped subscription's -ERR", timeout=10)
        for subject in ("orders.nats", "orders.nsq", "orders.vibe", "orders.mqks"):
            await bob.publish(subject, b"after")
        await bob.flush()
        await quiet()
        assert [m.data for m in got] == [b"before"] and alice.is_connected
        for nc in (alice, bob):
            await nc.close()

    run(scenario)
    # NSQ: E_UNAUTHORIZED and the connection closed (as nsqd closes on a failed re-auth)
    frames = nsq.read_until(lambda fs: any(isinstance(f, w.ErrorFrame) for f in fs),
                            "NSQ's refusal")
    assert w.ErrorFrame("E_UNAUTHORIZED", 'AUTH failed for SUB on "orders.nsq" "ch"') in frames
    assert not any(isinstance(f, w.Message) for f in frames)
    with pytest.raises(ConnectionError):
        nsq.read(2.0)
    # VibeMQ: NOT_AUTHORIZED, the connection stays, nothing more is delivered
    wait_until(lambda: any(f.error_code == "NOT_AUTHORIZED" for f in _pump_frames(vibe)),
             "VibeMQ's refusal")
    assert not vibe.deliveries and vibe.ping()
    # MQKS: the consumer is deleted with an error line under its id; nothing arrives
    mq.until(lambda ls: any(line.startswith(b"c1 error ") for line in ls), "MQKS's refusal")
    assert not mq.messages(b"c1")
    status, answer = admin_post(hub, "/api/users/reload", "bob-token")
    assert status == 200 and answer["users"] == 2
    users.write_text("[[user]\n")
    status, answer = admin_post(hub, "/api/users/reload", "bob-token")
    assert status == 400 and "not reloaded" in answer["error"]
    assert admin_post(hub, "/api/users/reload", "bob-token")[0] == 400   # still broken
    vibe.sock.close()
    nsq.close()
    mq.close()


def _pump_frames(client: SocketClient) -> list[Any]:
    """Every frame the client holds after a short read."""
    try:
        client.pump(0.1)
    except ConnectionError:
        pass
    return list(client.frames)


def test_failed_logins_are_slowed_down_per_peer(hub: BrokerProcess) -> None:
    """A peer that keeps sending wrong NATS passwords waits longer and longer for each
    answer (even a right one waits its turn); a client from another address is answered at
    once. Connections come from 127.0.0.2 (the guesser) and 127.0.0.1."""
    port = hub.port("mq9", "tcp")

    def attempt(password: str, source: str) -> tuple[float, bytes]:
        """One CONNECT from ``source``: seconds until the answer, and the answer."""
        sock = socket.socket()
        sock.bind((source, 0))
        sock.connect(("127.0.0.1", port))
        sock.settimeout(15)
        buf = b""
        while b"\r\n" not in buf:
            buf += sock.recv(4096)          # INFO
        start = time.monotonic()
        connect = json.dumps({"user": "alice", "pass": password, "verbose": False})
        sock.sendall(f"CONNECT {connect}\r\nPING\r\n".encode())
        answer = b""
        while b"PONG" not in answer and b"-ERR" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
        sock.close()
        return time.monotonic() - start, answer

    attempt("alice-pw", "127.0.0.1")     # warm-up: the server's first CONNECT does lazy work
    waits = []
    for _ in range(5):
        took, answer = attempt("guess", "127.0.0.2")
        assert b"Authorization Violation" in answer
        waits.append(took)
    assert max(waits[:3]) < 0.2                   # the first failures cost nothing
    assert waits[4] > waits[3] > 0.15             # then each waits longer (0.25 s, doubling)
    took, answer = attempt("alice-pw", "127.0.0.2")
    assert b"PONG" in answer and took > 0.5       # the right password waits its turn too
    took, answer = attempt("alice-pw", "127.0.0.1")
    assert b"PONG" in answer and took < 0.2       # another peer is not slowed down
    took, answer = attempt("alice-pw", "127.0.0.2")
    assert b"PONG" in answer and took < 0.2       # a success forgave the guesser
