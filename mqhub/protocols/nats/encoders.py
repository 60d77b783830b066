"""Encoders for the NATS wire: what the server sends (INFO, MSG, HMSG, -ERR) and what clients send.

Sans-IO (no Twisted); re-exported by :mod:`mqhub.protocols.nats.codec`.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "encode_info", "encode_connect", "encode_err", "msg_prefix", "hmsg_prefix", "encode_msg",
    "encode_hmsg", "encode_pub", "encode_hpub", "encode_sub", "encode_unsub", "PING", "PONG",
    "OK",
]

_CRLF = b"\r\n"


def encode_info(info: dict[str, Any]) -> bytes:
    """Render ``INFO {json} \\r\\n`` (nats-server's spacing)."""
    return b"INFO " + json.dumps(info, separators=(",", ":")).encode() + b" \r\n"


def encode_connect(options: dict[str, Any]) -> bytes:
    """Render a client ``CONNECT {json}\\r\\n``."""
    return b"CONNECT " + json.dumps(options, separators=(",", ":")).encode() + b"\r\n"


def encode_err(text: str) -> bytes:
    """Render ``-ERR '<text>'\\r\\n`` (clients require the quotes)."""
    return b"-ERR '" + text.encode("utf-8", "replace") + b"'\r\n"


def msg_prefix(subject: str, sid: str, reply: str | None, size: int) -> bytes:
    """Render the control line of a MSG (everything before the payload)."""
    if reply:
        return f"MSG {subject} {sid} {reply} {size}\r\n".encode("utf-8", "surrogateescape")
    return f"MSG {subject} {sid} {size}\r\n".encode("utf-8", "surrogateescape")


def hmsg_prefix(subject: str, sid: str, reply: str | None, hsize: int, total: int) -> bytes:
    """Render the control line of an HMSG (everything before the header block)."""
    if reply:
        line = f"HMSG {subject} {sid} {reply} {hsize} {total}\r\n"
    else:
        line = f"HMSG {subject} {sid} {hsize} {total}\r\n"
    return line.encode("utf-8", "surrogateescape")


def encode_msg(subject: str, sid: str, reply: str | None, payload: bytes) -> bytes:
    """Render a whole MSG."""
    return msg_prefix(subject, sid, reply, len(payload)) + payload + _CRLF


def encode_hmsg(subject: str, sid: str, reply: str | None, headers: bytes,
                payload: bytes) -> bytes:
    """Render a whole HMSG from a header block and a payload."""
    return (hmsg_prefix(subject, sid, reply, len(headers), len(headers) + len(payload))
            + headers + payload + _CRLF)


def encode_pub(subject: str, payload: bytes, reply: str | None = None) -> bytes:
    """Render a client PUB."""
    if reply:
        return f"PUB {subject} {reply} {len(payload)}\r\n".encode() + payload + _CRLF
    return f"PUB {subject} {len(payload)}\r\n".encode() + payload + _CRLF


def encode_hpub(subject: str, headers: bytes, payload: bytes,
                reply: str | None = None) -> bytes:
    """Render a client HPUB."""
    total = len(headers) + len(payload)
    if reply:
        line = f"HPUB {subject} {reply} {len(headers)} {total}\r\n"
    else:
        line = f"HPUB {subject} {len(headers)} {total}\r\n"
    return line.encode() + headers + payload + _CRLF


def encode_sub(subject: str, sid: str, queue: str | None = None) -> bytes:
    """Render a client SUB."""
    if queue:
        return f"SUB {subject} {queue} {sid}\r\n".encode()
    return f"SUB {subject} {sid}\r\n".encode()


def encode_unsub(sid: str, max_msgs: int | None = None) -> bytes:
    """Render a client UNSUB."""
    if max_msgs is None:
        return f"UNSUB {sid}\r\n".encode()
    return f"UNSUB {sid} {max_msgs}\r\n".encode()


PING = b"PING\r\n"
PONG = b"PONG\r\n"
OK = b"+OK\r\n"
