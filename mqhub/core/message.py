"""The logical Message model (cold paths only) and the entry-tuple field names for hot paths.

On the hot path a message is an entry tuple (:data:`mqhub.store.records.Entry`); this module
re-exports its field indexes and offers :class:`Message` for admin surfaces, the manhole and tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mqhub.records import TIER_DURABLE, TIER_MEMORY, TIERS, id_time
from mqhub.store.records import (
    ADDRESS,
    ATTEMPTS,
    BODY,
    DELIVER_AT,
    EXPIRES_AT,
    HEADERS,
    MSG_ID,
    ORIGIN,
    PRIORITY,
    Entry,
)

__all__ = ["ADDRESS", "ATTEMPTS", "BODY", "DELIVER_AT", "EXPIRES_AT", "HEADERS", "MSG_ID",
           "ORIGIN", "PRIORITY", "Entry", "Message", "TIER_DURABLE", "TIER_MEMORY", "TIERS"]

@dataclass
class Message:
    """One message as a readable object (never built per message on the hot path)."""

    msg_id: int
    body: bytes
    address: str = ""
    headers: dict[str, str] | None = field(default=None)
    priority: int = 0
    attempts: int = 0
    deliver_at: float = 0.0
    expires_at: float = 0.0
    origin: str = ""

    @property
    def timestamp(self) -> float:
        """POSIX time the message was published (taken from its id)."""
        return id_time(self.msg_id)

    @classmethod
    def from_entry(cls, entry: Entry) -> Message:
        """Build a Message from an entry tuple."""
        msg_id, priority, attempts, deliver_at, expires_at, address, headers, body, origin = entry
        return cls(msg_id, body, address, headers, priority, attempts, deliver_at, expires_at,
                   origin)

    def to_entry(self) -> Entry:
        """Return the entry tuple for this message."""
        return (self.msg_id, self.priority, self.attempts, self.deliver_at, self.expires_at,
                self.address, self.headers, self.body, self.origin)
