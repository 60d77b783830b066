"""The VibeMQ plugin's service: recover the VibeMQ queues, then listen on the ``tcp`` endpoint.

``make_service(hub, endpoints, options)`` is the entry point the plugin descriptor calls.
"""

from __future__ import annotations

from typing import Any

from mqhub.errors import PluginError
from mqhub.protocol_service import ProtocolService
from mqhub.protocols.vibemq.auth import UsersError, UserStore
from mqhub.protocols.vibemq.config import VibeMQConfig
from mqhub.protocols.vibemq.queues import QueueRegistry
from mqhub.protocols.vibemq.server import VibeMQFactory


class VibeMQService(ProtocolService):
    """Recovers the VibeMQ queue options, then starts the TCP listener."""

    label = "vibemq"

    def __init__(self, hub: Any, endpoints: dict[str, str], config: VibeMQConfig,
                 users: UserStore | None = None) -> None:
        """Build the registry, factory and listener (nothing is bound yet)."""
        super().__init__(hub)
        self.config = config
        self.registry = QueueRegistry(hub.broker, hub.broker.state, hub.clock, config.tier,
                                      config.ack_timeout, config.window)
        self.factory = VibeMQFactory(hub, config, self.registry, users)
        self.tcp = self.add_listener("tcp", endpoints["tcp"], self.factory)

    def recover(self) -> Any:
        """Load the VibeMQ queue options before anything listens."""
        return self.registry.load()


def make_service(hub: Any, endpoints: dict[str, str], options: dict[str, Any]) -> VibeMQService:
    """Build (not start) the VibeMQ service for ``hub``.

    :raises PluginError: when the hub has no broker core, or an option or the users file is bad.
    """
    if hub.broker is None:
        raise PluginError("vibemq needs the broker core (mqhub.core.broker)")
    config = VibeMQConfig.from_options(options)
    users = None
    if config.users:
        try:
            users = UserStore.load(config.users)
        except UsersError as exc:
            raise PluginError(f"vibemq: {exc}") from exc
    return VibeMQService(hub, endpoints, config, users)
