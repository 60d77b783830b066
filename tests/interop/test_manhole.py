"""The SSH manhole against a real broker, logged into with OpenSSH's ``ssh`` and test-made keys."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from tests.interop.broker import free_port, port_accepts, twistd_command
from tests.interop.nsq_client import ok

pytestmark = pytest.mark.interop

SSH = "/usr/bin/ssh"


def make_key(directory: Path, name: str) -> tuple[Path, str]:
    """A new ed25519 key: (private key file for ssh -i, public key line)."""
    key = ed25519.Ed25519PrivateKey.generate()
    private = directory / name
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.OpenSSH,
                                          serialization.NoEncryption()))
    private.chmod(0o600)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH).decode()
    return private, f"{public} {name}@test"


def ssh_command(port: int, key: Path) -> list[str]:
    """ssh with a forced terminal, only ``key``, no prompts and no host-key bookkeeping."""
    return [SSH, "-tt", "-p", str(port), "-i", str(key), "-F", "/dev/null",
            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "LogLevel=ERROR",
            "-o", "ConnectTimeout=10", "operator@127.0.0.1"]


class Output:
    """Everything a process writes to stdout, collected by one reader thread."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        """Start reading ``proc.stdout``."""
        self.chunks: queue.Queue[bytes] = queue.Queue()
        self.seen = b""
        self.proc = proc
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        """Copy stdout into the queue until EOF (then an empty chunk)."""
        assert self.proc.stdout is not None
        while data := os.read(self.proc.stdout.fileno(), 4096):
            self.chunks.put(data)
        self.chunks.put(b"")

    def until(self, wanted: bytes, timeout: float = 20.0) -> bytes:
        """All output so far once ``wanted`` appeared; fails at the deadline or at EOF."""
        deadline = time.monotonic() + timeout
        while wanted not in self.seen:
            left = deadline - time.monotonic()
            assert left > 0, f"no {wanted!r} within {timeout} s; got {self.seen[-2000:]!r}"
            try:
                data = self.chunks.get(timeout=left)
            except queue.Empty:
                continue
            assert data, f"session ended before {wanted!r}; got {self.seen[-2000:]!r}"
            self.seen += data
        return self.seen


@pytest.mark.skipif(not os.path.exists(SSH), reason="OpenSSH client missing (make test installs it)")
def test_key_login_evaluates_and_wrong_key_is_refused(make_broker: Any, tmp_path: Path) -> None:
    """The authorised key gets a shell that answers len(queues()); another key is refused."""
    good, good_line = make_key(tmp_path, "good")
    bad, _ = make_key(tmp_path, "bad")
    keys = tmp_path / "authorized_keys"
    keys.write_text("# operators\n" + good_line + "\n")
    port = free_port()
    broker = make_broker(["nsq"], extra_args=[
        "--durability", "none", "--manhole", f"tcp:{port}:interface=127.0.0.1",
        "--manhole-keys", str(keys)])
    ok(broker, "/topic/create?topic=t")
    ok(broker, "/channel/create?topic=t&channel=a")
    ok(broker, "/channel/create?topic=t&channel=b")
    deadline = time.monotonic() + 10
    while not port_accepts(port):
        assert time.monotonic() < deadline, "manhole port never opened"
        time.sleep(0.05)

    proc = subprocess.Popen(ssh_command(port, good), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert proc.stdin is not None
        out = Output(proc)
        out.until(b">>> ")
        proc.stdin.write(b"print('QUEUES', len(queues()), sorted(q.name for q in queues()))\r")
        proc.stdin.flush()
        out.until(b"QUEUES 2 ['nsq/t/a', 'nsq/t/b']")
        proc.stdin.write(b"print('HELPERS', sorted(k for k in ('hub','store','scheduler','broker',"
                         b"'stats','queue','dlq','replay','connections') if k in globals()))\r")
        proc.stdin.flush()
        out.until(b"HELPERS ['broker', 'connections', 'dlq', 'hub', 'queue', 'replay', "
                         b"'scheduler', 'stats', 'store']")
        proc.stdin.write(b"\x04")  # Ctrl-D ends the session
        proc.stdin.flush()
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    refused = subprocess.run(ssh_command(port, bad) + ["true"], capture_output=True, timeout=30,
                             stdin=subprocess.DEVNULL)
    assert refused.returncode == 255
    assert b"Permission denied" in refused.stderr


def test_absent_without_manhole(make_broker: Any) -> None:
    """No --manhole: the broker runs no manhole service at all."""
    broker = make_broker(["nsq"], extra_args=["--durability", "none"])
    assert "manhole" not in broker.output()
    assert "mqhub ready: nsq, admin" in broker.output()


@pytest.mark.parametrize("endpoint, message", [
    ("tcp:0", "not a loopback endpoint"),
    ("tcp:0:interface=127.0.0.1", "key authentication only"),
])
def test_manhole_without_keys_is_refused_at_start(tmp_path: Path, endpoint: str, message: str) -> None:
    """twistd exits with an error naming the problem; nothing starts."""
    cmd = [*twistd_command(), "-n", "--pidfile=", "mqhub", "--protocols", "nsq",
           "--data-dir", str(tmp_path / "data"), "--no-admin", "--manhole", endpoint]
    done = subprocess.run(cmd, capture_output=True, timeout=60, stdin=subprocess.DEVNULL,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode != 0
    assert message in (done.stdout + done.stderr).decode()
