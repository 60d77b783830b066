"""The MQKS plugin's service: recover the MQKS queues, then listen on the ``tcp`` endpoint.

``make_service(hub, endpoints, options)`` is the entry point the plugin descriptor calls.
"""

from __future__ import annotations

from typing import Any

from twisted.application.service import MultiService, Service
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.logger import Logger

from mqhub.errors import PluginError
from mqhub.listener import ListenerService
from mqhub.protocols.mqks.config import MqksConfig
from mqhub.protocols.mqks.queues import MqksRegistry
from mqhub.protocols.mqks.server import MqksFactory

log = Logger(namespace="mqhub.mqks")


class MqksService(MultiService):
    """Recovers the MQKS queues from the core and store, then starts the TCP listener.

    :ivar port: the bound TCP port once listening.
    """

    def __init__(self, hub: Any, endpoints: dict[str, str], config: MqksConfig) -> None:
        """Build the registry, factory and listener (nothing is bound yet)."""
        super().__init__()
        self.hub = hub
        self.config = config
        self.registry = MqksRegistry(hub.broker, hub.store, hub.clock, config.prefetch,
                                     config.window)
        self.factory = MqksFactory(hub, config, self.registry)
        self.port = 0
        self.tcp = ListenerService(endpoints["tcp"], self.factory,
                                   reactor=getattr(hub, "reactor", None))
        self.tcp.setName("mqks-tcp")
        self.tcp.setServiceParent(self)
        self.tcp.listening.addCallback(self._bound)
        self.tcp.listening.addErrback(lambda f: None)

    def _bound(self, port: Any) -> Any:
        """Remember the real bound port (the endpoint may ask for port 0)."""
        self.port = port.getHost().port
        return port

    def startService(self) -> None:
        """Recover the queues first, then start the listener."""
        Service.startService(self)
        d: Deferred[Any] = maybeDeferred(self.registry.load)

        def start_children(_: Any) -> None:
            """Listen once the queues are known."""
            if not self.running:
                return
            for child in self:
                child.startService()

        d.addCallback(start_children)
        d.addErrback(lambda f: log.failure("mqks: could not recover queues", f))


def make_service(hub: Any, endpoints: dict[str, str], options: dict[str, Any]) -> MqksService:
    """Build (not start) the MQKS service for ``hub``.

    :raises PluginError: when the hub has no broker core or an option is invalid.
    """
    if hub.broker is None:
        raise PluginError("mqks needs the broker core (mqhub.core.broker)")
    return MqksService(hub, endpoints, MqksConfig.from_options(options))
