"""Sans-IO codec for the NSQ TCP protocol V2 (nsqd's wire format); imports neither Twisted nor zope.

Strategy:

- The client opens with the 4-byte magic ``b"  V2"``; anything else is ``E_BAD_PROTOCOL``.
- Then commands: a text line ending ``\\n`` (a trailing ``\\r`` is stripped), parameters split on
  single spaces.  IDENTIFY, AUTH, PUB and DPUB are followed by ``[int32 size][size bytes]``; MPUB by
  ``[int32 body size][int32 count]`` and ``count`` times ``[int32 size][bytes]``.
- :class:`ServerCodec` turns bytes into command events (``receive_data`` then ``next_event`` until
  :data:`NEED_DATA`).  It checks syntax, names and size limits in nsqd's order and raises
  :class:`ProtocolError` carrying nsqd's wire code; every codec error is fatal (nsqd closes the
  connection for all of them), and a codec that raised keeps raising.  Connection *state* checks
  (``cannot FIN in current state``) belong to the server, which knows the state.
- While a body is incomplete the codec remembers how many bytes it needs and only joins incoming
  chunks once they are all there, so a 5 MiB MPUB arriving in 64 KiB reads is copied once.
  MPUB is parsed incrementally (message by message) because nsqd does not cross-check the
  declared body size against the messages that follow it.
- Server -> client frames are ``[int32 size][int32 type][data]``; type 0 response, 1 error,
  2 message.  Message data is ``[int64 ns timestamp][uint16 attempts][16-byte id][body]``.
  :class:`ClientCodec` decodes those frames (tests and the benchmark use it); the ``encode_*``
  functions build both directions.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from typing import Final

MAGIC_V2: Final = b"  V2"

FRAME_RESPONSE: Final = 0
FRAME_ERROR: Final = 1
FRAME_MESSAGE: Final = 2

HEARTBEAT: Final = b"_heartbeat_"
OK: Final = b"OK"
CLOSE_WAIT: Final = b"CLOSE_WAIT"

DEFAULT_MAX_MSG_SIZE: Final = 1024 * 1024
DEFAULT_MAX_BODY_SIZE: Final = 5 * 1024 * 1024
DEFAULT_MAX_LINE: Final = 16 * 1024
DEFAULT_MAX_REQ_TIMEOUT_MS: Final = 3_600_000

_I32 = struct.Struct(">i")
_FRAME_HEAD = struct.Struct(">ii")
#: a message frame's head: size, frame type, timestamp (ns), attempts (the 16-byte id follows)
MSG_HEAD: Final = struct.Struct(">iiqH")
_MSG_META = struct.Struct(">qH")

_NAME_RE = re.compile(rb"[.a-zA-Z0-9_-]+(#ephemeral)?")
_FIN_RUN = re.compile(rb"(?:FIN [0-9a-fA-F]{16}\n)+")
_MAX_NAME = 64


class _NeedData:
    """Type of the :data:`NEED_DATA` sentinel."""

    __slots__ = ()

    def __repr__(self) -> str:
        """Readable name in test output."""
        return "NEED_DATA"


#: Returned by ``next_event`` when no complete event is buffered.
NEED_DATA: Final = _NeedData()


class ProtocolError(Exception):
    """Bad input, carrying the nsqd wire error code and whether the connection must close."""

    def __init__(self, code: str, message: str = "", fatal: bool = True) -> None:
        """:param code: wire code such as ``E_INVALID``; :param message: nsqd's description."""
        super().__init__(code, message, fatal)
        self.code = code
        self.message = message
        self.fatal = fatal

    @property
    def wire_text(self) -> bytes:
        """The error frame's data: ``b"CODE description"`` (just the code when there is none)."""
        text = f"{self.code} {self.message}" if self.message else self.code
        return text.encode("utf-8", "replace")

    def __str__(self) -> str:
        """The wire text as a str."""
        return self.wire_text.decode("utf-8", "replace")


# -- events (client -> server) -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Identify:
    """IDENTIFY with its raw JSON body (the server validates the fields)."""

    body: bytes


@dataclass(frozen=True, slots=True)
class Auth:
    """AUTH with the secret."""

    secret: bytes


@dataclass(frozen=True, slots=True)
class Sub:
    """SUB topic channel (both names already validated)."""

    topic: str
    channel: str


@dataclass(frozen=True, slots=True)
class Pub:
    """PUB topic with one body."""

    topic: str
    body: bytes


@dataclass(frozen=True, slots=True)
class Mpub:
    """MPUB topic with at least one body."""

    topic: str
    bodies: list[bytes]


@dataclass(frozen=True, slots=True)
class Dpub:
    """DPUB topic defer_ms with one body (defer already range-checked)."""

    topic: str
    defer_ms: int
    body: bytes


@dataclass(frozen=True, slots=True)
class Rdy:
    """RDY count (parsed, range not checked: the server checks state first)."""

    count: int


@dataclass(frozen=True, slots=True)
class Fin:
    """FIN of a 16-byte message id."""

    msg_id: bytes


@dataclass(frozen=True, slots=True)
class Req:
    """REQ of a 16-byte id with a timeout in ms (clamped to 0..max_req_timeout like nsqd)."""

    msg_id: bytes
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class Touch:
    """TOUCH of a 16-byte message id."""

    msg_id: bytes


@dataclass(frozen=True, slots=True)
class Cls:
    """CLS: start closing (no more messages)."""


@dataclass(frozen=True, slots=True)
class Nop:
    """NOP: no response."""


Command = Identify | Auth | Sub | Pub | Mpub | Dpub | Rdy | Fin | Req | Touch | Cls | Nop


# -- helpers -----------------------------------------------------------------------------------


def go_quote(raw: bytes) -> str:
    """Render ``raw`` like Go's ``%q`` does for names in nsqd's error texts (close enough)."""
    return json.dumps(raw.decode("utf-8", "replace"))


def is_valid_name(raw: bytes) -> bool:
    """nsqd's topic/channel rule: ``^[.a-zA-Z0-9_-]+(#ephemeral)?$`` and 1..64 bytes long."""
    return 0 < len(raw) <= _MAX_NAME and _NAME_RE.fullmatch(raw) is not None


def is_ephemeral(name: str) -> bool:
    """True for names with the ``#ephemeral`` suffix (memory tier, removed with the last user)."""
    return name.endswith("#ephemeral")


def _parse_int(raw: bytes) -> int:
    """Parse a decimal integer the way Go's strconv does (optional sign, digits only)."""
    if not raw or not re.fullmatch(rb"[+-]?[0-9]+", raw):
        raise ValueError(raw)
    return int(raw)


# -- server side: bytes -> commands ------------------------------------------------------------


class ServerCodec:
    """Incremental parser of the client -> server byte stream (one per connection).

    :param max_msg_size: largest single message body (PUB, DPUB, each MPUB message).
    :param max_body_size: largest IDENTIFY/AUTH body and MPUB body.
    :param max_line: longest command line before the connection is refused.
    :param max_req_timeout_ms: DPUB defer range and REQ clamp.
    :param expect_magic: False skips the ``"  V2"`` magic (a caller that already consumed it).
    """

    def __init__(
        self,
        max_msg_size: int = DEFAULT_MAX_MSG_SIZE,
        max_body_size: int = DEFAULT_MAX_BODY_SIZE,
        max_line: int = DEFAULT_MAX_LINE,
        max_req_timeout_ms: int = DEFAULT_MAX_REQ_TIMEOUT_MS,
        expect_magic: bool = True,
    ) -> None:
        """Start a codec waiting for the magic (or for commands when ``expect_magic`` is False)."""
        self.max_msg_size = max_msg_size
        self.max_body_size = max_body_size
        self.max_line = max_line
        self.max_req_timeout_ms = max_req_timeout_ms
        self._magic_pending = expect_magic
        self._buf = b""
        self._pos = 0
        self._held: list[bytes] = []
        self._held_len = 0
        self._need = 0  # bytes needed after _pos before parsing is worth retrying
        self._failed: ProtocolError | None = None
        self._names: dict[bytes, str] = {}
        self._pub_lines: dict[bytes, str] = {}
        # MPUB in progress: [topic, remaining, bodies, end bound]; offsets are relative to _pos.
        self._mpub: list | None = None
        self._mpub_off = 0
        self._handlers = {
            b"PUB": self._on_pub,
            b"MPUB": self._on_mpub,
            b"DPUB": self._on_dpub,
            b"FIN": self._on_fin,
            b"RDY": self._on_rdy,
            b"REQ": self._on_req,
            b"TOUCH": self._on_touch,
            b"SUB": self._on_sub,
            b"NOP": self._on_nop,
            b"CLS": self._on_cls,
            b"IDENTIFY": self._on_identify,
            b"AUTH": self._on_auth,
        }

    @property
    def buffered(self) -> int:
        """Bytes received but not yet turned into events."""
        return len(self._buf) - self._pos + self._held_len

    def receive_data(self, data: bytes) -> None:
        """Add bytes read from the connection (an empty ``data`` is ignored)."""
        if not data:
            return
        if self._held or (self._need and len(self._buf) - self._pos + len(data) < self._need):
            self._held.append(data)
            self._held_len += len(data)
            if len(self._buf) - self._pos + self._held_len < self._need:
                return
            data = b"".join(self._held)
            self._held = []
            self._held_len = 0
        if self._pos >= len(self._buf):
            self._buf = data
        else:
            self._buf = self._buf[self._pos:] + data
        self._pos = 0

    def next_event(self) -> Command | _NeedData:
        """Return the next complete command, or :data:`NEED_DATA`.

        :raises ProtocolError: on input nsqd refuses (always fatal; raised again on every call).
        """
        if self._failed is not None:
            raise self._failed
        if self._held:
            return NEED_DATA
        try:
            event = self._parse()
        except ProtocolError as exc:
            self._failed = exc
            raise
        if event is not NEED_DATA:
            self._need = 0
        return event

    def _parse(self) -> Command | _NeedData:
        """Parse one command from the buffer (see :meth:`next_event`)."""
        if self._magic_pending:
            return self._read_magic()
        if self._mpub is not None:
            return self._mpub_continue()
        buf = self._buf
        pos = self._pos
        nl = buf.find(b"\n", pos)
        if nl < 0:
            if len(buf) - pos > self.max_line:
                raise ProtocolError("E_INVALID", "command line too long")
            self._need = 0
            return NEED_DATA
        if nl - pos > self.max_line:
            raise ProtocolError("E_INVALID", "command line too long")
        line = buf[pos:nl]
        if line[-1:] == b"\r":
            line = line[:-1]
        params = line.split(b" ")
        handler = self._handlers.get(params[0])
        if handler is None:
            raise ProtocolError("E_INVALID", f"invalid command {params[0].decode('utf-8', 'replace')}")
        return handler(params, nl + 1)

    # -- batch fast paths (the hot path of the server: no event object per message) ------------

    def _fast_ready(self) -> bool:
        """True when the buffer may be read by the fast paths (no pending state)."""
        return not (self._failed is not None or self._held or self._magic_pending
                    or self._mpub is not None)

    def read_pubs(self) -> tuple[str, list[bytes]]:
        """Consume consecutive complete ``PUB`` commands to one topic at the front of the buffer.

        Returns ``(topic, bodies)``; ``("", [])`` when the next command is not a well-formed
        complete PUB, in which case :meth:`next_event` must be used (it also raises the right
        error for a malformed one). Equivalent to a run of :class:`Pub` events.
        """
        if not self._fast_ready():
            return "", []
        buf = self._buf
        pos = self._pos
        if not buf.startswith(b"PUB ", pos):
            return "", []
        nl = buf.find(b"\n", pos, pos + 80)
        if nl < 0:
            return "", []
        line = buf[pos:nl + 1]
        topic = self._pub_lines.get(line)
        if topic is None:
            raw = line[4:-1]
            if b" " in raw or b"\r" in raw:
                return "", []
            name = self._name(raw)
            if name is None:
                return "", []
            if len(self._pub_lines) > 1024:
                self._pub_lines.clear()
            topic = self._pub_lines[line] = name
        head = len(line)
        limit = self.max_msg_size
        n = len(buf)
        unpack = _I32.unpack_from
        bodies: list[bytes] = []
        append = bodies.append
        startswith = buf.startswith
        while True:
            start = pos + head
            if n < start + 4:
                break
            size = unpack(buf, start)[0]
            if size <= 0 or size > limit:
                break
            end = start + 4 + size
            if end > n:
                break
            append(buf[start + 4:end])
            pos = end
            if not startswith(line, pos):
                break
        if not bodies:
            return "", []
        self._pos = pos
        self._need = 0
        return topic, bodies

    def read_fins(self) -> list[bytes]:
        """Consume consecutive ``FIN <16 hex digits>\\n`` lines at the front of the buffer.

        Returns the raw ids (empty when the next command is not such a line; then use
        :meth:`next_event`, which also handles ``\\r\\n`` and non-hex ids). Equivalent to a run
        of :class:`Fin` events; the run is found by one regular-expression match.
        """
        if not self._fast_ready():
            return []
        buf = self._buf
        match = _FIN_RUN.match(buf, self._pos)
        if match is None:
            return []
        end = match.end()
        out = [buf[i + 4:i + 20] for i in range(match.start(), end, 21)]
        self._pos = end
        self._need = 0
        return out

    def read_fin_ids(self) -> list[int]:
        """Like :meth:`read_fins`, but return the ids parsed (C-level work only, no per-line loop).

        The fixed columns of the 21-byte lines are checked with strided slices, the hex digits
        are decoded in one ``bytes.fromhex``; anything unusual goes through :meth:`read_fins`.
        """
        if not self._fast_ready():
            return []
        buf = self._buf
        pos = self._pos
        k = (len(buf) - pos) // 21
        if not k or not buf.startswith(b"FIN ", pos):
            return []
        end = pos + 21 * k
        for col, char in _FIN_COLUMNS:
            column = buf[pos + col:end:21]
            good = len(column) - len(column.lstrip(char))
            if good < k:
                k = good
                end = pos + 21 * k
                if not k:
                    return []
        try:
            raw = bytes.fromhex(buf[pos:end].replace(b"FIN ", b"").decode("ascii"))
        except (ValueError, UnicodeDecodeError):
            raw = b""
        if len(raw) != 8 * k:  # a non-hex digit or a space inside an id: the careful path
            return [int(r, 16) for r in self.read_fins()]
        self._pos = end
        self._need = 0
        return list(_id_struct(k).unpack(raw))

    def events(self) -> list[Command]:
        """Return every complete command buffered now (stops at NEED_DATA).

        :raises ProtocolError: as ``next_event``; events parsed before the error are lost, so
            callers that must act on them use ``next_event``.
        """
        out: list[Command] = []
        while True:
            ev = self.next_event()
            if ev is NEED_DATA:
                return out
            out.append(ev)  # type: ignore[arg-type]

    # -- framing helpers ------------------------------------------------------------------------

    def _read_magic(self) -> Command | _NeedData:
        """Consume the 4-byte magic."""
        if len(self._buf) - self._pos < 4:
            self._need = 4
            return NEED_DATA
        magic = self._buf[self._pos:self._pos + 4]
        if magic != MAGIC_V2:
            raise ProtocolError("E_BAD_PROTOCOL")
        self._pos += 4
        self._magic_pending = False
        return self._parse()

    def _wait(self, end: int) -> _NeedData:
        """Record that ``end`` (absolute offset) must be buffered before retrying."""
        self._need = end - self._pos
        return NEED_DATA

    def _name(self, raw: bytes) -> str | None:
        """Return ``raw`` as a str when it is a valid topic/channel name, else None."""
        name = self._names.get(raw)
        if name is None:
            if not is_valid_name(raw):
                return None
            if len(self._names) > 4096:
                self._names.clear()
            name = self._names[raw] = raw.decode("ascii")
        return name

    def _topic(self, raw: bytes, verb: str, prefix: str = "") -> str:
        """Validate a topic parameter or raise nsqd's E_BAD_TOPIC."""
        name = self._name(raw)
        if name is None:
            raise ProtocolError("E_BAD_TOPIC", f"{prefix}{verb} topic name {go_quote(raw)} is not valid")
        return name

    def _sized(self, start: int) -> int | None:
        """Read the int32 size at ``start``; None when it is not buffered yet."""
        if len(self._buf) < start + 4:
            return None
        return _I32.unpack_from(self._buf, start)[0]

    def _message_id(self, raw: bytes) -> bytes:
        """nsqd's getMessageID: exactly 16 bytes, otherwise fatal E_INVALID."""
        if len(raw) != 16:
            raise ProtocolError("E_INVALID", "invalid message ID")
        return raw

    # -- commands -------------------------------------------------------------------------------

    def _on_pub(self, params: list[bytes], start: int) -> Command | _NeedData:
        """PUB <topic>\\n[size][body]."""
        if len(params) < 2:
            raise ProtocolError("E_INVALID", "PUB insufficient number of parameters")
        topic = self._topic(params[1], "PUB")
        size = self._sized(start)
        if size is None:
            return self._wait(start + 4)
        if size <= 0:
            raise ProtocolError("E_BAD_MESSAGE", f"PUB invalid message body size {size}")
        if size > self.max_msg_size:
            raise ProtocolError("E_BAD_MESSAGE", f"PUB message too big {size} > {self.max_msg_size}")
        end = start + 4 + size
        if len(self._buf) < end:
            return self._wait(end)
        body = self._buf[start + 4:end]
        self._pos = end
        return Pub(topic, body)

    def _on_dpub(self, params: list[bytes], start: int) -> Command | _NeedData:
        """DPUB <topic> <defer_ms>\\n[size][body]."""
        if len(params) < 3:
            raise ProtocolError("E_INVALID", "DPUB insufficient number of parameters")
        topic = self._topic(params[1], "DPUB")
        try:
            defer = _parse_int(params[2])
        except ValueError:
            raise ProtocolError(
                "E_INVALID", f"DPUB could not parse timeout {params[2].decode('utf-8', 'replace')}"
            ) from None
        if defer < 0 or defer > self.max_req_timeout_ms:
            raise ProtocolError(
                "E_INVALID", f"DPUB timeout {defer} out of range 0-{self.max_req_timeout_ms}"
            )
        size = self._sized(start)
        if size is None:
            return self._wait(start + 4)
        if size <= 0:
            raise ProtocolError("E_BAD_MESSAGE", f"DPUB invalid message body size {size}")
        if size > self.max_msg_size:
            raise ProtocolError("E_BAD_MESSAGE", f"DPUB message too big {size} > {self.max_msg_size}")
        end = start + 4 + size
        if len(self._buf) < end:
            return self._wait(end)
        body = self._buf[start + 4:end]
        self._pos = end
        return Dpub(topic, defer, body)

    def _on_mpub(self, params: list[bytes], start: int) -> Command | _NeedData:
        """MPUB <topic>\\n[body size][count] then ``count`` sized messages."""
        if len(params) < 2:
            raise ProtocolError("E_INVALID", "MPUB insufficient number of parameters")
        topic = self._topic(params[1], "MPUB", prefix="E_BAD_TOPIC ")
        if len(self._buf) < start + 8:
            body_size = self._sized(start)
            if body_size is not None:
                self._check_mpub_body_size(body_size)
            return self._wait(start + 8)
        body_size, count = struct.unpack_from(">ii", self._buf, start)
        self._check_mpub_body_size(body_size)
        max_count = (self.max_body_size - 4) // 5
        if count <= 0 or count > max_count:
            raise ProtocolError("E_BAD_BODY", f"MPUB invalid message count {count}")
        payload = start + 8 - self._pos  # first message, relative to _pos
        self._mpub = [topic, count, [], payload + self.max_body_size - 4]
        self._mpub_off = payload
        return self._mpub_continue()

    def _check_mpub_body_size(self, body_size: int) -> None:
        """Validate MPUB's declared body size like nsqd (it is not cross-checked later)."""
        if body_size <= 0:
            raise ProtocolError("E_BAD_BODY", f"MPUB invalid body size {body_size}")
        if body_size > self.max_body_size:
            raise ProtocolError("E_BAD_BODY", f"MPUB body too big {body_size} > {self.max_body_size}")

    def _mpub_continue(self) -> Command | _NeedData:
        """Parse as many MPUB messages as are buffered; emit the event when all are in."""
        state = self._mpub
        assert state is not None
        buf = self._buf
        pos0 = self._pos
        off = pos0 + self._mpub_off
        remaining: int = state[1]
        bodies: list[bytes] = state[2]
        hard_end = pos0 + state[3]  # no message may end past this: max_body_size reached
        limit = self.max_msg_size
        blen = len(buf)
        unpack = _I32.unpack_from
        append = bodies.append
        if not bodies and remaining > 1 and blen >= off + 4:
            # a complete MPUB whose messages all have one size: check the size prefixes with
            # four strided slices and cut every body with one C-level unpack
            size = unpack(buf, off)[0]
            step = size + 4
            end = off + step * remaining
            if 0 < size <= limit and end <= hard_end and end <= blen:
                head = buf[off:off + 4]
                if all(buf[off + j:end:step] == head[j:j + 1] * remaining for j in range(4)):
                    bodies.extend(_uniform_bodies(size, remaining).unpack_from(buf, off))
                    off = end
                    remaining = 0
        while remaining:
            if blen < off + 4:
                break
            size = unpack(buf, off)[0]
            if size <= 0 or size > limit:
                if size <= 0:
                    raise ProtocolError(
                        "E_BAD_MESSAGE", f"MPUB invalid message({len(bodies)}) body size {size}")
                raise ProtocolError("E_BAD_MESSAGE", f"MPUB message too big {size} > {limit}")
            end = off + 4 + size
            if end > hard_end:
                total = end - hard_end + self.max_body_size
                raise ProtocolError("E_BAD_BODY", f"MPUB body too big {total} > {self.max_body_size}")
            if blen < end:
                break
            append(buf[off + 4:end])
            off = end
            remaining -= 1
        if remaining:
            state[1] = remaining
            self._mpub_off = off - pos0
            if blen >= off + 4:
                need = off + 4 + unpack(buf, off)[0]
            else:
                need = off + 4
            return self._wait(need)
        self._mpub = None
        self._pos = off
        return Mpub(state[0], bodies)

    def _on_fin(self, params: list[bytes], start: int) -> Command:
        """FIN <id>."""
        if len(params) < 2:
            raise ProtocolError("E_INVALID", "FIN insufficient number of params")
        self._pos = start
        return Fin(self._message_id(params[1]))

    def _on_rdy(self, params: list[bytes], start: int) -> Command:
        """RDY [count] (no count means 1)."""
        count = 1
        if len(params) > 1:
            try:
                count = _parse_int(params[1])
            except ValueError:
                raise ProtocolError(
                    "E_INVALID", f"RDY could not parse count {params[1].decode('utf-8', 'replace')}"
                ) from None
        self._pos = start
        return Rdy(count)

    def _on_req(self, params: list[bytes], start: int) -> Command:
        """REQ <id> <timeout_ms> (timeout clamped into range, like nsqd)."""
        if len(params) < 3:
            raise ProtocolError("E_INVALID", "REQ insufficient number of params")
        msg_id = self._message_id(params[1])
        try:
            timeout = _parse_int(params[2])
        except ValueError:
            raise ProtocolError(
                "E_INVALID", f"REQ could not parse timeout {params[2].decode('utf-8', 'replace')}"
            ) from None
        timeout = min(max(timeout, 0), self.max_req_timeout_ms)
        self._pos = start
        return Req(msg_id, timeout)

    def _on_touch(self, params: list[bytes], start: int) -> Command:
        """TOUCH <id>."""
        if len(params) < 2:
            raise ProtocolError("E_INVALID", "TOUCH insufficient number of params")
        self._pos = start
        return Touch(self._message_id(params[1]))

    def _on_sub(self, params: list[bytes], start: int) -> Command:
        """SUB <topic> <channel>."""
        if len(params) < 3:
            raise ProtocolError("E_INVALID", "SUB insufficient number of parameters")
        topic = self._topic(params[1], "SUB")
        channel = self._name(params[2])
        if channel is None:
            raise ProtocolError("E_BAD_CHANNEL", f"SUB channel name {go_quote(params[2])} is not valid")
        self._pos = start
        return Sub(topic, channel)

    def _on_nop(self, params: list[bytes], start: int) -> Command:
        """NOP."""
        self._pos = start
        return Nop()

    def _on_cls(self, params: list[bytes], start: int) -> Command:
        """CLS."""
        self._pos = start
        return Cls()

    def _body(self, verb: str, start: int) -> bytes | _NeedData:
        """Read an IDENTIFY/AUTH ``[size][body]`` bounded by max_body_size (E_BAD_BODY)."""
        size = self._sized(start)
        if size is None:
            return self._wait(start + 4)
        if size > self.max_body_size:
            raise ProtocolError("E_BAD_BODY", f"{verb} body too big {size} > {self.max_body_size}")
        if size <= 0:
            raise ProtocolError("E_BAD_BODY", f"{verb} invalid body size {size}")
        end = start + 4 + size
        if len(self._buf) < end:
            return self._wait(end)
        self._pos = end
        return self._buf[start + 4:end]

    def _on_identify(self, params: list[bytes], start: int) -> Command | _NeedData:
        """IDENTIFY\\n[size][json]."""
        body = self._body("IDENTIFY", start)
        if body is NEED_DATA:
            return NEED_DATA
        return Identify(body)  # type: ignore[arg-type]

    def _on_auth(self, params: list[bytes], start: int) -> Command | _NeedData:
        """AUTH\\n[size][secret]."""
        if len(params) != 1:
            raise ProtocolError("E_INVALID", "AUTH invalid number of parameters")
        body = self._body("AUTH", start)
        if body is NEED_DATA:
            return NEED_DATA
        return Auth(body)  # type: ignore[arg-type]


# -- server side: frames out -------------------------------------------------------------------


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
_UNIFORM: dict[tuple[int, int], struct.Struct] = {}
_IDS: dict[int, struct.Struct] = {}
_HEX_IDS: dict[int, struct.Struct] = {}
#: byte columns of a 21-byte ``FIN <16 hex>\n`` line that are fixed
_FIN_COLUMNS = ((0, b"F"), (1, b"I"), (2, b"N"), (3, b" "), (20, b"\n"))


def _uniform_bodies(size: int, count: int) -> struct.Struct:
    """A cached Struct that cuts ``count`` bodies of ``size`` bytes, each after a 4-byte size."""
    key = (size, count)
    st = _UNIFORM.get(key)
    if st is None:
        if len(_UNIFORM) >= 64:
            _UNIFORM.clear()
        st = _UNIFORM[key] = struct.Struct("=" + f"4x{size}s" * count)
    return st


def render_ids(ids: list[int]) -> tuple[bytes, ...]:
    """:func:`render_id` of many ids at once (one pack, one hex, one unpack)."""
    n = len(ids)
    st = _HEX_IDS.get(n)
    if st is None:
        if len(_HEX_IDS) >= 256:
            _HEX_IDS.clear()
        st = _HEX_IDS[n] = struct.Struct("16s" * n)
    return st.unpack(_id_struct(n).pack(*ids).hex().encode())


def _id_struct(count: int) -> struct.Struct:
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
    return b"IDENTIFY\n" + _I32.pack(len(body)) + body


def encode_auth(secret: bytes) -> bytes:
    """AUTH with a secret."""
    return b"AUTH\n" + _I32.pack(len(secret)) + secret


def encode_sub(topic: str, channel: str) -> bytes:
    """SUB topic channel."""
    return b"SUB " + _names(topic, channel) + b"\n"


def encode_pub(topic: str, body: bytes) -> bytes:
    """PUB topic with a body."""
    return b"PUB " + topic.encode() + b"\n" + _I32.pack(len(body)) + body


def encode_dpub(topic: str, defer_ms: int, body: bytes) -> bytes:
    """DPUB topic defer_ms with a body."""
    return b"DPUB %s %d\n" % (topic.encode(), defer_ms) + _I32.pack(len(body)) + body


def encode_mpub(topic: str, bodies: list[bytes]) -> bytes:
    """MPUB topic with the bodies."""
    parts = [_I32.pack(len(b)) + b for b in bodies]
    payload = _I32.pack(len(bodies)) + b"".join(parts)
    return b"MPUB " + topic.encode() + b"\n" + _I32.pack(len(payload)) + payload


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
        return b"IDENTIFY\n" + _I32.pack(len(event.body)) + event.body
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

    def next_event(self) -> Frame | _NeedData:
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
