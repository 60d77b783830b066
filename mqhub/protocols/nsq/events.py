"""NSQ V2 wire vocabulary shared by both directions: constants, limits, errors and command events.

Sans-IO (no Twisted).  :class:`~mqhub.protocols.nsq.codec.ServerCodec` produces the command events
defined here; :mod:`mqhub.protocols.nsq.frames` encodes them back for clients and tests.
"""

from __future__ import annotations

import json
import re
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

_NAME_RE = re.compile(rb"[.a-zA-Z0-9_-]+(#ephemeral)?")
_MAX_NAME = 64


class NeedData:
    """Type of the :data:`NEED_DATA` sentinel."""

    __slots__ = ()

    def __repr__(self) -> str:
        """Readable name in test output."""
        return "NEED_DATA"


#: Returned by ``next_event`` when no complete event is buffered.
NEED_DATA: Final = NeedData()


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


def parse_int(raw: bytes) -> int:
    """Parse a decimal integer the way Go's strconv does (optional sign, digits only)."""
    if not raw or not re.fullmatch(rb"[+-]?[0-9]+", raw):
        raise ValueError(raw)
    return int(raw)
