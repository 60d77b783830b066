"""MQKS publish → consume throughput over raw sockets, 127.0.0.1 only.

One pipelined publisher and one consumer, each in its own process, against a queue bound to the
published event. Scenarios: auto-ack at 16 B and 1 KiB, and manual-ack at 16 B (the consumer
acks every message, acks batched per read). By default the benchmark starts its own
``twistd -n mqhub --protocols mqks`` in the default store mode (``--durability sync``: every
message is in LMDB, fsync'd, before the broker confirms or delivers it); ``--address HOST:PORT``
aims the same run at any MQKS server (e.g. the original ``mqksd`` with a one-worker config).

The publisher sends chunks of 500 publishes, ``--confirm`` only on the last one of a chunk, and
keeps at most ``--window`` chunks (default 32, i.e. 16,000 messages) unconfirmed — the original
client library does not wait for confirms at all, so a pipelined publisher is the realistic
shape; the window only bounds what is in flight. With ``sync`` durability a smaller window makes
the run measure commit latency (fsync round trips) instead of throughput. Figures
(``<figure> <value> <unit>``):

- ``<mode>_<size>_publish``: messages confirmed per second at the publisher;
- ``<mode>_<size>_e2e``: messages consumed per second, from the publisher's first byte to the
  consumer's last message.

    python benchmarks/mqks_bench.py [--duration 4] [--address 127.0.0.1:25000]
    mqhub bench mqks
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

try:
    from benchmarks import _common
except ImportError:  # run as a script: benchmarks/ is on sys.path
    import _common  # type: ignore[no-redef]

HOST = _common.HOST
#: publishes per chunk (the last one asks for a confirm) and chunks kept unconfirmed (default)
CHUNK = 500
WINDOW = 32


def start_mqhub(data_dir: str, durability: str) -> tuple[subprocess.Popen, int]:
    """Start ``twistd -n mqhub --protocols mqks`` on a free loopback port."""
    port = _common.free_port()
    proc = _common.start_mqhub("mqks", [f"mqks.tcp=tcp:{port}:interface={HOST}"], data_dir,
                               durability, os.path.join(data_dir, "..", "mqhub.log"),
                               wait_for=port)
    return proc, port


def _wait_line(sock: socket.socket, line: bytes) -> bytes:
    """Read until ``line`` (with its newline) arrived; return what followed it."""
    buf = b""
    while line + b"\n" not in buf:
        data = sock.recv(65536)
        if not data:
            raise RuntimeError("server closed the connection")
        buf += data
    return buf[buf.index(line + b"\n") + len(line) + 1:]


def consumer(host: str, port: int, queue: str, event: str, manual: bool, ready: Any,
             total: Any, out: Any) -> None:
    """Consume (acking every message when ``manual``) until ``total`` arrived or 30 s idle."""
    sock = _common.connect(port, host)
    flags = " --manual-ack" if manual else ""
    sock.sendall(f"bc consume --confirm {queue} {event}{flags}\n".encode())
    buf = _wait_line(sock, b"bc ok ")
    ready.set()
    count = 0
    last = time.perf_counter()
    idle_until = last + 30
    sock.settimeout(0.1)
    while True:
        target = total.value
        if target and count >= target:
            break
        try:
            data = sock.recv(1 << 20)
        except TimeoutError:
            if time.perf_counter() > idle_until:
                break
            continue
        if not data:
            break
        buf += data
        cut = buf.rfind(b"\n") + 1
        if not cut:
            continue
        lines = buf[:cut].split(b"\n")
        buf = buf[cut:]
        n = len(lines) - 1
        if manual:
            acks = [b"a ack bc " + x.split(b" ", 3)[2] + b"\n" for x in lines[:-1]]
            sock.sendall(b"".join(acks))
        count += n
        last = time.perf_counter()
        idle_until = last + 30
    out.send((count, last, time.process_time()))
    sock.close()


def producer(host: str, port: int, event: str, size: int, duration: float, ready: Any,
             total: Any, out: Any, window: int = WINDOW) -> None:
    """Publish chunks for ``duration`` seconds (a confirm per chunk), then wait for every confirm."""
    body = b"x" * size
    ev = event.encode()
    sock = _common.connect(port, host)
    ready.wait(20)
    sent = 0
    chunks = 0
    confirmed = 0
    buf = b""
    start = time.perf_counter()
    stop_at = start + duration
    while True:
        now = time.perf_counter()
        if now < stop_at and chunks - confirmed < window:
            lines = [b"%d publish %s %s\n" % (sent + i, ev, body) for i in range(CHUNK - 1)]
            lines.append(b"c%d publish --confirm %s %s\n" % (chunks, ev, body))
            sock.sendall(b"".join(lines))
            sent += CHUNK
            chunks += 1
            continue
        if now >= stop_at and confirmed >= chunks:
            break
        data = sock.recv(1 << 16)
        if not data:
            raise RuntimeError("server closed the publisher connection")
        buf += data
        if b" error " in buf:
            raise RuntimeError(f"server error: {buf[:200]!r}")
        confirmed += buf.count(b" ok \n")
        buf = buf[buf.rfind(b"\n") + 1:]
    end = time.perf_counter()
    total.value = sent
    out.send((sent, start, end, time.process_time()))
    sock.close()


def run_scenario(host: str, port: int, size: int, manual: bool, duration: float,
                 server_pid: int | None = None, window: int = WINDOW) -> tuple[float, float]:
    """One publisher/consumer pair; returns (publish rate, end-to-end rate) in msg/s."""
    ctx = mp.get_context("fork")
    tag = uuid.uuid4().hex[:8]
    queue, event = f"bench_q_{tag}", f"bench.e{tag}"
    ready = ctx.Event()
    total = ctx.Value("q", 0)
    c_recv, c_send = ctx.Pipe(False)
    p_recv, p_send = ctx.Pipe(False)
    cons = ctx.Process(target=consumer,
                       args=(host, port, queue, event, manual, ready, total, c_send))
    prod = ctx.Process(target=producer, args=(host, port, event, size, duration, ready, total,
                                              p_send, window))
    cpu0 = _common.server_cpu(server_pid)
    cons.start()
    prod.start()
    sent, start, end, prod_cpu = p_recv.recv()
    count, last, cons_cpu = c_recv.recv()
    prod.join(10)
    cons.join(10)
    if count < sent:
        print(f"# {size}B: consumer got {count} of {sent}", file=sys.stderr)
    per = 1e6 / max(1, sent)
    server = f"server {(_common.server_cpu(server_pid) - cpu0) * per:.2f}, " if server_pid else ""
    print(f"# {'manual' if manual else 'auto'} {size}B cpu us/msg: {server}"
          f"producer {prod_cpu * per:.2f}, consumer {cons_cpu * per:.2f}")
    return sent / (end - start), count / (last - start)


def main(argv: list[str] | None = None) -> int:
    """Run the scenarios and print ``<figure> <value> <unit>`` lines."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", help="HOST:PORT of a running MQKS server")
    parser.add_argument("--duration", type=float, default=4.0, help="seconds of publishing per scenario")
    parser.add_argument("--durability", default="sync", choices=["sync", "batch", "none"],
                        help="store mode of the mqhub the benchmark starts itself")
    parser.add_argument("--window", type=int, default=WINDOW,
                        help="chunks of 500 publishes the publisher keeps unconfirmed")
    parser.add_argument("--scenarios", default="auto:16,auto:1024,manual:16",
                        help="comma-separated MODE:SIZE (MODE auto or manual)")
    args = _common.parse_args(parser, argv, {"duration": 0.3, "scenarios": "auto:16,manual:16"})
    proc: subprocess.Popen | None = None
    tmp: str | None = None
    if args.address:
        host, _, port_text = args.address.rpartition(":")
        host, port = host or HOST, int(port_text)
        label = "server"
    else:
        tmp = tempfile.mkdtemp(prefix="mqks-bench-")
        data_dir = os.path.join(tmp, "data")
        os.makedirs(data_dir)
        proc, port = start_mqhub(data_dir, args.durability)
        host = HOST
        label = f"mqhub durability={args.durability}"
    print(f"# mqks bench against {label} at {host}:{port}, {args.duration:g}s per scenario, "
          f"window {args.window} x {CHUNK} publishes")
    try:
        for scenario in args.scenarios.split(","):
            mode, _, size_text = scenario.partition(":")
            size = int(size_text)
            published, e2e = run_scenario(host, port, size, mode == "manual", args.duration,
                                          proc.pid if proc is not None else None, args.window)
            tag = f"{mode}_{size}B" if size < 1024 else f"{mode}_{size // 1024}KiB"
            print(f"{tag}_publish {published:.0f} msg/s")
            print(f"{tag}_e2e {e2e:.0f} msg/s", flush=True)
    finally:
        if proc is not None:
            _common.stop(proc)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
