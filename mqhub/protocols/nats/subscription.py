"""One SUB of one NATS connection."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mqhub.protocols.nats.connection import NatsConnection

__all__ = ["Subscription"]


class Subscription:
    """One SUB of one connection."""

    __slots__ = ("conn", "subject", "queue", "sid", "max", "delivered", "wire_subject",
                 "core_handle", "mq9")

    def __init__(self, conn: NatsConnection, subject: str, queue: str | None, sid: str,
                 wire_subject: str) -> None:
        """:param subject: the pattern matched on (``#`` already mapped); ``wire_subject`` as sent."""
        self.conn = conn
        self.subject = subject
        self.queue = queue
        self.sid = sid
        self.max: int | None = None
        self.delivered = 0
        self.wire_subject = wire_subject
        self.core_handle: Any = None
        self.mq9 = False

    def __repr__(self) -> str:
        """Show pattern, queue and sid."""
        return f"<Subscription {self.subject!r} q={self.queue!r} sid={self.sid!r}>"
