"""`mqhub bench store`: durable appends/s, acks/s and reads/s of LmdbStore, one figure a line.

Every figure is printed as ``<figure> <value> <unit>``. Appends arrive as WriteBatches of
``--group`` messages (one batch per simulated read); each turn's batches are group-committed.
Figures per body size (16 B, 1 KiB, 100 KiB) and durability mode (sync, batch, none), with the
inline writer; the thread writer is measured for 1 KiB in every mode (pipelined: batches that
arrive while the writer thread commits form the next group). ``steady_*`` is the broker's
steady state under NSQ load (each commit puts a batch and deletes an earlier one), with the
CPU time per message, which is steadier than the rate on a loaded machine. ``scatter_*`` is a
deep backlog FIN'd out of order (CPU per message in the first and the last quarter of the run).
A raw py-lmdb figure (prebuilt
values, one putmulti per commit) is printed for scale, since fsync cost varies a lot between
machines and with load. The open test builds a store of ``--scale`` 1 KiB messages, then
times a fresh process opening it and reading its first page, and reports that process's RSS.
The whole run is bounded to about a minute.
"""

from __future__ import annotations

import argparse
import os
import queue
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import lmdb
from twisted.internet.task import Clock

from mqhub.store.batch import WriteBatch
from mqhub.store.lmdb import LmdbStore
from mqhub.store.records import EntryKey, entry_key

try:
    from benchmarks import _common
except ImportError:  # run as a script: benchmarks/ is on sys.path
    import _common  # type: ignore[no-redef]

SIZES = {"16B": 16, "1KiB": 1024, "100KiB": 100 * 1024}
MODES = ("sync", "batch", "none")


def emit(figure: str, value: float, unit: str) -> None:
    """Print one figure line."""
    print(f"{figure} {value:.0f} {unit}" if value >= 100 else f"{figure} {value:.3g} {unit}",
          flush=True)


def make_batch(queue_name: str, first: int, group: int, body: bytes) -> WriteBatch:
    """Return a batch putting ``group`` messages with ids from ``first`` on ``queue_name``."""
    b = WriteBatch()
    b.put_entries(queue_name, [(i, 0, 0, 0.0, 0.0, "bench.address", None, body, "nsq")
                               for i in range(first, first + group)])
    return b


def bench_inline(path: str, mode: str, body: bytes, group: int, seconds: float,
                 max_bytes: int) -> tuple[float, float, float]:
    """Measure appends, reads and acks per second with the inline writer."""
    clock = Clock()
    store = LmdbStore(path, clock=clock, durability=mode, map_size=1 << 30)
    store.open()
    confirmed: list[Any] = []
    n = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline and n * len(body) < max_bytes:
        store.commit(make_batch("q", n, group, body)).addCallback(confirmed.append)
        n += group
        clock.advance(0)
    appends = n / (time.perf_counter() - start)
    assert len(confirmed) * group == n
    reads = _read_all(store, n)
    start = time.perf_counter()
    for first in range(0, n, group):
        b = WriteBatch()
        b.delete_entries("q", [(0, i) for i in range(first, min(first + group, n))])
        store.commit(b)
        clock.advance(0)
    acks = n / (time.perf_counter() - start)
    store.close()
    return appends, reads, acks


def bench_steady(path: str, mode: str, body: bytes, group: int, seconds: float,
                 lag: int = 4) -> tuple[float, float]:
    """The broker's steady state (NSQ PUB/MPUB with a consumer keeping up): each turn commits
    one batch putting ``group`` new messages and deleting the ``group`` put ``lag`` turns
    before (their FINs). Returns (messages/s, CPU µs per message put and deleted), inline
    writer."""
    clock = Clock()
    store = LmdbStore(path, clock=clock, durability=mode, writer="inline", map_size=1 << 30)
    store.open()
    n = 0
    cpu0 = time.process_time()
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        b = make_batch("q", n, group, body)
        old = n - lag * group
        if old >= 0:
            b.delete_entries("q", [(0, i) for i in range(old, old + group)])
        store.commit(b)
        n += group
        clock.advance(0)
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    store.close()
    return n / elapsed, cpu / n * 1e6


def bench_scatter(path: str, body: bytes, group: int, backlog: int, commits: int
                  ) -> tuple[float, float]:
    """A deep backlog FIN'd out of order (consumers with requeues and timeouts): ``backlog``
    stored messages, then ``commits`` turns each putting ``group`` messages and deleting
    ``group``: half the oldest, half at random among the next 10 groups' worth. Returns the
    CPU µs per message of the first and of the last quarter of the turns (commits only;
    ``none`` durability, inline writer), so a layout that slows down as deletes scatter
    shows it."""
    import random
    clock = Clock()
    store = LmdbStore(path, clock=clock, durability="none", writer="inline", map_size=1 << 30)
    store.open()
    n = 0
    while n < backlog:
        store.commit(make_batch("q", n, group, body))
        n += group
        clock.advance(0)
    live = list(range(n))
    rng = random.Random(7)
    half = group // 2
    cpu: list[float] = []
    for _ in range(commits):
        fin = live[:half] + rng.sample(live[half:10 * group], group - half)
        gone = set(fin)
        live = [i for i in live[:10 * group] if i not in gone] + live[10 * group:]
        b = make_batch("q", n, group, body)
        live += range(n, n + group)
        n += group
        b.delete_entries("q", [(0, i) for i in fin])
        t = time.process_time()
        store.commit(b)
        clock.advance(0)
        cpu.append(time.process_time() - t)
    store.close()
    q = max(1, commits // 4)
    return sum(cpu[:q]) / (q * group) * 1e6, sum(cpu[-q:]) / (q * group) * 1e6


def _read_all(store: LmdbStore, n: int) -> float:
    """Page through the whole queue 1000 entries at a time; return entries/s."""
    start = time.perf_counter()
    after: EntryKey | None = None
    total = 0
    while True:
        page: list[Any] = []
        store.read_entries("q", after, 1000).addCallback(page.extend)
        if not page:
            break
        total += len(page)
        after = entry_key(page[-1])
    assert total == n, (total, n)
    return total / (time.perf_counter() - start)


def bench_thread(path: str, mode: str, body: bytes, group: int, seconds: float) -> float:
    """Measure appends/s with the pipelined writer thread (bounded window of 32 batches)."""
    done: queue.SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]]] = queue.SimpleQueue()
    clock = Clock()
    store = LmdbStore(path, clock=clock, durability=mode, writer="thread", map_size=1 << 30,
                      call_from_thread=lambda f, *a: done.put((f, a)))
    store.open()
    state = {"confirmed": 0}

    def ok(_: object) -> None:
        """Count a confirmed batch."""
        state["confirmed"] += group

    def pump(block: bool) -> None:
        """Run one result the writer thread handed back (waiting for it when ``block``)."""
        try:
            f, a = done.get(timeout=1.0) if block else done.get_nowait()
        except queue.Empty:
            return
        f(*a)
        clock.advance(0)

    n = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        store.commit(make_batch("q", n, group, body)).addCallback(ok)
        n += group
        clock.advance(0)
        pump(block=n - state["confirmed"] > 32 * group)
    while state["confirmed"] < n:
        pump(block=True)
    rate = n / (time.perf_counter() - start)
    closed: list[Any] = []
    store.close().addCallback(closed.append)
    while not closed:
        pump(block=True)
    return rate


def bench_raw(path: str, sync: bool, body: bytes, group: int, seconds: float) -> float:
    """Raw py-lmdb: prebuilt values, one putmulti and one commit per group."""
    os.makedirs(path, exist_ok=True)
    env = lmdb.open(path, map_size=4 << 30, max_dbs=2, sync=sync, metasync=sync)
    db = env.open_db(b"x")
    pack = struct.Struct(">IBQ").pack
    n = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds and n * len(body) < 1 << 30:
        items = [(pack(1, 9, i), body) for i in range(n, n + group)]
        with env.begin(write=True) as txn:
            txn.cursor(db=db).putmulti(items)
        n += group
    rate = n / (time.perf_counter() - start)
    env.close()
    return rate


_OPEN_PROBE = """
import sys, time
t0 = time.perf_counter()
from twisted.internet.task import Clock
from mqhub.store.lmdb import LmdbStore
t1 = time.perf_counter()
clock = Clock()
store = LmdbStore(sys.argv[1], clock=clock)
store.open()
page = []
store.read_entries("q", None, 1000).addCallback(page.extend)
t2 = time.perf_counter()
count = []
store.count_entries("q").addCallback(count.append)
rss = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")][0]
print(t2 - t1, rss / 1024.0, len(page), count[0])
store.close()
"""


def bench_open(path: str, scale: int) -> tuple[float, float, int]:
    """Build a store of ``scale`` 1 KiB messages; time a new process opening and reading it."""
    clock = Clock()
    store = LmdbStore(path, clock=clock, durability="none", map_size=1 << 30)
    store.open()
    body = b"o" * 1024
    for first in range(0, scale, 2000):
        store.commit(make_batch("q", first, min(2000, scale - first), body))
        clock.advance(0)
    store.close()
    out = subprocess.run([sys.executable, "-c", _OPEN_PROBE, path], check=True,
                         capture_output=True, text=True).stdout.split()
    seconds, rss, page, count = float(out[0]), float(out[1]), int(out[2]), int(out[3])
    assert page == 1000 and count == scale
    return seconds, rss, count


def main(argv: Sequence[str] | None = None) -> int:
    """Run the store benchmark and print one ``<figure> <value> <unit>`` line per figure."""
    p = argparse.ArgumentParser(prog="mqhub bench store", description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=0.8, help="time per append figure")
    p.add_argument("--group", type=int, default=300, help="messages per batch (one read)")
    p.add_argument("--scale", type=int, default=300_000, help="messages in the open test")
    p.add_argument("--dir", default=None, help="where to put the stores (default: a temp dir)")
    args = _common.parse_args(p, argv, {"seconds": 0.05, "scale": 5000})
    root = tempfile.mkdtemp(prefix="mqhub-bench-", dir=args.dir)
    try:
        for label, size in SIZES.items():
            body = os.urandom(size)
            for mode in MODES:
                path = os.path.join(root, f"{mode}-{label}")
                appends, reads, acks = bench_inline(path, mode, body, args.group, args.seconds,
                                                    max_bytes=1 << 30)
                shutil.rmtree(path)
                emit(f"append_{mode}_inline_{label}", appends, "msg/s")
                emit(f"ack_{mode}_inline_{label}", acks, "msg/s")
                emit(f"read_{mode}_{label}", reads, "msg/s")
                if size <= 1024:
                    path = os.path.join(root, f"steady-{mode}-{label}")
                    rate, cpu = bench_steady(path, mode, body, args.group, args.seconds)
                    shutil.rmtree(path)
                    emit(f"steady_{mode}_inline_{label}", rate, "msg/s")
                    emit(f"steady_{mode}_cpu_{label}", cpu, "us/msg")
                if size == 1024:
                    path = os.path.join(root, f"thread-{mode}-{label}")
                    emit(f"append_{mode}_thread_{label}",
                         bench_thread(path, mode, body, args.group, args.seconds), "msg/s")
                    shutil.rmtree(path)
            if size <= 1024:
                path = os.path.join(root, f"scatter-{label}")
                first, last = bench_scatter(path, body, args.group, 30_000, 400)
                shutil.rmtree(path)
                emit(f"scatter_none_cpu_first_{label}", first, "us/msg")
                emit(f"scatter_none_cpu_last_{label}", last, "us/msg")
            if size == 1024:
                for sync in (True, False):
                    path = os.path.join(root, f"raw-{sync}")
                    emit(f"raw_lmdb_append_{'sync' if sync else 'nosync'}_{label}",
                         bench_raw(path, sync, body, args.group, args.seconds), "msg/s")
                    shutil.rmtree(path)
        path = os.path.join(root, "open")
        seconds, rss, count = bench_open(path, args.scale)
        emit("open_and_first_read_seconds", seconds, f"s@{count}msgs")
        emit("open_rss", rss, f"MiB@{count}msgs")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
