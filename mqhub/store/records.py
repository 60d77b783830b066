"""The shapes the store persists, as plain tuples (no per-message objects on the hot path).

An *entry* is one message waiting on one queue::

    (msg_id, priority, attempts, deliver_at, expires_at, address, headers, body, origin)

Indexes below name the fields so code can say ``entry[BODY]`` instead of ``entry[7]``.
This module imports neither Twisted nor zope.
"""

from __future__ import annotations

from typing import Final

MSG_ID: Final = 0
PRIORITY: Final = 1
ATTEMPTS: Final = 2
DELIVER_AT: Final = 3
EXPIRES_AT: Final = 4
ADDRESS: Final = 5
HEADERS: Final = 6
BODY: Final = 7
ORIGIN: Final = 8

#: One stored entry; see the module docstring for the field order.
Entry = tuple[int, int, int, float, float, str, dict[str, str] | None, bytes, str]

#: Position of an entry in its queue's ready order: (priority, msg_id).
EntryKey = tuple[int, int]

MIN_PRIORITY = 0
MAX_PRIORITY = 9
#: the largest msg_id a store holds (ids are unsigned 64-bit)
MAX_MSG_ID = (1 << 64) - 1


def make_entry(
    msg_id: int,
    body: bytes,
    address: str = "",
    *,
    priority: int = 0,
    attempts: int = 0,
    deliver_at: float = 0.0,
    expires_at: float = 0.0,
    headers: dict[str, str] | None = None,
    origin: str = "",
) -> Entry:
    """Build an entry tuple with keyword defaults (convenience for tests and cold paths)."""
    return (msg_id, priority, attempts, deliver_at, expires_at, address, headers, body, origin)


def entry_key(entry: Entry) -> EntryKey:
    """Return the ``(priority, msg_id)`` key that places ``entry`` in its queue."""
    return (entry[PRIORITY], entry[MSG_ID])


def entry_order(entry: Entry) -> tuple[int, int]:
    """Sort key placing ``entry`` in ready order: priority descending, then msg_id ascending."""
    return (-entry[PRIORITY], entry[MSG_ID])


def ready_order(key: EntryKey) -> tuple[int, int]:
    """Sort key for ready order: priority descending, then msg_id ascending."""
    return (-key[0], key[1])
