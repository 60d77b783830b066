"""The shapes the store persists: the entry record, defined with the seam's words in
:mod:`mqhub.records` and named here for the store's modules.

An *entry* is one message waiting on one queue::

    (msg_id, priority, attempts, deliver_at, expires_at, address, headers, body, origin)

This module imports neither Twisted nor zope.
"""

from __future__ import annotations

from mqhub.records import (
    ADDRESS,
    ATTEMPTS,
    BODY,
    DELIVER_AT,
    EXPIRES_AT,
    HEADERS,
    MAX_MSG_ID,
    MAX_PRIORITY,
    MIN_PRIORITY,
    MSG_ID,
    ORIGIN,
    PRIORITY,
    Entry,
    EntryKey,
    entry_key,
    entry_order,
    make_entry,
    ready_order,
)

__all__ = ["ADDRESS", "ATTEMPTS", "BODY", "DELIVER_AT", "EXPIRES_AT", "HEADERS", "MAX_MSG_ID",
           "MAX_PRIORITY", "MIN_PRIORITY", "MSG_ID", "ORIGIN", "PRIORITY", "Entry", "EntryKey",
           "entry_key", "entry_order", "make_entry", "ready_order"]
