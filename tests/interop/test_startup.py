"""Startup fails loudly (issue 27 item 1): a real ``twistd -n mqhub`` whose listener cannot bind,
whose store cannot open, or whose protocol refuses its settings exits with status 1 within 5 s
of the failure, logs one line saying why and never logs "ready"; a good start lists every
listener with its state in ``/healthz``."""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq

from tests.interop.broker import (
    HOST,
    REPO_ROOT,
    BrokerProcess,
    free_port,
    twistd_command,
    wait_until,
)

pytestmark = pytest.mark.interop


@pytest.fixture
def held_port() -> Iterator[int]:
    """A loopback TCP port this test holds (bound and listening) while the broker starts."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        sock.listen(1)
        yield int(sock.getsockname()[1])


def failed_start(args: list[str], tmp_path: Path) -> tuple[int, str]:
    """Run ``twistd -n mqhub ARGS``; wait (deadlines, not timings) for it to fail and exit.

    Returns its exit status and output. It must exit within 5 s of logging why.
    """
    log_path = tmp_path / "mqhub.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen([*twistd_command(), "-n", "--pidfile=", "mqhub",
                                 "--data-dir", str(tmp_path / "data"), *args],
                                stdout=log_file, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
    try:
        wait_until(lambda: proc.poll() is not None or "could not start" in log_path.read_text(),
                   "the failed start to be reported", timeout=60)
        proc.wait(timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, log_path.read_text()


def one_line(output: str, text: str) -> str:
    """The only line of ``output`` holding ``text``."""
    lines = [line for line in output.splitlines() if text in line]
    assert len(lines) == 1, (text, output)
    return lines[0]


def test_a_taken_protocol_port_stops_the_start(held_port: int, tmp_path: Path) -> None:
    """nsq.tcp on a port the test holds: one line naming it, exit 1, no "ready"."""
    endpoint = f"tcp:{held_port}:interface={HOST}"
    status, out = failed_start(["--protocols", "nsq", "--no-admin", "--listen",
                                f"nsq.tcp={endpoint}", "--listen",
                                f"nsq.http=tcp:{free_port()}:interface={HOST}"], tmp_path)
    assert status == 1, out
    line = one_line(out, "cannot listen on")
    assert f"nsq-tcp cannot listen on {endpoint}:" in line and "Address already in use" in line
    assert "mqhub could not start: nsq-tcp could not start" in out
    assert "mqhub ready" not in out and "Traceback" not in out


def test_a_taken_admin_port_stops_the_start(held_port: int, tmp_path: Path) -> None:
    """The admin listener is a listener like the others."""
    endpoint = f"tcp:{held_port}:interface={HOST}"
    status, out = failed_start(["--protocols", "mqks", "--listen", f"admin.http={endpoint}",
                                "--listen", f"mqks.tcp=tcp:{free_port()}:interface={HOST}"],
                               tmp_path)
    assert status == 1, out
    assert f"admin cannot listen on {endpoint}:" in one_line(out, "cannot listen on")
    assert "mqhub ready" not in out and "Traceback" not in out


def test_a_taken_zeromq_port_stops_the_start(tmp_path: Path) -> None:
    """An eMQP role whose ZeroMQ address is bound by another socket fails the start too."""
    context = zmq.Context()
    holder = context.socket(zmq.ROUTER)
    port = holder.bind_to_random_port(f"tcp://{HOST}")
    try:
        roles = {"frontend": port, "backend": free_port(), "pub-in": free_port(),
                 "pub-out": free_port()}
        args = ["--protocols", "emqp", "--no-admin"]
        for role, p in roles.items():
            args += ["--listen", f"emqp.{role}=tcp://{HOST}:{p}"]
        status, out = failed_start(args, tmp_path)
    finally:
        holder.close(0)
        context.term()
    assert status == 1, out
    line = one_line(out, "emqp cannot start")
    assert f"addr='tcp://{HOST}:{port}'" in line and "Address already in use" in line
    assert "mqhub ready" not in out and "Traceback" not in out


def test_a_store_that_cannot_open_stops_the_start_in_one_line(tmp_path: Path) -> None:
    """A data directory whose store path is a file: one line naming the store, exit 1."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "store").write_text("not a directory")
    status, out = failed_start(["--protocols", "nsq", "--no-admin", "--listen",
                                f"nsq.tcp=tcp:{free_port()}:interface={HOST}", "--listen",
                                f"nsq.http=tcp:{free_port()}:interface={HOST}"], tmp_path)
    assert status == 1, out
    line = one_line(out, "mqhub could not start")
    assert f"store {tmp_path / 'data' / 'store'} cannot open:" in line
    assert "mqhub ready" not in out and "Traceback" not in out


def test_a_refused_protocol_setting_stops_the_start(tmp_path: Path) -> None:
    """A plugin option its protocol refuses: one line on stderr, exit 1, nothing opened."""
    status, out = failed_start(["--protocols", "nsq", "--option", "nsq.max_rdy_count=lots"],
                               tmp_path)
    assert status == 1, out
    assert "mqhub could not start: nsq: option max_rdy_count expects a number" in \
        one_line(out, "could not start")
    assert "mqhub ready" not in out and not (tmp_path / "data" / "store").exists()


def test_healthz_lists_every_listener_with_its_state(
        make_broker: Callable[..., BrokerProcess]) -> None:
    """After a good start /healthz names each listener (admin included) as listening."""
    broker = make_broker(["nsq", "emqp"])
    broker.wait_for_log("mqhub ready: emqp, nsq, admin")
    url = f"http://{HOST}:{broker.port('admin', 'http')}/healthz"
    with urllib.request.urlopen(url, timeout=10) as response:
        health = json.load(response)
    states = health["listener_states"]
    assert set(states) == {"nsq-tcp", "nsq-http", "emqp", "admin"}
    assert {name: s["state"] for name, s in states.items()} == dict.fromkeys(states, "listening")
    assert states["nsq-tcp"]["endpoint"] == broker.endpoints[("nsq", "tcp")]
