"""The config file (``--config FILE``): keys from the option definitions, the command line over
the file, errors naming file, line and key, and ``mqhub config example`` listing every option."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
from twisted.python import usage

from mqhub import config
from mqhub.errors import PluginError
from mqhub.plugin_settings import apply_settings, describe, settings_class
from mqhub.plugins.builtin import BUILTIN
from mqhub.tap import Options
from tests.plugins import EXAMPLE_PLUGINS, isolated_plugin_path


def parse(tmp_path: Path, text: str, *args: str, options: Options | None = None) -> Options:
    """Options parsed from a config file holding ``text`` and the command line ``args``."""
    path = tmp_path / "mqhub.toml"
    path.write_text(text)
    options = options or Options()
    options.parseOptions(["--config", str(path), *args])
    return options


def error(tmp_path: Path, text: str, *args: str) -> str:
    """The usage error a config file holding ``text`` gives."""
    with pytest.raises(usage.UsageError) as info:
        parse(tmp_path, text, *args)
    return str(info.value)


def test_every_kind_of_key_reaches_the_options(tmp_path: Path) -> None:
    """Options by long name (either spelling), flags, lists, [listen] in its three forms and
    protocol sections (by name or alias) with typed values."""
    options = parse(tmp_path, """
protocols = ["nsq", "nats", "emqp"]
data_dir = "/srv/mqhub"
durability = "batch"
window = 500
no-admin = true
plugin-path = []

[listen]
"nsq.tcp" = "tcp:5150:interface=0.0.0.0"
mq9 = "tcp:5222"
mqks = "tcp:25001"                       # not enabled: ignored in a file

[listen.emqp]
backend = "tcp://127.0.0.1:5000"

[nsq]
max_rdy_count = 50
snappy = false

[nats]
token = "s3cret"
write_deadline = 2
""")
    assert (options["protocols"], options["data-dir"], options["durability"]) == \
        ("nsq,nats,emqp", "/srv/mqhub", "batch")
    assert options["window"] == 500 and options["no-admin"] == 1
    assert options["endpoints"]["nsq"]["tcp"] == "tcp:5150:interface=0.0.0.0"
    assert options["endpoints"]["mq9"] == {"tcp": "tcp:5222"}
    assert options["endpoints"]["emqp"]["backend"] == "tcp://127.0.0.1:5000"
    assert "mqks" not in options["endpoints"]
    assert options["plugin_options"] == {
        "nsq": {"max_rdy_count": 50, "snappy": False},
        "mq9": {"token": "s3cret", "write_deadline": 2}}


def test_nats_security_websocket_monitoring_and_lame_duck_keys(tmp_path: Path) -> None:
    """natsfeat's settings are NatsSettings fields (typed in the file, strict booleans on the
    command line), its optional roles (monitor, ws) are --listen roles in the file and on the
    command line, and the lame-duck and admin TLS options are top-level keys."""
    options = parse(tmp_path, """
protocols = "nats"
lame-duck-duration = 30
lame-duck-grace = 2.5
admin-tls-verify = false
[listen]
"nats.monitor" = "tcp:8222:interface=127.0.0.1"
[nats]
tls_ca = "ca.pem"
tls_verify = true
tls_handshake_first = true
nkeys = "UA,UB"
users = "users.json"
operator = "op.jwt"
resolver_preload = "accounts.json"
ws_no_tls = true
ws_compression = true
""", "--listen", "nats.ws=tcp:8080:interface=127.0.0.1", "--option", "nats.ws_tls_verify=yes")
    assert options["endpoints"]["mq9"] == {"tcp": "tcp:4222:interface=127.0.0.1",
                                           "monitor": "tcp:8222:interface=127.0.0.1",
                                           "ws": "tcp:8080:interface=127.0.0.1"}
    assert (options["lame-duck-duration"], options["lame-duck-grace"]) == (30.0, 2.5)
    cls = settings_class(next(p for p in BUILTIN if p.name == "mq9"))
    assert cls is not None
    settings = apply_settings(cls(), options["plugin_options"]["mq9"], "mq9")
    assert (settings.tls_verify, settings.tls_handshake_first, settings.ws_tls_verify,
            settings.ws_no_tls, settings.ws_compression) == (True, True, True, True, True)
    assert (settings.tls_ca, settings.nkeys, settings.users, settings.operator,
            settings.resolver_preload, settings.resolver) == (
        "ca.pem", "UA,UB", "users.json", "op.jwt", "accounts.json", "MEMORY")
    with pytest.raises(PluginError, match="option tls_verify expects true or false"):
        apply_settings(cls(), {"tls_verify": "maybe"}, "mq9")


def test_the_command_line_overrides_the_file(tmp_path: Path) -> None:
    """Values, endpoints and protocol settings given on the command line win, wherever they
    stand relative to --config; what the command line leaves alone comes from the file."""
    text = """
protocols = "nsq"
durability = "none"
data-dir = "/from/file"
[listen]
"nsq.tcp" = "tcp:5150"
"admin.http" = "tcp:9750"
[nsq]
max_rdy_count = 50
msg_timeout = 1000
"""
    path = tmp_path / "mqhub.toml"
    path.write_text(text)
    options = Options()
    options.parseOptions(["--durability", "sync", "--config", str(path),
                          "--listen", "nsq.tcp=tcp:6150", "--option", "nsq.max_rdy_count=7"])
    assert options["durability"] == "sync" and options["data-dir"] == "/from/file"
    assert options["endpoints"]["nsq"]["tcp"] == "tcp:6150"
    assert options["admin_endpoint"] == "tcp:9750"
    assert options["plugin_options"]["nsq"] == {"max_rdy_count": "7", "msg_timeout": 1000}


@pytest.mark.parametrize(("text", "message"), [
    ('durabilty = "sync"', "mqhub.toml:2: durabilty: unknown option"),
    ('durability = "fast"', "mqhub.toml:2: --durability must be one of sync, batch, none"),
    ("window = 0", "mqhub.toml:2: --window expects a whole number"),
    ('protocols = "nsq,bogus"', "mqhub.toml:2: --protocols: unknown protocol 'bogus'"),
    ('no-admin = "yes"', "mqhub.toml:2: no-admin: expects true or false, got 'yes'"),
    ('data-dir = ["a"]', "mqhub.toml:2: data-dir: expects a string or a number"),
    ('plugin-path = ["/no/such/dir"]', "mqhub.toml:2: plugin-path: --plugin-path: '/no/such/dir'"),
    ('\n[bogus]\nx = 1', "mqhub.toml:3: bogus: unknown option or protocol section"),
    ('\n[nsq]\n\nmax_rdy = 1', "mqhub.toml:5: nsq.max_rdy: unknown nsq option; known: max_msg_size"),
    ('[nsq]\nmax_rdy_count = "many"',
     "mqhub.toml:3: nsq.max_rdy_count: expects a whole number, got 'many'"),
    ('[nats]\nwrite_deadline = true', "mqhub.toml:3: nats.write_deadline: expects a number"),
    ('[nats]\ntls_verify = "maybe"', "mqhub.toml:3: nats.tls_verify: expects true or false"),
    ('[listen]\n"nats.mon" = "tcp:1"',
     "mqhub.toml:3: listen.nats.mon: --listen: mq9 has no role 'mon'; roles: tcp, monitor, ws"),
    ('[nsq]\nhostname = 5', "mqhub.toml:3: nsq.hostname: expects a string, got 5"),
    ('[listen]\n"nsq.nope" = "tcp:1"', "mqhub.toml:3: listen.nsq.nope: --listen: nsq has no role"),
    ('[listen.redis]\ntcp = "tcp:1"', "mqhub.toml:3: listen.redis.tcp: --listen: unknown protocol"),
    ('[listen]\nnsq = 4150', "mqhub.toml:3: listen.nsq: expects an endpoint string"),
    ('x = "a\nb"', "mqhub.toml: Illegal character '\\n' (at line 2, column 7)"),
])
def test_errors_name_the_file_line_and_key(tmp_path: Path, text: str, message: str) -> None:
    """Unknown keys and bad values: a usage error naming file, line and key."""
    assert message in error(tmp_path, "\n" + text)


def test_a_line_is_found_after_multi_line_strings_and_inline_tables() -> None:
    """key_lines: table headers, dotted and quoted keys, keys after a multi-line string."""
    lines = config.key_lines('a = 1\ntext = """\nb = 2\n"""\n[t.u]\n"x.y" = 3\nz.w = {q = 1}\n')
    assert lines == {("a",): 1, ("text",): 2, ("t", "u"): 5, ("t", "u", "x.y"): 6,
                     ("t", "u", "z", "w"): 7}


def test_an_unreadable_file_is_a_usage_error(tmp_path: Path) -> None:
    """A missing file: the error names it."""
    with pytest.raises(usage.UsageError, match="--config: cannot read .*missing.toml"):
        Options().parseOptions(["--config", str(tmp_path / "missing.toml")])


def all_plugin_settings() -> dict[str, list[Any]]:
    """Built-in protocol name -> its described settings."""
    out = {}
    for plugin in BUILTIN:
        cls = settings_class(plugin)
        assert cls is not None, f"{plugin.name} declares no settings"
        out[plugin.name] = describe(cls)
    return out


def example() -> str:
    """``mqhub config example``'s text."""
    options = Options()
    options.parseOptions([])
    return config.effective(options)


def test_the_example_names_every_option_and_setting_with_its_help() -> None:
    """Every twistd mqhub option and every protocol setting appears as a key (set, or
    commented out when unset) under a help comment, so the example cannot drift."""
    text = example()
    data = tomllib.loads(text)
    lines = text.splitlines()

    def documented(key: str, section_start: int = 0) -> None:
        wanted = {f"{config.toml_key(key)} = ", f"# {config.toml_key(key)} = "}
        found = [i for i, line in enumerate(lines) if i >= section_start
                 and any(line.startswith(w) for w in wanted)]
        assert found, f"{key} missing from the example"
        assert lines[found[0] - 1].startswith("# "), f"{key} has no help comment"

    for option in config.tap_options(Options()):
        if option.name != config.LISTEN:
            documented(option.name)
    for name, settings in all_plugin_settings().items():
        start = lines.index(f"[{name}]")
        for setting in settings:
            documented(setting.key, start)
            assert setting.help, f"{name}.{setting.key} has no #: help comment"
            if setting.default is not None:
                assert data[name][setting.key] == setting.default
    for plugin in BUILTIN:
        for role, endpoint in plugin.default_endpoints.items():
            assert data["listen"][f"{plugin.name}.{role}"] == endpoint
        for role in plugin.optional_roles:
            assert f'# "{plugin.name}.{role}" = ...' in lines


def test_the_example_reads_back_as_the_defaults(tmp_path: Path) -> None:
    """The example is a valid file whose effective configuration is the example itself."""
    text = example()
    options = parse(tmp_path, text)
    assert config.effective(options) == text
    defaults = Options()
    defaults.parseOptions([])
    for option in config.tap_options(defaults):
        if option.kind == "param":
            assert options[option.name] == defaults[option.name], option.name


def test_an_option_added_in_one_place_is_accepted_and_shown(tmp_path: Path) -> None:
    """Another branch adding an option (one optParameters line, as identity added ``--users``)
    or a settings field needs nothing more: the file takes it and the example shows it."""

    class WithAuditLog(Options):
        optParameters = [*Options.optParameters,
                         ["audit-log", None, None, "File the audit records are appended to."]]

    options = parse(tmp_path, 'audit-log = "/var/log/mqhub/audit.log"\n', options=WithAuditLog())
    assert options["audit-log"] == "/var/log/mqhub/audit.log"
    defaults = WithAuditLog()
    defaults.parseOptions([])
    assert "# File the audit records are appended to.\n# audit-log = ...\n" in \
        config.effective(defaults)


def test_a_drop_in_plugin_section_is_checked_against_its_settings(tmp_path: Path) -> None:
    """A drop-in (the Redis example) gets its own section from its settings dataclass."""
    head = f'plugin-path = ["{EXAMPLE_PLUGINS}"]\nprotocols = "redis"\n[resp]\n'
    with isolated_plugin_path():
        options = parse(tmp_path, head + "max_pubsub_buffer = 1024\n")
        assert options["plugin_options"] == {"redis": {"max_pubsub_buffer": 1024}}
        assert "mqhub.toml:4: resp.max_pub: unknown redis option" in error(
            tmp_path, head + "max_pub = 1\n")


def test_settings_are_described_from_the_dataclasses() -> None:
    """describe: kinds, optional fields and the #: comments; ALIASES are accepted keys."""
    nats = {s.key: s for s in all_plugin_settings()["mq9"]}
    assert nats["max_payload"].kind == "int" and nats["write_deadline"].kind == "float"
    assert nats["token"].optional and nats["token"].kind == "str"
    assert "tls_context" not in nats and "port" not in nats   # the service's, not options
    assert nats["ping_max"].help.startswith("unanswered PINGs")
    cls = settings_class(next(p for p in BUILTIN if p.name == "mq9"))
    assert cls is not None
    assert apply_settings(cls(), {"pass": "p", "auth_token": "t"}, "mq9").password == "p"
