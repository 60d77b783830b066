"""NSQ across two mqhub nodes of one cluster, with pynsq: a Writer on node A, Readers on
node B (every message once per channel; two Readers of one channel on different nodes
share it), REQ with delay, TOUCH and DPUB."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import nsq
import pytest
import tornado.ioloop

from mqhub.cluster.local import LocalCluster
from tests.cluster.conftest import queues_made
from tests.interop.broker import BrokerProcess
from tests.interop.test_nsq_pynsq import call, connected_writer, run, until

pytestmark = pytest.mark.interop


def reader(node: BrokerProcess, topic: str, channel: str, handler: Callable[[nsq.Message], Any],
           **kw: Any) -> nsq.Reader:
    """A pynsq Reader connected straight to ``node``."""
    kw.setdefault("max_in_flight", 100)
    return nsq.Reader(topic=topic, channel=channel, message_handler=handler,
                      nsqd_tcp_addresses=[f"127.0.0.1:{node.port('nsq', 'tcp')}"], **kw)


def test_writer_on_a_readers_on_b_each_channel_once_and_a_channel_shared(
        make_node: Callable[..., BrokerProcess], cluster: LocalCluster, uid: str) -> None:
    a = make_node(["nsq"])
    b = make_node(["nsq"])
    topic = uid
    got: dict[str, list[bytes]] = {"c1": [], "c2": [], "c2b": []}

    async def scenario() -> None:
        loop = tornado.ioloop.IOLoop.current()

        def slow(key: str) -> Callable[[nsq.Message], Any]:
            """A handler finishing 10 ms later (so one Reader cannot take everything)."""
            def handle(m: nsq.Message) -> None:
                got[key].append(m.body)
                m.enable_async()
                loop.call_later(0.01, m.finish)
            return handle

        readers = [reader(b, topic, "c1", lambda m: got["c1"].append(m.body) or True),
                   reader(b, topic, "c2", slow("c2"), max_in_flight=5),
                   reader(a, topic, "c2", slow("c2b"), max_in_flight=5)]
        await until(lambda: all(r.conns for r in readers), what="readers connected")
        await asyncio.to_thread(queues_made, cluster, f"nsq/{topic}/c1", f"nsq/{topic}/c2")
        writer = await connected_writer(a)
        for i in range(0, 300, 30):
            data = await call(writer.mpub, topic, [b"m%d" % j for j in range(i, i + 30)])
            assert data == b"OK", data
        assert await call(writer.pub, topic, b"last") == b"OK"
        await until(lambda: len(got["c1"]) >= 301 and len(got["c2"]) + len(got["c2b"]) >= 301,
                    timeout=30, what=f"every message on both channels: {[(k, len(v)) for k, v in got.items()]}")
        await asyncio.sleep(0.3)
        for r in readers:
            r.close()

    run(scenario, timeout=60)
    want = sorted([b"m%d" % i for i in range(300)] + [b"last"])
    assert sorted(got["c1"]) == want
    assert sorted(got["c2"] + got["c2b"]) == want        # shared, no duplicates
    assert got["c2"] and got["c2b"]                      # both nodes' readers took part


def test_buffered_topic_req_touch_and_dpub_as_on_one_node(
        make_node: Callable[..., BrokerProcess], cluster: LocalCluster, uid: str) -> None:
    """The one-node pynsq scenario (tests/interop/test_nsq_pynsq.py) with the Writer on node
    A and the Reader on node B: a message published before the channel exists is kept for
    it, REQ (with backoff) redelivers with attempts 2, TOUCH holds a message, DPUB waits."""
    a = make_node(["nsq"])
    b = make_node(["nsq"])
    topic = uid
    seen: dict[bytes, list[int]] = {}
    finished: set[bytes] = set()

    async def scenario() -> None:
        writer = await connected_writer(a)
        assert await call(writer.pub, topic, b"plain") == b"OK"   # no channel anywhere yet
        loop = tornado.ioloop.IOLoop.current()

        def handler(msg: nsq.Message) -> Any:
            seen.setdefault(msg.body, []).append(msg.attempts)
            if msg.body == b"req-me" and msg.attempts == 1:
                return False
            if msg.body == b"touch-me":
                msg.enable_async()
                msg.touch()

                def later() -> None:
                    msg.touch()
                    msg.finish()
                    finished.add(msg.body)
                loop.call_later(0.3, later)
                return None
            finished.add(msg.body)
            return True

        r = reader(b, topic, "work", handler, requeue_delay=0, max_backoff_duration=2)
        try:
            try:
                await until(lambda: b"plain" in finished, what="the buffered message")
            except AssertionError:
                for name, info in cluster.consumers().items():
                    print("DIAG", name, info["config"].get("filter_subjects"),
                          info["config"].get("deliver_policy"), info["num_pending"],
                          info["num_waiting"], info["num_ack_pending"], info["delivered"])
                raise
            assert await call(writer.mpub, topic, [b"req-me", b"touch-me", b"batch"]) == b"OK"
            t0 = time.monotonic()
            assert await call(writer.dpub, topic, 1200, b"deferred") == b"OK"
            await until(lambda: finished >= {b"plain", b"req-me", b"touch-me", b"batch",
                                             b"deferred"}, timeout=25, what=f"all: {seen}")
            assert time.monotonic() - t0 >= 1.0
        finally:
            r.close()

    run(scenario, timeout=60)
    assert seen[b"req-me"] == [1, 2]
    assert seen[b"touch-me"] == [1] and seen[b"plain"] == [1] and seen[b"deferred"] == [1]
