"""Every listener binds to loopback by default (DESIGN.md §8).

Two checks: (1) every default endpoint of every protocol descriptor (built-ins and the Redis
drop-in) and every endpoint ``twistd mqhub --help`` prints names 127.0.0.1; (2) the broker
started with NO ``--listen`` option listens on exactly those default ports, all on 127.0.0.1.
Check (2) runs the broker in a private network namespace (``unshare -rn``), so the default
ports can never collide with anything else on the machine, and reads that namespace's socket
table from ``/proc/PID/net/tcp{,6}``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from mqhub.discovery import load_plugins
from mqhub.tap import ADMIN_ENDPOINT
from tests.interop.broker import REPO_ROOT, twistd_command
from tests.plugins import EXAMPLE_PLUGINS, isolated_plugin_path

#: Every implemented protocol, started by the default-endpoint run.
RUN_PROTOCOLS = ["nsq", "mq9", "emqp", "mqks", "redis", "vibemq"]
LISTEN = "0A"
LOOPBACK_V4 = "0100007F"


def default_endpoints() -> dict[tuple[str, str], str]:
    """``(protocol, role) -> default endpoint`` of every discovered descriptor."""
    with isolated_plugin_path():
        found = load_plugins([str(EXAMPLE_PLUGINS)])
    return {
        (name, role): endpoint
        for name, plugin in found.plugins.items()
        for role, endpoint in plugin.default_endpoints.items()
    }


def endpoint_host_port(endpoint: str) -> tuple[str, int]:
    """Host and port of a Twisted ``tcp:PORT:interface=H`` or ZeroMQ ``tcp://H:PORT`` endpoint."""
    zmq_form = re.fullmatch(r"tcp://([^:]+):(\d+)", endpoint)
    if zmq_form:
        return zmq_form.group(1), int(zmq_form.group(2))
    parts = endpoint.split(":")
    assert parts[0] == "tcp", endpoint
    options = dict(p.split("=", 1) for p in parts[2:] if "=" in p)
    return options.get("interface", "0.0.0.0"), int(parts[1])  # Twisted's default is all interfaces


def test_every_default_endpoint_names_loopback() -> None:
    """Every descriptor's default endpoint, and every endpoint --help prints, is on 127.0.0.1."""
    defaults = default_endpoints()
    assert {name for name, _ in defaults} >= {*RUN_PROTOCOLS}
    for key, endpoint in defaults.items():
        assert endpoint_host_port(endpoint)[0] == "127.0.0.1", (key, endpoint)
    assert endpoint_host_port(ADMIN_ENDPOINT)[0] == "127.0.0.1"  # the admin web listener
    env = dict(os.environ, MQHUB_PLUGIN_PATH=str(EXAMPLE_PLUGINS))
    result = subprocess.run([*twistd_command(), "mqhub", "--help"], capture_output=True, text=True,
                            timeout=60, cwd=str(REPO_ROOT), env=env)
    assert result.returncode == 0, result.stderr
    printed = re.findall(r"^\s+([\w-]+) = (\S+)$", result.stdout.split("Protocols:", 1)[1], re.M)
    assert {endpoint for _, endpoint in printed} == set(defaults.values())
    assert all(endpoint_host_port(endpoint)[0] == "127.0.0.1" for _, endpoint in printed)


def listening(pid: int) -> dict[int, set[str]]:
    """``port -> {hex local address}`` of LISTEN sockets in ``pid``'s network namespace."""
    found: dict[int, set[str]] = {}
    for table in ("tcp", "tcp6"):
        lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        for line in lines:
            fields = line.split()
            if fields[3] != LISTEN:
                continue
            address, port = fields[1].split(":")
            found.setdefault(int(port, 16), set()).add(address)
    return found


def netns_usable() -> bool:
    """Whether an unprivileged ``unshare -rn`` with a loopback interface works here."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    probe = subprocess.run(["unshare", "-rn", "ip", "link", "set", "lo", "up"], capture_output=True,
                           timeout=10)
    return probe.returncode == 0


def test_broker_with_default_endpoints_listens_on_loopback_only(tmp_path: Path) -> None:
    """With no --listen, every listener is on its default port and bound to 127.0.0.1 only."""
    if not netns_usable():
        pytest.skip("no unprivileged network namespace here; defaults are checked by the test above")
    expected = {
        endpoint_host_port(endpoint)[1]
        for (name, _), endpoint in default_endpoints().items()
        if name in RUN_PROTOCOLS
    } | {endpoint_host_port(ADMIN_ENDPOINT)[1]}  # the admin web listener, on by default
    command = [
        *twistd_command(), "-n", "--pidfile=", "mqhub", "--protocols", ",".join(RUN_PROTOCOLS),
        "--plugin-path", str(EXAMPLE_PLUGINS), "--data-dir", str(tmp_path / "data"),
    ]
    log_path = tmp_path / "mqhub.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            ["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *command],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(REPO_ROOT),
        )
    try:
        deadline = time.monotonic() + 30
        sockets: dict[int, set[str]] = {}
        while not expected <= set(sockets):
            assert proc.poll() is None, f"broker exited:\n{log_path.read_text()[-5000:]}"
            assert time.monotonic() < deadline, (
                f"listening on {sorted(sockets)}, expected {sorted(expected)}:\n"
                f"{log_path.read_text()[-5000:]}"
            )
            time.sleep(0.05)
            sockets = listening(proc.pid)
        assert set(sockets) == expected
        for port, addresses in sockets.items():
            assert addresses == {LOOPBACK_V4}, (port, addresses)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, log_path.read_text()[-5000:]
