"""Helpers shared by the protocol benchmarks: loopback ports and the mqhub server they start.

Every benchmark talks to 127.0.0.1 only. ``start_mqhub`` runs ``twistd -n mqhub`` as a child
process with the given ``--listen`` endpoints and returns once the first given port accepts.

Import from a benchmark script so that both ``python benchmarks/x_bench.py`` (the script's
folder is on ``sys.path``) and ``mqhub bench x`` (the source root is on ``sys.path``) work::

    try:
        from benchmarks._common import free_port, start_mqhub, stop
    except ImportError:  # run as a script
        from _common import free_port, start_mqhub, stop
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

HOST = "127.0.0.1"
#: the source tree (benchmarks/..), the working directory of the servers started here
SOURCE_ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def connect(port: int, host: str = HOST, rcvbuf: int = 1 << 20) -> socket.socket:
    """A load generator's socket: connected, TCP_NODELAY, a large receive buffer."""
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    return sock


def wait_port(port: int, proc: subprocess.Popen | None = None, timeout: float = 20.0) -> None:
    """Poll until ``port`` accepts; fail if ``proc`` exited or the deadline passed."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with socket.create_connection((HOST, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"port {port} did not open")


def twistd_command() -> list[str]:
    """How to run twistd with this Python (the venv's script, else twistd's entry point)."""
    twistd = Path(sys.executable).parent / "twistd"
    if twistd.exists():
        return [str(twistd)]
    return [sys.executable, "-c", "import sys; from twisted.scripts.twistd import run; run()"]


def start_mqhub(protocols: str, listens: Sequence[str], data_dir: str | os.PathLike[str],
                durability: str, log_path: str | os.PathLike[str], wait_for: int,
                extra: Sequence[str] = (), cwd: str | os.PathLike[str] | None = None,
                env: Mapping[str, str] | None = None) -> subprocess.Popen:
    """Start ``twistd -n mqhub`` and return once ``wait_for`` accepts connections (the child
    is stopped when it does not).

    :param protocols: the ``--protocols`` value (``nsq``, ``nats``, ``emqp``...).
    :param listens: ``--listen`` values, e.g. ``nsq.tcp=tcp:4150:interface=127.0.0.1``.
    :param log_path: file receiving the server's stdout and stderr.
    :param extra: further twistd mqhub options.
    :param cwd: the child's working directory (default: this source tree).
    :param env: the child's environment (default: inherited), e.g. another tree's PYTHONPATH.
    """
    cmd = twistd_command() + ["-n", "--pidfile=", "mqhub", "--protocols", protocols,
                              "--data-dir", str(data_dir), "--durability", durability]
    for listen in listens:
        cmd += ["--listen", listen]
    if not any(listen.startswith("admin") for listen in listens) and "--no-admin" not in extra:
        # its own admin port: side-by-side servers (and other users' brokers) never share 8750
        cmd += ["--listen", f"admin.http=tcp:{free_port()}:interface=127.0.0.1"]
    cmd += list(extra)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL,
                                cwd=str(cwd if cwd is not None else SOURCE_ROOT),
                                env=dict(env) if env is not None else None)
    try:
        wait_port(wait_for, proc)
    except RuntimeError:
        stop(proc)
        raise
    return proc


def stop(proc: subprocess.Popen) -> None:
    """Terminate a server subprocess (kill it if it lingers 10 s)."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def fsync_ms(tmp: str, size: int = 4096, rounds: int = 31) -> float:
    """Median latency in ms of writing ``size`` bytes and fsyncing them, in directory ``tmp``.

    Printed beside the durable figures so they can be read against the disk of the moment.
    """
    path = os.path.join(tmp, "fsync.probe")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    times = []
    try:
        for _ in range(rounds):
            os.write(fd, b"x" * size)
            t = time.perf_counter()
            os.fsync(fd)
            times.append(time.perf_counter() - t)
    finally:
        os.close(fd)
        os.unlink(path)
    return sorted(times)[len(times) // 2] * 1000.0


def server_cpu(pid: int | None) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far (0 when unknown)."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


#: the users file of the benchmarks' "rights on" runs: one user whose rights are patterns
#: (never the ``>`` that would skip the checks), its token the clients present
BENCH_TOKEN = "bench-token"
BENCH_USERS = f"""
[[user]]
name = "bench"
token = "{BENCH_TOKEN}"
publish = ["bench.>", "*", "$mq9.>", "_INBOX.>"]
subscribe = ["bench.>", "*", "$mq9.>", "_INBOX.>"]
"""


def users_file(directory: str | os.PathLike[str]) -> str:
    """Write :data:`BENCH_USERS` into ``directory``; return the path (for ``--users``)."""
    path = os.path.join(directory, "users.toml")
    with open(path, "w") as f:
        f.write(BENCH_USERS)
    return path
