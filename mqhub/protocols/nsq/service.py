"""The NSQ plugin's service: TCP listener (protocol V2) and HTTP listener (nsqd API + lookupd).

``make_service(hub, endpoints, options)`` is the entry point the plugin descriptor calls.
"""

from __future__ import annotations

from typing import Any

from twisted.application.service import MultiService, Service
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.logger import Logger
from twisted.web.server import Site

from mqhub.errors import PluginError
from mqhub.listener import ListenerService
from mqhub.protocols.nsq.auth import SecretsFile
from mqhub.protocols.nsq.config import NsqConfig
from mqhub.protocols.nsq.http import NsqHttpResource, request_factory
from mqhub.protocols.nsq.server import NsqFactory
from mqhub.protocols.nsq.topics import TopicRegistry

log = Logger(namespace="mqhub.nsq")


class NsqService(MultiService):
    """Recovers the NSQ topics, then listens on the ``tcp`` and ``http`` endpoints.

    :ivar tcp_port: the bound TCP port once listening (for /info and /lookup).
    :ivar http_port: the bound HTTP port once listening.
    """

    def __init__(self, hub: Any, endpoints: dict[str, str], config: NsqConfig,
                 secrets: SecretsFile | None = None) -> None:
        """Build the factory, the HTTP site and their listeners (nothing is bound yet)."""
        super().__init__()
        self.hub = hub
        self.config = config
        self.registry = TopicRegistry(hub.broker, hub.store, config.mem_queue_size)
        self.factory = NsqFactory(hub, config, self.registry, secrets)
        self.start_time = int(hub.clock.seconds())
        self.tcp_port = _port_of(endpoints.get("tcp", ""))
        self.http_port = _port_of(endpoints.get("http", ""))
        self.tcp = self._listener("tcp", endpoints["tcp"], self.factory)
        self.http: ListenerService | None = None
        if endpoints.get("http"):
            site = Site(NsqHttpResource(self))
            site.requestFactory = request_factory(
                max(self.config.max_body_size, self.config.max_msg_size) + 1)
            site.noisy = False
            self.http = self._listener("http", endpoints["http"], site)

    def _listener(self, role: str, endpoint: str, factory: Any) -> ListenerService:
        """A child listener for ``role`` that records its bound port as ``<role>_port``."""
        listener = ListenerService(endpoint, factory, reactor=getattr(self.hub, "reactor", None))
        listener.setName(f"nsq-{role}")
        listener.setServiceParent(self)
        listener.listening.addCallback(self._bound, f"{role}_port")
        listener.listening.addErrback(lambda f: None)
        return listener

    def _bound(self, port: Any, attr: str) -> Any:
        """Remember the real bound port (endpoints may ask for port 0)."""
        setattr(self, attr, port.getHost().port)
        return port

    def startService(self) -> None:
        """Recover topics from the store first, then start both listeners."""
        Service.startService(self)
        d: Deferred[Any] = maybeDeferred(self.registry.load)

        def start_children(_: Any) -> None:
            """Start the listeners once the topics are known."""
            if not self.running:
                return
            for child in self:
                child.startService()

        d.addCallback(start_children)
        d.addErrback(lambda f: log.failure("nsq: could not recover topics", f))


def _port_of(endpoint: str) -> int:
    """The port number in a ``tcp:PORT:...`` endpoint string (0 when not given)."""
    parts = endpoint.split(":")
    for part in parts[1:]:
        if part.isdigit():
            return int(part)
        if part.startswith("port="):
            return int(part[5:])
    return 0


def make_service(hub: Any, endpoints: dict[str, str], options: dict[str, Any]) -> NsqService:
    """Build (not start) the NSQ service for ``hub``.

    :raises PluginError: when the hub has no broker core, or an option or file is invalid.
    """
    if hub.broker is None:
        raise PluginError("nsq needs the broker core (mqhub.core.broker)")
    config = NsqConfig.from_options(options)
    secrets = SecretsFile.load(config.auth_secrets) if config.auth_secrets else None
    if config.tls_cert:
        try:
            open(config.tls_cert, "rb").close()
        except OSError as exc:
            raise PluginError(f"nsq: cannot read TLS certificate: {exc}") from exc
    return NsqService(hub, endpoints, config, secrets)
