"""`mqhub bench scale`: a big durable backlog and many delayed messages, measured for real.

Three parts, each printing ``<figure> <value> <unit>`` lines:

1. **Backlog.** Fills a real LmdbStore (in a temporary directory) with ``--messages`` queued
   1 KiB messages on one durable queue through the core's Broker (durability ``none`` while
   filling, batches of 1000), then closes it. A *fresh child process* opens the store, starts the
   Broker and scheduler, attaches a consumer and serves (delivers and acks) the first 10,000
   messages in order. It reports open + recover seconds, time to the first delivered message,
   time to serve the 10,000, and its own peak RSS (``VmHWM``; ``ru_maxrss`` is printed too but
   inherits the parent's peak across exec) and current ``VmRSS`` (with the anonymous /
   file-backed split), so the memory figure is the broker's alone. The store's pages are dropped
   from the page cache first (cold open, as after a reboot); a second probe then runs warm.
2. **Delays.** Fills a store with ``--delays`` pending delayed 1 KiB messages (deliver_at one to
   many hours ahead, 1000 per due second), then a fresh child process restarts broker and
   scheduler over it, times the restart and ``next_due`` (what arming the timer costs), moves
   its clock to the first due second and checks that exactly the due rows fired.
3. **Sync-append curve.** Raw py-lmdb (fsync per commit; plain puts and MDB_APPEND puts)
   against LmdbStore ``sync`` with the inline writer, 1 KiB bodies, at group sizes ``--groups`` (200, 500, 1000, 2000), in
   interleaved slices so both see the same disk moment; plus the disk's median fsync latency.

The defaults (100k messages, 100k delays, short curve slices) finish in about a minute; the
targets are checked with ``--messages 10000000 --delays 1000000``. ``--only`` picks one part.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from mqhub.store.records import BODY, MSG_ID

try:
    from benchmarks import _common
except ImportError:  # run as a script: benchmarks/ is on sys.path
    import _common  # type: ignore[no-redef]

QUEUE = "scale"
LATER = "later"
SERVE = 10_000
BODY_SIZE = 1024
#: Where every clock starts (2026-01-01T00:00:00Z); filler and probe agree on it.
START = 1767225600.0
DELAY_BASE = 3600.0          # first due time, seconds after START
PER_SECOND = 1000            # delayed messages sharing one due second


def emit(figure: str, value: float, unit: str) -> None:
    """Print one figure line."""
    print(f"{figure} {value:.0f} {unit}" if abs(value) >= 100 else f"{figure} {value:.3g} {unit}",
          flush=True)


def note(text: str) -> None:
    """Progress on stderr (so a long background run can be followed)."""
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def body_for(i: int, pad: bytes) -> bytes:
    """A 1 KiB body carrying its sequence number, so the probe can check order."""
    return b"%012d" % i + pad


def _du_mib(path: str) -> float:
    """Disk blocks used under ``path`` in MiB."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            total += os.stat(os.path.join(root, f)).st_blocks * 512
    return total / (1 << 20)


def evict_cache(path: str) -> float:
    """Write the store's files to disk and drop them from the page cache; return seconds.

    So the probe that follows opens a cold store, as after a reboot (only this store's own
    clean pages are dropped, nothing else on the machine).
    """
    t0 = time.perf_counter()
    for root, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return time.perf_counter() - t0


def _open_store(path: str, durability: str) -> Any:
    """An opened LmdbStore with the inline writer on a Clock at START."""
    from twisted.internet.task import Clock

    from mqhub.store.lmdb import LmdbStore
    clock = Clock()
    clock.advance(START)
    store = LmdbStore(path, clock=clock, durability=durability, writer="inline")
    store.open()
    return store


def _filler_hub(path: str, queue: str) -> Any:
    """A started Hub over a fresh ``none``-durability store with ``queue`` declared and bound."""
    from mqhub.testing import memory_hub
    store = _open_store(path, "none")
    hub = memory_hub(store._clock, store=store)
    hub.broker.declare_queue(queue)
    hub.broker.bind_queue(queue, queue)
    hub.clock.advance(0)
    return hub


def _stop_hub(hub: Any) -> None:
    """Stop the scheduler and the broker and let their last store writes run."""
    hub.scheduler.stopService()
    hub.broker.stop()
    hub.clock.advance(0)


# -- filling (parent process) ---------------------------------------------------------------

def fill_messages(path: str, n: int) -> float:
    """Queue ``n`` 1 KiB messages on a durable queue through the Broker; return msg/s."""
    from mqhub.testing import result_of
    hub = _filler_hub(path, QUEUE)
    store, clock, broker = hub.store, hub.clock, hub.broker
    pad = os.urandom(BODY_SIZE - 12)
    step = 1000
    t0 = time.perf_counter()
    last = t0
    for first in range(0, n, step):
        bodies = [body_for(i, pad) for i in range(first, min(n, first + step))]
        broker.publish_batch(QUEUE, bodies, origin="bench")
        if (first // step) % 4 == 3:
            clock.advance(0)
        if time.perf_counter() - last > 10:
            last = time.perf_counter()
            mem = _memory()
            note(f"filled {first + step:,} of {n:,} ({(first + step) / (last - t0):,.0f} msg/s;"
                 f" RSS {mem['VmRSS']:.0f} MiB, anon {mem['RssAnon']:.0f}, file"
                 f" {mem['RssFile']:.0f}, peak {mem['VmHWM']:.0f})")
    clock.advance(0)
    rate = n / (time.perf_counter() - t0)
    depth = broker.queue(QUEUE).depth
    assert depth == n, (depth, n)
    for key, value in _memory().items():
        if key != "ru_maxrss":
            emit(f"fill_process_{key}", value, "MiB")
    _stop_hub(hub)
    t0 = time.perf_counter()
    result_of(store.close())
    note(f"closed the filled store in {time.perf_counter() - t0:.1f} s")
    return rate


def fill_delays(path: str, n: int) -> float:
    """Publish ``n`` delayed 1 KiB messages (``PER_SECOND`` per due second); return msg/s."""
    from mqhub.testing import result_of
    hub = _filler_hub(path, LATER)
    store, clock, broker = hub.store, hub.clock, hub.broker
    pad = os.urandom(BODY_SIZE - 12)
    t0 = time.perf_counter()
    last = t0
    for first in range(0, n, PER_SECOND):
        bodies = [body_for(i, pad) for i in range(first, min(n, first + PER_SECOND))]
        broker.publish_batch(LATER, bodies, deliver_at=START + DELAY_BASE + first // PER_SECOND)
        clock.advance(0)
        if time.perf_counter() - last > 30:
            last = time.perf_counter()
            note(f"delayed {first + PER_SECOND:,} of {n:,}")
    rate = n / (time.perf_counter() - t0)
    assert clock.seconds() == START and broker.queue(LATER).depth == 0
    _stop_hub(hub)
    result_of(store.close())
    return rate


# -- probes (fresh child process) -------------------------------------------------------------

def _memory() -> dict[str, float]:
    """Peak RSS and current VmRSS / RssAnon / RssFile of this process, in MiB.

    ``VmHWM`` is this process's own peak. ``ru_maxrss`` is reported too, but Linux carries the
    parent's peak across fork + exec into it, so after a big fill it shows the filler's peak.
    """
    out = {"ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = int(line.split()[1]) / 1024.0
    return out


class _Sink:
    """Delivery target remembering what it received (zope-declared in :func:`_sink`)."""

    protocol_name = "bench"

    def __init__(self) -> None:
        """Nothing received yet."""
        self.pending: list[tuple] = []
        self.first_at = 0.0

    def deliver_batch(self, binding: Any, address: str, messages: list[tuple]) -> None:
        """Keep the delivered entries for the probe to check and ack."""
        if not self.first_at:
            self.first_at = time.perf_counter()
        self.pending.extend(messages)


def _sink() -> _Sink:
    """A _Sink declared as an IDeliveryTarget."""
    from zope.interface import classImplements

    from mqhub.interfaces import IDeliveryTarget
    classImplements(_Sink, IDeliveryTarget)
    return _Sink()


def probe_messages(path: str, expected: int, first: int) -> dict[str, Any]:
    """Open the store, start the Broker, serve and ack the first SERVE messages, in order.

    ``expected`` is the backlog's depth; ``first`` the sequence number of its oldest message.
    """
    import mqhub.store.lmdb  # noqa: F401  (imports are not part of the open time)
    from mqhub.testing import memory_hub, result_of
    t0 = time.perf_counter()
    store = _open_store(path, "sync")
    t_open = time.perf_counter()
    clock = store._clock
    hub = memory_hub(clock, store=store)
    clock.advance(0)
    t_recover = time.perf_counter()
    q = hub.broker.queue(QUEUE)
    assert q is not None and q.depth == expected, (q and q.depth, expected)
    sink = _sink()
    consumer = q.attach(sink, ready=1000)
    served = 0
    want = min(SERVE, expected)
    deadline = time.perf_counter() + 120
    while served < want and time.perf_counter() < deadline:
        clock.advance(0)
        if sink.pending:
            got = sink.pending
            sink.pending = []
            for e in got:
                assert e[BODY][:12] == b"%012d" % (first + served), (e[BODY][:12], first + served)
                served += 1
            q.ack(consumer, [e[MSG_ID] for e in got])
    clock.advance(0)
    t_served = time.perf_counter()
    assert served == want, (served, want)
    left = q.depth + q.in_flight        # the consumer already holds its next credit's worth
    assert left == expected - want, (q.depth, q.in_flight, expected - want)
    mem = _memory()
    _stop_hub(hub)
    result_of(store.close())
    return {"open": t_open - t0, "recover": t_recover - t_open,
            "first": sink.first_at - t0, "served": t_served - t0, "count": served,
            "depth_after": left, **mem}


def probe_delays(path: str, expected: int) -> dict[str, Any]:
    """Restart over ``expected`` pending delayed messages; time it and check what fires."""
    import mqhub.store.lmdb  # noqa: F401  (imports are not part of the open time)
    from mqhub.testing import memory_hub, result_of
    t0 = time.perf_counter()
    store = _open_store(path, "sync")
    clock = store._clock
    hub = memory_hub(clock, store=store)
    clock.advance(0)
    t_restart = time.perf_counter() - t0
    q = hub.broker.queue(LATER)
    assert q is not None
    timer = hub.scheduler._timer
    armed = timer.getTime() if timer is not None and timer.active() else None
    calls = 2000
    t1 = time.perf_counter()
    for _ in range(calls):
        result_of(store.next_due())
    arm_us = (time.perf_counter() - t1) / calls * 1e6
    due0 = result_of(store.next_due())
    fired_early = q.depth
    clock.advance(DELAY_BASE - 0.5)      # half a second before the first due time
    clock.advance(0)
    before_due = q.depth
    clock.advance(1.0)                  # the first due second has passed
    clock.advance(0)
    first_slice = q.depth
    t2 = time.perf_counter()
    clock.advance(1.0)
    clock.advance(0)
    move_ms = (time.perf_counter() - t2) * 1000.0
    second_slice = q.depth
    mem = _memory()
    _stop_hub(hub)
    result_of(store.close())
    return {"restart": t_restart, "arm_us": arm_us, "next_due": due0 - START,
            "timer_armed_at": (armed - START) if armed is not None else None,
            "fired_at_restart": fired_early, "fired_before_due": before_due,
            "fired_first_second": first_slice, "fired_two_seconds": second_slice,
            "move_ms": move_ms, **mem}


def run_probe(kind: str, path: str, expected: int, first: int) -> dict[str, Any]:
    """Run a probe in a fresh Python process and return its JSON result."""
    cmd = [sys.executable, os.path.abspath(__file__), "--probe", kind, path, str(expected),
           str(first)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise RuntimeError(f"{kind} probe failed:\n{out.stderr}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


# -- sync-append curve -------------------------------------------------------------------------

def write_fsync_ms(tmp: str, kib: int) -> float:
    """Median time to write ``kib`` KiB of fresh 4 KiB pages at the end of a file and fsync."""
    path = os.path.join(tmp, "write.probe")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    chunk = os.urandom(kib << 10)
    times = []
    try:
        for _ in range(15):
            t = time.perf_counter()
            os.write(fd, chunk)
            os.fsync(fd)
            times.append(time.perf_counter() - t)
    finally:
        os.close(fd)
        os.unlink(path)
    return sorted(times)[len(times) // 2] * 1000.0


def raw_slice(env: Any, db: Any, start: int, group: int, body: bytes, seconds: float,
              append: bool = False) -> int:
    """Raw py-lmdb: one putmulti and one (fsynced) commit per group; return messages written.

    ``append`` uses MDB_APPEND (keys arrive in order), which fills leaf pages instead of
    splitting them in half: three 1 KiB values per 4 KiB page instead of two.
    """
    pack = struct.Struct(">IBQ").pack
    n = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        items = [(pack(1, 9, i), body) for i in range(start + n, start + n + group)]
        with env.begin(write=True) as txn:
            txn.cursor(db=db).putmulti(items, append=append)
        n += group
    return n


def store_slice(store: Any, start: int, group: int, body: bytes, seconds: float) -> int:
    """LmdbStore ``sync``, inline writer: one WriteBatch and one group commit per group."""
    from mqhub.store.batch import WriteBatch
    clock = store._clock
    n = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        b = WriteBatch()
        b.put_entries("q", [(i, 0, 0, 0.0, 0.0, "bench.address", None, body, "nsq")
                            for i in range(start + n, start + n + group)])
        store.commit(b)
        clock.advance(0)
        n += group
    return n


def sync_curve(tmp: str, groups: list[int], seconds: float, rounds: int) -> None:
    """Raw py-lmdb vs LmdbStore sync appends per group size, interleaved slices; best and median."""
    import lmdb
    body = os.urandom(BODY_SIZE)
    emit("disk_fsync_median_4k", _common.fsync_ms(tmp), "ms")
    for kib in (4, 256, 1024, 4096):
        emit(f"disk_write_fsync_{kib}KiB", write_fsync_ms(tmp, kib), "ms")
    for group in groups:
        raw_path = os.path.join(tmp, f"raw-{group}")
        os.makedirs(raw_path)
        env = lmdb.open(raw_path, map_size=8 << 30, max_dbs=3, sync=True, metasync=True)
        db = env.open_db(b"x")
        dba = env.open_db(b"a")
        store = _open_store(os.path.join(tmp, f"store-{group}"), "sync")
        raw_rates: list[float] = []
        append_rates: list[float] = []
        store_rates: list[float] = []
        nr = na = ns = 0
        for _ in range(rounds):
            t = time.perf_counter()
            k = raw_slice(env, db, nr, group, body, seconds)
            raw_rates.append(k / (time.perf_counter() - t))
            nr += k
            t = time.perf_counter()
            k = raw_slice(env, dba, na, group, body, seconds, append=True)
            append_rates.append(k / (time.perf_counter() - t))
            na += k
            t = time.perf_counter()
            k = store_slice(store, ns, group, body, seconds)
            store_rates.append(k / (time.perf_counter() - t))
            ns += k
        env.close()
        store.close()
        shutil.rmtree(raw_path, ignore_errors=True)
        shutil.rmtree(os.path.join(tmp, f"store-{group}"), ignore_errors=True)
        raw_rates.sort()
        append_rates.sort()
        store_rates.sort()
        emit(f"raw_lmdb_sync_append_g{group}_best", raw_rates[-1], "msg/s")
        emit(f"raw_lmdb_sync_append_g{group}_median", raw_rates[len(raw_rates) // 2], "msg/s")
        emit(f"raw_lmdb_sync_mdb_append_g{group}_best", append_rates[-1], "msg/s")
        emit(f"raw_lmdb_sync_mdb_append_g{group}_median", append_rates[len(append_rates) // 2],
             "msg/s")
        emit(f"store_sync_append_g{group}_best", store_rates[-1], "msg/s")
        emit(f"store_sync_append_g{group}_median", store_rates[len(store_rates) // 2], "msg/s")
    emit("disk_fsync_median_4k_after", _common.fsync_ms(tmp), "ms")


# -- driver --------------------------------------------------------------------------------

def bench_messages(root: str, n: int) -> None:
    """Part 1: fill, then probe from a fresh process."""
    path = os.path.join(root, "messages")
    note(f"filling {n:,} queued 1 KiB messages")
    t0 = time.perf_counter()
    emit("fill_publish_rate", fill_messages(path, n), "msg/s")
    emit("fill_seconds", time.perf_counter() - t0, "s")
    emit("store_on_disk", _du_mib(path), "MiB")
    emit("evict_page_cache_seconds", evict_cache(path), "s")
    note("probing the backlog from a fresh process (cold page cache)")
    r = run_probe("messages", path, n, 0)
    emit("backlog_messages", n, "messages")
    emit("backlog_open_seconds", r["open"], "s")
    emit("backlog_open_recover_seconds", r["open"] + r["recover"], "s")
    emit("backlog_first_message_seconds", r["first"], "s")
    emit(f"backlog_serve_{r['count']}_seconds", r["served"], "s")
    emit("backlog_depth_after_serving", r["depth_after"], "messages")
    emit("backlog_peak_rss_vmhwm", r["VmHWM"], "MiB")
    emit("backlog_ru_maxrss_incl_parent_peak", r["ru_maxrss"], "MiB")
    emit("backlog_vmrss", r["VmRSS"], "MiB")
    emit("backlog_rss_anon", r.get("RssAnon", 0.0), "MiB")
    emit("backlog_rss_file", r.get("RssFile", 0.0), "MiB")
    if r["count"] >= n:  # the first probe served them all (a small --messages)
        shutil.rmtree(path, ignore_errors=True)
        return
    note("probing again (warm page cache, the next 10,000 messages)")
    r = run_probe("messages", path, n - r["count"], r["count"])
    emit("warm_backlog_open_recover_seconds", r["open"] + r["recover"], "s")
    emit("warm_backlog_first_message_seconds", r["first"], "s")
    emit(f"warm_backlog_serve_{r['count']}_seconds", r["served"], "s")
    emit("warm_backlog_peak_rss_vmhwm", r["VmHWM"], "MiB")
    emit("warm_backlog_vmrss", r["VmRSS"], "MiB")
    shutil.rmtree(path, ignore_errors=True)


def bench_delays(root: str, n: int) -> None:
    """Part 2: fill delayed messages, then restart from a fresh process."""
    path = os.path.join(root, "delays")
    note(f"publishing {n:,} delayed 1 KiB messages")
    emit("delays_publish_rate", fill_delays(path, n), "msg/s")
    emit("delays_store_on_disk", _du_mib(path), "MiB")
    emit("delays_evict_page_cache_seconds", evict_cache(path), "s")
    note("restarting over the delayed messages in a fresh process")
    r = run_probe("delays", path, n, 0)
    emit("delays_pending", n, "messages")
    emit("delays_restart_seconds", r["restart"], "s")
    emit("delays_next_due_us", r["arm_us"], "us")
    emit("delays_next_due_offset", r["next_due"], "s")
    emit("delays_timer_armed_at_offset", r["timer_armed_at"] if r["timer_armed_at"] is not None
         else -1, "s")
    emit("delays_fired_at_restart", r["fired_at_restart"], "messages")
    emit("delays_fired_before_first_due", r["fired_before_due"], "messages")
    emit("delays_fired_after_first_due", r["fired_first_second"], "messages")
    emit("delays_fired_after_second_due", r["fired_two_seconds"], "messages")
    emit("delays_move_1000_due_ms", r["move_ms"], "ms")
    emit("delays_peak_rss_vmhwm", r["VmHWM"], "MiB")
    emit("delays_ru_maxrss_incl_parent_peak", r["ru_maxrss"], "MiB")
    emit("delays_vmrss", r["VmRSS"], "MiB")
    ok = (r["fired_at_restart"] == 0 and r["fired_before_due"] == 0
          and r["fired_first_second"] == min(n, PER_SECOND)
          and r["fired_two_seconds"] == min(n, 2 * PER_SECOND))
    emit("delays_only_due_fired", 1.0 if ok else 0.0, "bool")
    shutil.rmtree(path, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the scale benchmark and print one ``<figure> <value> <unit>`` line per figure."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--probe"]:
        kind, path, expected, first = argv[1], argv[2], int(argv[3]), int(argv[4])
        result = (probe_messages(path, expected, first) if kind == "messages"
                  else probe_delays(path, expected))
        print(json.dumps(result), flush=True)
        return 0
    p = argparse.ArgumentParser(prog="mqhub bench scale", description=__doc__.split("\n")[0])
    p.add_argument("--messages", type=int, default=100_000, help="queued 1 KiB messages")
    p.add_argument("--delays", type=int, default=100_000, help="pending delayed messages")
    p.add_argument("--groups", default="200,500,1000,2000",
                   help="comma-separated group sizes for the sync-append curve")
    p.add_argument("--slice", type=float, default=0.5, help="seconds per curve slice")
    p.add_argument("--rounds", type=int, default=3, help="interleaved slices per group size")
    p.add_argument("--only", default="messages,delays,curve",
                   help="comma-separated parts to run: messages, delays, curve")
    p.add_argument("--dir", default=None, help="where the stores go (default: a temp dir)")
    args = _common.parse_args(p, argv, {"messages": 12_000, "delays": 3000, "groups": "200",
                                        "slice": 0.05, "rounds": 1})
    root = tempfile.mkdtemp(prefix="mqhub-scale-", dir=args.dir)
    try:
        parts = set(args.only.split(","))
        if "messages" in parts and args.messages > 0:
            bench_messages(root, args.messages)
        if "delays" in parts and args.delays > 0:
            bench_delays(root, args.delays)
        if "curve" in parts:
            sync_curve(root, [int(g) for g in args.groups.split(",")], args.slice, args.rounds)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
