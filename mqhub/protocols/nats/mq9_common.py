"""What the mq9 modules share: subject prefixes, the kinds of after-commit operations, and
header helpers (:mod:`mqhub.protocols.nats.mq9` assembles the layer)."""

from __future__ import annotations

from mqhub.protocols.nats import codec

#: every mq9 subject starts so (``settings.MQ9_PREFIX`` is this)
PREFIX = "$mq9.AI."
MAILBOX = PREFIX + "MAILBOX."
#: persisted-broadcast subjects (``settings.BROADCAST_PREFIX`` is this)
BROADCAST = PREFIX + "BROADCAST."
#: live mailboxes by default: an empty one costs ~5.2 KB of RAM (three core queues, their
#: bindings and records; docs/core-api.md "Memory"), so 250,000 stay near 1.2 GiB
DEFAULT_MAX_MAILBOXES = 250_000

# kinds of the after-commit operations in ``Mq9.ops`` (first field of each op tuple)
OP_BROADCAST = 2   # (kind, publisher, entry, seen, reply, hdr): deliver a persisted broadcast
OP_REPLY = 3       # (kind, reply subject, JSON bytes): answer a MAILBOX request
OP_PONG = 4        # (kind, connection): a flush() barrier's PONG
OP_PUSH = 5        # (kind, pusher, consumer, entries): push stored mailbox messages


def sub_pattern(subject: str) -> str:
    """The pattern a SUB matches on: mq9 lets a broadcast SUB end in ``#``, meaning ``>``."""
    if subject.startswith(BROADCAST) and subject.endswith(".#"):
        return subject[:-1] + ">"
    return subject


def no_mailbox(mail_id: str) -> str:
    """mq9's error text for a mailbox that does not exist (unknown, expired or removed)."""
    return f"mailbox {mail_id} does not exist"


def headers_dict(hdr: bytes | None) -> dict[str, str] | None:
    """A header block as a dict (last value wins), or None."""
    if not hdr:
        return None
    try:
        _, _, items = codec.parse_headers(hdr)
    except codec.ProtocolError:
        return None
    return dict(items) if items else None


def header_value(headers: dict[str, str] | None, name: str) -> str | None:
    """Case-insensitive header lookup."""
    if not headers:
        return None
    low = name.lower()
    for k, v in headers.items():
        if k.lower() == low:
            return v
    return None


def ttl_header(headers: dict[str, str] | None) -> float:
    """The ``mq9-ttl`` header as positive seconds, or 0."""
    raw = header_value(headers, "mq9-ttl")
    if raw is None:
        return 0.0
    try:
        ttl = float(raw)
    except ValueError:
        return 0.0
    return ttl if ttl > 0 else 0.0
