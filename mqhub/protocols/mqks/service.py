"""The MQKS plugin's service: recover the MQKS queues, then listen on the ``tcp`` endpoint.

``make_service(hub, endpoints, options)`` is the entry point the plugin descriptor calls.
"""

from __future__ import annotations

from typing import Any

from mqhub.errors import PluginError
from mqhub.protocol_service import ProtocolService
from mqhub.protocols.mqks.config import MqksConfig
from mqhub.protocols.mqks.queues import MqksRegistry
from mqhub.protocols.mqks.server import MqksFactory


class MqksService(ProtocolService):
    """Recovers the MQKS queues from the core and store, then starts the TCP listener."""

    label = "mqks"

    def __init__(self, hub: Any, endpoints: dict[str, str], config: MqksConfig) -> None:
        """Build the registry, factory and listener (nothing is bound yet)."""
        super().__init__(hub)
        self.config = config
        self.registry = MqksRegistry(hub.broker, hub.broker.state, hub.clock, config.prefetch,
                                     config.window)
        self.factory = MqksFactory(hub, config, self.registry)
        self.tcp = self.add_listener("tcp", endpoints["tcp"], self.factory)

    def recover(self) -> Any:
        """Load the MQKS queues before anything listens."""
        return self.registry.load()


def make_service(hub: Any, endpoints: dict[str, str], options: dict[str, Any]) -> MqksService:
    """Build (not start) the MQKS service for ``hub``.

    :raises PluginError: when the hub has no broker core or an option is invalid.
    """
    if hub.broker is None:
        raise PluginError("mqks needs the broker core (mqhub.core.broker)")
    return MqksService(hub, endpoints, MqksConfig.from_options(options))
