"""The config file on real processes: ``twistd -n mqhub --config FILE`` with command-line
overrides, ``mqhub config check`` (good and bad files) and ``mqhub config example`` round trip."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from mqhub.protocols.nsq import codec as wire
from tests.interop.broker import (
    HOST,
    REPO_ROOT,
    free_port,
    port_accepts,
    twistd_command,
    wait_until,
)
from tests.interop.nsq_client import NsqSocket

pytestmark = pytest.mark.interop

MQHUB = Path(sys.executable).parent / "mqhub"


def endpoint(port: int) -> str:
    """A loopback Twisted endpoint string."""
    return f"tcp:{port}:interface={HOST}"


def mqhub(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the ``mqhub`` command."""
    return subprocess.run([str(MQHUB), *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO_ROOT)


def test_a_broker_runs_from_the_file_with_command_line_overrides(tmp_path: Path) -> None:
    """Protocols, data dir, endpoints and NSQ settings come from the file; --listen and
    --option on the command line win over it."""
    file_tcp, cli_tcp, http, admin = free_port(), free_port(), free_port(), free_port()
    conf = tmp_path / "mqhub.toml"
    conf.write_text(f"""
protocols = "nsq"
data-dir = "{tmp_path / 'data'}"
durability = "none"

[listen]
"nsq.tcp" = "{endpoint(file_tcp)}"
"nsq.http" = "{endpoint(http)}"
"admin.http" = "{endpoint(admin)}"

[nsq]
max_rdy_count = 42
msg_timeout = 5000
""")
    log_path = tmp_path / "mqhub.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [*twistd_command(), "-n", "--pidfile=", "mqhub", "--config", str(conf),
             "--listen", f"nsq.tcp={endpoint(cli_tcp)}", "--option", "nsq.msg_timeout=7000"],
            stdout=log_file, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
    try:
        wait_until(lambda: "mqhub ready: nsq, admin" in log_path.read_text()
                   or proc.poll() is not None, "the broker to start", timeout=30)
        assert proc.poll() is None, log_path.read_text()
        assert port_accepts(cli_tcp) and not port_accepts(file_tcp)
        client = NsqSocket(cli_tcp)
        client.send(wire.encode_identify({"feature_negotiation": True}))
        frames = client.read_until(lambda fs: any(isinstance(f, wire.Response) for f in fs),
                                   "IDENTIFY response")
        client.sock.close()
        identity = json.loads(next(f for f in frames if isinstance(f, wire.Response)).data)
        assert (identity["max_rdy_count"], identity["msg_timeout"]) == (42, 7000)
        with urllib.request.urlopen(f"http://{HOST}:{admin}/healthz", timeout=10) as response:
            assert json.load(response)["status"] == "ok"
        assert (tmp_path / "data" / "store").is_dir()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0


def test_twistd_refuses_a_bad_file_naming_its_line(tmp_path: Path) -> None:
    """A bad value in the file: twistd exits 1 and the message names file, line and key."""
    conf = tmp_path / "mqhub.toml"
    conf.write_text('protocols = "nsq"\n\n[nsq]\nmax_rdy_count = "lots"\n')
    done = subprocess.run([*twistd_command(), "-n", "--pidfile=", "mqhub", "--config", str(conf)],
                          capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert done.returncode == 1
    assert f"{conf}:4: nsq.max_rdy_count: expects a whole number, got 'lots'" in \
        done.stdout + done.stderr


def test_config_check_prints_the_effective_configuration(tmp_path: Path) -> None:
    """A good file: exit 0 and the effective configuration (file values, defaults filled in,
    only the enabled protocols' sections), itself a file that checks the same."""
    conf = tmp_path / "mqhub.toml"
    conf.write_text('protocols = ["nats"]\nwindow = 500\n[nats]\nmax_payload = 4096\n')
    done = mqhub("config", "check", str(conf))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert 'protocols = "nats"' in out and "window = 500" in out
    assert "[mq9]" in out and "max_payload = 4096" in out and "ping_max = 2" in out
    assert "[nsq]" not in out and '"mq9.tcp" = "tcp:4222:interface=127.0.0.1"' in out
    again = tmp_path / "effective.toml"
    again.write_text(out)
    second = mqhub("config", "check", str(again))
    assert second.returncode == 0 and second.stdout.splitlines()[1:] == out.splitlines()[1:]


@pytest.mark.parametrize(("text", "message"), [
    ("[nsq]\nmax_rdy = 1\n", ":2: nsq.max_rdy: unknown nsq option"),
    ('durability = "fast"\n', ":1: --durability must be one of"),
    ('protocols = "nats"\n[nats]\ntls_cert = "/no/such.pem"\n',
     "mq9: cannot load TLS files: [Errno 2] No such file or directory"),
])
def test_config_check_refuses_bad_files(tmp_path: Path, text: str, message: str) -> None:
    """Unknown keys, bad values and settings the protocol itself refuses (a missing
    certificate): exit 1 and one message naming the file."""
    conf = tmp_path / "bad.toml"
    conf.write_text(text)
    done = mqhub("config", "check", str(conf))
    assert done.returncode == 1
    assert f"{conf}" in done.stderr and message in done.stderr, done.stderr


def test_config_example_checks_clean(tmp_path: Path) -> None:
    """``mqhub config example`` writes a file ``mqhub config check`` accepts as it is."""
    example = mqhub("config", "example")
    assert example.returncode == 0, example.stderr
    conf = tmp_path / "example.toml"
    conf.write_text(example.stdout)
    checked = mqhub("config", "check", str(conf))
    assert checked.returncode == 0, checked.stderr
    assert [line for line in checked.stdout.splitlines() if not line.startswith("#")] == \
        [line for line in example.stdout.splitlines() if not line.startswith("#")]
