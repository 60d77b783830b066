"""Plugin discovery: the built-in descriptors, drop-in directories, broken and clashing drop-ins."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from twisted.application.service import IServiceMaker
from twisted.plugin import getPlugins
from zope.interface.verify import verifyObject

import mqhub.plugins
from mqhub.discovery import ENV_PLUGIN_PATH, load_plugins, plugin_dirs
from mqhub.errors import PluginError
from mqhub.interfaces import IProtocolPlugin
from mqhub.plugins.builtin import BuiltinProtocol
from tests.plugins import EXAMPLE_PLUGINS, TEST_PLUGINS, isolated_plugin_path

BUILTIN = ["emqp", "mq9", "mqks", "nsq", "vibemq"]


@pytest.fixture(autouse=True)
def _isolated() -> Iterator[None]:
    """Every test starts from mqhub's own plugin path."""
    with isolated_plugin_path():
        yield


def test_builtin_plugins_are_the_five_protocols() -> None:
    """Discovery finds exactly the five built-in protocols, sorted, with nats as mq9's alias."""
    found = load_plugins()
    assert list(found.plugins) == BUILTIN
    assert found.aliases["nats"] == "mq9"
    assert found.failures == []


def test_builtin_descriptors_provide_the_interface() -> None:
    """Each descriptor fully provides IProtocolPlugin and binds every default to loopback."""
    for plugin in load_plugins().plugins.values():
        assert verifyObject(IProtocolPlugin, plugin)
        assert plugin.description
        assert plugin.default_endpoints
        for endpoint in plugin.default_endpoints.values():
            assert "127.0.0.1" in endpoint


def test_design_default_endpoints() -> None:
    """The default roles and ports are those of DESIGN.md section 6."""
    plugins = load_plugins().plugins
    assert plugins["nsq"].default_endpoints == {
        "tcp": "tcp:4150:interface=127.0.0.1",
        "http": "tcp:4151:interface=127.0.0.1",
    }
    assert plugins["mq9"].default_endpoints == {"tcp": "tcp:4222:interface=127.0.0.1"}
    assert list(plugins["emqp"].default_endpoints) == ["frontend", "backend", "pub-in", "pub-out"]
    assert plugins["emqp"].default_endpoints["frontend"] == "tcp://127.0.0.1:47291"
    assert plugins["mqks"].default_endpoints == {"tcp": "tcp:25000:interface=127.0.0.1"}
    assert plugins["vibemq"].default_endpoints == {"tcp": "tcp:2925:interface=127.0.0.1"}


def test_twisted_getplugins_sees_the_same_builtins() -> None:
    """The documented twisted.plugin call finds the same five descriptors."""
    names = sorted(p.name for p in getPlugins(IProtocolPlugin, mqhub.plugins))
    assert names == BUILTIN


def test_twistd_service_maker_is_registered() -> None:
    """``twistd mqhub`` exists: the drop-in ServiceMaker is found with tapname mqhub."""
    makers = {m.tapname: m for m in getPlugins(IServiceMaker)}
    assert "mqhub" in makers
    assert makers["mqhub"].module == "mqhub.tap"


def test_drop_in_directory_adds_plugins_and_reports_broken_file() -> None:
    """A plugin path adds its plugins; a broken file is reported by name and the rest load."""
    found = load_plugins([str(TEST_PLUGINS)])
    assert "echotest" in found.plugins and "refusetest" in found.plugins
    assert found.aliases["echo"] == "echotest"
    assert set(BUILTIN) <= set(found.plugins)
    [(file_name, error)] = found.failures
    assert file_name.endswith("broken_testing.py")
    assert error == "RuntimeError: this drop-in is broken on purpose"


def test_example_redis_plugin_is_found_only_through_its_path() -> None:
    """mqhub never loads the example by itself; --plugin-path plugins adds ``redis``."""
    assert "redis" not in load_plugins().plugins
    found = load_plugins([str(EXAMPLE_PLUGINS)])
    assert found.plugins["redis"].default_endpoints == {"tcp": "tcp:6380:interface=127.0.0.1"}
    assert found.failures == []


def test_environment_variable_adds_directories(tmp_path: Path) -> None:
    """MQHUB_PLUGIN_PATH entries follow the --plugin-path values."""
    env = {ENV_PLUGIN_PATH: f"{tmp_path}/a:{tmp_path}/b"}
    assert plugin_dirs(["x"], env) == ["x", f"{tmp_path}/a", f"{tmp_path}/b"]
    assert plugin_dirs([], {}) == []


def _write_plugin(root: Path, module: str, body: str) -> Path:
    """Write ``root/mqhub/plugins/<module>.py``."""
    folder = root / "mqhub" / "plugins"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{module}.py"
    path.write_text(body)
    return path


def test_syntax_error_is_reported_with_file_and_line(tmp_path: Path) -> None:
    """A drop-in that does not even compile is named with the error; built-ins still load."""
    path = _write_plugin(tmp_path, "unit_syntax_error", "def broken(:\n")
    found = load_plugins([str(tmp_path)])
    assert list(found.plugins) == BUILTIN
    [(file_name, error)] = found.failures
    assert file_name == str(path)
    assert error.startswith("SyntaxError")


def test_name_clash_keeps_first_and_reports_the_other(tmp_path: Path) -> None:
    """A drop-in reusing a taken name (here 'nats') is refused with a clear reason."""
    _write_plugin(
        tmp_path,
        "unit_clash",
        "from zope.interface import implementer\n"
        "from mqhub.interfaces import IProtocolPlugin\n"
        "@implementer(IProtocolPlugin)\n"
        "class Clash:\n"
        "    name = 'zclash'\n"
        "    aliases = ('nats',)\n"
        "    description = 'clashes'\n"
        "    default_endpoints = {'tcp': 'tcp:1:interface=127.0.0.1'}\n"
        "    def make_service(self, hub, endpoints, options):\n"
        "        raise AssertionError\n"
        "clash = Clash()\n",
    )
    found = load_plugins([str(tmp_path)])
    assert "zclash" not in found.plugins
    assert found.aliases["nats"] == "mq9"
    assert found.failures == [("zclash", "name 'nats' is already taken by mq9")]


def test_missing_protocol_module_raises_one_line_plugin_error() -> None:
    """A protocol whose server package has not landed refuses with a one-line PluginError."""
    ghost = BuiltinProtocol(
        name="ghost", package="ghost_protocol_for_tests", description="d", default_endpoints={}
    )
    with pytest.raises(PluginError) as info:
        ghost.make_service(None, {}, {})
    assert str(info.value) == "protocol ghost is not implemented yet"
