"""What a NATS connection uses of its server, as a typing Protocol (annotations only).

:class:`mqhub.protocols.nats.connection.NatsConnection` is typed against :class:`NatsHost`
instead of naming :class:`mqhub.protocols.nats.server.NatsServer`, so the server (which builds
connections) imports the connection and nothing imports back: no import circle. mypy checks
that ``NatsServer`` fits ``NatsHost[NatsConnection, Subscription]`` where the server hands
itself to a new connection (``buildProtocol``), and checks every use in the connection against
the members declared here. The two type parameters are the connection and subscription
classes, which live above this module.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

from mqhub.protocols.nats.auth import Authenticator
from mqhub.protocols.nats.settings import NatsSettings

__all__ = ["NatsHost"]

#: the connection class (``NatsConnection``)
C = TypeVar("C")
#: the subscription class (``Subscription``); only ever passed in
S_contra = TypeVar("S_contra", contravariant=True)


class NatsHost(Protocol[C, S_contra]):
    """The members of ``NatsServer`` that a connection reads, writes or calls."""

    settings: NatsSettings
    #: turns CONNECT credentials into a principal (:class:`mqhub.protocols.nats.auth.Authenticator`)
    auth: Authenticator
    clock: Any
    stats: dict[str, int]
    connections: dict[int, C]
    #: connections with output to write at the end of this read (hot loops hold this list)
    dirty: list[C]
    routes: dict[bytes, tuple]
    head_routes: dict[bytes, tuple]
    core_epoch: int
    stall_for: float
    bridge: Any
    mq9: Any
    journal: Any
    #: the routing epoch (bumped by :meth:`changed`)
    epoch: int
    #: CONNECT's credentials onto users (:class:`mqhub.protocols.nats.rights.NatsGuard`)
    guard: Any

    def info(self, conn: C) -> dict[str, Any]:
        """The INFO object for ``conn``."""

    def changed(self) -> None:
        """Every cached route is stale."""

    def add_sub(self, sub: S_contra) -> None:
        """Register a subscription."""

    def remove_sub(self, sub: S_contra) -> None:
        """Forget a subscription."""

    def resolve(self, hit: tuple) -> tuple:
        """Build and cache the route of a PUB control line."""

    def deliver_special(self, pub: C | None, subject: str, reply: str | None,
                        hdr: bytes | None, payload: bytes, special: tuple) -> int:
        """Deliver to limited subs, queue groups, mq9 and foreign bindings."""

    def publish(self, pub: C | None, subject: str, reply: str | None, hdr: bytes | None,
                payload: bytes, *, foreign: bool = True) -> int:
        """Deliver one message to every subscriber of ``subject`` (cold path)."""

    def no_responders(self, pub: C, subject: str, reply: str) -> None:
        """Send ``pub`` the 503 no-responders status."""

    def end_turn(self) -> None:
        """Finish one read."""

    def flush(self) -> None:
        """Write every touched connection's output."""
