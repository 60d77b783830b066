"""The analytics pipeline end to end: a known mix through NSQ, NATS/mq9 and eMQP on a real
broker, an online snapshot, ``mqhub analytics`` on local[2] and on a standalone Spark cluster
(from an export), with exact table numbers. Two Spark driver JVMs in the whole module.

The mix includes messages that leave without a consumer (issue 27 item 5): an mq9 mailbox
that expires holding two, an NSQ channel emptied with four, an NSQ topic deleted with two."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mqhub.protocols.nsq import codec as wire
from tests.interop.broker import BrokerProcess
from tests.interop.nsq_client import NsqSocket

pytest.importorskip("pyspark", reason="pip install 'mqhub[spark]'")
pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402

from mqhub.analytics.arrow import table_batches  # noqa: E402

pytestmark = [pytest.mark.interop, pytest.mark.spark]
if not shutil.which("java") and not os.environ.get("JAVA_HOME"):
    pytest.skip("Spark needs Java 17+", allow_module_level=True)

NSQ_BODY = b"n" * 100
NATS_DEAD_BODY = b"d" * 50
METRIC_BODY = b"m" * 20
INBOX_BODY = b"i" * 10
AUDIT_BODY = b"a" * 30
TRASH_BODY = b"t" * 30
MQHUB = [sys.executable, "-m", "mqhub.cli"]


async def _nats_side(url: str) -> str:
    """NATS core traffic, a NATS publish that will be dead-lettered, an mq9 expiry."""
    import nats

    nc = await nats.connect(url)
    got: list[Any] = []

    async def cb(msg: Any) -> None:
        got.append(msg)

    await nc.subscribe("metrics.cpu", cb=cb)
    await nc.flush()
    for _ in range(5):
        await nc.publish("metrics.cpu", METRIC_BODY)
    await nc.publish("orders", NATS_DEAD_BODY, headers={"mqhub-max-attempts": "1"})
    reply = await nc.request("$mq9.AI.MAILBOX.CREATE", json.dumps({"ttl": 600}).encode(),
                             timeout=5)
    box = json.loads(reply.data)
    inbox = f"$mq9.AI.INBOX.{box['mail_id']}.normal"
    await nc.publish(inbox, INBOX_BODY, headers={"mq9-ttl": "0.2"})
    await nc.publish(inbox, INBOX_BODY)
    reply = await nc.request("$mq9.AI.MAILBOX.CREATE", json.dumps({"ttl": 1}).encode(),
                             timeout=5)
    short = json.loads(reply.data)   # expires after 1 s with both of its messages inside
    for _ in range(2):
        await nc.publish(f"$mq9.AI.INBOX.{short['mail_id']}.normal", INBOX_BODY)
    await nc.flush()
    deadline = time.monotonic() + 10
    while len(got) < 5:
        assert time.monotonic() < deadline, "NATS subscriber did not get its 5 messages"
        await asyncio.sleep(0.02)
    await nc.close()
    return str(box["mail_id"])


def _nsq_removals(http: int) -> None:
    """Four messages in channel audit/archive, then the channel emptied; two in trash/c, then
    the topic deleted (nsqd's HTTP API)."""

    def post(path: str, body: bytes = b"") -> None:
        with urllib.request.urlopen(urllib.request.Request(
                f"http://127.0.0.1:{http}{path}", data=body, method="POST"), timeout=10) as r:
            assert r.status == 200, path

    for topic, channel, body, n in (("audit", "archive", AUDIT_BODY, 4),
                                    ("trash", "c", TRASH_BODY, 2)):
        post(f"/topic/create?topic={topic}")
        post(f"/channel/create?topic={topic}&channel={channel}")
        post(f"/mpub?topic={topic}", b"\n".join([body] * n))
    post("/channel/empty?topic=audit&channel=archive")
    post("/topic/delete?topic=trash")


def _emqp_side(frontend: str) -> None:
    """Three eventmq jobs on queue 'default' with no worker: they stay stored."""
    from eventmq.client.messages import defer_job

    from tests.unit.protocols.emqp.interop_support import Client

    client = Client(frontend)
    try:
        for n in range(3):
            defer_job(client.sender, "emqjobs.work", args=[n])
        client.pump(0.2)
    finally:
        client.close()


def _snapshot(broker: BrokerProcess, out: Path) -> Path:
    """``mqhub snapshot`` of the running broker."""
    done = subprocess.run([*MQHUB, "snapshot", "--data-dir", str(broker.data_dir), "--out",
                           str(out)], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return out


def _events(snap: Path) -> list[dict[str, Any]]:
    """The snapshot's journal events (pyarrow, no Spark)."""
    return [r for b in table_batches(str(snap), "events") for r in b.to_pylist()]


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Run the known mix on a real broker and snapshot it while it runs."""
    root = tmp_path_factory.mktemp("analytics")
    broker = BrokerProcess(["nsq", "mq9", "emqp"], root / "data", log_dir=root,
                           extra_args=["--option", "mq9.sweep_interval=0.1"])
    broker.start()
    try:
        consumer = NsqSocket(broker.port("nsq", "tcp"))
        consumer.send(wire.encode_sub("orders", "billing") + wire.encode_rdy(50))
        consumer.read_until(lambda fs: wire.Response(b"OK") in fs, "SUB OK", 10)
        producer = NsqSocket(broker.port("nsq", "tcp"))
        producer.send(wire.encode_mpub("orders", [NSQ_BODY] * 10))
        producer.read_until(lambda fs: wire.Response(b"OK") in fs, "MPUB OK", 10)
        asyncio.run(asyncio.wait_for(
            _nats_side(f"nats://127.0.0.1:{broker.port('mq9', 'tcp')}"), 30))
        first = consumer.messages_until(11, "11 orders")
        nsq = [m for m in first if m.body == NSQ_BODY]
        dead = [m for m in first if m.body == NATS_DEAD_BODY]
        consumer.send(b"".join(wire.encode_fin(m.msg_id) for m in nsq[:8]))
        consumer.send(b"".join(wire.encode_req(m.msg_id, 0) for m in nsq[8:] + dead))
        again = consumer.messages_until(2, "2 redeliveries")
        assert sorted(m.attempts for m in again) == [2, 2]
        consumer.send(b"".join(wire.encode_fin(m.msg_id) for m in again))
        _emqp_side(broker.url("emqp", "frontend"))
        _nsq_removals(broker.port("nsq", "http"))
        deadline = time.monotonic() + 30
        n = 0
        while True:  # snapshot until the journal holds the whole mix (commits are async)
            snap = _snapshot(broker, root / f"snap{n}")
            ev = _events(snap)
            kinds = [r["event"] for r in ev]
            counters = [r for b in table_batches(str(snap), "counters") for r in b.to_pylist()]
            if (kinds.count("acked") == 10 and kinds.count("expired") == 3
                    and kinds.count("purged") == 6 and "dead_lettered" in kinds
                    and kinds.count("published") >= 24
                    and sum(c["messages"] for c in counters if c["origin"] == "nats-core") >= 9):
                break
            assert time.monotonic() < deadline, f"journal incomplete: {kinds} {counters}"
            n += 1
            time.sleep(0.3)
        consumer.close()
        producer.close()
        yield snap
    finally:
        broker.close()


def _table(report: Path, name: str) -> list[dict[str, Any]]:
    """Rows of one report table (Parquet)."""
    return pq.read_table(report / name).to_pylist()


def _analytics(src: Path, out: Path, *extra: str) -> dict[str, Any]:
    """Run ``mqhub analytics`` and return its JSON answer."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run([*MQHUB, "analytics", str(src), "--out", str(out), *extra],
                          capture_output=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-5000:]
    return dict(json.loads(done.stdout.decode().strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def local_report(snapshot: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``mqhub analytics SNAP --out R --read datasource`` on local[2] (the Python data source)."""
    out = tmp_path_factory.mktemp("report")
    _analytics(snapshot, out, "--read", "datasource")
    return out


def test_report_tables_are_exact(snapshot: Path, local_report: Path) -> None:
    """Published, acked, redeliveries, dead letters by reason, expiries and the protocol mix
    match the mix exactly; latencies are plausible; the report and plots exist."""
    orders = "nsq/orders/billing"
    thr = _table(local_report, "throughput")
    assert sum(r["published"] for r in thr if r["address"] == "orders") == 11
    assert sum(r["acked"] for r in thr if r["address"] == "orders") == 10
    assert sum(r["delivered"] for r in thr if r["address"] == "orders") == 13
    # NATS core PUBs are counted per read under "*" (5 metrics, 1 HPUB, 2 inbox, 1 request)
    assert sum(r["published"] for r in thr if r["origin"] == "nats-core") >= 9
    assert {r["origin"] for r in thr if r["address"] == "orders"} == {"nsq", "nats"}
    red = {r["queue"]: r for r in _table(local_report, "redeliveries")}
    assert (red[orders]["messages_redelivered"], red[orders]["redeliveries"],
            red[orders]["max_attempt"]) == (2, 2, 2)
    assert [(r["queue"], r["reason"], r["count"]) for r in _table(local_report, "dead_letters")] \
        == [(orders, "max_attempts", 1)]
    # the message with its own 0.2 s TTL, then the expired mailbox's two (whichever sweep came
    # first, the core's TTL sweep or the mailbox's: their entries expire with the mailbox)
    expired = _table(local_report, "expired")
    assert all("mq9" in r["queue"] for r in expired) and sum(r["count"] for r in expired) == 3
    assert {r["reason"] for r in expired} <= {"ttl", "queue_expired"}
    assert sorted(sum(r["count"] for r in expired if r["queue"] == q)
                  for q in {r["queue"] for r in expired}) == [1, 2]
    assert [(r["queue"], r["reason"], r["count"]) for r in _table(local_report, "purged")] == [
        ("nsq/audit/archive", "purged", 4), ("nsq/trash/c", "queue_deleted", 2)]
    proto = {r["origin"]: r for r in _table(local_report, "protocols")}
    assert (proto["nsq"]["messages"], proto["nsq"]["bytes"]) == (16, 1000 + 6 * 30)
    assert (proto["nats"]["messages"], proto["nats"]["bytes"]) == (5, 50 + 4 * 10)
    assert proto["nats-core"]["messages"] >= 9
    assert proto["emqp"]["messages"] == 3 and proto["emqp"]["bytes"] > 0
    sizes = {r["bucket"]: r["count"] for r in _table(local_report, "sizes")}
    assert list(sizes) == ["64", "256", "1024", "4096", "16384", "65536", "larger"]
    assert sizes["256"] >= 10 and sizes["64"] >= 11 and sum(sizes.values()) == 24
    lat = {(r["address"], r["kind"]): r for r in _table(local_report, "latency")}
    assert lat[("orders", "deliver")]["count"] == 11 and lat[("orders", "ack")]["count"] == 10
    for row in lat.values():
        assert 0 < row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"] <= row["max_ms"] < 60_000
    summary = json.loads((local_report / "summary.json").read_text())
    assert (summary["messages"], summary["acked"], summary["dead_lettered"],
            summary["expired"], summary["purged"]) == (24, 10, 1, 3, 6)
    assert summary["memory_published"] >= 9
    manifest = json.loads((snapshot / "manifest.json").read_text())
    assert summary["stored"] == manifest["entries"] >= 4  # 3 eMQP jobs, 1 mailbox message, DLQ
    html = (local_report / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 5
    for png in ("throughput", "latency", "protocols", "sizes", "dead_letters"):
        assert (local_report / "plots" / f"{png}.png").stat().st_size > 5000


def test_standalone_cluster_from_export_gives_the_same_tables(
        snapshot: Path, local_report: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """``mqhub export`` then ``mqhub analytics EXPORT --master spark://127.0.0.1:PORT`` on a
    local standalone master and worker produce the same tables as local[2] from the snapshot."""
    from tests.interop.spark_cluster import SparkCluster

    root = tmp_path_factory.mktemp("cluster")
    export = root / "export"
    done = subprocess.run([*MQHUB, "export", str(snapshot), "--out", str(export)],
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout.decode().strip().splitlines()[-1])["rows"]
    assert rows["events"] == len(_events(snapshot)) and rows["counters"] >= 1
    assert sorted(p.name for p in (export / "events").iterdir())[0].startswith("day=")
    with SparkCluster(root / "spark") as cluster:
        answer = _analytics(export, root / "report", "--master", cluster.url)
    assert answer["summary"]["master"] == cluster.url
    for name in ("throughput", "redeliveries", "dead_letters", "expired", "purged", "protocols",
                 "sizes"):
        assert _table(root / "report", name) == _table(local_report, name), name
    lat = _table(root / "report", "latency")
    assert [(r["address"], r["kind"], r["count"]) for r in lat] == [
        (r["address"], r["kind"], r["count"]) for r in _table(local_report, "latency")]
