"""`mqhub bench journal`: the flow journal's CPU cost per message, journal on vs off (same run).

Everything runs in this process on a task.Clock, so the figure is the CPU this process spends
(``time.process_time``), not wall time on a shared machine: the real core over an LmdbStore
(inline writer, ``--durability``, default ``none`` so the disk does not decide it) with and
without the journal, one durable queue bound to an address and a consumer that acks each
delivery. Each reactor turn publishes ``--calls`` batches of ``--batch`` 16-byte messages (one
group commit per turn, as one read of a pipelining NSQ publisher) and acks what the previous
turn delivered. Since issue 27 a commit that stores a publish also writes its journal chunk,
so small commits pay the chunk's fixed cost: ``--batch 1 --calls 1`` is the worst case.
Journal on and off alternate, ``--rounds`` times; each figure is the median.

    mqhub bench journal [--messages 50000] [--batches 1,10,100] [--rounds 5]
    PYTHONPATH=OTHER_TREE python benchmarks/journal_bench.py   # the same against another tree
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from mqhub.core.broker import Broker
from mqhub.store.journal import Journal
from mqhub.store.journal_recorder import JournalRecorder
from mqhub.store.lmdb import LmdbStore
from mqhub.testing import result_of, start_clock

try:
    from benchmarks import _common
except ImportError:  # run as a script: benchmarks/ is on sys.path
    import _common  # type: ignore[no-redef]


class _Sink:
    """A consumer target that keeps the ids delivered since the last ack."""

    protocol_name = "bench"

    def __init__(self) -> None:
        """Nothing delivered yet."""
        self.ids: list[int] = []

    def deliver_batch(self, consumer: Any, queue: str, entries: list[tuple]) -> None:
        """Remember the ids to ack."""
        self.ids += [e[0] for e in entries]

    def take(self) -> list[int]:
        """The ids to ack now."""
        ids, self.ids = self.ids, []
        return ids


def run(path: str, journal_on: bool, durability: str, batch: int, calls: int,
        messages: int) -> float:
    """CPU microseconds per message of publishing, delivering and acking ``messages``."""
    clock = start_clock()
    store = LmdbStore(path, clock=clock, durability=durability, writer="inline",
                      map_size=1 << 30)
    store.open()
    broker = Broker(store, clock)
    journal: Any = None
    if journal_on:
        recorder = JournalRecorder(clock)
        journal = Journal(path, recorder)
        journal.open()
        store.journal = journal
        recorder.start(store)
        broker.journal = recorder
    result_of(broker.start())
    queue = broker.declare_queue("bench")
    broker.bind_queue("bench.address", "bench")
    target = _Sink()
    consumer = queue.attach(target, ready=max(2 * batch * calls, 100))
    bodies = [b"x" * 16] * batch
    turns = max(1, messages // (batch * calls))
    gc.collect()
    start = time.process_time()
    for _ in range(turns):
        for _ in range(calls):
            broker.publish_batch("bench.address", bodies, origin="nsq")
        clock.advance(0)
        queue.ack(consumer, target.take())
    for _ in range(3):  # the last deliveries and their acks
        clock.advance(0)
        queue.ack(consumer, target.take())
    spent = time.process_time() - start
    assert queue.depth == 0 and queue.in_flight == 0, "bench queue did not drain"
    broker.stop()
    if journal is not None:
        journal.recorder.stop()
        clock.advance(0)
    result_of(store.close())
    if journal is not None:
        journal.close()
    return spent * 1e6 / (turns * calls * batch)


def main(argv: Sequence[str] | None = None) -> int:
    """Print ``journal_cpu_{on,off}_bB_cC`` and ``journal_cost_bB_cC`` figures."""
    p = argparse.ArgumentParser(prog="mqhub bench journal", description=__doc__.split("\n")[0])
    p.add_argument("--messages", type=int, default=50_000, help="messages per run")
    p.add_argument("--batches", default="1,10,100",
                   help="comma-separated messages per publish call")
    p.add_argument("--calls", type=int, default=1, help="publish calls per commit (turn)")
    p.add_argument("--rounds", type=int, default=5, help="on/off pairs per figure (median)")
    p.add_argument("--durability", default="none", choices=["sync", "batch", "none"])
    args = _common.parse_args(p, argv, {"messages": 2000, "batches": "1,100", "rounds": 1})
    root = tempfile.mkdtemp(prefix="mqhub-journal-bench-")
    try:
        for batch in (int(b) for b in args.batches.split(",")):
            figures: dict[bool, list[float]] = {True: [], False: []}
            for rnd in range(args.rounds):
                for on in ((True, False) if rnd % 2 == 0 else (False, True)):
                    path = os.path.join(root, f"s{batch}-{rnd}-{int(on)}")
                    figures[on].append(run(path, on, args.durability, batch, args.calls,
                                           args.messages))
                    shutil.rmtree(path, ignore_errors=True)
            tag = f"b{batch}_c{args.calls}"
            on, off = statistics.median(figures[True]), statistics.median(figures[False])
            print(f"journal_cpu_on_{tag} {on:.3f} us/msg", flush=True)
            print(f"journal_cpu_off_{tag} {off:.3f} us/msg", flush=True)
            print(f"journal_cost_{tag} {100 * (on / off - 1):+.1f} %", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
