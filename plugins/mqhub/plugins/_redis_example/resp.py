"""Sans-IO RESP codec: request parsing (arrays of bulk strings, or inline) and reply encoding.

Strategy: bytes accumulate in a bytearray with a read offset. ``next_event`` parses one complete
command from the offset, or returns NEED_DATA without consuming anything. A multibulk command
split across reads keeps what it has parsed so far (count, arguments, position), so the next read
resumes where the last one stopped: a huge command costs linear, not quadratic, work. The buffer
is compacted once half of it has been consumed. Limits mirror redis-server's: a bulk string, an
array length and an inline line are bounded, and breaking a limit or the framing is a fatal
``ProtocolError`` with redis-server's own wording. This module imports neither Twisted nor zope.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Union


class _NeedData:
    """Sentinel type of NEED_DATA."""

    def __repr__(self) -> str:
        """``NEED_DATA``."""
        return "NEED_DATA"


NEED_DATA: Final = _NeedData()

Command = list[bytes]


class ProtocolError(Exception):
    """A request broke RESP framing or a limit.

    :ivar code: the error prefix redis-server sends (``ERR``).
    :ivar message: the text after the prefix.
    :ivar fatal: whether the connection must be closed after the error reply.
    """

    def __init__(self, code: str, message: str, fatal: bool = True) -> None:
        """Build the error; ``str(error)`` is the wire text."""
        super().__init__(f"{code} {message}")
        self.code = code
        self.message = message
        self.fatal = fatal


class RespCodec:
    """Incremental parser of client requests.

    :param max_bulk: largest bulk string accepted (redis-server: proto-max-bulk-len).
    :param max_args: largest argument count of one command.
    :param max_inline: longest inline command line.
    """

    def __init__(
        self, max_bulk: int = 8 * 1024 * 1024, max_args: int = 1024 * 1024, max_inline: int = 64 * 1024
    ) -> None:
        """Start with an empty buffer."""
        self.max_bulk = max_bulk
        self.max_args = max_args
        self.max_inline = max_inline
        self._pending = bytearray()
        self._offset = 0
        #: a multibulk command cut by the end of the buffer: (count, args so far, next position)
        self._partial: tuple[int, Command, int] | None = None

    def receive_data(self, data: bytes) -> None:
        """Append bytes read from the connection."""
        if self._offset and self._offset * 2 >= len(self._pending):
            del self._pending[: self._offset]
            if self._partial is not None:
                count, args, pos = self._partial
                self._partial = (count, args, pos - self._offset)
            self._offset = 0
        self._pending += data

    def next_event(self) -> Command | _NeedData:
        """Return the next complete command (a list of byte strings), or NEED_DATA.

        Empty inline lines are skipped, as redis-server does.

        :raises ProtocolError: on broken framing or an exceeded limit (always fatal).
        """
        while True:
            buf = self._pending
            start = self._offset
            if start >= len(buf):
                return NEED_DATA
            if buf[start] == 0x2A:  # b"*"
                command = self._multibulk(start)
                if command == []:
                    continue  # "*0\r\n" is ignored, as by redis-server
                return command
            end = buf.find(b"\n", start)
            if end < 0:
                if len(buf) - start > self.max_inline:
                    raise ProtocolError("ERR", "Protocol error: too big inline request")
                return NEED_DATA
            if end - start > self.max_inline:
                raise ProtocolError("ERR", "Protocol error: too big inline request")
            line = bytes(buf[start:end]).rstrip(b"\r")
            self._offset = end + 1
            args = line.split()
            if args:
                return args

    def _line(self, start: int) -> tuple[bytes, int] | None:
        """The ``\\r\\n``-terminated header line at ``start`` and the offset after it, or None."""
        end = self._pending.find(b"\r\n", start)
        if end < 0:
            if len(self._pending) - start > 64:
                raise ProtocolError("ERR", "Protocol error: too big count or length line")
            return None
        return bytes(self._pending[start:end]), end + 2

    def _multibulk(self, start: int) -> Command | _NeedData:
        """Parse ``*N\\r\\n`` followed by N ``$len\\r\\ndata\\r\\n`` bulk strings.

        Resumes a command an earlier call left incomplete; an empty list is ``*0``.
        """
        if self._partial is not None:
            count, args, pos = self._partial
            self._partial = None
        else:
            header = self._line(start)
            if header is None:
                return NEED_DATA
            line, pos = header
            try:
                count = int(line[1:])
            except ValueError:
                raise ProtocolError("ERR", "Protocol error: invalid multibulk length") from None
            if count > self.max_args:
                raise ProtocolError("ERR", "Protocol error: invalid multibulk length")
            args = []
        buf = self._pending
        while len(args) < count:
            if pos >= len(buf):
                self._partial = (count, args, pos)
                return NEED_DATA
            if buf[pos] != 0x24:  # b"$"
                got = chr(buf[pos])
                raise ProtocolError("ERR", f"Protocol error: expected '$', got '{got}'")
            header = self._line(pos)
            if header is None:
                self._partial = (count, args, pos)
                return NEED_DATA
            line, after = header
            try:
                size = int(line[1:])
            except ValueError:
                raise ProtocolError("ERR", "Protocol error: invalid bulk length") from None
            if size < 0 or size > self.max_bulk:
                raise ProtocolError("ERR", "Protocol error: invalid bulk length")
            if after + size + 2 > len(buf):
                self._partial = (count, args, pos)
                return NEED_DATA
            if buf[after + size : after + size + 2] != b"\r\n":
                raise ProtocolError("ERR", "Protocol error: bulk string not terminated by CRLF")
            args.append(bytes(buf[after : after + size]))
            pos = after + size + 2
        self._offset = pos
        return args


# Reply encoding -------------------------------------------------------------------------------

Reply = Union[None, int, bytes, str, list, dict, "SimpleString", "ErrorReply"]


class SimpleString(str):
    """A reply sent as a RESP simple string (``+OK``)."""


class ErrorReply(str):
    """A reply sent as a RESP error (``-ERR ...``); the text includes the code."""


def encode(value: Reply, proto: int = 2, push: bool = False) -> bytes:
    """Encode one reply in RESP2 or RESP3.

    ``bytes``/``str`` are bulk strings, ``int`` integers, ``list`` arrays (RESP3 ``>`` pushes when
    ``push``), ``dict`` maps (flattened arrays in RESP2), None the null reply.
    """
    return b"".join(_encode(value, proto, push))


def _encode(value: Reply, proto: int, push: bool = False) -> Iterable[bytes]:
    """Yield the pieces of one encoded reply."""
    if isinstance(value, SimpleString):
        yield b"+" + value.encode() + b"\r\n"
    elif isinstance(value, ErrorReply):
        yield b"-" + value.encode() + b"\r\n"
    elif isinstance(value, bool):
        yield b":1\r\n" if value else b":0\r\n"
    elif isinstance(value, int):
        yield b":%d\r\n" % value
    elif isinstance(value, (bytes, str)):
        data = value.encode() if isinstance(value, str) else value
        yield b"$%d\r\n" % len(data)
        yield data
        yield b"\r\n"
    elif value is None:
        yield b"_\r\n" if proto >= 3 else b"$-1\r\n"
    elif isinstance(value, list):
        yield (b">%d\r\n" if push and proto >= 3 else b"*%d\r\n") % len(value)
        for item in value:
            yield from _encode(item, proto)
    elif isinstance(value, dict):
        if proto >= 3:
            yield b"%%%d\r\n" % len(value)
        else:
            yield b"*%d\r\n" % (2 * len(value))
        for key, item in value.items():
            yield from _encode(key, proto)
            yield from _encode(item, proto)
    else:
        raise TypeError(f"cannot encode {type(value).__name__} as RESP")
