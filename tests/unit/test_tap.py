"""``twistd mqhub`` option parsing and the service makeService builds (no global reactor)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from twisted.internet.testing import MemoryReactorClock
from twisted.python import usage

from mqhub.discovery import ENV_PLUGIN_PATH
from mqhub.hub import HubService, StartFailed
from mqhub.tap import Options, build_service
from tests.plugins import EXAMPLE_PLUGINS, TEST_PLUGINS, isolated_plugin_path

BUILTIN = ["emqp", "mq9", "mqks", "nsq", "vibemq"]


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No MQHUB_PLUGIN_PATH from the environment, and mqhub.plugins restored afterwards."""
    monkeypatch.delenv(ENV_PLUGIN_PATH, raising=False)
    with isolated_plugin_path():
        yield


def parse(*args: str) -> Options:
    """Parse ``args`` as ``twistd mqhub`` would."""
    options = Options()
    options.parseOptions(list(args))
    return options


def test_defaults_enable_every_protocol_on_default_endpoints() -> None:
    """No options: all protocols, ./var, text logs, sync durability, default endpoints."""
    options = parse()
    assert [p.name for p in options["plugins"]] == BUILTIN
    assert options["data-dir"] == "./var"
    assert options["log-format"] == "text"
    assert options["durability"] == "sync"
    assert options["endpoints"]["nsq"]["http"] == "tcp:4151:interface=127.0.0.1"
    assert options["plugin_options"] == {}


def test_protocol_list_resolves_aliases_and_sorts() -> None:
    """--protocols takes aliases (nats = mq9) and the chosen plugins come sorted by name."""
    options = parse("--protocols", "nsq, nats")
    assert [p.name for p in options["plugins"]] == ["mq9", "nsq"]
    assert set(options["endpoints"]) == {"mq9", "nsq"}


def test_unknown_protocol_is_a_usage_error_listing_names() -> None:
    """An unknown name fails and the message lists every available name."""
    with pytest.raises(usage.UsageError) as info:
        parse("--protocols", "nsq,amqp")
    assert "unknown protocol 'amqp'" in str(info.value)
    assert "emqp, mq9, mqks, nsq, vibemq" in str(info.value)


def test_duplicate_protocol_is_a_usage_error() -> None:
    """A protocol named twice (even through its alias) is refused."""
    with pytest.raises(usage.UsageError) as info:
        parse("--protocols", "mq9,nats")
    assert "given twice" in str(info.value)
    assert "available: emqp" in str(info.value)


def test_listen_overrides_a_role_and_the_first_role() -> None:
    """NAME.ROLE=ENDPOINT sets that role; NAME=ENDPOINT sets the plugin's first role."""
    options = parse(
        "--protocols", "nsq,mq9",
        "--listen", "nsq.http=tcp:9151:interface=127.0.0.1",
        "--listen", "nats=unix:/tmp/nats.sock",
    )
    assert options["endpoints"]["nsq"] == {
        "tcp": "tcp:4150:interface=127.0.0.1",
        "http": "tcp:9151:interface=127.0.0.1",
    }
    assert options["endpoints"]["mq9"] == {"tcp": "unix:/tmp/nats.sock"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--listen", "nsq.udp=tcp:1"], "nsq has no role 'udp'; roles: tcp, http"),
        (["--listen", "nsq"], "--listen expects NAME=VALUE"),
        (["--listen", "kafka=tcp:1"], "--listen: unknown protocol 'kafka'"),
        (["--protocols", "nsq", "--listen", "mqks=tcp:1"], "protocol 'mqks' is not enabled"),
        (["--option", "nsq=1"], "--option expects NAME.KEY=VALUE"),
        (["--option", "kafka.x=1"], "--option: unknown protocol 'kafka'"),
        (["--log-format", "xml"], "--log-format must be one of text, json"),
        (["--durability", "maybe"], "--durability must be one of sync, batch, none"),
        (["--journal", "maybe"], "--journal must be on or off"),
        (["--journal-days", "0"], "--journal-days and --journal-max-bytes must be positive"),
        (["--journal-max-bytes", "x"], "--journal-days and --journal-max-bytes must be positive"),
        (["--plugin-path", "/nonexistent/plugins"], "'/nonexistent/plugins' is not a directory"),
        (["--window", "0"], "--window expects a whole number of entries from 1 to 10000000"),
        (["--window", "20000000"], "--window expects a whole number of entries"),
        (["--window", "1e3"], "--window expects a whole number of entries"),
        (["--window-bytes", "64M"], "--window-bytes expects a whole number of bytes from 65536"),
        (["--window-bytes", "1000"], "--window-bytes expects a whole number of bytes"),
        (["--tails-bytes", "-1"], "--tails-bytes expects a whole number of bytes from 65536 to "
                                  "1099511627776, got '-1'"),
        (["--tails-bytes", ""], "--tails-bytes expects a whole number of bytes"),
        (["--windows-bytes", "65535"], "--windows-bytes expects a whole number of bytes from "
                                       "65536 to 1099511627776, got '65535'"),
        (["--windows-bytes", "256MiB"], "--windows-bytes expects a whole number of bytes"),
    ],
)
def test_bad_options_are_usage_errors(args: list[str], message: str) -> None:
    """Malformed or inconsistent options fail with a message saying what is wrong."""
    with pytest.raises(usage.UsageError) as info:
        parse(*args)
    assert message in str(info.value)


def test_plugin_options_land_under_the_canonical_name() -> None:
    """--option NAME.KEY=VALUE lands in options['plugin_options'][NAME][KEY], aliases merged."""
    options = parse(
        "--option", "nats.max_payload=1024",
        "--option", "mq9.auth_token=s3cret",
        "--option", "nsq.auth-secrets=/etc/secrets",
    )
    assert options["plugin_options"] == {
        "mq9": {"max_payload": "1024", "auth_token": "s3cret"},
        "nsq": {"auth-secrets": "/etc/secrets"},
    }


def test_durability_and_data_dir() -> None:
    """--durability and --data-dir are kept for the store."""
    options = parse("--durability", "batch", "--data-dir", "/srv/q")
    assert options["durability"] == "batch"
    assert options["data-dir"] == "/srv/q"


def test_plugin_path_adds_drop_ins_to_all() -> None:
    """--plugin-path makes its plugins selectable, and 'all' includes them."""
    options = parse("--plugin-path", str(TEST_PLUGINS), "--protocols", "echo")
    assert [p.name for p in options["plugins"]] == ["echotest"]


def test_all_includes_drop_ins() -> None:
    """'all' means every discovered plugin, drop-ins included."""
    options = parse("--plugin-path", str(EXAMPLE_PLUGINS))
    assert [p.name for p in options["plugins"]] == ["emqp", "mq9", "mqks", "nsq", "redis", "vibemq"]


def test_environment_plugin_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """MQHUB_PLUGIN_PATH works like --plugin-path."""
    monkeypatch.setenv(ENV_PLUGIN_PATH, str(EXAMPLE_PLUGINS))
    assert [p.name for p in parse("--protocols", "redis")["plugins"]] == ["redis"]


def test_help_lists_protocols_descriptions_and_endpoints() -> None:
    """The usage text lists every protocol with its description, aliases and endpoints."""
    text = Options().getUsage()
    for name in BUILTIN:
        assert f"\n  {name}" in text
    assert "mq9 (alias nats): NATS client protocol" in text
    assert "pub-out = tcp://127.0.0.1:47299" in text
    assert "http = tcp:4151:interface=127.0.0.1" in text
    assert "\n  redis" not in text


def test_help_with_plugin_path_lists_drop_ins_and_failures() -> None:
    """With a plugin path, help also shows its plugins and names the broken file."""
    options = Options()
    options["plugin_path"].append(str(TEST_PLUGINS))
    text = options.getUsage()
    assert "echotest (alias echo): Test-only line echo server" in text
    assert "broken_testing.py failed to load: RuntimeError" in text


@pytest.mark.parametrize(
    ("parent_options", "expected_path"),
    [
        ({"nodaemon": True, "logfile": None}, None),
        ({"nodaemon": True, "logfile": "-"}, None),
        ({"nodaemon": True, "logfile": "/var/log/mqhub.json"}, "/var/log/mqhub.json"),
        ({"nodaemon": False, "logfile": None}, "twistd.log"),
    ],
)
def test_json_log_format_installs_json_logger_on_twistd(
    monkeypatch: pytest.MonkeyPatch, parent_options: dict[str, object], expected_path: str | None
) -> None:
    """--log-format json asks twistd (the parent options) for the JSON observer and its target."""
    import os

    import mqhub.logs

    monkeypatch.setattr(mqhub.logs, "json_log_path", None)
    parent: dict[str, object] = {"logger": None, **parent_options}
    options = Options()
    options.parent = parent  # as usage.Options does for a subcommand
    options.parseOptions(["--log-format", "json", "--protocols", "nsq"])
    assert parent["logger"] == "mqhub.logs.json_observer"
    expected = None if expected_path is None else os.path.abspath(expected_path)
    assert mqhub.logs.json_log_path == expected


def test_json_observer_writes_to_the_configured_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With a twistd --logfile the JSON lines go to that file."""
    import json

    from twisted.logger import Logger

    import mqhub.logs

    target = tmp_path / "mqhub.json"
    monkeypatch.setattr(mqhub.logs, "json_log_path", str(target))
    Logger(namespace="t", observer=mqhub.logs.json_observer()).info("hi {n}", n=1)
    assert json.loads(target.read_text().splitlines()[0])["n"] == 1


def test_optparameters_is_a_plain_extensible_list() -> None:
    """Protocol work may append its own optParameters lines."""
    assert isinstance(Options.optParameters, list)
    assert {p[0] for p in Options.optParameters} >= {"protocols", "data-dir", "log-format", "durability"}


def test_build_service_refuses_to_start_without_a_requested_protocol(tmp_path: Path) -> None:
    """A plugin raising PluginError while being built stops the start (StartFailed names it);
    without it, the others become listener children."""
    def options_for(protocols: str) -> Options:
        return parse("--plugin-path", str(TEST_PLUGINS), "--protocols", protocols,
                     "--data-dir", str(tmp_path / "data"), "--durability", "none",
                     "--listen", "echo=tcp:0:interface=127.0.0.1", "--no-admin")

    reactor = MemoryReactorClock()
    with pytest.raises(StartFailed, match="refusetest: protocol refusetest is not implemented"):
        build_service(options_for("echotest,refusetest"), reactor)
    root = build_service(options_for("echotest"), reactor)
    assert isinstance(root, HubService)
    assert [child.name for child in root] == ["echotest"]
    assert root.hub.reactor is reactor
    assert root.hub.data_dir == str(tmp_path / "data")
    assert reactor.tcpServers == []  # nothing listens before the service starts


def test_journal_retention_defaults_come_from_the_journal(tmp_path: Path) -> None:
    """The tap's --journal-days/--journal-max-bytes defaults are the journal's own defaults."""
    from twisted.internet.task import Clock

    from mqhub.hub import build_hub
    from mqhub.store.journal import DEFAULT_RETENTION_BYTES, DEFAULT_RETENTION_SECONDS

    options = parse("--data-dir", str(tmp_path))
    assert float(options["journal-days"]) * 86400.0 == DEFAULT_RETENTION_SECONDS
    assert int(options["journal-max-bytes"]) == DEFAULT_RETENTION_BYTES
    parsed = build_hub(dict(options), Clock()).journal
    unset = build_hub({"data-dir": str(tmp_path / "b")}, Clock()).journal
    for journal in (parsed, unset):
        assert journal.retention_seconds == DEFAULT_RETENTION_SECONDS
        assert journal.retention_bytes == DEFAULT_RETENTION_BYTES


def test_paging_options_reach_the_broker(tmp_path: Path) -> None:
    """--window, --window-bytes, --tails-bytes and --windows-bytes become the hub's Broker
    settings; a durable queue declared on it pages with that window."""
    options = parse(
        "--plugin-path", str(TEST_PLUGINS), "--protocols", "echotest",
        "--data-dir", str(tmp_path / "data"), "--durability", "none", "--no-admin",
        "--listen", "echo=tcp:0:interface=127.0.0.1",
        "--window", "500", "--window-bytes", "1048576", "--tails-bytes", " 2097152",
        "--windows-bytes", "3145728 ",
    )
    assert (options["window"], options["window-bytes"], options["tails-bytes"],
            options["windows-bytes"]) == (500, 1 << 20, 2 << 20, 3 << 20)
    broker = build_service(options, MemoryReactorClock()).hub.broker
    assert (broker.window, broker.window_bytes, broker.tails.limit, broker.windows.limit) == \
        (500, 1 << 20, 2 << 20, 3 << 20)

    from twisted.internet.task import Clock

    from mqhub.hub import build_hub
    from mqhub.testing import settle

    hub = build_hub({**dict(options), "data-dir": None}, Clock())
    hub.store.open()
    hub.broker.start()
    settle(hub)
    assert hub.broker.declare_queue("paged", tier="durable").window == 500


def test_paging_defaults_are_the_brokers_own(tmp_path: Path) -> None:
    """Without the options the hub's Broker has exactly the defaults Broker() has."""
    from twisted.internet.task import Clock

    from mqhub.core.broker import Broker
    from mqhub.hub import build_hub
    from mqhub.store.memory import MemoryStore

    plain = Broker(MemoryStore(clock=Clock()), Clock())
    for hub_options in (dict(parse("--data-dir", str(tmp_path))), {}):
        broker = build_hub(hub_options, Clock()).broker
        assert (broker.window, broker.window_bytes, broker.tails.limit, broker.windows.limit,
                broker.windows.floor) == (plain.window, plain.window_bytes, plain.tails.limit,
                                          plain.windows.limit, plain.windows.floor)
