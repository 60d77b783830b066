"""Versioned byte layout of the broker's delayed-delivery rows (payloads of the ``due`` table).

A stored due row must stay readable after a Python upgrade, so its payload is an explicit
big-endian layout instead of ``marshal``. The first byte names the layout:

``0x01`` queue row (``dq/<queue>/<msg_id>``): ``incarnation:u64`` then one entry.
``0x02`` address row (``da/<msg_id>``): ``alen:u16 | address | nmarks:u16``, per mark
         ``nlen:u16 | queue name | incarnation:u64``, then one entry.

An entry is ``msg_id:u64 | priority:u8 | attempts:u32 | deliver_at:f64 | expires_at:f64 |
metalen:u32 | meta | body`` with *meta* as in :func:`mqhub.store.codec.encode_meta`.

Rows written by older versions hold a ``marshal`` dump; its first byte is an ASCII type code,
never 0x01 or 0x02, so such a row is still decoded (with ``marshal``) and the broker rewrites
nothing: the row is consumed when it comes due. This module imports neither Twisted nor zope.
"""

from __future__ import annotations

import marshal
import struct

from mqhub.store.codec import decode_meta, encode_meta
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

QUEUE_ROW_V1 = 0x01
ADDRESS_ROW_V1 = 0x02

_ENTRY = struct.Struct(">QBIddI")
_QUEUE_HEAD = struct.Struct(">BQ")
_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")

#: a due row's marks: ``(queue name, incarnation)`` of every queue counted at publish time
Marks = tuple[tuple[str, int], ...]


def _encode_entry(e: Entry) -> bytes:
    """Return the bytes of one entry tuple."""
    meta = encode_meta(e[ADDRESS], e[HEADERS], e[ORIGIN])
    return (_ENTRY.pack(e[MSG_ID], e[PRIORITY], e[ATTEMPTS], e[DELIVER_AT], e[EXPIRES_AT],
                        len(meta)) + meta + bytes(e[BODY]))


def _decode_entry(data: bytes, pos: int) -> Entry:
    """Decode the entry that starts at ``pos`` and runs to the end of ``data``."""
    msg_id, priority, attempts, deliver_at, expires_at, mlen = _ENTRY.unpack_from(data, pos)
    pos += _ENTRY.size
    if pos + mlen > len(data):
        raise ValueError("due row entry is truncated")
    address, headers, origin = decode_meta(data[pos:pos + mlen])
    body = bytes(data[pos + mlen:])
    return (msg_id, priority, attempts, deliver_at, expires_at, address, headers, body, origin)


def _legacy(payload: bytes) -> tuple:
    """Decode a row an older version wrote with ``marshal`` (read-only compatibility)."""
    try:
        value = marshal.loads(payload)
    except (EOFError, TypeError) as e:
        raise ValueError(f"unreadable legacy due row: {e}") from e
    if not isinstance(value, (tuple, list)):
        raise ValueError("legacy due row is not a tuple")
    return tuple(value)


def encode_queue_row(incarnation: int, entry: Entry) -> bytes:
    """Return the payload of a ``dq/`` row: ``entry`` held for a queue of ``incarnation``."""
    return _QUEUE_HEAD.pack(QUEUE_ROW_V1, incarnation) + _encode_entry(entry)


def decode_queue_row(payload: bytes) -> tuple[int, Entry]:
    """Return ``(incarnation, entry)`` of a ``dq/`` payload.

    :raises ValueError: when the payload is damaged or of an unknown layout.
    """
    try:
        if payload[:1] == bytes((QUEUE_ROW_V1,)):
            _, inc = _QUEUE_HEAD.unpack_from(payload)
            return inc, _decode_entry(payload, _QUEUE_HEAD.size)
        inc, entry = _legacy(payload)
        return int(inc), tuple(entry)
    except (struct.error, UnicodeDecodeError, TypeError) as e:
        raise ValueError(f"unreadable due row: {e}") from e


def encode_address_row(address: str, marks: Marks, entry: Entry) -> bytes:
    """Return the payload of a ``da/`` row: ``entry`` to route by ``address`` when due."""
    a = address.encode()
    parts = [bytes((ADDRESS_ROW_V1,)), _U16.pack(len(a)), a, _U16.pack(len(marks))]
    for name, inc in marks:
        n = name.encode()
        parts += (_U16.pack(len(n)), n, _U64.pack(inc))
    parts.append(_encode_entry(entry))
    return b"".join(parts)


def decode_address_row(payload: bytes) -> tuple[str, Marks, Entry]:
    """Return ``(address, marks, entry)`` of a ``da/`` payload.

    :raises ValueError: when the payload is damaged or of an unknown layout.
    """
    try:
        if payload[:1] != bytes((ADDRESS_ROW_V1,)):
            address, marks, entry = _legacy(payload)
            old_marks = tuple((str(n), int(i)) for n, i in marks)
            return str(address), old_marks, tuple(entry)
        pos = 1
        (alen,) = _U16.unpack_from(payload, pos)
        pos += 2
        address = payload[pos:pos + alen].decode()
        pos += alen
        (count,) = _U16.unpack_from(payload, pos)
        pos += 2
        out: list[tuple[str, int]] = []
        for _ in range(count):
            (nlen,) = _U16.unpack_from(payload, pos)
            pos += 2
            name = payload[pos:pos + nlen].decode()
            pos += nlen
            out.append((name, _U64.unpack_from(payload, pos)[0]))
            pos += 8
        return address, tuple(out), _decode_entry(payload, pos)
    except (struct.error, UnicodeDecodeError, TypeError) as e:
        raise ValueError(f"unreadable due row: {e}") from e
