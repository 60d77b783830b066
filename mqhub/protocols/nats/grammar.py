"""What is valid on the NATS wire: subjects, header blocks, CONNECT/INFO JSON, protocol errors.

Sans-IO (no Twisted); the parser in :mod:`mqhub.protocols.nats.codec` raises these errors and
re-exports every public name here, so ``codec.ProtocolError`` and friends keep working.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "ProtocolError", "MAX_CONTROL_LINE", "DEFAULT_MAX_PAYLOAD", "E_UNKNOWN_OP", "E_MAX_CONTROL",
    "E_MAX_PAYLOAD", "E_BAD_ARGS", "E_BAD_CONNECT", "E_INVALID_SUBJECT", "json_object",
    "valid_subject", "valid_publish_subject", "parse_headers", "build_headers", "size_field",
    "text_field",
]

#: nats-server's real limit for one control line (its docs' 1024 is stale).
MAX_CONTROL_LINE = 4096
#: Default maximum payload (announced in INFO as ``max_payload``).
DEFAULT_MAX_PAYLOAD = 1024 * 1024

# ProtocolError codes. The server maps each to the wire in one place (server.py).
E_UNKNOWN_OP = "unknown_op"          # -ERR 'Unknown Protocol Operation', close
E_MAX_CONTROL = "max_control_line"   # -ERR 'maximum control line exceeded', close
E_MAX_PAYLOAD = "max_payload"        # -ERR 'Maximum Payload Violation', close
E_BAD_ARGS = "bad_args"              # close without -ERR (as nats-server does)
E_BAD_CONNECT = "bad_connect"        # close without -ERR
E_INVALID_SUBJECT = "invalid_subject"  # -ERR 'Invalid Subject', stays open


def json_object(raw: bytes, code: str, verb: str) -> dict[str, Any]:
    """Parse the JSON object argument of CONNECT or INFO (empty means ``{}``).

    :raises ProtocolError: with ``code`` when it is not valid JSON or not an object.
    """
    raw = raw.strip()
    try:
        value = json.loads(raw) if raw else {}
    except ValueError as exc:
        raise ProtocolError(code, f"invalid {verb} JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ProtocolError(code, f"{verb} JSON must be an object")
    return value


class ProtocolError(Exception):
    """A violation of the NATS protocol found by the codec.

    :ivar code: one of the ``E_*`` codes (no wire text; the server maps it).
    :ivar message: human-readable detail.
    :ivar fatal: whether the connection must be closed.
    """

    def __init__(self, code: str, message: str, fatal: bool = True) -> None:
        """Record the code, the detail and whether the connection ends."""
        super().__init__(message)
        self.code = code
        self.message = message
        self.fatal = fatal

    def __repr__(self) -> str:
        """Show code, message and fatality."""
        return f"ProtocolError({self.code!r}, {self.message!r}, fatal={self.fatal})"


_WS = frozenset(" \t\r\n\f\v")


def valid_subject(subject: str) -> bool:
    """True when ``subject`` is a valid SUB subject: non-empty tokens, ``>`` only last."""
    if not subject:
        return False
    tokens = subject.split(".")
    last = len(tokens) - 1
    for i, tok in enumerate(tokens):
        if not tok:
            return False
        if tok == ">" and i != last:
            return False
    return not any(c in _WS for c in subject)


def valid_publish_subject(subject: str) -> bool:
    """True when ``subject`` is a valid PUB subject: a valid subject without wildcard tokens."""
    if not valid_subject(subject):
        return False
    for tok in subject.split("."):
        if tok == "*" or tok == ">":
            return False
    return True


def parse_headers(block: bytes) -> tuple[int | None, str, list[tuple[str, str]]]:
    """Parse a ``NATS/1.0`` header block into ``(status, description, [(name, value), ...])``.

    :raises ProtocolError: (fatal, bad_args) when the block does not start with ``NATS/1.0``.
    """
    text = block.decode("utf-8", "replace")
    lines = text.split("\r\n")
    first = lines[0]
    if not first.startswith("NATS/1.0"):
        raise ProtocolError(E_BAD_ARGS, "header block must start with NATS/1.0")
    status: int | None = None
    description = ""
    rest = first[8:].strip()
    if rest:
        code, _, description = rest.partition(" ")
        if code.isdigit():
            status = int(code)
        description = description.strip()
    items: list[tuple[str, str]] = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            continue
        items.append((name.strip(), value.strip()))
    return status, description, items


def build_headers(items: Any = (), status: int | None = None, description: str = "") -> bytes:
    """Build a header block from ``(name, value)`` pairs or a dict, with an optional status line."""
    if isinstance(items, dict):
        items = items.items()
    first = "NATS/1.0"
    if status is not None:
        first += f" {status}"
        if description:
            first += f" {description}"
    parts = [first]
    for name, value in items:
        parts.append(f"{name}: {value}")
    return ("\r\n".join(parts) + "\r\n\r\n").encode("utf-8")


def size_field(field: bytes) -> int:
    """Parse a non-negative decimal size field or raise a bad-args ProtocolError."""
    if not field.isdigit():
        raise ProtocolError(E_BAD_ARGS, f"invalid size {field!r}")
    return int(field)


def text_field(field: bytes) -> str:
    """Decode a subject/sid/queue field (bytes that are not UTF-8 survive via surrogates)."""
    return field.decode("utf-8", "surrogateescape")
