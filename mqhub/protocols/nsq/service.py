"""The NSQ plugin's service: TCP listener (protocol V2) and HTTP listener (nsqd API + lookupd).

``make_service(hub, endpoints, options)`` is the entry point the plugin descriptor calls.
"""

from __future__ import annotations

from typing import Any

from twisted.web.server import Site

from mqhub.errors import PluginError
from mqhub.listener import ListenerService
from mqhub.protocol_service import ProtocolService
from mqhub.protocols.nsq.auth import SecretsFile
from mqhub.protocols.nsq.config import NsqConfig
from mqhub.protocols.nsq.http import NsqHttpResource, request_factory
from mqhub.protocols.nsq.server import NsqFactory
from mqhub.protocols.nsq.topics import TopicRegistry
from mqhub.tls import TlsConfigError, server_context


class NsqService(ProtocolService):
    """Recovers the NSQ topics, then listens on the ``tcp`` and ``http`` endpoints."""

    label = "nsq"

    def __init__(self, hub: Any, endpoints: dict[str, str], config: NsqConfig,
                 secrets: SecretsFile | None = None) -> None:
        """Build the factory, the HTTP site and their listeners (nothing is bound yet)."""
        super().__init__(hub)
        self.config = config
        self.registry = TopicRegistry(hub.broker, hub.broker.state, config.mem_queue_size)
        self.factory = NsqFactory(hub, config, self.registry, secrets)
        self.start_time = int(hub.clock.seconds())
        # the configured ports until the listeners report the ones they really bound
        self.ports.update(tcp=_port_of(endpoints.get("tcp", "")),
                          http=_port_of(endpoints.get("http", "")))
        self.tcp = self.add_listener("tcp", endpoints["tcp"], self.factory)
        self.http: ListenerService | None = None
        if endpoints.get("http"):
            site = Site(NsqHttpResource(self))
            site.requestFactory = request_factory(
                max(self.config.max_body_size, self.config.max_msg_size) + 1)
            site.noisy = False
            self.http = self.add_listener("http", endpoints["http"], site)

    @property
    def tcp_port(self) -> int:
        """The TCP port (for /info and /lookup): the bound one once listening."""
        return self.ports["tcp"]

    @property
    def http_port(self) -> int:
        """The HTTP port (for /info and /lookup): the bound one once listening."""
        return self.ports["http"]

    def lame_duck(self) -> None:
        """Hub lame-duck mode: every subscribed consumer enters CLOSE_WAIT (see mqhub.lameduck)."""
        for client in list(self.factory.clients):
            client.close_wait()

    def recover(self) -> Any:
        """Load the NSQ topics before anything listens."""
        return self.registry.load()


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
        try:   # fail the start now, not at a client's first tls_v1
            server_context(config.tls_cert, config.tls_key, config.tls_ca, config.tls_verify)
        except TlsConfigError as exc:
            raise PluginError(f"nsq: {exc}") from exc
    elif config.tls_verify:
        raise PluginError("nsq: tls_verify needs tls_cert")
    return NsqService(hub, endpoints, config, secrets)
