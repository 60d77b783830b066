"""eMQP jobs/s: mqhub versus the original ``emq-router``, with the same synthetic fast workers.

Run ``mqhub bench emqp [--jobs N] [--workers K] [--slots S] [--skip-original]``. Everything is
on 127.0.0.1, each router in its own subprocess, the synthetic workers in another subprocess
and the client in this one. A *job* counts when a worker has received its REQUEST and answered
it (REPLY with the result, then READY, as eventmq's jobmanager does with ``reply-requested``).
Prints ``<figure> <value> <unit>`` lines. Bounded: each run stops after ``--limit`` seconds.
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
from pathlib import Path

import zmq

try:
    from benchmarks import _common
except ImportError:  # run as a script: benchmarks/ is on sys.path
    import _common  # type: ignore[no-redef]

free_port, wait_port, stop = _common.free_port, _common.wait_port, _common.stop

V = b"eMQP/1.0"
# pyzmq's sugar layer makes an enum of every flag; the load generators call the backend
# directly with int flags so that they, not the routers under test, are cheap.
_SEND = zmq.backend.Socket.send
_RECV = zmq.backend.Socket.recv
_NB = int(zmq.NOBLOCK)
_NB_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)


def send(sock: zmq.Socket, frames: list[bytes]) -> None:
    """Send a multipart message without the sugar layer's per-frame overhead."""
    for f in frames[:-1]:
        _SEND(sock, f, _NB_MORE)
    _SEND(sock, frames[-1], _NB)


def recv(sock: zmq.Socket) -> list[bytes]:
    """Receive one multipart message (raises zmq.Again when none is waiting)."""
    frame = _RECV(sock, _NB, False)
    out = [frame.bytes]
    while frame.more:
        frame = _RECV(sock, 0, False)
        out.append(frame.bytes)
    return out


BODY = json.dumps(["run", {"callable": "noop", "path": "bench", "args": [], "kwargs": {},
                           "class_args": [], "class_kwargs": {}}]).encode()


# synthetic workers (run in their own process) -----------------------------------------------

def run_workers(backend: str, workers: int, slots: int, jobs: int, limit: float) -> None:
    """``workers`` DEALERs, each INFORM + ``slots`` READYs; answer jobs until ``jobs`` are done.

    Prints ``ready`` once every worker is ACKed, then ``done <count> <seconds>`` where seconds
    run from the first REQUEST received to the last answer sent.
    """
    ctx = zmq.Context()
    socks = []
    poller = zmq.Poller()
    for i in range(workers):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.IDENTITY, f"bench-worker-{i}-{os.getpid()}".encode())
        s.setsockopt(zmq.LINGER, 0)
        s.connect(backend)
        s.send_multipart([b"", V, b"INFORM", b"inform-%d" % i, b'[[10, "default"]]', b"worker"])
        socks.append(s)
        poller.register(s, zmq.POLLIN)
    acked: set[int] = set()
    done = 0
    first: float | None = None
    end = time.monotonic() + limit
    seq = 0
    while time.monotonic() < end and done < jobs:
        for s, _ in poller.poll(200):
            i = socks.index(s)
            while True:
                try:
                    msg = recv(s)
                except zmq.Again:
                    break
                cmd = msg[2]
                if cmd == b"ACK" and i not in acked:
                    acked.add(i)
                    for k in range(slots):
                        s.send_multipart([b"", V, b"READY", b"r-%d-%d" % (i, k)])
                    if len(acked) == workers:
                        print("ready", flush=True)
                elif cmd == b"REQUEST":
                    if first is None:
                        first = time.monotonic()
                    seq += 1
                    if b"reply-requested" in msg[5]:
                        send(s, [b"", V, b"REPLY", b"a%d" % seq, b'{"value": null}', msg[3]])
                    send(s, [b"", V, b"READY", b"b%d" % seq])
                    done += 1
    elapsed = time.monotonic() - first if first is not None else 0.0
    print(f"done {done} {elapsed:.6f} {time.process_time():.6f}", flush=True)
    for s in socks:
        s.close()
    ctx.term()


# one measured run ---------------------------------------------------------------------------

def cpu_seconds(pid: int) -> float:
    """User+system CPU seconds used so far by process ``pid``."""
    import psutil

    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def measure(frontend: str, backend: str, jobs: int, workers: int, slots: int,
            limit: float) -> tuple[int, float]:
    """Start the workers, send ``jobs`` REQUESTs from one client; return (answered, seconds)."""
    proc = subprocess.Popen([sys.executable, __file__, "--role", "workers", "--backend", backend,
                             "--workers", str(workers), "--slots", str(slots),
                             "--jobs", str(jobs), "--limit", str(limit)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"workers did not get ACKs: {line!r}")
        time.sleep(0.2)  # let the READYs arrive
        ctx = zmq.Context()
        client = ctx.socket(zmq.DEALER)
        client.setsockopt(zmq.IDENTITY, b"bench-client")
        client.setsockopt(zmq.LINGER, 0)
        client.setsockopt(zmq.SNDHWM, 0)
        client.connect(frontend)
        time.sleep(0.2)
        start = time.monotonic()
        for n in range(jobs):
            send(client, [b"", V, b"REQUEST", b"job-%08d" % n, b"default", b"reply-requested",
                          BODY])
            if n % 256 == 0:  # drain acks/results so the client never blocks the router
                while client.poll(0):
                    client.recv_multipart()
        while proc.poll() is None:
            while client.poll(50):
                client.recv_multipart()
        out = proc.stdout.read().split()
        total = time.monotonic() - start
        client.close()
        ctx.term()
        answered = int(out[1]) if len(out) >= 2 else 0
        if answered and len(out) >= 4:
            print(f"# workers cpu per job {float(out[3]) / answered * 1e6:.0f} us, "
                  f"client cpu per job {time.process_time() / answered * 1e6:.0f} us (cumulative)")
        return answered, total
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


# routers ------------------------------------------------------------------------------------

def start_mqhub(tmp: Path, durability: str) -> tuple[subprocess.Popen[bytes], str, str]:
    """``twistd -n mqhub --protocols emqp`` on free ports; returns (process, frontend, backend)."""
    ports = {role: free_port() for role in ("frontend", "backend", "pub-in", "pub-out")}
    proc = _common.start_mqhub(
        "emqp", [f"emqp.{role}=tcp://127.0.0.1:{port}" for role, port in ports.items()],
        tmp / f"data-{durability}", durability, tmp / f"mqhub-{durability}.log",
        wait_for=ports["backend"])
    return proc, f"tcp://127.0.0.1:{ports['frontend']}", f"tcp://127.0.0.1:{ports['backend']}"


def start_original(tmp: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    """The original ``emq-router`` on free ports (logs to /dev/null)."""
    front, back, admin = free_port(), free_port(), free_port()
    env = dict(os.environ)
    env.update({"EVENTMQ_CONFIG_FILE": str(tmp / "none.conf"), "EVENTMQ_WAL": str(tmp / "wal.log"),
                "EVENTMQ_FRONTEND_ADDR": f"tcp://127.0.0.1:{front}",
                "EVENTMQ_BACKEND_ADDR": f"tcp://127.0.0.1:{back}",
                "EVENTMQ_ADMINISTRATIVE_ADDR": f"tcp://127.0.0.1:{admin}"})
    router = Path(sys.executable).parent / "emq-router"
    proc = subprocess.Popen([str(router)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    wait_port(back)
    return proc, f"tcp://127.0.0.1:{front}", f"tcp://127.0.0.1:{back}"


def run_router(label: str, started: tuple[subprocess.Popen[bytes], str, str], jobs: int,
               a: argparse.Namespace) -> float:
    """Measure one started router, stop it, print its ``label``-prefixed figures; return jobs/s."""
    proc, front, back = started
    try:
        cpu0 = cpu_seconds(proc.pid)
        done, secs = measure(front, back, jobs, a.workers, a.slots, a.limit)
        cpu = cpu_seconds(proc.pid) - cpu0
    finally:
        stop(proc)
    if done:
        print(f"{label}_router_cpu_per_job {cpu / done * 1e6:.0f} us")
    rate = done / secs if secs else 0.0
    print(f"{label}_jobs_per_s {rate:.0f} jobs/s")
    print(f"{label}_jobs_answered {done} jobs")
    return rate


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print ``<figure> <value> <unit>`` lines."""
    p = argparse.ArgumentParser(prog="mqhub bench emqp", description=__doc__)
    p.add_argument("--jobs", type=int, default=20000, help="jobs per mqhub run")
    p.add_argument("--original-jobs", type=int, default=20000, help="jobs for emq-router")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--slots", type=int, default=16, help="READY slots per worker")
    p.add_argument("--limit", type=float, default=15.0, help="seconds per run at most")
    p.add_argument("--durability", default="sync,none")
    p.add_argument("--skip-original", action="store_true")
    p.add_argument("--role", default="bench", help=argparse.SUPPRESS)
    p.add_argument("--backend", help=argparse.SUPPRESS)
    a = _common.parse_args(p, argv, {"jobs": 300, "original_jobs": 300, "limit": 5.0,
                                     "durability": "none"})
    if a.role == "workers":
        run_workers(a.backend, a.workers, a.slots, a.jobs, a.limit)
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="emqp-bench-"))
    rates: dict[str, float] = {}
    try:
        for durability in a.durability.split(","):
            rates[durability] = run_router(f"emqp_mqhub_{durability}", start_mqhub(tmp, durability),
                                           a.jobs, a)
        if not a.skip_original:
            original = run_router("emqp_original", start_original(tmp), a.original_jobs, a)
            if original:
                for durability, rate in rates.items():
                    print(f"emqp_speedup_{durability} {rate / original:.1f} x")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
