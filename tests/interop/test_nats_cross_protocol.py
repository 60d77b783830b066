"""Cross-protocol on a real broker: NSQ publishes reach nats-py subscribers (wildcards, queue groups)."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable
from typing import Any

import nats

from tests.interop.broker import BrokerProcess
from tests.interop.test_nats_py import barrier, collector, run, until, url


def test_nsq_http_publish_reaches_nats_subscribers(make_broker: Callable[..., BrokerProcess]) -> None:
    """NSQ HTTP publishes reach nats-py exact, wildcard and queue subscribers."""
    broker = make_broker(["nsq", "nats"])
    http = broker.port("nsq", "http")

    async def main() -> None:
        nc = await nats.connect(url(broker))
        exact: list[Any] = []
        star: list[Any] = []
        q1: list[Any] = []
        q2: list[Any] = []

        await nc.subscribe("events", cb=collector(exact))
        await nc.subscribe("*", cb=collector(star))
        await nc.subscribe("events", queue="w", cb=collector(q1))
        await nc.subscribe("events", queue="w", cb=collector(q2))
        await barrier(nc)
        for body in (b"one", b"two\x00bin"):
            req = urllib.request.Request(f"http://127.0.0.1:{http}/pub?topic=events", data=body,
                                         method="POST")
            with urllib.request.urlopen(req, timeout=5) as resp:
                assert resp.status == 200
        await until(lambda: len(exact) == 2 and len(star) == 2 and len(q1) + len(q2) == 2)
        assert [m.data for m in exact] == [b"one", b"two\x00bin"]
        assert [m.subject for m in star] == ["events", "events"]
        await nc.close()
    run(main())
