"""NSQ end-to-end throughput: one pipelined producer and one consumer (RDY 1000), 127.0.0.1 only.

Scenarios: PUB (pipelined, a window of 500-command chunks) and MPUB (200 messages per command),
each with 16 B and 1 KiB bodies. By default it starts its own ``twistd -n mqhub --protocols nsq``
with ``--durability sync`` (every message fsync'd in LMDB before its ``OK``); ``--address
HOST:PORT`` aims the same run at any nsqd-compatible server (e.g. a reference nsqd).

Producer and consumer are raw-socket clients, each in its own process. The consumer subscribes
first, FINs every message (FINs batched per read). Figures (``<figure> <value> <unit>``):

- ``<mode>_<size>_publish``: messages confirmed (OK) per second at the producer;
- ``<mode>_<size>_e2e``: messages consumed per second, from the producer's first byte to the
  consumer's last message.

``--base-tree DIR`` (a source tree, e.g. ``git archive main | tar -x -C DIR``) runs each scenario
against a fresh server of this tree and of ``DIR``, alternating which goes first, and prints
``<figure>_e2e`` and ``<figure>_e2e_base`` with each run's server CPU per message (a same-run
A/B; ``--rounds N`` repeats it). ``--rights`` does the same A/B between this tree without and
with a users file (``--users``; the clients AUTH with a token, rights are patterns), figures
suffixed ``_rights`` (docs/security.md).

    python benchmarks/nsq_bench.py [--duration 4] [--address 127.0.0.1:4150]
    python benchmarks/nsq_bench.py --base-tree /tmp/main --rounds 3 --sizes 16
    mqhub bench nsq
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

from mqhub.protocols.nsq import codec as wire

try:
    from benchmarks import _common
except ImportError:  # run as a script: benchmarks/ is on sys.path
    import _common  # type: ignore[no-redef]

HOST = _common.HOST
free_port = _common.free_port
server_cpu = _common.server_cpu
_HEAD = struct.Struct(">ii")
OK_FRAME = wire.OK_FRAME
#: chunks (500 PUBs, or 5 MPUBs of 200) the producer keeps unconfirmed
WINDOW = 8


#: the AUTH secret the clients send first (set in the parent before the clients fork)
SECRET: bytes = b""


def start_mqhub(data_dir: str, durability: str, journal: str = "on",
                tree: str = "", users: str = "") -> tuple[subprocess.Popen, int]:
    """Start ``twistd -n mqhub --protocols nsq`` on free loopback ports (``--journal journal``).

    :param tree: another source tree (``git archive REV | tar -x -C tree``) whose ``mqhub``
        package runs instead of this one (same-run A/B, ``--base-tree``).
    :param users: a users file (``--users``) for the rights-on runs.
    """
    tcp, http = free_port(), free_port()
    listens = [f"nsq.tcp=tcp:{tcp}:interface={HOST}", f"nsq.http=tcp:{http}:interface={HOST}"]
    log_path = os.path.join(data_dir, "..", "mqhub.log" + (".base" if tree else ""))
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree)) if tree else None
    extra = ["--journal", journal] + (["--users", users] if users else [])
    proc = _common.start_mqhub("nsq", listens, data_dir, durability, log_path, wait_for=tcp,
                               extra=extra, cwd=tree or None, env=env)
    return proc, tcp


def _connect(port: int, host: str) -> socket.socket:
    """A connected socket with the V2 magic sent (and AUTH with :data:`SECRET` when set: its
    JSON answer comes before anything the caller waits for)."""
    sock = _common.connect(port, host)
    sock.sendall(wire.MAGIC_V2 + (wire.encode_auth(SECRET) if SECRET else b""))
    return sock


def answer_frames(buf: bytes) -> tuple[bytes, list[bytes], bool]:
    """Parse the complete frames at the head of ``buf``: returns (the rest, a ``FIN`` command per
    message frame, whether a heartbeat asks for a ``NOP``)."""
    unpack = _HEAD.unpack_from
    pos = 0
    n = len(buf)
    fins = []
    nop = False
    while n - pos >= 8:
        size, ftype = unpack(buf, pos)
        end = pos + 4 + size
        if end > n:
            break
        if ftype == 2:
            fins.append(b"FIN " + buf[pos + 18:pos + 34] + b"\n")
        elif buf[pos + 8:end] == b"_heartbeat_":
            nop = True
        pos = end
    return buf[pos:], fins, nop


def consumer(host: str, port: int, topic: str, ready: Any, total: Any, out: Any,
             rdy: int = 1000, arrivals: bool = False) -> None:
    """SUB with RDY ``rdy``, FIN everything, stop once ``total`` messages arrived (or 30 s idle).

    Sends ``(count, last arrival, CPU seconds)`` to ``out``, or with ``arrivals`` the list of
    ``(time, messages)`` of every read that brought messages (``mqhub bench fairness``).
    """
    sock = _connect(port, host)
    sock.sendall(b"SUB %s bench\nRDY %d\n" % (topic.encode(), rdy))
    buf = b""
    # wait for the SUB's OK before telling the producer to start
    while OK_FRAME not in buf:
        buf += sock.recv(65536)
    buf = buf[buf.index(OK_FRAME) + len(OK_FRAME):]
    ready.set()
    count = 0
    reads: list[tuple[float, int]] = []
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
        buf, fins, nop = answer_frames(buf + data if buf else data)
        if fins:
            count += len(fins)
            last = time.perf_counter()
            idle_until = last + 30
            if arrivals:
                reads.append((last, len(fins)))
        if fins or nop:
            sock.sendall(b"".join(fins) + (b"NOP\n" if nop else b""))
    out.send(reads if arrivals else (count, last, time.process_time()))
    sock.close()


def producer(host: str, port: int, topic: str, mode: str, size: int, duration: float,
             ready: Any, total: Any, out: Any) -> None:
    """Publish for ``duration`` seconds (PUB pipelined or MPUB x200), then wait for every OK."""
    body = b"x" * size
    if mode == "pub":
        per_cmd, cmds_per_chunk, window = 1, 500, WINDOW
        cmd = wire.encode_pub(topic, body)
    else:
        per_cmd, cmds_per_chunk, window = 200, 5, WINDOW
        cmd = wire.encode_mpub(topic, [body] * 200)
    chunk = cmd * cmds_per_chunk
    sock = _connect(port, host)
    ready.wait(20)
    sent_cmds = 0
    oks = 0
    buf = b""
    start = time.perf_counter()
    stop_at = start + duration
    while True:
        now = time.perf_counter()
        if now < stop_at and sent_cmds - oks < window * cmds_per_chunk:
            sock.sendall(chunk)
            sent_cmds += cmds_per_chunk
            continue
        if now >= stop_at and oks >= sent_cmds:
            break
        data = sock.recv(1 << 16)
        if not data:
            raise RuntimeError("server closed the producer connection")
        buf += data
        pos = 0
        while len(buf) - pos >= 8:
            fsize, ftype = _HEAD.unpack_from(buf, pos)
            if len(buf) < pos + 4 + fsize:
                break
            frame = buf[pos + 8:pos + 4 + fsize]
            if ftype == 1:
                raise RuntimeError(f"server error: {frame!r}")
            if frame == b"OK":
                oks += 1
            elif frame == b"_heartbeat_":
                sock.sendall(b"NOP\n")
            pos += 4 + fsize
        buf = buf[pos:]
    end = time.perf_counter()
    total.value = sent_cmds * per_cmd
    out.send((sent_cmds * per_cmd, start, end, time.process_time()))
    sock.close()


def run_pair(host: str, port: int, topic: str, mode: str, size: int, duration: float,
             **consumer_options: Any) -> tuple[Any, Any]:
    """Run ``consumer`` (with ``consumer_options``) and ``producer`` on ``topic``, each in its
    own forked process; return what each sent back (the producer's result first)."""
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    total = ctx.Value("q", 0)
    c_recv, c_send = ctx.Pipe(False)
    p_recv, p_send = ctx.Pipe(False)
    cons = ctx.Process(target=consumer, args=(host, port, topic, ready, total, c_send),
                       kwargs=consumer_options)
    prod = ctx.Process(target=producer, args=(host, port, topic, mode, size, duration, ready, total, p_send))
    cons.start()
    prod.start()
    produced = p_recv.recv()
    consumed = c_recv.recv()
    prod.join(10)
    cons.join(10)
    return produced, consumed


def run_scenario(host: str, port: int, mode: str, size: int, duration: float,
                 server_pid: int | None = None) -> tuple[float, float]:
    """One producer/consumer pair; returns (publish rate, end-to-end rate) in msg/s.

    Also prints, as a ``#`` comment, the CPU each side spent per message (the cores are shared,
    so this says which side limits the run).
    """
    topic = f"bench_{mode}_{size}_{uuid.uuid4().hex[:8]}"
    cpu0 = server_cpu(server_pid)
    (sent, start, end, prod_cpu), (count, last, cons_cpu) = run_pair(host, port, topic, mode, size,
                                                                     duration)
    if count < sent:
        print(f"# {mode} {size}B: consumer got {count} of {sent}", file=sys.stderr)
    per = 1e6 / max(1, sent)
    server = f"server {(server_cpu(server_pid) - cpu0) * per:.2f}, " if server_pid else ""
    print(f"# {mode} {size}B cpu us/msg: {server}producer {prod_cpu * per:.2f}, "
          f"consumer {cons_cpu * per:.2f}")
    return sent / (end - start), count / (last - start)


def main(argv: list[str] | None = None) -> int:
    """Run the scenarios and print ``<figure> <value> <unit>`` lines."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", help="HOST:PORT of a running nsqd-compatible server")
    parser.add_argument("--duration", type=float, default=4.0, help="seconds of publishing per scenario")
    parser.add_argument("--durability", default="sync", choices=["sync", "batch", "none"],
                        help="store mode of the mqhub the benchmark starts itself")
    parser.add_argument("--journal", default="on", choices=["on", "off"],
                        help="the broker's flow journal (measure both: benchmarks/results/README.md)")
    parser.add_argument("--sizes", default="16,1024", help="comma-separated body sizes")
    parser.add_argument("--modes", default="pub,mpub", help="comma-separated: pub, mpub")
    parser.add_argument("--base-tree", default="",
                        help="also run the mqhub of this source tree, alternating with this "
                             "one per scenario (figures suffixed _base): a same-run A/B")
    parser.add_argument("--rounds", type=int, default=1, help="repeat the scenarios (A/B pairs)")
    parser.add_argument("--rights", action="store_true",
                        help="A/B of this tree without and with a users file (figures suffixed "
                             "_rights): the cost of per-topic rights")
    args = parser.parse_args(argv)
    if (args.base_tree or args.rights) and args.address:
        parser.error("--base-tree and --rights run their own servers: no --address")
    if args.base_tree and args.rights:
        parser.error("one A/B at a time: --base-tree or --rights")
    if args.base_tree or args.rights:
        return _ab(args)
    proc: subprocess.Popen | None = None
    tmp: str | None = None
    if args.address:
        host, _, port_text = args.address.rpartition(":")
        host, port = host or HOST, int(port_text)
        label = "server"
    else:
        tmp = tempfile.mkdtemp(prefix="nsq-bench-")
        data_dir = os.path.join(tmp, "data")
        os.makedirs(data_dir)
        proc, port = start_mqhub(data_dir, args.durability, args.journal)
        host = HOST
        label = f"mqhub durability={args.durability} journal={args.journal}"
    print(f"# nsq bench against {label} at {host}:{port}, {args.duration:g}s per scenario")
    try:
        for mode in args.modes.split(","):
            for size in (int(s) for s in args.sizes.split(",")):
                published, e2e = run_scenario(host, port, mode, size, args.duration,
                                              proc.pid if proc is not None else None)
                tag = f"{mode}_{size}B" if size < 1024 else f"{mode}_{size // 1024}KiB"
                print(f"{tag}_publish {published:.0f} msg/s")
                print(f"{tag}_e2e {e2e:.0f} msg/s", flush=True)
    finally:
        if proc is not None:
            _common.stop(proc)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


def _ab(args: argparse.Namespace) -> int:
    """Alternate this tree's server and ``--base-tree``'s (or, with ``--rights``, this tree
    with a users file), a fresh server per scenario."""
    global SECRET
    tmp = tempfile.mkdtemp(prefix="nsq-bench-ab-")
    other = "users file" if args.rights else args.base_tree
    label, suffix = ("rights", "_rights") if args.rights else ("base", "_base")
    print(f"# nsq A/B: this tree vs {other}, durability={args.durability}, "
          f"{args.duration:g}s per scenario")
    try:
        run = 0
        for _ in range(args.rounds):
            for mode in args.modes.split(","):
                for size in (int(s) for s in args.sizes.split(",")):
                    tag = f"{mode}_{size}B" if size < 1024 else f"{mode}_{size // 1024}KiB"
                    order = (False, True) if run % 2 == 0 else (True, False)
                    run += 1
                    for other_side in order:
                        data_dir = os.path.join(tmp, f"data{run}{'b' if other_side else 'a'}")
                        os.makedirs(data_dir)
                        rights = args.rights and other_side
                        users = _common.users_file(data_dir) if rights else ""
                        tree = args.base_tree if other_side else ""
                        SECRET = _common.BENCH_TOKEN.encode() if rights else b""
                        proc, port = start_mqhub(data_dir, args.durability, args.journal, tree,
                                                 users)
                        try:
                            print(f"# {label if other_side else 'this'}:", end=" ")
                            published, e2e = run_scenario(HOST, port, mode, size, args.duration,
                                                          proc.pid)
                        finally:
                            _common.stop(proc)
                        end = suffix if other_side else ""
                        print(f"{tag}_publish{end} {published:.0f} msg/s")
                        print(f"{tag}_e2e{end} {e2e:.0f} msg/s", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
