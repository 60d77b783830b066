"""NSQ V2 frames and message ids: server frames out, client commands out, client frames in.

Sans-IO (no Twisted).  Server -> client frames are ``[int32 size][int32 type][data]``; message data
is ``[int64 ns timestamp][uint16 attempts][16-byte id][body]``.  :class:`ClientCodec` decodes that
stream (tests, the benchmark and load tools use it); the ``encode_*`` functions build both
directions; ``render_id(s)``/``parse_id(s)`` map 64-bit hub ids to nsqd's 16-hex-digit ids.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Final

from mqhub.protocols.nsq.events import (
    CLOSE_WAIT,
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    HEARTBEAT,
    NEED_DATA,
    OK,
    Auth,
    Cls,
    Command,
    Dpub,
    Fin,
    Identify,
    Mpub,
    NeedData,
    Nop,
    ProtocolError,
    Pub,
    Rdy,
    Req,
    Sub,
    Touch,
)

#: a big-endian int32: the sizes and counts before bodies in both directions
I32: Final = struct.Struct(">i")
_FRAME_HEAD = struct.Struct(">ii")
#: a message frame's head: size, frame type, timestamp (ns), attempts (the 16-byte id follows)
MSG_HEAD: Final = struct.Struct(">iiqH")
_MSG_META = struct.Struct(">qH")


def encode_frame(frame_type: int, data: bytes) -> bytes:
    """One server frame: ``[int32 size][int32 type][data]``."""
    return _FRAME_HEAD.pack(len(data) + 4, frame_type) + data


def encode_response(data: bytes) -> bytes:
    """A response frame (``OK``, ``CLOSE_WAIT``, ``_heartbeat_``, JSON)."""
    return encode_frame(FRAME_RESPONSE, data)


def encode_error(text: bytes) -> bytes:
    """An error frame carrying ``b"CODE description"``."""
    return encode_frame(FRAME_ERROR, text)


#: Prebuilt frames sent often.
OK_FRAME: Final = encode_response(OK)
HEARTBEAT_FRAME: Final = encode_response(HEARTBEAT)
CLOSE_WAIT_FRAME: Final = encode_response(CLOSE_WAIT)


def encode_message(timestamp_ns: int, attempts: int, msg_id: bytes, body: bytes) -> bytes:
    """A message frame: header (30 bytes incl. size and type) followed by the body."""
    return MSG_HEAD.pack(len(body) + 30, FRAME_MESSAGE, timestamp_ns, attempts) + msg_id + body


def render_id(msg_id: int) -> bytes:
    """Render a 64-bit hub id as nsqd does: 16 lowercase hex ASCII bytes."""
    return b"%016x" % msg_id


_HEX = b"0123456789abcdefABCDEF"
_IDS: dict[int, struct.Struct] = {}
_HEX_IDS: dict[int, struct.Struct] = {}


def render_ids(ids: list[int]) -> tuple[bytes, ...]:
    """:func:`render_id` of many ids at once (one pack, one hex, one unpack)."""
    n = len(ids)
    st = _HEX_IDS.get(n)
    if st is None:
        if len(_HEX_IDS) >= 256:
            _HEX_IDS.clear()
        st = _HEX_IDS[n] = struct.Struct("16s" * n)
    return st.unpack(id_struct(n).pack(*ids).hex().encode())


def id_struct(count: int) -> struct.Struct:
    """A cached Struct reading ``count`` big-endian 64-bit ids."""
    st = _IDS.get(count)
    if st is None:
        if len(_IDS) >= 256:
            _IDS.clear()
        st = _IDS[count] = struct.Struct(f">{count}Q")
    return st


def parse_id(raw: bytes) -> int | None:
    """Inverse of :func:`render_id`; None when ``raw`` is not exactly 16 hex digits."""
    if len(raw) != 16 or raw.translate(None, _HEX):
        return None
    return int(raw, 16)


def parse_ids(raws: list[bytes]) -> tuple[list[int], list[bytes]]:
    """Parse many ids at once: (hub ids, raw ids that are not 16 hex digits)."""
    if raws and set(map(len, raws)) == {16} and not b"".join(raws).translate(None, _HEX):
        return [int(r, 16) for r in raws], []
    good: list[int] = []
    bad: list[bytes] = []
    for raw in raws:
        parsed = parse_id(raw)
        if parsed is None:
            bad.append(raw)
        else:
            good.append(parsed)
    return good, bad


# -- client side: commands out -----------------------------------------------------------------


def _names(*names: str) -> bytes:
    """Join command parameters."""
    return " ".join(names).encode("utf-8")


def encode_identify(fields: dict) -> bytes:
    """IDENTIFY with a JSON body."""
    body = json.dumps(fields).encode()
    return b"IDENTIFY\n" + I32.pack(len(body)) + body


def encode_auth(secret: bytes) -> bytes:
    """AUTH with a secret."""
    return b"AUTH\n" + I32.pack(len(secret)) + secret


def encode_sub(topic: str, channel: str) -> bytes:
    """SUB topic channel."""
    return b"SUB " + _names(topic, channel) + b"\n"


def encode_pub(topic: str, body: bytes) -> bytes:
    """PUB topic with a body."""
    return b"PUB " + topic.encode() + b"\n" + I32.pack(len(body)) + body


def encode_dpub(topic: str, defer_ms: int, body: bytes) -> bytes:
    """DPUB topic defer_ms with a body."""
    return b"DPUB %s %d\n" % (topic.encode(), defer_ms) + I32.pack(len(body)) + body


def encode_mpub(topic: str, bodies: list[bytes]) -> bytes:
    """MPUB topic with the bodies."""
    parts = [I32.pack(len(b)) + b for b in bodies]
    payload = I32.pack(len(bodies)) + b"".join(parts)
    return b"MPUB " + topic.encode() + b"\n" + I32.pack(len(payload)) + payload


def encode_rdy(count: int) -> bytes:
    """RDY count."""
    return b"RDY %d\n" % count


def encode_fin(msg_id: bytes) -> bytes:
    """FIN id."""
    return b"FIN " + msg_id + b"\n"


def encode_req(msg_id: bytes, timeout_ms: int) -> bytes:
    """REQ id timeout_ms."""
    return b"REQ " + msg_id + b" %d\n" % timeout_ms


def encode_touch(msg_id: bytes) -> bytes:
    """TOUCH id."""
    return b"TOUCH " + msg_id + b"\n"


def encode_command(event: Command) -> bytes:
    """Encode any command event back to its wire form (the inverse of :class:`ServerCodec`)."""
    if isinstance(event, Pub):
        return encode_pub(event.topic, event.body)
    if isinstance(event, Mpub):
        return encode_mpub(event.topic, event.bodies)
    if isinstance(event, Dpub):
        return encode_dpub(event.topic, event.defer_ms, event.body)
    if isinstance(event, Sub):
        return encode_sub(event.topic, event.channel)
    if isinstance(event, Rdy):
        return encode_rdy(event.count)
    if isinstance(event, Fin):
        return encode_fin(event.msg_id)
    if isinstance(event, Req):
        return encode_req(event.msg_id, event.timeout_ms)
    if isinstance(event, Touch):
        return encode_touch(event.msg_id)
    if isinstance(event, Identify):
        return b"IDENTIFY\n" + I32.pack(len(event.body)) + event.body
    if isinstance(event, Auth):
        return encode_auth(event.secret)
    if isinstance(event, Cls):
        return b"CLS\n"
    if isinstance(event, Nop):
        return b"NOP\n"
    raise TypeError(f"not an NSQ command: {event!r}")


# -- client side: frames in --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Response:
    """A response frame's data."""

    data: bytes


@dataclass(frozen=True, slots=True)
class ErrorFrame:
    """An error frame: the code and the description."""

    code: str
    message: str


@dataclass(frozen=True, slots=True)
class Message:
    """A message frame, decoded."""

    timestamp_ns: int
    attempts: int
    msg_id: bytes
    body: bytes


Frame = Response | ErrorFrame | Message


class ClientCodec:
    """Incremental decoder of the server -> client frame stream (for tests and load tools)."""

    def __init__(self, max_frame: int = 64 * 1024 * 1024) -> None:
        """:param max_frame: largest frame accepted before raising ProtocolError."""
        self.max_frame = max_frame
        self._buf = b""
        self._pos = 0

    def receive_data(self, data: bytes) -> None:
        """Add bytes read from the server."""
        self._buf = self._buf[self._pos:] + data
        self._pos = 0

    def next_event(self) -> Frame | NeedData:
        """Return the next complete frame or :data:`NEED_DATA`.

        :raises ProtocolError: on a frame size out of range or an unknown frame type.
        """
        buf, pos = self._buf, self._pos
        if len(buf) - pos < 8:
            return NEED_DATA
        size, ftype = _FRAME_HEAD.unpack_from(buf, pos)
        if size < 4 or size > self.max_frame:
            raise ProtocolError("E_BAD_FRAME", f"frame size {size}")
        end = pos + 4 + size
        if len(buf) < end:
            return NEED_DATA
        data = buf[pos + 8:end]
        self._pos = end
        if ftype == FRAME_RESPONSE:
            return Response(data)
        if ftype == FRAME_ERROR:
            code, _, message = data.decode("utf-8", "replace").partition(" ")
            return ErrorFrame(code, message)
        if ftype == FRAME_MESSAGE:
            if len(data) < 26:
                raise ProtocolError("E_BAD_FRAME", "message frame too short")
            ts, attempts = _MSG_META.unpack_from(data, 0)
            return Message(ts, attempts, data[10:26], data[26:])
        raise ProtocolError("E_BAD_FRAME", f"unknown frame type {ftype}")

    def frames(self) -> list[Frame]:
        """Return every complete frame buffered now."""
        out: list[Frame] = []
        while True:
            ev = self.next_event()
            if ev is NEED_DATA:
                return out
            out.append(ev)  # type: ignore[arg-type]
