"""Analytics pipeline benchmark: N journaled messages → snapshot → export and Spark report.

Targets (issue 16): 1,000,000 journaled messages: snapshot → ``mqhub analytics`` report in
under 60 s on ``local[2]``; ``mqhub export`` at >= 500,000 rows/s.

The messages go through the real core, LmdbStore (durability none) and flow journal in this
process on a simulated clock (spread over ~30 minutes, 12 addresses, three origins): each is
published, delivered and acked a simulated moment later; the first message of every 100th
delivery batch is requeued instead (dead-lettered on the queues with ``max_attempts=1``). Generation is not timed against
the targets; the snapshot, the export and the analytics run (a separate ``mqhub analytics``
process, JVM start included) are.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from mqhub.core.broker import Broker
from mqhub.store.journal import Journal
from mqhub.store.journal_recorder import JournalRecorder
from mqhub.store.lmdb import LmdbStore
from mqhub.store.snapshot import take_snapshot
from mqhub.testing import result_of, start_clock

try:
    from benchmarks import _common
except ImportError:  # run as a script: benchmarks/ is on sys.path
    import _common  # type: ignore[no-redef]

ORIGINS = ("nsq", "nats", "emqp")
ADDRESSES = 12
BATCH = 1000


class AckingTarget:
    """Acks each delivered batch on :meth:`finish` (a simulated moment later), requeueing the
    first entry of every 100th batch instead."""

    def __init__(self) -> None:
        """Count batches."""
        self.batches = 0
        self.delivered = 0
        self.held: list[tuple[Any, list[Any]]] = []

    def deliver_batch(self, consumer: Any, queue_name: str, entries: list[Any]) -> None:
        """Hold what arrived until :meth:`finish`."""
        self.batches += 1
        self.delivered += len(entries)
        self.held.append((consumer, entries))

    def finish(self) -> None:
        """Ack (or requeue one of) every held batch."""
        held, self.held = self.held, []
        for consumer, entries in held:
            ids = [e[0] for e in entries]
            if self.batches % 100 == 0 and entries[0][2] == 1:
                consumer.queue.requeue(consumer, ids[:1])
                ids = ids[1:]
            if ids:
                consumer.queue.ack(consumer, ids)


def generate(path: str, messages: int) -> dict[str, Any]:
    """Journal ``messages`` messages into a store at ``path``; return counts and time taken."""
    started = time.perf_counter()
    clock = start_clock()
    store = LmdbStore(path, clock=clock, durability="none", writer="inline",
                      map_size=1 << 30)
    store.open()
    recorder = JournalRecorder(clock)
    journal = Journal(path, recorder)
    journal.open()
    store.journal = journal
    recorder.start(store)
    broker = Broker(store, clock)
    broker.journal = recorder
    result_of(broker.start())
    target = AckingTarget()
    for a in range(ADDRESSES):
        q = broker.declare_queue(f"q{a}", max_attempts=1 if a % 4 == 0 else 0)
        broker.bind_queue(f"bench.addr{a}", f"q{a}")
        q.attach(target, ready=2 * BATCH)
    bodies = [b"x" * size for size in (40, 200, 900, 3000)]
    step = 1800.0 / max(messages // BATCH, 1)
    for i in range(messages // BATCH):
        a = (i * 7) % ADDRESSES
        body = bodies[i % len(bodies)]
        broker.publish_batch(f"bench.addr{a}", [body] * BATCH, origin=ORIGINS[a % 3])
        clock.advance(step * (0.05 + 0.4 * (i % 7) / 7))  # ack latency varies per batch
        target.finish()
        clock.advance(step / 2)
    for _ in range(5):
        target.finish()
        clock.advance(0.1)
    recorder.stop()  # force the last records into a chunk
    clock.advance(0)
    broker.stop()
    clock.advance(0)
    result_of(store.close())
    journal.close()
    return {"messages": messages // BATCH * BATCH, "delivered": target.delivered,
            "seconds": time.perf_counter() - started}


def main(argv: list[str] | None = None) -> int:
    """Generate, snapshot, export and analyse; print the figures."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--keep", help="keep the work directory here instead of a temporary one")
    args = _common.parse_args(ap, argv, {"messages": 5000})
    work = args.keep or tempfile.mkdtemp(prefix="analytics-bench-")
    os.makedirs(work, exist_ok=True)
    try:
        store = os.path.join(work, "store")
        gen = generate(store, args.messages)
        print(f"# generated {gen['messages']} messages ({gen['delivered']} deliveries) in "
              f"{gen['seconds']:.1f} s (not a target)", flush=True)
        t0 = time.perf_counter()
        snap = os.path.join(work, "snap")
        manifest = take_snapshot(store, snap)
        t_snap = time.perf_counter() - t0
        jbytes = sum(f["length"] for f in manifest["journal"]["files"])
        print(f"snapshot_seconds {t_snap:.2f} s  # journal {jbytes / 1e6:.1f} MB", flush=True)

        from mqhub.analytics.export import export_snapshot

        t0 = time.perf_counter()
        exp = export_snapshot(snap, os.path.join(work, "export"))
        t_exp = time.perf_counter() - t0
        rows = exp["rows"]["events"] + exp["rows"]["counters"] + exp["rows"]["messages"]
        print(f"export_rows {rows}")
        print(f"export_rate {rows / t_exp:.0f} rows/s  # target >= 500000", flush=True)

        t0 = time.perf_counter()
        out = os.path.join(work, "report")
        done = subprocess.run([sys.executable, "-m", "mqhub.cli", "analytics", snap, "--out", out,
                               "--master", args.master], capture_output=True, timeout=900)
        t_an = time.perf_counter() - t0
        if done.returncode != 0:
            print(done.stderr.decode(errors="replace")[-3000:], file=sys.stderr)
            return 1
        summary = json.loads(done.stdout.decode().strip().splitlines()[-1])["summary"]
        print(f"analytics_seconds {t_an:.1f} s  # mqhub analytics, JVM start included")
        print(f"snapshot_to_report_seconds {t_snap + t_an:.1f} s  # target < 60")
        print(f"# summary: messages={summary['messages']} delivered={summary['delivered']} "
              f"acked={summary['acked']} requeued={summary['requeued']}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
