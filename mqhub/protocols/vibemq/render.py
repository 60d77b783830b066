"""Outgoing VibeMQ frames built from core entries (Deliver, PublishAck), batch at a time.

Payload rule for messages other protocols published (their bodies are bytes, not JSON):
a body that is valid JSON is sent as is; UTF-8 text that is not JSON becomes a JSON string of
that text with header ``payload-encoding: text``; other bytes become a JSON string of their
base64 with header ``payload-encoding: base64``; an empty body is "no payload". VibeMQ's own
publishes were checked as JSON on the way in and go out unchanged. No Twisted import.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterable

from mqhub.protocols.vibemq.codec import DELIVER, PUBLISH_ACK, VERSION, frame

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
H_ATTEMPTS = "deliveryAttempts"
H_ENCODING = "payload-encoding"
_ATTEMPTS_KEY = _U16.pack(len(H_ATTEMPTS)) + H_ATTEMPTS.encode()
_DELIVER_HEAD = bytes((VERSION, DELIVER)) + b"\x00\x10"  # ids are 16 hex characters
_ACK_HEAD = bytes((VERSION, PUBLISH_ACK))


def render_payload(body: bytes, origin: str) -> tuple[bytes | None, str | None]:
    """The JSON payload to send for ``body`` and the ``payload-encoding`` value (or None)."""
    if not body:
        return None, None
    if origin == "vibemq":
        return body, None
    try:
        json.loads(body)
        return body, None
    except ValueError:
        pass
    try:
        return json.dumps(body.decode("utf-8")).encode(), "text"
    except UnicodeDecodeError:
        return json.dumps(base64.b64encode(body).decode("ascii")).encode(), "base64"


def _pair(key: str, value: str) -> bytes:
    """One header pair (over-long values are cut to what a u16 length can hold)."""
    k = key.encode("utf-8")[:0xFFFF]
    v = value.encode("utf-8")[:0xFFFF]
    return _U16.pack(len(k)) + k + _U16.pack(len(v)) + v


def deliver_body(msg_id: int, queue_field: bytes, payload: bytes | None,
                 headers: dict[str, str] | None, extra: Iterable[tuple[str, str]] = (),
                 attempts: int = 0) -> bytes:
    """The body of one Deliver frame.

    :param queue_field: the queue as an encoded u16 string (shared by a batch).
    :param extra: more header pairs after the publisher's; ``attempts`` adds ``deliveryAttempts``.
    """
    pairs = [_pair(k, v) for k, v in headers.items() if k and v] if headers else []
    pairs.extend(_pair(k, v) for k, v in extra)
    if attempts:
        a = str(attempts).encode()
        pairs.append(_ATTEMPTS_KEY + _U16.pack(len(a)) + a)
    return b"".join((_DELIVER_HEAD, b"%016x" % msg_id, queue_field,
                     _U32.pack(len(payload)) + payload if payload else b"\x00\x00\x00\x00",
                     _U16.pack(len(pairs)), *pairs))


def queue_field(queue: str) -> bytes:
    """A queue name as a u16 string field."""
    raw = queue.encode("utf-8")
    return _U16.pack(len(raw)) + raw


def deliver_frames(entries: list[tuple], queue: str, flag: int, threshold: int,
                   limit: int = 1 << 20) -> tuple[bytes, list[int]]:
    """Deliver frames for core entries (one write's worth), and the ids left out.

    An entry whose frame body would exceed ``limit`` (the .NET client drops the connection on a
    frame over 1 MiB, so such a message could never be delivered) is left out and its id
    returned. Fast path: a VibeMQ-published entry without headers, left uncompressed, is one
    ``%`` format (no per-field joins).
    """
    too_big: list[int] = []
    qf = queue_field(queue)
    out = []
    pack = _U32.pack
    fast = b"%b\x00" + _DELIVER_HEAD + b"%016x" + qf.replace(b"%", b"%%") + b"%b%b\x00\x01" + _ATTEMPTS_KEY + b"%b"
    # body = head(4) + id(16) + queue + u32 + payload + u16 count + key + u16 len + attempts
    fixed = 4 + 16 + len(qf) + 4 + 2 + len(_ATTEMPTS_KEY) + 2
    for msg_id, _, attempts, _, _, _, headers, body_, origin in entries:
        if headers is None and origin == "vibemq" and body_:
            a = b"%d" % attempts
            size = fixed + len(body_) + len(a)
            if size > limit:
                too_big.append(msg_id)
                continue
            if not flag or size < threshold:
                out.append(fast % (pack(size), msg_id, pack(len(body_)), body_,
                                   _U16.pack(len(a)) + a))
                continue
        payload, enc = render_payload(body_, origin)
        body = deliver_body(msg_id, qf, payload, headers,
                            ((H_ENCODING, enc),) if enc else (), attempts)
        data = frame(body, flag, threshold)
        if len(data) - 5 > limit:
            too_big.append(msg_id)
            continue
        out.append(data)
    return b"".join(out), too_big


def publish_acks(ids: list[str], queue: str) -> bytes:
    """PublishAck frames (uncompressed: they are far below any threshold) for ``ids``."""
    tail = queue_field(queue) + b"\x00\x00\x00\x00\x00\x00"
    out = []
    for i in ids:
        raw = i.encode("utf-8")
        n = len(raw) + 2 + len(tail)
        out.append(b"".join((_U32.pack(n + 2), b"\x00", _ACK_HEAD, _U16.pack(len(raw)), raw, tail)))
    return b"".join(out)
