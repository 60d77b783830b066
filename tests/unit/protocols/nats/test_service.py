"""The plugin entry point: options reach the server, nothing listens until started."""

from __future__ import annotations

import pytest

from mqhub.errors import PluginError
from mqhub.protocols.nats.service import make_service, own_options
from mqhub.testing import memory_hub


def test_own_options_by_plugin_name_and_alias() -> None:
    """Settings come from plugin_options['mq9'] or ['nats'], or a flat dict."""
    assert own_options({"plugin_options": {"mq9": {"token": "a"}, "nsq": {"x": "1"}}}) == {
        "token": "a"}
    assert own_options({"plugin_options": {"nats": {"user": "u"}}}) == {"user": "u"}
    assert own_options({"plugin_options": {"token": "flat"}}) == {"token": "flat"}
    assert own_options({}) == {}


def test_make_service_applies_settings_without_listening() -> None:
    """make_service builds the server with the options applied and binds nothing."""
    hub = memory_hub()
    svc = make_service(hub, {"tcp": "tcp:0:interface=127.0.0.1"},
                       {"plugin_options": {"mq9": {"token": "t", "max_payload": "2048",
                                                   "ping_interval": "5"}}})
    s = svc.server.settings
    assert s.token == "t" and s.auth_required and s.max_payload == 2048
    assert s.ping_interval == 5.0
    assert svc.server.mq9 is not None and svc.server.bridge is not None
    assert not svc.running and svc.listener.port is None


def test_option_aliases_for_credentials() -> None:
    """auth_token and pass are accepted as option names for token and password."""
    hub = memory_hub()
    svc = make_service(hub, {"tcp": "tcp:0:interface=127.0.0.1"},
                       {"plugin_options": {"mq9": {"auth_token": "x"}}})
    assert svc.server.settings.token == "x"
    svc = make_service(hub, {"tcp": "tcp:0:interface=127.0.0.1"},
                       {"plugin_options": {"mq9": {"user": "u", "pass": "p"}}})
    assert (svc.server.settings.user, svc.server.settings.password) == ("u", "p")


def test_optional_roles_and_websocket_tls_rule() -> None:
    """monitor and ws are extra listeners; plain ws off loopback needs ws_no_tls (nats-server's
    no_tls); bad nkeys, a missing CA for tls_verify and a non-MEMORY resolver are refused."""
    hub = memory_hub()
    svc = make_service(hub, {"tcp": "tcp:0:interface=127.0.0.1",
                             "monitor": "tcp:0:interface=127.0.0.1",
                             "ws": "tcp:0:interface=127.0.0.1"}, {})
    assert sorted(x.name for x in svc.extra) == ["mq9-monitor", "mq9-ws"]
    assert make_service(hub, {"tcp": "tcp:0"}, {}).extra == []
    wide = {"tcp": "tcp:0", "ws": "tcp:0:interface=0.0.0.0"}
    with pytest.raises(PluginError, match="no_tls"):
        make_service(hub, wide, {})
    assert make_service(hub, wide, {"plugin_options": {"nats": {"ws_no_tls": "true"}}}).extra
    for bad, why in (({"nkeys": "SUABC"}, "public user keys"),
                     ({"tls_cert": "x.pem", "tls_verify": "true"}, "CA file"),
                     ({"tls_verify": "true"}, "need tls_cert"),
                     ({"operator": "op.jwt", "resolver": "URL"}, "only MEMORY")):
        with pytest.raises(PluginError, match=why):
            make_service(hub, {"tcp": "tcp:0"}, {"plugin_options": {"nats": bad}})
