"""The records and words of the core seam: what protocol adapters may import besides the seam.

Protocol packages import three things from mqhub's core side: the seam's interfaces
(:mod:`mqhub.interfaces`: ``ICore``, ``IQueue``, ``IConsumer`` ...), this module, and
:mod:`mqhub.errors`. Everything here is a plain value or a pure function shared by every
backend of the seam (the embedded core over LMDB today, cluster mode tomorrow):

- the entry record a message travels as (:data:`Entry`, its field names, column readers and
  constructors; the store keeps the same record);
- message ids as the adapters render and read them (:func:`format_id`, :func:`id_time`...);
- the address space's name rules (:func:`validate_address`, :func:`validate_pattern`);
- dead letters as adapters list them (:class:`DeadLetter`) and the reasons they carry;
- the words of queue settings and of refused acks (tiers, modes, overflow policies,
  :data:`NOT_OWNER` ...).

It imports neither Twisted nor zope nor any part of the core or the store (both import it),
so a codec, a benchmark or Spark can import it too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from operator import itemgetter
from typing import Final

from mqhub.errors import InvalidName

__all__ = [
    "ADDRESS", "ATTEMPTS", "BODY", "DELIVER_AT", "EXPIRES_AT", "HEADERS", "MSG_ID", "ORIGIN",
    "PRIORITY", "MIN_PRIORITY", "MAX_PRIORITY", "MAX_MSG_ID", "Entry", "EntryKey", "entry_key",
    "entry_order", "ready_order", "make_entry", "get_msg_id", "get_priority", "get_attempts",
    "get_expires_at", "get_headers", "get_body", "get_key",
    "EPOCH", "SEQ_BITS", "MAX_ID", "first_id_at", "id_time", "format_id", "parse_id",
    "MAX_ADDRESS", "validate_address", "validate_pattern", "is_pattern",
    "DeadLetter", "DLQ_HEADERS", "H_REASON", "H_ERROR", "H_PRIORITY", "H_TIME", "H_QUEUE",
    "REASON_MAX_ATTEMPTS", "REASON_OVERFLOW", "REASON_EXPIRED", "REASON_REJECTED",
    "clean_headers", "Peer",
    "TIER_MEMORY", "TIER_DURABLE", "TIERS", "MODES", "OVERFLOW_POLICIES",
    "NOT_IN_FLIGHT", "NOT_OWNER", "MAX_ATTEMPTS_HEADER",
]

# -- the entry record -------------------------------------------------------------------------
# One message waiting on one queue, as it travels on the hot path and as the store keeps it: a
# plain 9-tuple (no object per message; the store decodes hundreds of thousands a second)
#
#     (msg_id, priority, attempts, deliver_at, expires_at, address, headers, body, origin)
#
# read by name: ``e[BODY]``, ``for msg_id, priority, ... in entries``, or the column readers
# below over many entries at once (``list(map(get_msg_id, entries))``, C-level). A tuple
# subclass with properties, a namedtuple or a slotted class would read as ``e.body`` but cost
# 2 to 6 times a tuple to make (docs/core-api.md, "Data on the hot path").

MSG_ID: Final = 0
PRIORITY: Final = 1
ATTEMPTS: Final = 2
DELIVER_AT: Final = 3
EXPIRES_AT: Final = 4
ADDRESS: Final = 5
HEADERS: Final = 6
BODY: Final = 7
ORIGIN: Final = 8

#: One entry; see above for the field order.
Entry = tuple[int, int, int, float, float, str, dict[str, str] | None, bytes, str]

#: Position of an entry in its queue's ready order: (priority, msg_id).
EntryKey = tuple[int, int]

MIN_PRIORITY = 0
MAX_PRIORITY = 9
#: the largest msg_id a store holds (ids are unsigned 64-bit)
MAX_MSG_ID = (1 << 64) - 1

#: column readers: one field of an entry (map them over a batch)
get_msg_id = itemgetter(MSG_ID)
get_priority = itemgetter(PRIORITY)
get_attempts = itemgetter(ATTEMPTS)
get_expires_at = itemgetter(EXPIRES_AT)
get_headers = itemgetter(HEADERS)
get_body = itemgetter(BODY)
#: an entry's store key ``(priority, msg_id)`` (see :data:`EntryKey`)
get_key = itemgetter(PRIORITY, MSG_ID)


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
    """Build an entry with keyword defaults (convenience for tests and cold paths)."""
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


# -- message ids ------------------------------------------------------------------------------
# Layout: ``(ms since EPOCH) << SEQ_BITS | sequence``; the generator is mqhub.core.ids.

#: 2020-01-01T00:00:00Z, the zero of the id time field.
EPOCH = 1577836800.0
SEQ_BITS = 22
MAX_ID = (1 << 64) - 1


def first_id_at(when: float) -> int:
    """Return the lowest id made at POSIX time ``when`` (ids below it are older)."""
    return int((when - EPOCH) * 1000.0) << SEQ_BITS


def id_time(msg_id: int) -> float:
    """Return the POSIX time (seconds) encoded in ``msg_id``."""
    return EPOCH + (msg_id >> SEQ_BITS) / 1000.0


def format_id(msg_id: int) -> str:
    """Render ``msg_id`` as 16 lowercase hex characters (NSQ's message-id width)."""
    return f"{msg_id:016x}"


def parse_id(text: str | bytes) -> int:
    """Parse a 16-hex-character id; raise ValueError on anything else."""
    if isinstance(text, bytes):
        text = text.decode("ascii", "replace")
    if len(text) != 16:
        raise ValueError("message id must be 16 hex characters")
    return int(text, 16)


# -- address names ----------------------------------------------------------------------------
# The pattern syntax and the trie that matches it are in mqhub.core.address.

#: the longest address or pattern the core accepts (docs/core-api.md, "Addresses")
MAX_ADDRESS = 1024
_BAD = re.compile(r"[\s\x00]")


def validate_address(address: str) -> None:
    """Raise InvalidName unless ``address`` is a publishable address (no wildcards)."""
    if not address or len(address) > MAX_ADDRESS or _BAD.search(address):
        raise InvalidName(f"invalid address {address[:64]!r}")
    for token in address.split("."):
        if not token or token == ">" or token == "#" or "*" in token:
            raise InvalidName(f"invalid address {address[:64]!r}")


def validate_pattern(pattern: str) -> None:
    """Raise InvalidName unless ``pattern`` is a valid subscription pattern."""
    if not pattern or len(pattern) > MAX_ADDRESS or _BAD.search(pattern):
        raise InvalidName(f"invalid pattern {pattern[:64]!r}")
    tokens = pattern.split(".")
    for i, token in enumerate(tokens):
        if not token:
            raise InvalidName(f"invalid pattern {pattern[:64]!r}")
        if (token == ">" or token == "#") and i != len(tokens) - 1:
            raise InvalidName(f"{token!r} must be the last token")
        if len(token) > 1 and (">" in token or "#" in token):
            raise InvalidName(f"invalid pattern {pattern[:64]!r}")


def is_pattern(text: str) -> bool:
    """True when ``text`` contains a wildcard (``*``, a final ``>`` or ``#``)."""
    if "*" in text:
        return True
    return text.endswith((">", "#")) and (len(text) == 1 or text[-2] == ".")


# -- dead letters -----------------------------------------------------------------------------
# A dead letter is the entry with its reason, last error, original priority, time and queue in
# these reserved headers (mqhub.core.deadletter writes them; DeadLetter and replay strip them).

H_REASON = "mqhub-dlq-reason"
H_ERROR = "mqhub-dlq-error"
H_PRIORITY = "mqhub-dlq-priority"
H_TIME = "mqhub-dlq-time"
H_QUEUE = "mqhub-dlq-queue"
DLQ_HEADERS = (H_REASON, H_ERROR, H_PRIORITY, H_TIME, H_QUEUE)

REASON_MAX_ATTEMPTS = "max_attempts"
REASON_OVERFLOW = "overflow"
REASON_EXPIRED = "expired"
REASON_REJECTED = "rejected"


def clean_headers(headers: dict[str, str] | None) -> dict[str, str] | None:
    """Headers without the reserved dead-letter keys (None when nothing is left)."""
    if not headers:
        return None
    out = {k: v for k, v in headers.items() if k not in DLQ_HEADERS}
    return out or None


@dataclass
class DeadLetter:
    """A dead-lettered message with why it died (a cold-path record)."""

    msg_id: int
    queue: str
    address: str
    body: bytes
    headers: dict[str, str] | None
    priority: int
    attempts: int
    reason: str
    last_error: str | None
    origin: str
    dead_at: float

    @classmethod
    def from_entry(cls, dead: Entry, queue: str) -> DeadLetter:
        """Build the record from a stored dead-letter entry."""
        msg_id, _, attempts, _, _, address, headers, body, origin = dead
        h = headers or {}
        return cls(msg_id, h.get(H_QUEUE, queue), address, body, clean_headers(headers),
                   int(h.get(H_PRIORITY, "0") or 0), attempts, h.get(H_REASON, ""),
                   h.get(H_ERROR), origin, float(h.get(H_TIME, "0") or 0.0))


# -- peers -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Peer:
    """Another node of the hub as a client of one protocol reaches it (``ICore.peers``).

    :ivar node: the node's name (NSQ's ``hostname`` in ``/lookup``).
    :ivar host: the address clients connect to.
    :ivar ports: role -> port of the protocol's listeners on that node (``{"tcp": 4150,
        "http": 4151}``).
    """

    node: str
    host: str
    ports: dict[str, int]


# -- queue words ------------------------------------------------------------------------------

TIER_MEMORY = "memory"
TIER_DURABLE = "durable"
TIERS = (TIER_MEMORY, TIER_DURABLE)
#: delivery modes: each message to one consumer, or a copy to every consumer
MODES = ("competing", "fanout")
OVERFLOW_POLICIES = ("drop_oldest", "reject", "dead_letter")
#: why an ack/requeue/touch/reject refused an id (IQueue.failure_reasons)
NOT_IN_FLIGHT = "not_in_flight"
NOT_OWNER = "not_owner"
#: header a message may carry to override its queue's ``max_attempts``
MAX_ATTEMPTS_HEADER = "mqhub-max-attempts"
