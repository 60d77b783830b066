"""nats-py against a real ``twistd -n mqhub --protocols nats`` subprocess."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import nats
import pytest
from nats.errors import NoRespondersError

from tests.interop.broker import BrokerProcess


def run(coro: Awaitable[Any]) -> Any:
    """Run one coroutine on a fresh event loop, bounded in time."""
    return asyncio.run(asyncio.wait_for(coro, 30))


async def until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll ``cond`` with a deadline (no sleep-and-hope)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


@pytest.fixture
def broker(make_broker: Callable[..., BrokerProcess]) -> BrokerProcess:
    """A broker serving NATS."""
    return make_broker(["nats"])


def url(broker: BrokerProcess) -> str:
    """The nats:// URL of ``broker``."""
    return f"nats://127.0.0.1:{broker.port('mq9', 'tcp')}"


def collector(store: list[Any]) -> Callable[[Any], Awaitable[None]]:
    """A nats-py callback appending every message to ``store``."""
    async def cb(msg: Any) -> None:
        store.append(msg)
    return cb


async def barrier(nc: Any) -> None:
    """Two flushes: nats-py's flush alone is no ordering barrier (clients.md)."""
    await nc.flush()
    await nc.flush()


def test_pub_sub_wildcards_headers_and_queue_groups(broker: BrokerProcess) -> None:
    """nats-py pub/sub with wildcards, headers and a queue group."""
    async def main() -> None:
        nc = await nats.connect(url(broker))
        assert nc.max_payload == 1024 * 1024
        got: dict[str, list[Any]] = {"exact": [], "star": [], "gt": [], "q1": [], "q2": []}
        await nc.subscribe("demo.a", cb=collector(got["exact"]))
        await nc.subscribe("demo.*", cb=collector(got["star"]))
        await nc.subscribe("demo.>", cb=collector(got["gt"]))
        await nc.subscribe("work", queue="workers", cb=collector(got["q1"]))
        await nc.subscribe("work", queue="workers", cb=collector(got["q2"]))
        await barrier(nc)
        pub = await nats.connect(url(broker))
        await pub.publish("demo.a", b"one", headers={"X-Test": "1"})
        await pub.publish("demo.b.c", b"two")
        for i in range(50):
            await pub.publish("work", b"%d" % i)
        await pub.flush()
        await until(lambda: len(got["gt"]) == 2 and len(got["q1"]) + len(got["q2"]) == 50)
        assert [m.data for m in got["exact"]] == [b"one"]
        assert got["exact"][0].headers == {"X-Test": "1"}
        assert [m.data for m in got["star"]] == [b"one"]
        assert sorted(m.data for m in got["gt"]) == [b"one", b"two"]
        assert sorted(int(m.data) for m in got["q1"] + got["q2"]) == list(range(50))
        await pub.close()
        await nc.close()
    run(main())


def test_request_reply_no_responders_auto_unsub_and_drain(broker: BrokerProcess) -> None:
    """nats-py request/reply (new and old style), 503, auto-unsubscribe and drain."""
    async def main() -> None:
        svc = await nats.connect(url(broker))

        async def respond(msg: Any) -> None:
            await msg.respond(b"pong:" + msg.data)

        await svc.subscribe("svc.ping", queue="svc", cb=respond)
        await barrier(svc)
        nc = await nats.connect(url(broker))
        reply = await nc.request("svc.ping", b"ping", timeout=5)
        assert reply.data == b"pong:ping"
        reply = await nc.request("svc.ping", b"old", timeout=5, old_style=True)
        assert reply.data == b"pong:old"
        with pytest.raises(NoRespondersError):
            await nc.request("svc.none", b"x", timeout=5)
        seen: list[Any] = []
        sub = await nc.subscribe("limited", cb=collector(seen))
        await sub.unsubscribe(limit=2)
        await barrier(nc)
        for i in range(5):
            await svc.publish("limited", b"%d" % i)
        await svc.flush()
        await until(lambda: len(seen) == 2)
        await barrier(nc)
        assert [m.data for m in seen] == [b"0", b"1"]
        await nc.drain()
        assert nc.is_closed
        await svc.close()
    run(main())


def test_reconnect_after_broker_restart(broker: BrokerProcess) -> None:
    """nats-py reconnects after a broker restart and its subscription works again."""
    async def main() -> None:
        got: list[Any] = []
        reconnected = asyncio.Event()

        async def on_reconnect() -> None:
            reconnected.set()

        nc = await nats.connect(url(broker), reconnected_cb=on_reconnect, max_reconnect_attempts=-1,
                                reconnect_time_wait=0.2)
        await nc.subscribe("after.restart", cb=collector(got))
        await barrier(nc)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, broker.restart)
        await asyncio.wait_for(reconnected.wait(), 15)
        await barrier(nc)
        await nc.publish("after.restart", b"back")
        await nc.flush()
        await until(lambda: [m.data for m in got] == [b"back"])
        await nc.close()
    run(main())


def raw_session(port: int, data: bytes, expect_close: bool) -> bytes:
    """Send ``data`` on a raw socket and read until the server closes or goes quiet."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.recv(4096)                                      # INFO
        s.sendall(b'CONNECT {"verbose":false,"pedantic":false}\r\n' + data)
        out = b""
        s.settimeout(0.5 if not expect_close else 5)
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
        except TimeoutError:
            assert not expect_close, out
        return out


def test_bad_input_gets_nats_errors_and_others_are_unaffected(broker: BrokerProcess) -> None:
    """Bad raw input gets nats-server's errors while a nats-py client carries on."""
    port = broker.port("mq9", "tcp")

    async def main() -> None:
        got: list[Any] = []
        nc = await nats.connect(url(broker))
        await nc.subscribe("still.ok", cb=collector(got))
        await barrier(nc)
        loop = asyncio.get_running_loop()
        cases = [
            (b"FOO bar\r\n", b"-ERR 'Unknown Protocol Operation'\r\n"),
            (b"PUB foo 2000000\r\n", b"-ERR 'Maximum Payload Violation'\r\n"),
            (b"PUB " + b"x" * 5000 + b" 1\r\n", b"-ERR 'maximum control line exceeded'\r\n"),
            (b"PUB foo 2\r\nhiXX", b"-ERR 'Unknown Protocol Operation'\r\n"),
        ]
        for data, err in cases:
            out = await loop.run_in_executor(None, raw_session, port, data, True)
            assert out.endswith(err), out
        out = await loop.run_in_executor(None, raw_session, port,
                                         b"SUB foo..bar 1\r\nPING\r\n", False)
        assert out == b"-ERR 'Invalid Subject'\r\nPONG\r\n"
        await nc.publish("still.ok", b"yes")
        await nc.flush()
        await until(lambda: [m.data for m in got] == [b"yes"])
        assert nc.is_connected
        await nc.close()
    run(main())
