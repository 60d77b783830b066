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
* ``mqhub nsq <pub|mpub> <size>``: NSQ through one mqhub node (``--cluster``) with the
  producer and consumer of ``benchmarks/nsq_bench.py`` (publish and end-to-end rates; the
  consumer FINs everything), to compare with ``engine e2e``.
* ``mqhub nats pub->sub <size>``: core NATS through one mqhub node (publisher and subscriber
  on that node), to compare with ``nats-server pub->sub``.
* ``two nodes nsq mpub <size>``: two producer/consumer pairs at once, each on its own node,
  summed; to compare with one node's ``mqhub nsq mpub``.
* ``cpu <run> <group>``: where the machine's CPU went during the one-node NSQ MPUB runs and
  the two-node runs, in cores (CPU seconds per wall second) for the three nats-servers, the
  mqhub node(s), and everything else (load generators, other sessions), plus the idle rest;
  with ``cpu us/msg`` per group (CPU seconds / messages consumed). When the two cores are
  saturated in both runs, a second node cannot add throughput on this machine: the figures
  say which process group holds the cores (docs/cluster.md, "Scaling").
* ``failover``: seconds from ``kill -9`` of the node an NSQ consumer reads through until it
  reads through another node; seconds from ``kill -9`` of the ``MQHUB`` stream leader until
  JetStream named a new leader, and until a publish through mqhub was OK'd again.

Output: ``<figure> <value> <unit>`` lines; ratios are printed once both sides of a figure ran.

    python benchmarks/cluster_bench.py [--count 100000] [--rounds 3] [--only TEXT]
    mqhub bench cluster
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

try:
    from benchmarks import _common, nats_bench, nsq_bench
except ImportError:  # run as a script: benchmarks/ is on sys.path
    import _common  # type: ignore[no-redef]
    import nats_bench  # type: ignore[no-redef]
    import nsq_bench  # type: ignore[no-redef]

from mqhub.cluster.local import LocalCluster

HOST = "127.0.0.1"

#: payload sizes of the figures
SIZES = (16, 1024)


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
    """One engine-alone run into cluster mode's own stream ``MQHUB`` (made with its config
    when no node made it yet); returns (publish rate, end-to-end rate) in msg/s."""
    import nats

    from mqhub.cluster.jetstream import STREAM, stream_config

    durable = f"bench{time.time_ns() % 10**9}"
    subject = f"mq.{durable}"

    async def setup() -> None:
        nc = await nats.connect(cluster.urls[0])
        try:
            await _api(nc, f"$JS.API.STREAM.INFO.{STREAM}", None)
        except RuntimeError:
            await _api(nc, f"$JS.API.STREAM.CREATE.{STREAM}", stream_config(3)[0])
        await _api(nc, f"$JS.API.CONSUMER.CREATE.{STREAM}.{durable}", {
            "stream_name": STREAM, "config": {"durable_name": durable, "ack_policy": "explicit",
                                              "max_ack_pending": 20000,
                                              "filter_subject": subject}})
        await nc.close()

    async def teardown() -> None:
        nc = await nats.connect(cluster.urls[0])
        await _api(nc, f"$JS.API.CONSUMER.DELETE.{STREAM}.{durable}", None)
        await nc.close()

    asyncio.run(setup())
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    recv, send = ctx.Pipe(False)
    proc = ctx.Process(target=engine_consumer,
                       args=(cluster.urls[1], STREAM, durable, count, ready, send))
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


def start_node(cluster: LocalCluster, root: str, name: str,
               protocols: str = "nsq,nats") -> tuple[Any, int, int]:
    """An mqhub node of the cluster: (process, NSQ port, NATS port)."""
    nsq_port, nats_port = _common.free_port(), _common.free_port()
    data = os.path.join(root, name)
    os.makedirs(data, exist_ok=True)
    listens = [f"nsq.tcp=tcp:{nsq_port}:interface=127.0.0.1",
               f"nsq.http=tcp:{_common.free_port()}:interface=127.0.0.1"]
    if "nats" in protocols:
        listens.append(f"mq9.tcp=tcp:{nats_port}:interface=127.0.0.1")
    proc = _common.start_mqhub(
        protocols, listens,
        data, "none", os.path.join(data, "mqhub.log"), wait_for=nsq_port,
        extra=("--cluster", cluster.url_list, "--cluster-name", name, "--no-admin"))
    return proc, nsq_port, nats_port


def _machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far (/proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields) - idle) / tick, sum(fields) / tick


class CpuMeter:
    """CPU seconds of the nats-servers, the mqhub nodes and the rest of the machine over
    one run (see the module docstring)."""

    def __init__(self, cluster: LocalCluster, node_pids: list[int]) -> None:
        self.servers = [s.proc.pid for s in cluster.servers if s.proc is not None]
        self.nodes = node_pids

    def __enter__(self) -> CpuMeter:
        self.t0 = time.monotonic()
        self.s0 = sum(map(_common.server_cpu, self.servers))
        self.n0 = sum(map(_common.server_cpu, self.nodes))
        self.m0 = _machine_cpu()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.monotonic() - self.t0
        self.servers_cpu = sum(map(_common.server_cpu, self.servers)) - self.s0
        self.nodes_cpu = sum(map(_common.server_cpu, self.nodes)) - self.n0
        busy, total = _machine_cpu()
        self.busy = busy - self.m0[0]
        self.cores = (total - self.m0[1]) / max(self.wall, 1e-9)

    def figures(self, run: str, messages: float) -> dict[str, float]:
        """``cpu <run> ...`` figures: cores used per group, µs of CPU per message."""
        rest = max(0.0, self.busy - self.servers_cpu - self.nodes_cpu)
        idle = max(0.0, self.cores * self.wall - self.busy)
        out = {}
        for group, seconds in (("nats-servers", self.servers_cpu),
                               ("mqhub nodes", self.nodes_cpu),
                               ("generators and rest", rest), ("idle", idle)):
            out[f"cpu {run} {group} cores"] = seconds / self.wall
            if group != "idle":
                out[f"cpu {run} {group} us/msg"] = seconds * 1e6 / max(messages, 1.0)
        return out


def nsq_run(port: int, pid: int, mode: str, size: int, duration: float) -> tuple[float, float]:
    """NSQ producer/consumer through one node: (publish, end-to-end) msg/s."""
    return nsq_bench.run_scenario(HOST, port, mode, size, duration, pid)


def two_nodes_run(ports: list[tuple[int, int]], size: int,
                  duration: float) -> float:
    """Two NSQ pairs at once, one per node: the summed end-to-end rate."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()

    def one(port: int, pid: int) -> None:
        out.put(nsq_bench.run_scenario(HOST, port, "mpub", size, duration, None)[1])
    procs = [ctx.Process(target=one, args=p) for p in ports]
    for proc in procs:
        proc.start()
    total = sum(out.get(timeout=duration + 120) for _ in procs)
    for proc in procs:
        proc.join(10)
    return total


def failover(cluster: LocalCluster, root: str) -> dict[str, float]:
    """The two failover figures (see the module docstring)."""
    from mqhub.protocols.nsq import codec as wire
    from tests.cluster.crash import Collector, Producer

    a, a_nsq, _ = start_node(cluster, root, f"fa{time.time_ns() % 10**6}", "nsq")
    b, b_nsq, _ = start_node(cluster, root, f"fb{time.time_ns() % 10**6}", "nsq")
    topic = f"failover{time.time_ns() % 10**9}"
    out: dict[str, float] = {}
    try:
        reader = Collector(a_nsq, topic, "ch")
        producer = Producer(lambda: b_nsq, topic, window=20)
        deadline = time.monotonic() + 30
        while not reader.got and time.monotonic() < deadline:
            producer.step()
            reader.pump(0.05)
        a.kill()
        a.wait()
        killed = time.monotonic()
        try:
            reader.sock.read(0.05)
        except ConnectionError:
            pass
        reader = Collector(b_nsq, topic, "ch")      # the client's reconnect to another node
        while not reader.got and time.monotonic() - killed < 30:
            producer.step()
            reader.pump(0.05)
        out["failover node kill -> consuming again"] = time.monotonic() - killed
        leader = cluster.stream_leader()
        assert leader is not None
        index = cluster.index_of(leader)
        for _ in range(5):
            producer.step()
        cluster.kill(index)
        killed = time.monotonic()
        recovered = resumed = 0.0
        while time.monotonic() - killed < 60 and not (recovered and resumed):
            if not recovered:
                now_leader = cluster.stream_leader()
                if now_leader and now_leader != leader:
                    recovered = time.monotonic() - killed
            if not resumed and producer.step():
                resumed = time.monotonic() - killed
            time.sleep(0.01)
        out["failover stream leader kill -> new leader"] = recovered
        out["failover stream leader kill -> publishing again"] = resumed
        producer.close()
        cluster.restart(index)
        del wire
    finally:
        for proc in (a, b):
            _common.stop(proc)
    return out


def main(argv: list[str] | None = None) -> int:
    """Start the cluster, run every figure ``--rounds`` times alternating, print medians."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=100_000, help="messages per durable run")
    ap.add_argument("--core-count", type=int, default=1_000_000,
                    help="messages per core NATS run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default="", help="run only figures whose name contains this")
    ap.add_argument("--duration", type=float, default=4.0,
                    help="seconds of publishing per NSQ run")
    args = _common.parse_args(ap, argv, {"count": 2_000, "core_count": 20_000, "rounds": 1,
                                         "duration": 0.5})
    runs: list[tuple[str, Callable[[LocalCluster], dict[str, float]]]] = []
    for size in SIZES:
        def engine(c: LocalCluster, s: int = size) -> dict[str, float]:
            publish, e2e = engine_run(c, s, args.count)
            return {f"engine publish {s}B": publish, f"engine e2e {s}B": e2e}

        def core(c: LocalCluster, s: int = size) -> dict[str, float]:
            return {f"nats-server pub->sub {s}B": nats_core_run(c, s, args.core_count)}

        runs += [(f"engine {size}B", engine), (f"nats-server pub->sub {size}B", core)]
    nodes: list[tuple[Any, int, int]] = []

    def gateway(c: LocalCluster) -> dict[str, float]:
        out = {}
        proc, nsq_port, nats_port = nodes[0]
        for size in SIZES:
            for mode in ("pub", "mpub"):
                with CpuMeter(c, [proc.pid]) as meter:
                    publish, e2e = nsq_run(nsq_port, proc.pid, mode, size, args.duration)
                out[f"mqhub nsq {mode} publish {size}B"] = publish
                out[f"mqhub nsq {mode} e2e {size}B"] = e2e
                if mode == "mpub":
                    out.update(meter.figures(f"one node mpub {size}B", e2e * meter.wall))
            subject = f"bench.core.{size}"
            spec = ("fixed", subject, size, args.core_count)
            expected = nats_bench.frames_fixed(subject, size, args.core_count)[1]
            out[f"mqhub nats pub->sub {size}B"] = nats_bench.run_once(
                nats_port, spec, args.core_count, expected, subject)[0]
        return out

    def two(c: LocalCluster) -> dict[str, float]:
        ports = [(n[1], n[0].pid) for n in nodes[:2]]
        out = {}
        for s in SIZES:
            with CpuMeter(c, [n[0].pid for n in nodes[:2]]) as meter:
                rate = two_nodes_run(ports, s, args.duration)
            out[f"two nodes nsq mpub e2e {s}B"] = rate
            out.update(meter.figures(f"two nodes mpub {s}B", rate * meter.wall))
        return out

    runs += [("mqhub gateway", gateway), ("two nodes", two)]
    runs = [r for r in runs if args.only in r[0]]
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="mqhub-cluster-bench-") as root:
        with LocalCluster(os.path.join(root, "cluster")) as cluster:
            if any(name in ("mqhub gateway", "two nodes") for name, _ in runs):
                nodes.append(start_node(cluster, root, "bench-a"))
                nodes.append(start_node(cluster, root, "bench-b"))
            try:
                for _ in range(args.rounds):
                    for _name, run in runs:
                        for figure, value in run(cluster).items():
                            results.setdefault(figure, []).append(value)
                if args.only in "failover":
                    for figure, value in failover(cluster, root).items():
                        results.setdefault(figure, []).append(value)
            finally:
                for proc, _, _ in nodes:
                    _common.stop(proc)
    for figure, values in results.items():
        unit = "s" if figure.startswith("failover") else "msg/s"
        if figure.startswith("cpu "):
            unit = "cores" if figure.endswith("cores") else "us/msg"
            figure = figure.rsplit(" ", 1)[0]
        fmt = "{:.2f}" if unit in ("s", "cores", "us/msg") else "{:.0f}"
        print(f"{figure} {fmt.format(statistics.median(values))} {unit}")
    for size in SIZES:
        for mode in ("pub", "mpub"):
            mine = results.get(f"mqhub nsq {mode} e2e {size}B")
            base = results.get(f"engine e2e {size}B")
            if mine and base:
                print(f"ratio nsq {mode} {size}B e2e / engine e2e "
                      f"{statistics.median(mine) / statistics.median(base):.2f}")
        mine = results.get(f"mqhub nats pub->sub {size}B")
        base = results.get(f"nats-server pub->sub {size}B")
        if mine and base:
            print(f"ratio nats pub->sub {size}B mqhub / nats-server "
                  f"{statistics.median(mine) / statistics.median(base):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
