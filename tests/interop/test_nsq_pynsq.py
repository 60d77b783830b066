"""pynsq (the real Tornado client) against a real ``twistd -n mqhub`` broker: Writer, Reader, lookupd."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import nsq
import pytest
import tornado.ioloop

from tests.interop.broker import BrokerProcess
from tests.interop.nsq_client import ok, stats

pytestmark = pytest.mark.interop


def run(scenario: Callable[[], Awaitable[Any]], timeout: float = 30.0) -> Any:
    """Run an async scenario on a fresh asyncio loop (Tornado uses it) with a deadline."""
    async def bounded() -> Any:
        """The scenario under a deadline."""
        return await asyncio.wait_for(scenario(), timeout)

    return asyncio.run(bounded())


async def until(predicate: Callable[[], bool], timeout: float = 15.0, what: str = "condition") -> None:
    """Poll ``predicate`` until true or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def connected_writer(broker: BrokerProcess) -> nsq.Writer:
    """A pynsq Writer once its connection is up."""
    writer = nsq.Writer([f"127.0.0.1:{broker.port('nsq', 'tcp')}"])
    await until(lambda: bool(writer.conns), what="writer connection")
    return writer


async def call(method: Callable[..., None], *args: Any) -> Any:
    """Call a pynsq publish method and await its callback's data."""
    fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    method(*args, callback=lambda conn, data: fut.done() or fut.set_result(data))
    return await fut


def test_pynsq_writer_and_reader_with_req_touch_and_backoff(make_broker: Callable[..., BrokerProcess]) -> None:
    """PUB/MPUB/DPUB get OK; a Reader FINs, REQs (with backoff) and TOUCHes; /stats agrees."""
    broker = make_broker(["nsq"])
    seen: dict[bytes, list[int]] = {}
    finished: set[bytes] = set()

    async def scenario() -> None:
        """Publish, consume with FIN/REQ/TOUCH, publish more while the Reader runs."""
        writer = await connected_writer(broker)
        assert await call(writer.pub, "jobs", b"plain") == b"OK"  # buffered: no channel yet
        loop = tornado.ioloop.IOLoop.current()

        def handler(msg: nsq.Message) -> Any:
            """FIN most, REQ req-me once, TOUCH then FIN touch-me asynchronously."""
            seen.setdefault(msg.body, []).append(msg.attempts)
            if msg.body == b"req-me" and msg.attempts == 1:
                return False  # REQ, and the Reader backs off
            if msg.body == b"touch-me":
                msg.enable_async()
                msg.touch()

                def later() -> None:
                    """Touch again, then finish."""
                    msg.touch()
                    msg.finish()
                    finished.add(msg.body)
                loop.call_later(0.3, later)
                return None
            finished.add(msg.body)
            return True

        reader = nsq.Reader(topic="jobs", channel="work", message_handler=handler,
                            nsqd_tcp_addresses=[f"127.0.0.1:{broker.port('nsq', 'tcp')}"],
                            max_in_flight=10, requeue_delay=0, max_backoff_duration=2)
        try:
            await until(lambda: b"plain" in finished, what="the buffered message")
            assert await call(writer.mpub, "jobs", [b"req-me", b"touch-me", b"batch"]) == b"OK"
            assert await call(writer.dpub, "jobs", 300, b"deferred") == b"OK"
            await until(lambda: finished >= {b"plain", b"req-me", b"touch-me", b"batch", b"deferred"},
                        timeout=25, what="all messages finished")
        finally:
            reader.close()
            for conn in list(writer.conns.values()):
                conn.close()

    run(scenario)
    assert seen[b"req-me"] == [1, 2]
    assert seen[b"touch-me"] == [1] and seen[b"plain"] == [1]
    (topic,) = [t for t in stats(broker)["topics"] if t["topic_name"] == "jobs"]
    (channel,) = topic["channels"]
    assert channel["channel_name"] == "work"
    assert channel["requeue_count"] >= 1 and channel["timeout_count"] == 0
    assert channel["depth"] == 0


def test_pynsq_reader_finds_broker_through_lookupd_address(make_broker: Callable[..., BrokerProcess]) -> None:
    """A Reader configured only with a lookupd HTTP address finds this broker and consumes."""
    broker = make_broker(["nsq"])
    assert ok(broker, "/pub?topic=found", b"via-http") == b"OK"
    got: list[bytes] = []

    async def scenario() -> None:
        """A Reader that knows only the lookupd address."""
        reader = nsq.Reader(topic="found", channel="c", message_handler=lambda m: got.append(m.body) or True,
                            lookupd_http_addresses=[f"http://127.0.0.1:{broker.port('nsq', 'http')}"],
                            max_in_flight=5)
        try:
            await until(lambda: got == [b"via-http"], what="message via lookupd discovery")
        finally:
            reader.close()

    run(scenario)
    lookup = json.loads(ok(broker, "/lookup?topic=found", None))
    assert lookup["channels"] == ["c"]
    assert lookup["producers"][0]["tcp_port"] == broker.port("nsq", "tcp")
