"""Dead letters: how a dead-lettered entry records its reason, and the record the API returns.

A dead letter is stored as an entry of the hidden queue ``~dlq/<queue>``; the reason, last error,
original priority and time are kept in reserved ``mqhub-dlq-*`` headers which :class:`DeadLetter`
and replay strip again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from mqhub.store.records import ADDRESS, ATTEMPTS, BODY, HEADERS, MSG_ID, ORIGIN, PRIORITY, Entry

DLQ_PREFIX = "~dlq/"
H_REASON = "mqhub-dlq-reason"
H_ERROR = "mqhub-dlq-error"
H_PRIORITY = "mqhub-dlq-priority"
H_TIME = "mqhub-dlq-time"
H_QUEUE = "mqhub-dlq-queue"
RESERVED = (H_REASON, H_ERROR, H_PRIORITY, H_TIME, H_QUEUE)

REASON_MAX_ATTEMPTS = "max_attempts"
REASON_OVERFLOW = "overflow"
REASON_EXPIRED = "expired"
REASON_REJECTED = "rejected"


def dlq_name(queue: str) -> str:
    """Store name of ``queue``'s dead-letter list."""
    return DLQ_PREFIX + queue


def to_dead(entry: Entry, queue: str, reason: str, error: Optional[str], now: float) -> Entry:
    """Return the dead-letter entry for ``entry`` (priority 0 so the list is in arrival order)."""
    headers = dict(entry[HEADERS] or ())
    headers[H_REASON] = reason
    headers[H_PRIORITY] = str(entry[PRIORITY])
    headers[H_TIME] = repr(now)
    headers[H_QUEUE] = queue
    if error is not None:
        headers[H_ERROR] = str(error)[:1024]
    return (entry[MSG_ID], 0, entry[ATTEMPTS], 0.0, 0.0, entry[ADDRESS], headers, entry[BODY],
            entry[ORIGIN])


def _clean(headers: Optional[dict[str, str]]) -> Optional[dict[str, str]]:
    """Headers without the reserved dead-letter keys (None when nothing is left)."""
    if not headers:
        return None
    out = {k: v for k, v in headers.items() if k not in RESERVED}
    return out or None


def from_dead(dead: Entry) -> Entry:
    """Return the entry to put back on the queue when replaying ``dead`` (attempts reset)."""
    headers = dead[HEADERS] or {}
    priority = int(headers.get(H_PRIORITY, "0") or 0)
    return (dead[MSG_ID], priority, 0, 0.0, 0.0, dead[ADDRESS], _clean(dead[HEADERS]),
            dead[BODY], dead[ORIGIN])


@dataclass
class DeadLetter:
    """A dead-lettered message with why it died (a cold-path record)."""

    msg_id: int
    queue: str
    address: str
    body: bytes
    headers: Optional[dict[str, str]]
    priority: int
    attempts: int
    reason: str
    last_error: Optional[str]
    origin: str
    dead_at: float

    @classmethod
    def from_entry(cls, dead: Entry, queue: str) -> "DeadLetter":
        """Build the record from a stored dead-letter entry."""
        h = dead[HEADERS] or {}
        return cls(dead[MSG_ID], h.get(H_QUEUE, queue), dead[ADDRESS], dead[BODY],
                   _clean(dead[HEADERS]), int(h.get(H_PRIORITY, "0") or 0), dead[ATTEMPTS],
                   h.get(H_REASON, ""), h.get(H_ERROR), dead[ORIGIN],
                   float(h.get(H_TIME, "0") or 0.0))


__all__ = ["DeadLetter", "dlq_name", "to_dead", "from_dead", "DLQ_PREFIX", "REASON_EXPIRED",
           "REASON_MAX_ATTEMPTS", "REASON_OVERFLOW", "REASON_REJECTED"]
