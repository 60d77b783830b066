"""Tests of the eMQP plugin entry point: option parsing and endpoint checks (no sockets)."""

from __future__ import annotations

import pytest

from mqhub.errors import PluginError
from mqhub.plugins.builtin import emqp as descriptor
from mqhub.protocols.emqp.service import (
    FRONTEND_HWM,
    EmqpService,
    make_service,
    router_settings,
)
from mqhub.testing import memory_hub


def test_router_settings_from_plugin_options():
    """--option emqp.KEY=VALUE strings become typed router settings (flat or nested form)."""
    flat = {"plugin_options": {"heartbeat_interval": "1.5", "heartbeat_timeout": "9",
                               "queues": '[[20, "mail"], [10, "default"]]',
                               "schedules": "forward", "max_body": "1024",
                               "pub_bridge": "news.>, alerts.*"}}
    assert router_settings(flat) == {
        "heartbeat_interval": 1.5, "heartbeat_timeout": 9.0,
        "default_queues": [(20, "mail"), (10, "default")], "forward_schedules": True,
        "max_body": 1024, "pub_bridge": ("news.>", "alerts.*")}
    nested = {"plugin_options": {"emqp": {"schedules": "internal"}}}
    assert router_settings(nested) == {"forward_schedules": False}
    assert router_settings({}) == {}


@pytest.mark.parametrize("raw", [{"heartbeat_interval": "x"}, {"queues": "nope"},
                                 {"schedules": "elsewhere"}, {"pub_bridge": "a..b"}])
def test_bad_options_are_plugin_errors(raw):
    """A bad option value is a one-line PluginError, not a traceback."""
    with pytest.raises(PluginError):
        router_settings({"plugin_options": raw})


def test_make_service_builds_without_binding():
    """make_service builds an unstarted service on the descriptor's default ZeroMQ endpoints."""
    hub = memory_hub()
    service = make_service(hub, dict(descriptor.default_endpoints), {})
    assert isinstance(service, EmqpService)
    assert not service.running and service.sockets == {}
    assert all(e.startswith("tcp://127.0.0.1:") for e in descriptor.default_endpoints.values())


def test_make_service_rejects_missing_or_twisted_endpoints():
    """Every role needs a ZeroMQ address; a Twisted endpoint string is refused with the role."""
    hub = memory_hub()
    endpoints = dict(descriptor.default_endpoints)
    endpoints["backend"] = "tcp:47290:interface=127.0.0.1"
    with pytest.raises(PluginError, match="emqp.backend"):
        make_service(hub, endpoints, {})
    del endpoints["backend"]
    with pytest.raises(PluginError, match="backend"):
        make_service(hub, endpoints, {})


def test_receive_hwm_option() -> None:
    """--option emqp.receive_hwm sets the frontend's per-client receive HWM (default 16);
    a value that is not a positive integer is a PluginError."""
    hub = memory_hub()
    endpoints = dict(descriptor.default_endpoints)
    assert make_service(hub, endpoints, {}).receive_hwm == FRONTEND_HWM == 16
    opts = {"plugin_options": {"emqp": {"receive_hwm": "10000"}}}
    assert make_service(hub, endpoints, opts).receive_hwm == 10000
    for bad in ("0", "many"):
        with pytest.raises(PluginError, match="emqp"):
            make_service(hub, endpoints, {"plugin_options": {"receive_hwm": bad}})
