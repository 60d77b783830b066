"""BrokerProcess: a real ``twistd -n mqhub`` subprocess on free 127.0.0.1 ports, for interop tests.

Usage::

    broker = BrokerProcess(["nsq"], tmp_path / "data", log_dir=tmp_path)
    broker.start()                       # returns once every listening port accepts
    port = broker.port("nsq", "tcp")
    broker.stop()                        # SIGTERM; returns the exit status
    broker.start()                       # same data dir, same ports
    broker.kill()                        # SIGKILL (crash tests)

Ports are chosen free (bind port 0, release) and passed with ``--listen NAME.ROLE=ENDPOINT``;
roles come from the plugin descriptors (drop-in directories included), so a new protocol needs
no change here. Readiness is "every port accepts a TCP connection", polled with a deadline.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from mqhub.discovery import load_plugins
from tests.plugins import isolated_plugin_path

REPO_ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
#: how long test helpers wait for a condition by default (seconds)
WAIT = 10.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def wait_until(cond: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    """Poll ``cond`` until it returns something truthy and return that; fail with ``what``
    after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = cond()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def port_accepts(port: int, timeout: float = 0.2) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port``."""
    try:
        with socket.create_connection((HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


def twistd_command() -> list[str]:
    """The command that runs twistd with this interpreter's environment."""
    script = Path(sys.executable).parent / "twistd"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from twisted.scripts.twistd import run; run()"]


class BrokerError(AssertionError):
    """The broker did not start or stop as expected (the message holds its log tail)."""


class BrokerProcess:
    """One mqhub broker subprocess; restartable on the same data dir and ports.

    :ivar ports: ``(protocol, role) -> port`` for every listening role.
    :ivar returncode: exit status of the last run, once stopped.
    """

    def __init__(
        self,
        protocols: Sequence[str],
        data_dir: os.PathLike[str] | str,
        log_dir: os.PathLike[str] | str | None = None,
        plugin_paths: Iterable[os.PathLike[str] | str] = (),
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        wait_for: Sequence[tuple[str, str]] | None = None,
    ) -> None:
        """:param protocols: plugin names (aliases allowed) to run.
        :param plugin_paths: drop-in roots passed as ``--plugin-path``.
        :param extra_args: more ``twistd mqhub`` options (e.g. ``--durability none``).
        :param wait_for: the ``(protocol, role)`` ports start() waits for (default: all).
        """
        self.data_dir = Path(data_dir)
        self.log_dir = Path(log_dir) if log_dir is not None else self.data_dir.parent
        self.plugin_paths = [str(Path(p).resolve()) for p in plugin_paths]
        self.extra_args = list(extra_args)
        self.env = env
        with isolated_plugin_path():  # this test process keeps mqhub's own plugin path
            found = load_plugins(self.plugin_paths)
        self.protocols = [found.aliases.get(p, p) for p in protocols]
        self.ports: dict[tuple[str, str], int] = {}
        self.endpoints: dict[tuple[str, str], str] = {}
        for name in self.protocols:
            plugin = found.plugins.get(name)
            if plugin is None:
                raise BrokerError(f"unknown protocol {name!r}; found {sorted(found.plugins)}")
            for role, default in plugin.default_endpoints.items():
                self.endpoints[(name, role)] = default
                self._assign((name, role), free_port())
        if "--no-admin" not in self.extra_args:  # the admin web listener (role admin.http)
            self.endpoints[("admin", "http")] = "tcp:0"
            self._assign(("admin", "http"), free_port())
        self.wait_for = list(wait_for) if wait_for is not None else list(self.ports)
        self.process: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None
        self.runs = 0
        self.log_path: Path | None = None

    # addresses ---------------------------------------------------------------------------

    def port(self, protocol: str, role: str | None = None) -> int:
        """The port of ``protocol``'s ``role`` (its first role when None)."""
        if role is None:
            role = next(r for (p, r) in self.ports if p == protocol)
        return self.ports[(protocol, role)]

    def url(self, protocol: str, role: str | None = None, scheme: str = "tcp") -> str:
        """``scheme://127.0.0.1:PORT`` of a role."""
        return f"{scheme}://{HOST}:{self.port(protocol, role)}"

    def command(self) -> list[str]:
        """The full twistd command line."""
        args = [*twistd_command(), "-n", "--pidfile=", "mqhub"]
        args += ["--protocols", ",".join(self.protocols), "--data-dir", str(self.data_dir)]
        for path in self.plugin_paths:
            args += ["--plugin-path", path]
        for (name, role), endpoint in self.endpoints.items():
            args += ["--listen", f"{name}.{role}={endpoint}"]
        return args + self.extra_args

    # lifecycle ---------------------------------------------------------------------------

    def start(self, timeout: float = 20.0) -> BrokerProcess:
        """Start the broker and return once every awaited port accepts connections.

        A port chosen free can be taken by another process before the broker binds it (other
        suites run beside this one): the broker then logs ``cannot listen on`` (a ZeroMQ
        role: ``addr='tcp://...'``) and exits with status 1. Such a role gets a fresh port and the broker is started again
        (up to three times), so a test never talks to a stranger.

        :raises BrokerError: when it exits or does not listen within ``timeout`` seconds.
        """
        for _ in range(3):
            taken = self._start_once(timeout)
            if not taken:
                return self
            self.kill()
            for key in taken:
                self._assign(key, free_port())
        raise BrokerError(f"ports kept being taken: {taken}:\n{self.output()}")

    def _assign(self, key: tuple[str, str], port: int) -> None:
        """Give role ``key`` the loopback TCP ``port``, in the form of its current endpoint (a
        ZeroMQ address ``tcp://`` for eMQP roles, else a Twisted endpoint string)."""
        self.ports[key] = port
        if self.endpoints[key].startswith("tcp://"):
            self.endpoints[key] = f"tcp://{HOST}:{port}"
        else:
            self.endpoints[key] = f"tcp:{port}:interface={HOST}"

    def _start_once(self, timeout: float) -> list[tuple[str, str]]:
        """One start; return the roles whose port another process had taken (none: started)."""
        if self.process is not None and self.process.poll() is None:
            raise BrokerError("broker already running")
        self.runs += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.log_dir / f"mqhub-{'-'.join(self.protocols)}-{self.runs}.log"
        env = dict(os.environ if self.env is None else self.env)
        env["PYTHONUNBUFFERED"] = "1"
        with open(self.log_path, "wb") as log_file:
            self.process = subprocess.Popen(
                self.command(),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=str(REPO_ROOT),
                env=env,
            )
        self.returncode = None
        deadline = time.monotonic() + timeout
        pending = list(self.wait_for)
        while pending:
            if self.process.poll() is not None:
                self.returncode = self.process.returncode
                taken = self._taken()
                if taken:
                    return taken
                raise BrokerError(f"broker exited with {self.returncode}:\n{self.output()}")
            taken = self._taken()
            if taken:
                return taken
            pending = [key for key in pending if not port_accepts(self.ports[key])]
            if not pending:
                break
            if time.monotonic() > deadline:
                self.kill()
                raise BrokerError(f"broker did not listen on {pending}:\n{self.output()}")
            time.sleep(0.02)
        # a stranger may have answered before the broker bound: wait (briefly) for the
        # broker's own word on each Twisted listener (JSON logs do not render it: 2 s at most)
        listeners = [k for k in self.wait_for if not self.endpoints[k].startswith("tcp://")]
        settle = time.monotonic() + 2.0
        while time.monotonic() < settle:
            out = self.output()
            taken = self._taken()
            if taken:
                return taken
            if all(f"listening on {self.endpoints[k]}" in out for k in listeners):
                break
            time.sleep(0.02)
        return []

    def _taken(self) -> list[tuple[str, str]]:
        """The roles whose port the broker's log says it could not bind."""
        out = self.output()
        return [key for key in self.ports
                if f"cannot listen on {self.endpoints[key]}:" in out
                or f"(addr='{self.endpoints[key]}')" in out]

    def wait_for_log(self, text: str, timeout: float = 10.0) -> None:
        """Poll the log until ``text`` appears.

        :raises BrokerError: when it does not appear in time.
        """
        deadline = time.monotonic() + timeout
        while text not in self.output():
            if time.monotonic() > deadline:
                raise BrokerError(f"{text!r} not logged in time:\n{self.output()}")
            time.sleep(0.02)

    def stop(self, timeout: float = 10.0, sig: int = signal.SIGTERM) -> int:
        """Send ``sig`` (SIGTERM) and wait for the exit; return the exit status.

        :raises BrokerError: when it has not exited within ``timeout`` (it is then killed).
        """
        proc = self.process
        if proc is None:
            raise BrokerError("broker was never started")
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise BrokerError(f"broker ignored signal {sig} for {timeout}s:\n{self.output()}") from None
        self.returncode = proc.returncode
        return proc.returncode

    def kill(self) -> int:
        """SIGKILL the broker (a crash); return the exit status."""
        return self.stop(timeout=10.0, sig=signal.SIGKILL)

    def restart(self, timeout: float = 20.0) -> BrokerProcess:
        """SIGTERM, then start again on the same data dir and ports."""
        self.stop()
        return self.start(timeout)

    @property
    def running(self) -> bool:
        """Whether the subprocess is alive."""
        return self.process is not None and self.process.poll() is None

    def output(self) -> str:
        """The log of the current (or last) run."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    def __enter__(self) -> BrokerProcess:
        """Start on entering a ``with`` block."""
        return self.start()

    def __exit__(self, *exc: object) -> None:
        """Stop (SIGKILL if SIGTERM fails) on leaving."""
        self.close()

    def close(self) -> None:
        """Make sure the subprocess is gone (SIGTERM, then SIGKILL)."""
        if self.running:
            try:
                self.stop(timeout=5.0)
            except BrokerError:
                pass
