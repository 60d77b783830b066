"""Dead letters: how a dead-lettered entry records its reason, and the record the API returns.

A dead letter is stored as an entry of the hidden queue ``~dlq/<queue>``; the reason, last error,
original priority and time are kept in reserved ``mqhub-dlq-*`` headers which :class:`DeadLetter`
and replay strip again.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import inlineCallbacks

from mqhub.records import (
    H_ERROR,
    H_PRIORITY,
    H_QUEUE,
    H_REASON,
    H_TIME,
    MSG_ID,
    PRIORITY,
    REASON_EXPIRED,
    REASON_MAX_ATTEMPTS,
    REASON_OVERFLOW,
    REASON_REJECTED,
    DeadLetter,
    clean_headers,
)
from mqhub.store.records import Entry

DLQ_PREFIX = "~dlq/"


def dlq_name(queue: str) -> str:
    """Store name of ``queue``'s dead-letter list."""
    return DLQ_PREFIX + queue


def to_dead(entry: Entry, queue: str, reason: str, error: str | None, now: float) -> Entry:
    """Return the dead-letter entry for ``entry`` (priority 0 so the list is in arrival order)."""
    msg_id, priority, attempts, _, _, address, old, body, origin = entry
    headers = dict(old or ())
    headers[H_REASON] = reason
    headers[H_PRIORITY] = str(priority)
    headers[H_TIME] = repr(now)
    headers[H_QUEUE] = queue
    if error is not None:
        headers[H_ERROR] = str(error)[:1024]
    return (msg_id, 0, attempts, 0.0, 0.0, address, headers, body, origin)


def from_dead(dead: Entry) -> Entry:
    """Return the entry to put back on the queue when replaying ``dead`` (attempts reset)."""
    msg_id, _, _, _, _, address, headers, body, origin = dead
    priority = int((headers or {}).get(H_PRIORITY, "0") or 0)
    return (msg_id, priority, 0, 0.0, 0.0, address, clean_headers(headers), body, origin)


__all__ = ["DeadLetter", "dlq_name", "to_dead", "from_dead", "DLQ_PREFIX", "REASON_EXPIRED",
           "REASON_MAX_ATTEMPTS", "REASON_OVERFLOW", "REASON_REJECTED"]


@inlineCallbacks
def all_dead_letters(store: Any, queue: Any) -> Any:
    """Every dead-letter entry of ``queue`` (a Deferred list; cold path, stored ones read in pages)."""
    if not queue.durable:
        return queue.memory_dead_letters()
    out: list[Entry] = []
    after = None
    while True:
        page = yield store.read_entries(dlq_name(queue.name), after, 1000)
        out.extend(page)
        if len(page) < 1000:
            return out
        after = (page[-1][PRIORITY], page[-1][MSG_ID])
