"""Cluster mode: mqhub nodes over a three-server JetStream cluster, next to the engine alone.

Everything runs on 127.0.0.1: three ``nats-server -js`` processes routed into one cluster
(``mqhub.cluster.local.LocalCluster``, each with its own store dir), and the load generators
in their own processes. Figures, each the median of ``--rounds`` (default 3) of runs that
alternate between the engine alone and the gateway, so load from elsewhere hits both alike:

* ``engine <size>``: the engine's own limit, nats-py publishing ``--count`` messages straight
  into an R3 interest stream of the cluster-mode layout with async PubAcks
  (``publish_async``), while a nats-py pull consumer in another process fetches and acks
  them; rate = messages / (first publish → last message consumed); also the publish rate.
* ``nats-server pub->sub <size>``: core NATS through one nats-server of the cluster, with the
  raw-socket publisher and subscriber of ``benchmarks/nats_bench.py``.

Output: ``<figure> <value> <unit>`` lines; ratios are printed once both sides of a figure ran.

    python benchmarks/cluster_bench.py [--count 100000] [--rounds 3] [--only TEXT]
    mqhub bench cluster
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

try:
    from benchmarks import nats_bench
except ImportError:  # run as a script: benchmarks/ is on sys.path
    import nats_bench  # type: ignore[no-redef]

from mqhub.cluster.local import LocalCluster

#: payload sizes of the figures
SIZES = (16, 1024)
#: the stream layout cluster mode uses for durable addresses (docs/cluster.md)
STREAM_CONFIG = {"retention": "interest", "num_replicas": 3, "storage": "file",
                 "allow_msg_ttl": True, "allow_msg_schedules": True}


async def _api(nc: Any, subject: str, payload: dict | None) -> dict:
    """One JetStream API request; raise on an error reply."""
    msg = await nc.request(subject, json.dumps(payload).encode() if payload else b"", timeout=10)
    reply = json.loads(msg.data)
    if "error" in reply:
        raise RuntimeError(f"{subject}: {reply['error']}")
    return reply


def engine_consumer(url: str, stream: str, durable: str, count: int, ready: Any,
                    out: Any) -> None:
    """Pull ``count`` messages with nats-py (fetch 500 at a time), ack each; report the time
    of the last one."""
    import nats

    async def run() -> None:
        nc = await nats.connect(url)
        js = nc.jetstream()
        sub = await js.pull_subscribe_bind(durable, stream)
        ready.set()
        got = 0
        last = time.time()
        while got < count:
            try:
                msgs = await sub.fetch(500, timeout=5)
            except nats.errors.TimeoutError:
                break
            for msg in msgs:
                await msg.ack()
            got += len(msgs)
            last = time.time()
        await nc.flush()
        out.send((got, last))
        await nc.close()

    asyncio.run(run())


async def _engine_publish(url: str, subject: str, body: bytes, count: int) -> tuple[float, float]:
    """Publish ``count`` messages with nats-py's async PubAcks; (first send, all acked) times."""
    import nats
    nc = await nats.connect(url)
    js = nc.jetstream(publish_async_max_pending=4000)
    t0 = time.time()
    for _ in range(count):
        await js.publish_async(subject, body)
    await js.publish_async_completed()
    t1 = time.time()
    await nc.close()
    return t0, t1


def engine_run(cluster: LocalCluster, size: int, count: int) -> tuple[float, float]:
    """One engine-alone run; returns (publish rate, end-to-end rate) in msg/s."""
    import nats

    stream = f"BENCH{int(time.time() * 1000) % 10**9}"
    subject = f"mq.{stream.lower()}"

    async def setup() -> None:
        nc = await nats.connect(cluster.urls[0])
        await _api(nc, f"$JS.API.STREAM.CREATE.{stream}",
                   dict(STREAM_CONFIG, name=stream, subjects=[f"{subject}.>", subject]))
        await _api(nc, f"$JS.API.CONSUMER.CREATE.{stream}.q", {
            "stream_name": stream, "config": {"durable_name": "q", "ack_policy": "explicit",
                                              "max_ack_pending": 20000,
                                              "filter_subject": subject}})
        await nc.close()

    async def teardown() -> None:
        nc = await nats.connect(cluster.urls[0])
        await _api(nc, f"$JS.API.STREAM.DELETE.{stream}", None)
        await nc.close()

    asyncio.run(setup())
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    recv, send = ctx.Pipe(False)
    proc = ctx.Process(target=engine_consumer,
                       args=(cluster.urls[1], stream, "q", count, ready, send))
    proc.start()
    ready.wait(30)
    t0, t1 = asyncio.run(_engine_publish(cluster.urls[0], subject, b"x" * size, count))
    got, last = recv.recv()
    proc.join(10)
    asyncio.run(teardown())
    if got < count:
        print(f"# engine {size}B: consumer got {got} of {count}", file=sys.stderr)
    return count / (t1 - t0), got / max(last - t0, 1e-9)


def nats_core_run(cluster: LocalCluster, size: int, count: int) -> float:
    """Core NATS pub → sub through one nats-server of the cluster (msg/s)."""
    subject = f"bench.core.{size}"
    spec = ("fixed", subject, size, count)
    expected = nats_bench.frames_fixed(subject, size, count)[1]
    rate, complete = nats_bench.run_once(cluster.servers[0].port, spec, count, expected, subject)
    if not complete:
        print(f"# nats-server pub->sub {size}B incomplete", file=sys.stderr)
    return rate


def main(argv: list[str] | None = None) -> int:
    """Start the cluster, run every figure ``--rounds`` times alternating, print medians."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=100_000, help="messages per durable run")
    ap.add_argument("--core-count", type=int, default=1_000_000,
                    help="messages per core NATS run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default="", help="run only figures whose name contains this")
    args = ap.parse_args(argv)
    runs: list[tuple[str, Callable[[LocalCluster], dict[str, float]]]] = []
    for size in SIZES:
        def engine(c: LocalCluster, s: int = size) -> dict[str, float]:
            publish, e2e = engine_run(c, s, args.count)
            return {f"engine publish {s}B": publish, f"engine e2e {s}B": e2e}

        def core(c: LocalCluster, s: int = size) -> dict[str, float]:
            return {f"nats-server pub->sub {s}B": nats_core_run(c, s, args.core_count)}

        runs += [(f"engine {size}B", engine), (f"nats-server pub->sub {size}B", core)]
    runs = [r for r in runs if args.only in r[0]]
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="mqhub-cluster-bench-") as root:
        with LocalCluster(root) as cluster:
            for _ in range(args.rounds):
                for _name, run in runs:
                    for figure, value in run(cluster).items():
                        results.setdefault(figure, []).append(value)
    for figure, values in results.items():
        print(f"{figure} {statistics.median(values):.0f} msg/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
