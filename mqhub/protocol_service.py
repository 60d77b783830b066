"""ProtocolService: a protocol's service that recovers its own state, then starts its listeners.

NSQ, MQKS and VibeMQ each keep per-protocol state (topics, queue settings) that must be loaded
from the core and store before a client may connect: a listener accepting earlier could confirm
a message into a queue that is not known yet. This base does that ordering once; a protocol
adds its listeners with :meth:`ProtocolService.add_listener` and loads its state in
:meth:`ProtocolService.recover`.
"""

from __future__ import annotations

from typing import Any

from twisted.application.service import MultiService, Service
from twisted.internet.defer import maybeDeferred
from twisted.logger import Logger

from mqhub.listener import ListenerService

log = Logger(namespace="mqhub.protocol_service")


class ProtocolService(MultiService):
    """Runs ``recover()`` first, then starts every listener added with ``add_listener``.

    :ivar ports: role -> the real bound port once listening (endpoints may ask for port 0);
        a subclass may seed it with the configured ports.
    """

    #: the protocol's name, used in listener service names and log lines
    label = "protocol"

    def __init__(self, hub: Any) -> None:
        """Build an empty service for ``hub`` (nothing is bound until it starts)."""
        super().__init__()
        self.hub = hub
        self.ports: dict[str, int] = {}

    @property
    def port(self) -> int:
        """The bound port of the ``tcp`` role once listening (0 before)."""
        return self.ports.get("tcp", 0)

    def add_listener(self, role: str, endpoint: str, factory: Any) -> ListenerService:
        """Add a child listener for ``role`` whose bound port is recorded in ``ports[role]``."""
        listener = ListenerService(endpoint, factory, reactor=getattr(self.hub, "reactor", None))
        listener.setName(f"{self.label}-{role}")
        listener.setServiceParent(self)
        listener.listening.addCallback(self._bound, role)
        listener.listening.addErrback(lambda f: None)  # ListenerService logs its own failure
        return listener

    def _bound(self, port: Any, role: str) -> Any:
        """Remember the port ``role`` really bound."""
        self.ports[role] = port.getHost().port
        return port

    def recover(self) -> Any:
        """Load the protocol's state before anything listens (a value or a Deferred)."""

    def startService(self) -> None:
        """Recover first, then start the listeners (unless stopped meanwhile)."""
        Service.startService(self)
        d = maybeDeferred(self.recover)

        def start_children(_: Any) -> None:
            """Listen once the state is known."""
            if self.running:
                for child in self:
                    child.startService()

        d.addCallback(start_children)
        d.addErrback(lambda f: log.failure("{label}: could not recover its state", f,
                                           label=self.label))
