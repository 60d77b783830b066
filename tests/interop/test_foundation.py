"""The real ``twistd -n mqhub`` process: help, drop-ins, broken plugins, SIGTERM, JSON logs."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.interop.broker import REPO_ROOT, BrokerError, BrokerProcess, port_accepts, twistd_command
from tests.plugins import EXAMPLE_PLUGINS, TEST_PLUGINS

pytestmark = pytest.mark.interop

MakeBroker = Callable[..., BrokerProcess]


def twistd_help(*args: str) -> str:
    """Output of ``twistd mqhub [args] --help``."""
    result = subprocess.run(
        [*twistd_command(), "mqhub", *args, "--help"],
        capture_output=True, text=True, timeout=60, cwd=REPO_ROOT, check=True,
    )
    return result.stdout


def echo_broker(make_broker: MakeBroker, *protocols: str, **kwargs: object) -> BrokerProcess:
    """A broker serving the test-only echo protocol from tests/plugins."""
    return make_broker(list(protocols or ["echotest"]), plugin_paths=[TEST_PLUGINS], **kwargs)


def talk(sock: socket.socket, line: bytes) -> bytes:
    """Send one line and read the echoed line back."""
    sock.sendall(line + b"\n")
    reply = b""
    while not reply.endswith(b"\n"):
        chunk = sock.recv(4096)
        assert chunk, "connection closed"
        reply += chunk
    return reply


def test_twistd_help_lists_every_builtin_protocol() -> None:
    """``twistd mqhub --help`` lists the five protocols with descriptions and endpoints."""
    text = twistd_help()
    for name in ("nsq", "mq9", "emqp", "mqks", "vibemq"):
        assert f"\n  {name}" in text
    assert "alias nats" in text
    assert "tcp = tcp:4222:interface=127.0.0.1" in text
    assert "frontend = tcp://127.0.0.1:47291" in text
    assert "\n  redis" not in text


def test_twistd_help_with_plugin_path_lists_the_example() -> None:
    """With ``--plugin-path plugins`` the Redis example is listed too."""
    text = twistd_help("--plugin-path", str(EXAMPLE_PLUGINS))
    assert "\n  redis (alias resp): Redis RESP" in text
    assert "tcp = tcp:6380:interface=127.0.0.1" in text


def test_unknown_protocol_exits_with_usage_error(tmp_path: Path) -> None:
    """An unknown protocol name stops twistd before it starts, listing the names."""
    result = subprocess.run(
        [*twistd_command(), "-n", "--pidfile=", "mqhub", "--protocols", "kafka",
         "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60, cwd=REPO_ROOT,
    )
    assert result.returncode != 0
    assert "unknown protocol 'kafka'; available: emqp, mq9, mqks, nsq, vibemq" in (
        result.stdout + result.stderr
    )


def test_a_broken_drop_in_does_not_stop_the_others(make_broker: MakeBroker) -> None:
    """A broken drop-in file (not asked for) is reported by name; echo still serves."""
    broker = echo_broker(make_broker, "echotest", extra_args=["--option", "echo.prefix=> "])
    with socket.create_connection(("127.0.0.1", broker.port("echotest"))) as sock:
        assert talk(sock, b"hello") == b"> hello\n"
    log = broker.output()
    assert "broken_testing.py failed to load: RuntimeError: this drop-in is broken on purpose" in log


def test_a_refusing_plugin_stops_the_start(make_broker: MakeBroker) -> None:
    """A protocol asked for that refuses to be built stops the start in one line, status 1."""
    broker = echo_broker(make_broker, "echotest", "refusetest", start=False,
                         wait_for=[("echotest", "tcp")])
    with pytest.raises(BrokerError):
        broker.start()
    assert broker.returncode == 1
    log = broker.output()
    assert "mqhub could not start: refusetest: protocol refusetest is not implemented yet" in log
    assert not port_accepts(broker.port("echotest"))


def test_sigterm_with_connected_clients_exits_zero_quickly(make_broker: MakeBroker) -> None:
    """SIGTERM with clients connected: exit status 0 within 5 s, connections closed, store closed."""
    broker = echo_broker(make_broker)
    clients = [socket.create_connection(("127.0.0.1", broker.port("echotest"))) for _ in range(5)]
    for n, sock in enumerate(clients):
        assert talk(sock, b"ping %d" % n) == b"ping %d\n" % n
    started = time.monotonic()
    status = broker.stop(timeout=10.0)
    elapsed = time.monotonic() - started
    assert status == 0
    assert elapsed < 5.0
    for sock in clients:
        sock.settimeout(2.0)
        assert sock.recv(10) == b""  # the broker closed the connection
        sock.close()
    log = broker.output()
    assert "received SIGTERM: stopping" in log
    assert log.index("listeners stopped") < log.index("store closed")


def test_restart_on_same_ports_and_data_dir(make_broker: MakeBroker) -> None:
    """A stopped or killed broker starts again on the same ports and data directory."""
    broker = echo_broker(make_broker)
    port = broker.port("echotest")
    broker.restart()
    assert broker.port("echotest") == port
    with socket.create_connection(("127.0.0.1", port)) as sock:
        assert talk(sock, b"again") == b"again\n"
    assert broker.kill() == -9
    broker.start()
    assert broker.stop(sig=signal.SIGINT) == 0  # Ctrl-C is a graceful stop too
    assert "received SIGINT: stopping" in broker.output()


def test_json_log_format_writes_one_object_per_line(make_broker: MakeBroker) -> None:
    """``--log-format json``: every line of the log is a JSON object."""
    broker = echo_broker(make_broker, extra_args=["--log-format", "json"])
    assert broker.stop() == 0
    lines = [line for line in broker.output().splitlines() if line.strip()]
    events = [json.loads(line) for line in lines]
    namespaces = {e.get("log_namespace") for e in events}
    assert "mqhub.hub" in namespaces
    assert any(e.get("log_format") == "store closed" for e in events)


def test_core_and_store_stdlib_logs_reach_the_twistd_log(make_broker: MakeBroker, tmp_path: Path) -> None:
    """The core's stdlib ``logging`` (a recovery warning) lands in twistd's JSON log, not stderr."""
    from twisted.internet.task import Clock

    from mqhub.store.batch import WriteBatch
    from mqhub.store.lmdb import LmdbStore
    from mqhub.store.records import make_entry
    from mqhub.testing import result_of

    data = tmp_path / "orphan-data"
    clock = Clock()
    store = LmdbStore(str(data / "store"), clock=clock, durability="none")
    store.open()
    batch = WriteBatch()
    batch.put_entries("orphan", [make_entry(1, b"left behind", "orphan")])  # no queue settings
    committed = store.commit(batch)
    clock.advance(0)
    result_of(committed)
    store.close()
    broker = echo_broker(make_broker, data_dir=data, extra_args=["--log-format", "json"])
    assert broker.stop() == 0
    events = [json.loads(line) for line in broker.output().splitlines() if line.strip()]
    warnings = [e for e in events if e.get("log_namespace") == "mqhub.core.broker"]
    assert [e["message"] for e in warnings] == [
        "recovering queue 'orphan', which had entries but no settings"
    ]
    assert warnings[0]["log_level"]["name"] == "warn"


def test_store_that_cannot_open_exits_one_without_listening(
    make_broker: MakeBroker, tmp_path: Path
) -> None:
    """If recovery fails the broker never listens, logs why, and exits with status 1."""
    data = tmp_path / "broken-data"
    data.mkdir()
    (data / "store").write_text("not a directory")
    broker = echo_broker(make_broker, data_dir=data, start=False)
    with pytest.raises(BrokerError):
        broker.start()
    assert broker.returncode == 1
    assert "mqhub could not start" in broker.output()
    assert not port_accepts(broker.port("echotest"))


def test_all_protocols_start_every_landed_listener(make_broker: MakeBroker) -> None:
    """Like ``make run``: every protocol whose server exists listens; the others refuse in one line."""
    import importlib.util

    from mqhub.plugins.builtin import emqp, mq9, mqks, nsq, vibemq

    def has_server(package: str) -> bool:
        """Whether mqhub.protocols.<package>.service exists in this tree."""
        try:
            return importlib.util.find_spec(f"mqhub.protocols.{package}.service") is not None
        except ModuleNotFoundError:  # not even the protocol package exists yet
            return False

    landed = [p for p in (emqp, mq9, mqks, nsq, vibemq) if has_server(p.package)]
    missing = [p for p in (emqp, mq9, mqks, nsq, vibemq) if p not in landed]
    broker = make_broker(
        ["emqp", "mq9", "mqks", "nsq", "vibemq"],
        wait_for=[(p.name, role) for p in landed for role in p.default_endpoints],
    )
    for plugin in landed:
        for role in plugin.default_endpoints:
            assert port_accepts(broker.port(plugin.name, role)), (plugin.name, role)
    log = broker.output()
    for plugin in missing:
        assert f"{plugin.name}: protocol {plugin.name} is not implemented yet" in log
    assert broker.stop() == 0


def test_mqhub_console_script_is_installed() -> None:
    """The ``mqhub`` console command exists and lists its subcommands."""
    import sys

    script = Path(sys.executable).parent / "mqhub"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60,
                            check=True)
    assert "Usage: mqhub" in result.stdout
    for command in ("bench", "snapshot"):
        assert f"  {command} " in result.stdout
