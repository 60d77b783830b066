"""Sans-IO codec of the VibeMQ binary protocol (no Twisted import).

A frame is ``[u32 BE body_len][u8 flags][body]``; flags 0 = plain, 1 = gzip, 2 = brotli, and
``body_len`` is the length as sent (compressed). The body holds, in order: version (u8), type
(u8), id (u16 length + UTF-8, required), queue (u16 + UTF-8, empty = none), payload (u32 length
+ UTF-8 JSON, empty = none), header count (u16) and pairs (u16 + UTF-8 each; pairs with an empty
key or value are dropped on decode), and, for type 99 only, error code and error message (u16 +
UTF-8 each). See docs/protocols/vibemq.md.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

import brotli

# command types --------------------------------------------------------------------------------
CONNECT, CONNECT_ACK, DISCONNECT = 0, 1, 2
PING, PONG = 10, 11
PUBLISH, PUBLISH_ACK, SUBSCRIBE, SUBSCRIBE_ACK = 20, 21, 22, 23
UNSUBSCRIBE, UNSUBSCRIBE_ACK, DELIVER = 24, 25, 26
ACK = 30
CREATE_QUEUE, DELETE_QUEUE, QUEUE_INFO, LIST_QUEUES = 40, 41, 42, 43
ADMIN_CREATE_USER, ADMIN_DELETE_USER, ADMIN_CHANGE_PASSWORD = 50, 51, 52
ADMIN_GRANT_PERMISSION, ADMIN_REVOKE_PERMISSION, ADMIN_LIST_USERS = 53, 54, 55
ADMIN_GET_USER_PERMISSIONS = 56
ERROR = 99

FLAG_NONE, FLAG_GZIP, FLAG_BROTLI = 0, 1, 2
#: ``supported-compression`` names and their frame flags
COMPRESSIONS = {"gzip": FLAG_GZIP, "brotli": FLAG_BROTLI}

VERSION = 1
DEFAULT_MAX_FRAME = 1 << 20
DEFAULT_MAX_DECOMPRESSED = 64 << 20
DEFAULT_THRESHOLD = 1024
MAX_STRING = 0xFFFF

_PREFIX = struct.Struct(">IB")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_HEAD = struct.Struct(">BBH")


class ProtocolError(Exception):
    """A framing error: the stream cannot be resynchronised, so the connection must close."""


class BadFrame:
    """A complete frame whose body is invalid; ``id`` is the request id when it could be read."""

    __slots__ = ("id", "type", "code", "message")

    def __init__(self, id: str | None, type: int, code: str, message: str) -> None:
        """:param code: the VibeMQ error code to answer with (INVALID_MESSAGE...)."""
        self.id = id
        self.type = type
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"BadFrame({self.id!r}, {self.type}, {self.code!r}, {self.message!r})"


class Frame:
    """One decoded VibeMQ message. ``payload`` is the raw JSON bytes (None when absent)."""

    __slots__ = ("version", "type", "id", "queue", "payload", "headers", "error_code",
                 "error_message", "flags")

    def __init__(self, type: int, id: str, queue: str | None = None, payload: bytes | None = None,
                 headers: dict[str, str] | None = None, error_code: str | None = None,
                 error_message: str | None = None, version: int = VERSION,
                 flags: int = FLAG_NONE) -> None:
        """:param flags: the compression flag the frame arrived with (decode only)."""
        self.version = version
        self.type = type
        self.id = id
        self.queue = queue
        self.payload = payload
        self.headers = headers
        self.error_code = error_code
        self.error_message = error_message
        self.flags = flags

    def json(self) -> Any:
        """The payload parsed as JSON (None when absent)."""
        return None if self.payload is None else json.loads(self.payload)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Frame) and all(
            getattr(self, k) == getattr(other, k) for k in self.__slots__ if k != "flags")

    def __repr__(self) -> str:
        return (f"Frame(type={self.type}, id={self.id!r}, queue={self.queue!r}, "
                f"payload={self.payload!r}, headers={self.headers!r}, "
                f"error={self.error_code!r}/{self.error_message!r})")


# encoding -----------------------------------------------------------------------------------

def _str(text: str | None) -> bytes:
    """u16 length + UTF-8 (None and "" are both length 0)."""
    if not text:
        return b"\x00\x00"
    raw = text.encode("utf-8")
    if len(raw) > MAX_STRING:
        raise ValueError(f"string of {len(raw)} UTF-8 bytes exceeds 65535")
    return _U16.pack(len(raw)) + raw


def encode_headers(headers: dict[str, str] | None) -> bytes:
    """u16 count and the key/value pairs (insertion order)."""
    if not headers:
        return b"\x00\x00"
    if len(headers) > MAX_STRING:
        raise ValueError("too many headers")
    parts = [_U16.pack(len(headers))]
    for k, v in headers.items():
        parts.append(_str(k))
        parts.append(_str(v))
    return b"".join(parts)


def encode_body(type: int, id: str, queue: str | None = None, payload: bytes | None = None,
                headers: dict[str, str] | None = None, error_code: str | None = None,
                error_message: str | None = None, version: int = VERSION) -> bytes:
    """The uncompressed body of one message.

    :raises ValueError: for an empty id or a string over 65,535 UTF-8 bytes.
    """
    if not id:
        raise ValueError("id is required")
    parts = [bytes((version, type)), _str(id), _str(queue),
             _U32.pack(len(payload)) + payload if payload else b"\x00\x00\x00\x00",
             encode_headers(headers)]
    if type == ERROR:
        parts.append(_str(error_code))
        parts.append(_str(error_message))
    return b"".join(parts)


def compression_names(names: str) -> list[str]:
    """The known compression names of a comma-separated list, lower-cased, in its order."""
    return [n for n in (x.strip().lower() for x in names.split(",")) if n in COMPRESSIONS]


def negotiate_compression(offered: str, supported: list[str]) -> str | None:
    """The first name of the client's ``supported-compression`` list the server also supports.

    The client's order wins; None when they share none (the connection stays uncompressed).
    """
    return next((n for n in compression_names(offered) if n in supported), None)


def compress(body: bytes, flag: int) -> bytes:
    """``body`` compressed for frame flag ``flag`` (fast levels, like .NET's Fastest)."""
    if flag == FLAG_GZIP:
        return zlib.compress(body, 1, wbits=31)
    if flag == FLAG_BROTLI:
        return brotli.compress(body, quality=1)
    return body


def frame(body: bytes, flag: int = FLAG_NONE, threshold: int = DEFAULT_THRESHOLD) -> bytes:
    """Wrap ``body`` in a frame, compressed with ``flag`` when it is at least ``threshold`` long."""
    if flag and len(body) >= threshold:
        data = compress(body, flag)
        return _PREFIX.pack(len(data), flag) + data
    return _PREFIX.pack(len(body), FLAG_NONE) + body


def encode(msg: Frame, flag: int = FLAG_NONE, threshold: int = DEFAULT_THRESHOLD) -> bytes:
    """A whole frame for ``msg``."""
    return frame(encode_body(msg.type, msg.id, msg.queue, msg.payload, msg.headers,
                             msg.error_code, msg.error_message, msg.version), flag, threshold)


def encode_error(id: str, code: str, message: str) -> bytes:
    """An uncompressed Error (99) frame."""
    return frame(encode_body(ERROR, id, None, None, None, code, message))


# decoding -----------------------------------------------------------------------------------

class _Short(Exception):
    """The body ended inside a field."""


def _read_str(body: bytes, pos: int, what: str) -> tuple[str | None, int]:
    """A u16-prefixed UTF-8 string at ``pos`` (None when empty) and the next position."""
    end = pos + 2
    if end > len(body):
        raise _Short(what)
    (n,) = _U16.unpack_from(body, pos)
    if not n:
        return None, end
    stop = end + n
    if stop > len(body):
        raise _Short(what)
    return body[end:stop].decode("utf-8"), stop


def decode_body(body: bytes, flags: int = FLAG_NONE,
                _cache: dict[bytes, str] = {}) -> Frame | BadFrame:  # noqa: B006
    """Decode one body; a malformed one gives a :class:`BadFrame` (the stream stays usable).

    The common shape (ASCII id and queue, no headers, not an Error) is read inline; queue names
    are decoded once and cached (a bounded cache shared by all connections).
    """
    size = len(body)
    if size < 2:
        return BadFrame(None, -1, "INVALID_MESSAGE", "Frame body too short.")
    type_ = body[1]
    if size >= 12 and type_ != ERROR:
        n = (body[2] << 8) | body[3]
        q = 4 + n
        if n and q + 2 <= size:
            qn = (body[q] << 8) | body[q + 1]
            p = q + 2 + qn
            if p + 6 <= size:
                plen = (body[p] << 24) | (body[p + 1] << 16) | (body[p + 2] << 8) | body[p + 3]
                h = p + 4 + plen
                if h + 2 <= size and body[h] == 0 and body[h + 1] == 0:
                    raw_q = body[q + 2:p]
                    queue = _cache.get(raw_q) if qn else None
                    try:
                        if queue is None and qn:
                            queue = raw_q.decode("utf-8")
                            if len(_cache) < 4096:
                                _cache[raw_q] = queue
                        msg_id = body[4:q].decode("utf-8")
                    except UnicodeDecodeError:
                        pass  # the slow path names the field and keeps the id if it can
                    else:
                        return Frame(type_, msg_id, queue, body[p + 4:h] if plen else None,
                                     None, None, None, body[0], flags)
    return _decode_slow(body, flags)


def _decode_slow(body: bytes, flags: int) -> Frame | BadFrame:
    """Field-by-field decode with precise errors (headers, Error frames, malformed bodies)."""
    version, type_ = body[0], body[1]
    msg_id: str | None = None
    try:
        msg_id, pos = _read_str(body, 2, "id")
        if not msg_id:
            return BadFrame(None, type_, "INVALID_MESSAGE", "Message id is required.")
        queue, pos = _read_str(body, pos, "queue")
        if pos + 4 > len(body):
            raise _Short("payload")
        (plen,) = _U32.unpack_from(body, pos)
        pos += 4
        payload = None
        if plen:
            if pos + plen > len(body):
                raise _Short("payload")
            payload = body[pos:pos + plen]
            pos += plen
        if pos + 2 > len(body):
            raise _Short("headers")
        (count,) = _U16.unpack_from(body, pos)
        pos += 2
        headers: dict[str, str] | None = None
        if count:
            headers = {}
            for _ in range(count):
                key, pos = _read_str(body, pos, "header key")
                value, pos = _read_str(body, pos, "header value")
                if key and value:
                    headers[key] = value
            if not headers:
                headers = None
        code = text = None
        if type_ == ERROR:
            code, pos = _read_str(body, pos, "error code")
            text, pos = _read_str(body, pos, "error message")
    except _Short as exc:
        return BadFrame(msg_id, type_, "INVALID_MESSAGE", f"Truncated frame body ({exc}).")
    except UnicodeDecodeError:
        return BadFrame(msg_id, type_, "INVALID_MESSAGE", "Invalid UTF-8 in frame body.")
    return Frame(type_, msg_id, queue, payload, headers, code, text, version, flags)


class FrameDecoder:
    """Incremental frame reader: ``feed(data)`` returns the complete messages so far.

    :raises ProtocolError: from ``feed`` on a bad length or flag, a corrupt compressed body, or
        a body that decompresses past ``max_decompressed``; the connection must then close.
    """

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME,
                 max_decompressed: int = DEFAULT_MAX_DECOMPRESSED) -> None:
        """:param max_frame: the largest ``body_len`` accepted (1 MiB by default)."""
        self.max_frame = max_frame
        self.max_decompressed = max_decompressed
        self._buf = bytearray()
        self._salvaged: list[Frame | BadFrame] = []

    def salvage(self) -> list[Frame | BadFrame]:
        """The frames a failed ``feed`` decoded before its error (to answer them first)."""
        out, self._salvaged = self._salvaged, []
        return out

    @property
    def buffered(self) -> int:
        """Bytes received and not yet decoded."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[Frame | BadFrame]:
        """Add ``data``; return every frame it completes, in order."""
        buf = self._buf
        if type(data) is not bytes:
            data = bytes(data)
        if buf:
            buf += data
            data = bytes(buf)
        out: list[Frame | BadFrame] = []
        pos = 0
        size = len(data)
        unpack = _PREFIX.unpack_from
        try:
            while size - pos >= 5:
                length, flags = unpack(data, pos)
                if length < 2 or length > self.max_frame:
                    raise ProtocolError(f"bad frame length {length}")
                if flags > FLAG_BROTLI:
                    raise ProtocolError(f"bad frame flags {flags}")
                end = pos + 5 + length
                if end > size:
                    break
                body = data[pos + 5:end]
                pos = end
                if flags:
                    body = self.decompress(body, flags)
                out.append(decode_body(body, flags))
        except ProtocolError:
            self._salvaged = out
            buf.clear()
            raise
        if pos < size:
            buf[:] = data[pos:]
        else:
            buf.clear()
        return out

    def decompress(self, data: bytes, flags: int) -> bytes:
        """Inflate one compressed body, capped at ``max_decompressed`` bytes."""
        cap = self.max_decompressed
        try:
            if flags == FLAG_GZIP:
                d = zlib.decompressobj(wbits=31)
                out = d.decompress(data, cap + 1)
                if len(out) > cap or d.unconsumed_tail:
                    raise ProtocolError("decompressed frame exceeds the limit")
                if not d.eof:
                    raise ProtocolError("truncated gzip body")
                return out
            b = brotli.Decompressor()
            out = b.process(data, output_buffer_limit=cap + 1)
            if len(out) > cap or not b.is_finished():
                raise ProtocolError("decompressed frame exceeds the limit or is truncated")
            return out
        except (zlib.error, brotli.error) as exc:
            raise ProtocolError(f"corrupt compressed body: {exc}") from exc


__all__ = [name for name in dir() if name.isupper() and not name.startswith("_")] + [
    "ProtocolError", "BadFrame", "Frame", "FrameDecoder", "encode", "encode_body",
    "encode_error", "encode_headers", "frame", "compress", "decode_body"]
