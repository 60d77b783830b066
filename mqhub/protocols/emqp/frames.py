"""eMQP/1.0 frames: parse and build every command's multipart message (sans-IO).

ZeroMQ already delimits messages, so the unit of this codec is a *multipart message* (a list
of frames), not a byte stream. A ROUTER socket hands us ``[identity, b"", b"eMQP/1.0",
COMMAND, MSGID, *body]``; :func:`parse_routed` checks it against the command table (frame
count, UTF-8 where eventmq peers will decode it, size limits) and returns a :class:`Command`
or raises :class:`ProtocolError` with a reason for the log line. :class:`FrameDecoder`
gives the project's ``receive_data`` / ``next_event`` shape on top of it and also accepts
frames one at a time (the ZMQ ``RCVMORE`` view).

The wire follows what eventmq 0.3.13 really sends (KBYE, 9-frame SCHEDULE, JSON INFORM,
5-frame ACK, 6-frame PUBLISH), not the older protocol text. This module imports neither
Twisted nor zope nor zmq.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import deque
from typing import NamedTuple

VERSION = b"eMQP/1.0"
EMPTY = b""

#: Returned by :meth:`FrameDecoder.next_event` when no complete message is buffered.
NEED_DATA = object()

#: Highest number of frames any eMQP message has (routing id included): SCHEDULE has 10.
MAX_FRAMES = 10
#: Default size limits (bytes).
DEFAULT_MAX_BODY = 16 * 1024 * 1024
MAX_IDENTITY = 255
MAX_MSGID = 255
MAX_NAME = 255
MAX_HEADERS = 4096

#: Body frame count (after COMMAND and MSGID) accepted per command, as (min, max).
ARITY: dict[bytes, tuple[int, int]] = {
    b"INFORM": (2, 2),
    b"READY": (0, 0),
    b"REQUEST": (3, 3),
    b"REPLY": (1, 2),
    b"HEARTBEAT": (0, 1),
    b"SCHEDULE": (5, 5),
    b"UNSCHEDULE": (5, 5),
    b"DISCONNECT": (0, 0),
    b"KBYE": (0, 0),
    b"PUBLISH": (2, 2),
    b"ACK": (1, 1),
}

#: Frames (by body index) that eventmq peers decode as UTF-8 and so must be valid UTF-8.
_TEXT_FIELDS: dict[bytes, tuple[int, ...]] = {
    b"INFORM": (0, 1),
    b"REQUEST": (0, 1, 2),
    b"REPLY": (0, 1),
    b"SCHEDULE": (0, 1, 2, 3, 4),
    b"UNSCHEDULE": (0, 1, 2, 3, 4),
    b"PUBLISH": (0, 1),
    b"ACK": (0,),
    b"HEARTBEAT": (0,),
}

# Error codes (eMQP has no error frame: a bad message is logged with its code and dropped).
E_SHORT = "E_SHORT_MESSAGE"
E_TOO_MANY = "E_TOO_MANY_FRAMES"
E_ENVELOPE = "E_BAD_ENVELOPE"
E_VERSION = "E_BAD_VERSION"
E_COMMAND = "E_UNKNOWN_COMMAND"
E_ARITY = "E_BAD_FRAME_COUNT"
E_UTF8 = "E_NOT_UTF8"
E_TOO_LARGE = "E_TOO_LARGE"
E_BAD_VALUE = "E_BAD_VALUE"
E_UNAUTHORIZED = "E_UNAUTHORIZED"


class ProtocolError(Exception):
    """A message that is not valid eMQP; ``fatal`` means forget the sending peer."""

    def __init__(self, code: str, message: str, fatal: bool = False) -> None:
        """Keep the machine-readable ``code`` and the human ``message``."""
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.fatal = fatal


class Command(NamedTuple):
    """One parsed eMQP message: who sent it, the command, its msgid and its body frames."""

    peer: bytes
    name: bytes
    msgid: bytes
    body: tuple[bytes, ...]


class Headers(NamedTuple):
    """The comma-separated header frame of REQUEST/SCHEDULE, decoded."""

    reply_requested: bool
    guarantee: bool
    retry_count: int
    timeout: int
    nohaste: bool
    run_count: int


class ScheduleSpec(NamedTuple):
    """The five body frames of SCHEDULE/UNSCHEDULE, decoded."""

    queue: str
    headers: str
    interval: int
    body: str
    cron: str
    schedule_id: str


def peer_label(peer: bytes) -> str:
    """Printable form of a ZeroMQ identity for log lines (binary ids become ``0x<hex>``)."""
    if peer.isascii() and peer.decode("ascii").isprintable():
        return peer.decode("ascii")[:80]
    return "0x" + peer.hex()[:80]


def parse_routed(frames: list[bytes], max_body: int = DEFAULT_MAX_BODY) -> Command:
    """Parse one message received on a ROUTER socket (routing id first).

    :raises ProtocolError: with the reason when the message is not valid eMQP.
    """
    n = len(frames)
    if n < 5:
        raise ProtocolError(E_SHORT, f"{n} frames, eMQP needs at least 5")
    peer = frames[0]
    if n > MAX_FRAMES:
        raise ProtocolError(E_TOO_MANY, f"{n} frames")
    if len(peer) > MAX_IDENTITY or not peer:
        raise ProtocolError(E_ENVELOPE, "bad routing identity")
    if frames[1] != EMPTY:
        raise ProtocolError(E_ENVELOPE, "frame 0 must be empty")
    if frames[2] != VERSION:
        raise ProtocolError(E_VERSION, f"version {frames[2][:20]!r}")
    name = frames[3]
    arity = ARITY.get(name)
    if arity is None:
        raise ProtocolError(E_COMMAND, f"command {name[:20]!r}")
    msgid = frames[4]
    if len(msgid) > MAX_MSGID:
        raise ProtocolError(E_TOO_LARGE, "msgid longer than 255 bytes")
    body = tuple(frames[5:])
    if not arity[0] <= len(body) <= arity[1]:
        raise ProtocolError(E_ARITY, f"{name.decode()} with {len(body)} body frames")
    for frame in body:
        if len(frame) > max_body:
            raise ProtocolError(E_TOO_LARGE, f"{name.decode()} frame of {len(frame)} bytes")
    try:
        msgid.decode("utf-8")
        for i in _TEXT_FIELDS.get(name, ()):
            if i < len(body):
                body[i].decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(E_UTF8, f"{name.decode()} carries a frame that is not UTF-8") from None
    return Command(peer, name, msgid, body)


class FrameDecoder:
    """Buffer of received multipart messages with the ``receive_data``/``next_event`` shape.

    ``receive_data(frames)`` takes one whole multipart message; ``receive_frame(frame, more)``
    takes it one frame at a time. ``next_event()`` returns a :class:`Command`, raises
    :class:`ProtocolError` for a bad message (the decoder stays usable), or returns NEED_DATA.
    """

    def __init__(self, max_body: int = DEFAULT_MAX_BODY) -> None:
        """:param max_body: largest accepted frame after the envelope, in bytes."""
        self.max_body = max_body
        self._ready: deque[list[bytes]] = deque()
        self._partial: list[bytes] = []
        self._partial_bytes = 0
        self._partial_overflow = False

    def receive_data(self, frames: list[bytes]) -> None:
        """Queue one complete multipart message."""
        self._ready.append(list(frames))

    def receive_frame(self, frame: bytes, more: bool) -> None:
        """Queue one frame; ``more`` is ZeroMQ's RCVMORE (False ends the message)."""
        if len(self._partial) <= MAX_FRAMES:
            self._partial.append(frame)
        else:
            self._partial_overflow = True
        if not more:
            message, self._partial = self._partial, []
            if self._partial_overflow:
                message.append(b"")  # keeps the frame count above the limit
                self._partial_overflow = False
            self._ready.append(message)

    def next_event(self) -> Command | object:
        """Return the next parsed command, or NEED_DATA; raise ProtocolError for a bad one."""
        if not self._ready:
            return NEED_DATA
        return parse_routed(self._ready.popleft(), self.max_body)


# headers ---------------------------------------------------------------------------------

def _int_value(item: str, default: int) -> int:
    """The integer after the first ':' of ``item`` (``default`` when it is not a number)."""
    _, _, value = item.partition(":")
    try:
        return int(value.strip())
    except ValueError:
        return default


def parse_headers(raw: bytes | str) -> Headers:
    """Decode a header frame like ``reply-requested,retry-count:2,timeout:5``.

    Unknown items are ignored (eventmq does the same); an unparsable number counts as absent.
    """
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    reply = guarantee = nohaste = False
    retry = timeout = 0
    run_count = -1
    if text:
        if len(text) > MAX_HEADERS:
            raise ProtocolError(E_TOO_LARGE, "header frame longer than 4096 bytes")
        for item in text.split(","):
            item = item.strip()
            if item == "reply-requested":
                reply = True
            elif item == "guarantee":
                guarantee = True
            elif item == "nohaste":
                nohaste = True
            elif item.startswith("retry-count:"):
                retry = max(0, _int_value(item, 0))
            elif item.startswith("timeout:"):
                timeout = max(0, _int_value(item, 0))
            elif item.startswith("run_count:"):
                run_count = _int_value(item, -1)
    return Headers(reply, guarantee, retry, timeout, nohaste, run_count)


def join_headers(items: list[str]) -> bytes:
    """Build a header frame from items (``[]`` gives the empty frame eMQP requires)."""
    return ",".join(items).encode()


def add_header(raw: bytes, item: bytes) -> bytes:
    """Return ``raw`` with ``item`` appended when it is not already one of its items."""
    if not raw:
        return item
    if item in raw.split(b","):
        return raw
    return raw + b"," + item


# INFORM ------------------------------------------------------------------------------------

def parse_inform_queues(raw: bytes) -> list[tuple[int, str]]:
    """Decode INFORM's queue frame: JSON ``[[weight, name], ...]``, or ``b""`` for none.

    Bare names (``["a", "b"]``) are accepted with weight 10 for friendliness; the spec's CSV form
    is rejected, as eventmq's router rejects it.
    """
    if not raw.strip():
        return []
    try:
        value = json.loads(raw)
    except ValueError:
        raise ProtocolError(E_BAD_VALUE, "INFORM queues are not JSON") from None
    if not isinstance(value, list) or len(value) > 1024:
        raise ProtocolError(E_BAD_VALUE, "INFORM queues must be a JSON list")
    out: list[tuple[int, str]] = []
    for item in value:
        if isinstance(item, str):
            weight, name = 10, item
        elif (isinstance(item, list) and len(item) == 2 and isinstance(item[0], int)
              and not isinstance(item[0], bool) and isinstance(item[1], str)):
            weight, name = item[0], item[1]
        else:
            raise ProtocolError(E_BAD_VALUE, "INFORM queue items must be [weight, name]")
        if not name or len(name) > MAX_NAME:
            raise ProtocolError(E_BAD_VALUE, "bad queue name in INFORM")
        out.append((weight, name))
    return out


# SCHEDULE ----------------------------------------------------------------------------------

def schedule_id(body: str) -> str:
    """The schedule id eventmq uses: sha1 of the job's identifying fields as sorted JSON.

    Queue, interval, cron and headers are not part of it, so re-SCHEDULE of the same callable and
    arguments replaces the schedule and UNSCHEDULE with them cancels it.
    """
    try:
        job = json.loads(body)[1]
        ident = json.dumps({"args": job["args"], "kwargs": job["kwargs"],
                            "class_args": job["class_args"],
                            "class_kwargs": job["class_kwargs"],
                            "path": job["path"], "callable": job["callable"]},
                           sort_keys=True)
    except (ValueError, TypeError, KeyError, IndexError):
        raise ProtocolError(E_BAD_VALUE, "schedule body is not an eventmq job") from None
    return hashlib.sha1(ident.encode("utf-8")).hexdigest()


def parse_schedule(body: tuple[bytes, ...], unschedule: bool = False) -> ScheduleSpec:
    """Decode SCHEDULE/UNSCHEDULE's ``queue, headers, interval, json body, cron`` frames."""
    queue, headers, interval_raw, job, cron = (f.decode("utf-8") for f in body)
    try:
        interval = int(interval_raw) if interval_raw.strip() else -1
    except ValueError:
        raise ProtocolError(E_BAD_VALUE, f"interval {interval_raw[:20]!r}") from None
    sid = schedule_id(job)
    if not unschedule:
        if interval < 0 and not cron.strip():
            raise ProtocolError(E_BAD_VALUE, "SCHEDULE needs an interval or a cron")
        if interval == 0:
            raise ProtocolError(E_BAD_VALUE, "SCHEDULE interval must be positive")
    if len(queue) > MAX_NAME:
        raise ProtocolError(E_BAD_VALUE, "queue name longer than 255")
    return ScheduleSpec(queue or "default", headers, interval, job, cron.strip(), sid)


# building ----------------------------------------------------------------------------------

class MsgIds:
    """Cheap unique msgids in uuid4 text form: a random 64-bit prefix and a 64-bit counter."""

    def __init__(self, seed: bytes | None = None) -> None:
        """:param seed: 8 bytes for the prefix (random when None)."""
        prefix = (seed or os.urandom(8)).hex()
        self._head = f"{prefix[:8]}-{prefix[8:12]}-4{prefix[13:16]}-"
        self._count = int.from_bytes(os.urandom(2), "big") << 40

    def next(self) -> bytes:
        """Return a fresh 36-character msgid."""
        self._count += 1
        c = f"{self._count & 0xFFFFFFFFFFFFFFFF:016x}"
        return f"{self._head}{'89ab'[int(c[0], 16) & 3]}{c[1:4]}-{c[4:]}".encode()


def build(peer: bytes, command: bytes, msgid: bytes, *body: bytes) -> list[bytes]:
    """Frames for a ROUTER send: ``[peer, b"", b"eMQP/1.0", command, msgid, *body]``."""
    return [peer, EMPTY, VERSION, command, msgid, *body]


def build_dealer(command: bytes, msgid: bytes, *body: bytes) -> list[bytes]:
    """Frames a DEALER peer sends: ``[b"", b"eMQP/1.0", command, msgid, *body]``."""
    return [EMPTY, VERSION, command, msgid, *body]


def ack(peer: bytes, msgid: bytes, acked: bytes) -> list[bytes]:
    """ACK of an INFORM (5 frames after the routing id)."""
    return [peer, EMPTY, VERSION, b"ACK", msgid, acked]


def heartbeat(peer: bytes, msgid: bytes, now: float) -> list[bytes]:
    """HEARTBEAT with the sender's unix time as its body."""
    return [peer, EMPTY, VERSION, b"HEARTBEAT", msgid, repr(float(now)).encode()]


def kbye(peer: bytes, msgid: bytes) -> list[bytes]:
    """KBYE: the sender stops talking to ``peer``."""
    return [peer, EMPTY, VERSION, b"KBYE", msgid]


def reply_ack(peer: bytes, msgid: bytes, request_id: bytes) -> list[bytes]:
    """The dispatch acknowledgement a client gets: ``REPLY, id, <request msgid>``."""
    return [peer, EMPTY, VERSION, b"REPLY", msgid, request_id]


def reply_result(peer: bytes, msgid: bytes, result: bytes, request_id: bytes) -> list[bytes]:
    """A job's result forwarded to its client: ``REPLY, id, <result json>, <request msgid>``."""
    return [peer, EMPTY, VERSION, b"REPLY", msgid, result, request_id]


def request(peer: bytes, msgid: bytes, queue: bytes, headers: bytes, body: bytes) -> list[bytes]:
    """REQUEST to a worker (the client's msgid is kept, as eventmq's router does)."""
    return [peer, EMPTY, VERSION, b"REQUEST", msgid, queue, headers, body]


def is_failure(result: bytes) -> bool:
    """True when a worker's REPLY body reports a timeout (``{"value": "TimeoutError"}``)."""
    return b'"TimeoutError"' in result and result.replace(b" ", b"") == b'{"value":"TimeoutError"}'
