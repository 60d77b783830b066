"""The VibeMQ plugin's service: recover the VibeMQ queues, then listen on the ``tcp`` endpoint.

``make_service(hub, endpoints, options)`` is the entry point the plugin descriptor calls.
"""

from __future__ import annotations

from typing import Any

from twisted.application.service import MultiService, Service
from twisted.internet.defer import maybeDeferred
from twisted.logger import Logger

from mqhub.errors import PluginError
from mqhub.listener import ListenerService
from mqhub.protocols.vibemq.auth import UsersError, UserStore
from mqhub.protocols.vibemq.config import VibeMQConfig
from mqhub.protocols.vibemq.queues import QueueRegistry
from mqhub.protocols.vibemq.server import VibeMQFactory

log = Logger(namespace="mqhub.vibemq")


class VibeMQService(MultiService):
    """Recovers the VibeMQ queue options, then starts the TCP listener.

    :ivar port: the bound TCP port once listening.
    """

    def __init__(self, hub: Any, endpoints: dict[str, str], config: VibeMQConfig,
                 users: UserStore | None = None) -> None:
        """Build the registry, factory and listener (nothing is bound yet)."""
        super().__init__()
        self.hub = hub
        self.config = config
        self.registry = QueueRegistry(hub.broker, hub.store, hub.clock, config.tier,
                                      config.ack_timeout, config.window)
        self.factory = VibeMQFactory(hub, config, self.registry, users)
        self.port = 0
        self.tcp = ListenerService(endpoints["tcp"], self.factory,
                                   reactor=getattr(hub, "reactor", None))
        self.tcp.setName("vibemq-tcp")
        self.tcp.setServiceParent(self)
        self.tcp.listening.addCallback(self._bound)
        self.tcp.listening.addErrback(lambda f: None)

    def _bound(self, port: Any) -> Any:
        """Remember the real bound port (endpoints may ask for port 0)."""
        self.port = port.getHost().port
        return port

    def startService(self) -> None:
        """Recover queues from the store first, then start the listener."""
        Service.startService(self)
        d = maybeDeferred(self.registry.load)

        def start_children(_: Any) -> None:
            """Start listening once the queues are known."""
            if self.running:
                for child in self:
                    child.startService()

        d.addCallback(start_children)
        d.addErrback(lambda f: log.failure("vibemq: could not recover queues", f))


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
