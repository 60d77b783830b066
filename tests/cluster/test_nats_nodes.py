"""NATS across mqhub nodes of one cluster with nats-py: a subscriber on node A gets what a
publisher on node B sends (core NATS, at most once, like nats-server routes), and a NATS
publish reaches an NSQ channel consumed on the other node."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import nats
import pytest

from mqhub.cluster.local import LocalCluster
from mqhub.protocols.nsq import codec as wire
from tests.cluster.conftest import queues_made
from tests.interop.broker import BrokerProcess
from tests.interop.nsq_client import NsqSocket

pytestmark = pytest.mark.interop


def url(node: BrokerProcess) -> str:
    """The nats:// URL of a node."""
    return f"nats://127.0.0.1:{node.port('mq9', 'tcp')}"


async def until(cond: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    """Poll ``cond`` with a deadline."""
    end = asyncio.get_running_loop().time() + timeout
    while not cond():
        if asyncio.get_running_loop().time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def test_a_subscriber_on_a_gets_a_publish_from_b(
        make_node: Callable[..., BrokerProcess], uid: str) -> None:
    a = make_node(["nats"])
    b = make_node(["nats"])

    async def scenario() -> None:
        sub_conn = await nats.connect(url(a))
        pub_conn = await nats.connect(url(b))
        got: list[tuple[str, bytes]] = []

        async def handler(msg: nats.aio.msg.Msg) -> None:
            got.append((msg.subject, msg.data))
        await sub_conn.subscribe(f"{uid}.*", cb=handler)
        await sub_conn.flush()

        async def probe() -> bool:
            await pub_conn.publish(f"{uid}.probe", b"?")
            await pub_conn.flush()
            await asyncio.sleep(0.05)
            return bool(got)
        end = asyncio.get_running_loop().time() + 15
        while not await probe():   # B learns A's interest within its announce interval
            assert asyncio.get_running_loop().time() < end, "B never forwarded to A"
        got.clear()
        for i in range(100):
            await pub_conn.publish(f"{uid}.x", b"m%d" % i, headers={"k": f"v{i}"})
        await pub_conn.flush()
        await until(lambda: len(got) >= 100, "100 messages on A")
        assert [d for _, d in got] == [b"m%d" % i for i in range(100)]
        assert {s for s, _ in got} == {f"{uid}.x"}
        await sub_conn.close()
        await pub_conn.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_nats_publish_on_a_reaches_an_nsq_channel_read_on_b(
        make_node: Callable[..., BrokerProcess], cluster: LocalCluster, uid: str) -> None:
    a = make_node(["nats"])
    b = make_node(["nsq"])
    s = NsqSocket(b.port("nsq", "tcp"))
    s.send(wire.encode_sub(uid, "ch") + wire.encode_rdy(100))
    queues_made(cluster, f"nsq/{uid}/ch")

    async def publish(bodies: list[bytes]) -> None:
        nc = await nats.connect(url(a))
        for body in bodies:
            await nc.publish(uid, body)
        await nc.flush()
        await nc.close()

    def read(want: Callable[[list[bytes]], bool], what: str,
             timeout: float = 15.0) -> list[bytes]:
        got: list[bytes] = []
        stop = time.monotonic() + timeout
        while not want(got):
            assert time.monotonic() < stop, f"timed out waiting for {what}: {got}"
            msgs = [f for f in s.read(0.2) if isinstance(f, wire.Message)]
            if msgs:
                s.send(b"".join(wire.encode_fin(m.msg_id) for m in msgs))
            got.extend(m.body for m in msgs)
        return got

    # A learns the channel's binding from the cluster's directory (a refresh), then bridges
    stop = time.monotonic() + 15
    while True:
        asyncio.run(publish([b"probe"]))
        try:
            read(lambda got: b"probe" in got, "a probe", timeout=1.0)
            break
        except AssertionError:
            assert time.monotonic() < stop, "A never bridged to the channel"
    asyncio.run(publish([b"n%d" % i for i in range(20)]))
    got = read(lambda got: len([g for g in got if g != b"probe"]) >= 20, "20 messages")
    assert [g for g in got if g != b"probe"] == [b"n%d" % i for i in range(20)]
