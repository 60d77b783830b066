"""Test-only plugin ``refusetest`` that refuses to start, like a protocol not implemented yet."""

from __future__ import annotations

from typing import Any

from zope.interface import implementer

from mqhub.errors import PluginError
from mqhub.interfaces import IProtocolPlugin


@implementer(IProtocolPlugin)
class RefusingTesting:
    """Descriptor whose make_service always raises PluginError."""

    name = "refusetest"
    aliases = ()
    description = "Test-only protocol that refuses to start"
    default_endpoints = {"tcp": "tcp:7908:interface=127.0.0.1"}

    def make_service(self, hub: Any, endpoints: dict[str, str], options: dict[str, Any]) -> Any:
        """Always refuse, in one line."""
        raise PluginError("protocol refusetest is not implemented yet")


refusetest = RefusingTesting()
