"""Sans-IO codec for the NATS client protocol (no Twisted, no zope).

The parser turns bytes into *events*, which are plain tuples whose first item is one of the
``OP_*`` constants below (no per-message object on the hot path)::

    (OP_PUB, hit, payload)                   hit = (line, subject, reply, size) from the line cache
    (OP_HPUB, hit, header_block, payload)    hit = (line, subject, reply, hdr_size, total_size)
    (OP_SUB, subject, queue, sid)            queue is None without a queue group
    (OP_UNSUB, sid, max_msgs)                max_msgs is None without a limit
    (OP_CONNECT, options_dict)
    (OP_INFO, info_dict)
    (OP_MSG, subject, sid, reply, payload)
    (OP_HMSG, subject, sid, reply, header_block, payload)
    (OP_PING,) (OP_PONG,) (OP_OK,) (OP_ERR, text)
    (OP_ERROR, ProtocolError)                a non-fatal error in stream order (``events()`` only)

A parser made with ``server=True`` accepts what clients send (CONNECT, PUB, HPUB, SUB, UNSUB,
PING, PONG, +OK, -ERR); with ``server=False`` what servers send (INFO, MSG, HMSG, PING, PONG,
+OK, -ERR). The buffer is an immutable ``bytes`` object walked with an offset; each distinct
PUB control line is parsed once and cached, which is what makes the hot path cheap.

The parser only parses: it knows nothing of subscriptions or routes. The server's fast path,
which delivers PUB frames straight out of this buffer, is :class:`mqhub.protocols.nats.router.
PubRouter`; it reads through :meth:`NatsParser.window`, :meth:`NatsParser.seek` and
:meth:`NatsParser.next_read`, and takes turns with :meth:`NatsParser.events_until`.
"""

from __future__ import annotations

from collections.abc import Callable

# re-exported so codec.encode_msg, codec.PONG... keep working (encoders.py defines __all__)
from mqhub.protocols.nats import encoders
from mqhub.protocols.nats.encoders import *  # noqa: F403
from mqhub.protocols.nats.grammar import (  # noqa: F401  (re-exported: codec.ProtocolError...)
    DEFAULT_MAX_PAYLOAD,
    E_BAD_ARGS,
    E_BAD_CONNECT,
    E_INVALID_SUBJECT,
    E_MAX_CONTROL,
    E_MAX_PAYLOAD,
    E_UNKNOWN_OP,
    MAX_CONTROL_LINE,
    ProtocolError,
    build_headers,
    json_object,
    parse_headers,
    size_field,
    text_field,
    valid_publish_subject,
    valid_subject,
)
from mqhub.protocols.nats.reads import frame_completion

__all__ = [
    "NEED_DATA", "ProtocolError", "NatsParser", "MAX_CONTROL_LINE", "DEFAULT_MAX_PAYLOAD",
    "parse_headers", "build_headers", "valid_subject", "valid_publish_subject",
] + encoders.__all__

#: Returned by :meth:`NatsParser.next_event` when a complete event is not yet buffered.
NEED_DATA = object()

OP_PUB = 1
OP_HPUB = 2
OP_SUB = 3
OP_UNSUB = 4
OP_CONNECT = 5
OP_PING = 6
OP_PONG = 7
OP_OK = 8
OP_ERR = 9
OP_INFO = 10
OP_MSG = 11
OP_HMSG = 12
OP_ERROR = 13

_CACHE_LIMIT = 16384
_CRLF = b"\r\n"


Event = tuple


class NatsParser:
    """Incremental NATS parser; feed with :meth:`receive_data`, read with :meth:`events`.

    :param server: True to parse client→server operations, False for server→client ones.
    :param max_payload: the largest payload (HPUB: headers plus payload) accepted.
    :param max_control_line: the longest control line accepted, in bytes.
    """

    def __init__(self, server: bool = True, max_payload: int = DEFAULT_MAX_PAYLOAD,
                 max_control_line: int = MAX_CONTROL_LINE) -> None:
        """Start with an empty buffer."""
        self.server = server
        self.max_payload = max_payload
        self.max_control_line = max_control_line
        self._buf = b""
        self._pos = 0
        self._chunks: list[bytes] = []   # waiting for a large payload: raw chunks after _buf
        self._chunked = 0                # total bytes in _chunks
        self._need = 0                   # bytes needed past _pos before parsing is worthwhile
        self._next: bytes | None = None  # a read that continues after _buf (see reads.py)
        self._next_pos = 0
        self._pub_cache: dict[bytes, tuple] = {}
        self._hpub_cache: dict[bytes, tuple] = {}
        self._head_cache: dict[bytes, tuple[str, str | None]] = {}
        self._pending: list[Event] = []
        self._dead: ProtocolError | None = None

    # input -------------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        """Append ``data`` (any split of the stream) to the buffer."""
        if not data:
            return
        if self._next is not None:
            self._advance()
        if self._need:
            self._chunks.append(data)
            self._chunked += len(data)
            if len(self._buf) - self._pos + self._chunked < self._need:
                return
            self._buf = self._buf[self._pos:] + b"".join(self._chunks)
            self._pos = 0
            self._chunks = []
            self._chunked = 0
            self._need = 0
            return
        if self._pos >= len(self._buf):
            self._buf = data
        else:
            left = self._buf[self._pos:]
            k = frame_completion(left, data)
            if k > 0:       # parse left + the frame's rest, then data itself from k on
                self._buf = left + data[:k]
                self._next = data
                self._next_pos = k
            else:
                self._buf = left + data
        self._pos = 0

    def _advance(self) -> None:
        """Go on in the pending next read: free when the buffer is used up, else one join."""
        nxt, self._next = self._next, None
        assert nxt is not None
        if self._pos >= len(self._buf):
            self._buf = nxt
            self._pos = self._next_pos
        else:
            self._buf = self._buf[self._pos:] + nxt[self._next_pos:]
            self._pos = 0

    @property
    def buffered(self) -> int:
        """Bytes received but not yet turned into events."""
        nxt = len(self._next) - self._next_pos if self._next is not None else 0
        return len(self._buf) - self._pos + self._chunked + nxt

    # output ------------------------------------------------------------------------------

    def next_event(self) -> Event | object:
        """Return the next event, or :data:`NEED_DATA`.

        :raises ProtocolError: for every protocol violation (fatal ones end the parser).
        """
        if not self._pending:
            self._pending = self.events()
            self._pending.reverse()
            if not self._pending:
                if self._dead is not None:
                    raise self._dead
                return NEED_DATA
        ev = self._pending.pop()
        if ev[0] == OP_ERROR:
            raise ev[1]
        return ev

    def events(self) -> list[Event]:
        """Return every complete event buffered now, in order.

        Non-fatal errors appear in place as ``(OP_ERROR, ProtocolError)``. A fatal error ends
        the list with ``(OP_ERROR, err)``; afterwards the parser only returns that error.
        """
        return self._run()

    def events_until(self, stop: Callable[[bytes], bool]) -> list[Event]:
        """Like :meth:`events`, but stop before the first control line (as received, with its
        CR) for which ``stop`` is true, once at least one event was parsed (a router takes such
        lines itself, see router.py)."""
        return self._run(stop)

    def _run(self, stop: Callable[[bytes], bool] | None = None) -> list[Event]:
        """Parse what is buffered (see :meth:`_parse`); a raised error is fatal and ends the list."""
        if self._dead is not None:
            return [(OP_ERROR, self._dead)]
        if self._need:
            return []
        out: list[Event] = []
        try:
            self._parse(out, stop)
            while self._next is not None:
                self._advance()
                self._parse(out, stop)
        except ProtocolError as err:
            err.fatal = True
            self._dead = err
            self._buf = b""
            self._pos = 0
            self._next = None
            out.append((OP_ERROR, err))
        return out

    # parsing -----------------------------------------------------------------------------

    def _parse(self, out: list[Event], claims: Callable[[bytes], bool] | None = None) -> None:
        """Parse every buffered event into ``out`` (up to a line ``claims`` is true of, see
        :meth:`events_until`)."""
        buf = self._buf
        pos = self._pos
        n = len(buf)
        pub_cache = self._pub_cache
        append = out.append
        find = buf.find
        limit = self.max_control_line
        try:
            while pos < n:
                i = find(b"\n", pos)
                if i < 0:
                    if n - pos > limit:
                        raise ProtocolError(E_MAX_CONTROL, "maximum control line exceeded")
                    break
                raw = buf[pos:i]
                if claims is not None and out and claims(raw):
                    break
                hit = pub_cache.get(raw)
                if hit is not None:
                    start = i + 1
                    stop = start + hit[3]
                    if stop + 2 > n:
                        self._wait(pos, stop + 2 - pos)
                        break
                    if buf[stop:stop + 2] != _CRLF:
                        raise ProtocolError(E_UNKNOWN_OP, "payload not followed by CRLF")
                    append((OP_PUB, hit, buf[start:stop]))
                    pos = stop + 2
                    continue
                end = i - 1 if i > pos and buf[i - 1] == 13 else i
                if end - pos > limit:
                    raise ProtocolError(E_MAX_CONTROL, "maximum control line exceeded")
                consumed = self._slow(buf, pos, i, raw, buf[pos:end], out)
                if consumed < 0:
                    break
                pos = consumed
        finally:
            self._pos = pos

    # the cursor a router reads through (see router.py) ------------------------------------------

    def window(self) -> tuple[bytes, int] | None:
        """The current buffer and the offset of the next unparsed frame, or None while parsing
        cannot go on (a large payload is still arriving, or the stream is dead)."""
        if self._need or self._dead is not None:
            return None
        return self._buf, self._pos

    def seek(self, pos: int) -> None:
        """Mark everything of the current buffer before ``pos`` as consumed (``pos`` must be a
        frame boundary at or after the offset :meth:`window` gave)."""
        self._pos = pos

    def next_read(self) -> bool:
        """Move on into the read that follows a used-up buffer (no copy); False when there is none
        or the current buffer still has unparsed bytes."""
        if self._next is None or self._pos < len(self._buf):
            return False
        self._advance()
        return True

    def _wait(self, pos: int, need: int) -> None:
        """Remember that ``need`` bytes from ``pos`` are required before parsing again."""
        if need > 65536:
            self._need = need

    def _slow(self, buf: bytes, pos: int, i: int, raw: bytes, line: bytes,
              out: list[Event]) -> int:
        """Parse one control line that is not a cached PUB; return the new offset or -1.

        ``raw`` is the line as received (the PUB cache key), ``line`` without a final CR.
        """
        if self.server and line[:4].upper() == b"PUB ":
            # a known subject/reply with a new size: only the size needs parsing
            sp = line.rfind(b" ")
            size_f = line[sp + 1:]
            if size_f.isdigit():
                sr = self._head_cache.get(line[:sp])
                if sr is not None:
                    return self._pub_known(buf, pos, i + 1, raw, sr, int(size_f), out)
        parts = line.split()
        if not parts:
            return i + 1   # empty line: ignored, as nats-server tolerates stray CRLFs
        op = parts[0].upper()
        args = parts[1:]
        nxt = i + 1
        if self.server:
            if op == b"PUB":
                return self._pub(buf, pos, nxt, raw, line, args, out)
            if op == b"HPUB":
                return self._hpub(buf, pos, nxt, line, args, out)
            if op == b"SUB":
                if len(args) == 2:
                    subject, queue, sid = args[0], None, args[1]
                elif len(args) == 3:
                    subject, queue, sid = args[0], text_field(args[1]), args[2]
                else:
                    raise ProtocolError(E_BAD_ARGS, "SUB needs subject [queue] sid")
                subj = text_field(subject)
                if not valid_subject(subj):
                    out.append((OP_ERROR, ProtocolError(E_INVALID_SUBJECT, "Invalid Subject",
                                                        fatal=False)))
                else:
                    out.append((OP_SUB, subj, queue, text_field(sid)))
                return nxt
            if op == b"UNSUB":
                if len(args) == 1:
                    out.append((OP_UNSUB, text_field(args[0]), None))
                elif len(args) == 2:
                    mx = int(args[1]) if args[1].isdigit() else None
                    out.append((OP_UNSUB, text_field(args[0]), mx))
                else:
                    raise ProtocolError(E_BAD_ARGS, "UNSUB needs sid [max]")
                return nxt
            if op == b"CONNECT":
                out.append((OP_CONNECT, json_object(line.lstrip()[7:], E_BAD_CONNECT, "CONNECT")))
                return nxt
        else:
            if op == b"MSG":
                return self._msg(buf, pos, nxt, args, out)
            if op == b"HMSG":
                return self._hmsg(buf, pos, nxt, args, out)
            if op == b"INFO":
                out.append((OP_INFO, json_object(line.lstrip()[4:], E_BAD_ARGS, "INFO")))
                return nxt
        if op == b"PING" and not args:
            out.append((OP_PING,))
            return nxt
        if op == b"PONG" and not args:
            out.append((OP_PONG,))
            return nxt
        if op == b"+OK":
            out.append((OP_OK,))
            return nxt
        if op == b"-ERR":
            text = line.lstrip()[4:].strip().decode("utf-8", "replace")
            if len(text) >= 2 and text[0] == text[-1] == "'":
                text = text[1:-1]
            out.append((OP_ERR, text))
            return nxt
        raise ProtocolError(E_UNKNOWN_OP, "Unknown Protocol Operation")

    def _pub(self, buf: bytes, pos: int, nxt: int, raw: bytes, line: bytes, args: list[bytes],
             out: list[Event]) -> int:
        """Parse a PUB line (not yet cached), cache it, and take its payload if buffered."""
        if len(args) == 2:
            subject, reply, size_f = args[0], None, args[1]
        elif len(args) == 3:
            subject, reply, size_f = args[0], text_field(args[1]), args[2]
        else:
            raise ProtocolError(E_BAD_ARGS, "PUB needs subject [reply] size")
        size = size_field(size_f)
        sr = (text_field(subject), reply)
        sp = line.rfind(b" ")
        if line[sp + 1:] == size_f:
            heads = self._head_cache
            if len(heads) >= _CACHE_LIMIT:
                heads.clear()
            heads[line[:sp]] = sr
        return self._pub_known(buf, pos, nxt, raw, sr, size, out)

    def _pub_known(self, buf: bytes, pos: int, nxt: int, line: bytes,
                   sr: tuple[str, str | None], size: int, out: list[Event]) -> int:
        """Finish a PUB whose subject and reply are known: cache the line, take the payload.

        An oversized payload is refused by :meth:`_payload_end` (fatal: the parser is dead).
        """
        hit = (line, sr[0], sr[1], size)
        cache = self._pub_cache
        if len(cache) >= _CACHE_LIMIT:
            cache.clear()
        cache[line] = hit
        stop = self._payload_end(buf, pos, nxt, size)
        if stop < 0:
            return -1
        out.append((OP_PUB, hit, buf[nxt:stop]))
        return stop + 2

    def _hpub(self, buf: bytes, pos: int, nxt: int, line: bytes, args: list[bytes],
              out: list[Event]) -> int:
        """Parse an HPUB line and take its header block and payload if buffered."""
        hit = self._hpub_cache.get(line)
        if hit is None:
            if len(args) == 3:
                subject, reply, hs, ts = args[0], None, args[1], args[2]
            elif len(args) == 4:
                subject, reply, hs, ts = args[0], text_field(args[1]), args[2], args[3]
            else:
                raise ProtocolError(E_BAD_ARGS, "HPUB needs subject [reply] hdr_size total_size")
            hsize, total = size_field(hs), size_field(ts)
            if hsize > total:
                raise ProtocolError(E_BAD_ARGS, "header size larger than total size")
            hit = (line, text_field(subject), reply, hsize, total)
            if len(self._hpub_cache) >= _CACHE_LIMIT:
                self._hpub_cache.clear()
            self._hpub_cache[line] = hit
        hsize = hit[3]
        stop = self._payload_end(buf, pos, nxt, hit[4])
        if stop < 0:
            return -1
        block = buf[nxt:nxt + hsize]
        if hsize and not block.startswith(b"NATS/1.0"):
            raise ProtocolError(E_BAD_ARGS, "header block must start with NATS/1.0")
        out.append((OP_HPUB, hit, block, buf[nxt + hsize:stop]))
        return stop + 2

    def _msg(self, buf: bytes, pos: int, nxt: int, args: list[bytes], out: list[Event]) -> int:
        """Parse a MSG line (client side) and its payload."""
        if len(args) == 3:
            subject, sid, reply, size_f = args[0], args[1], None, args[2]
        elif len(args) == 4:
            subject, sid, reply, size_f = args[0], args[1], text_field(args[2]), args[3]
        else:
            raise ProtocolError(E_BAD_ARGS, "MSG needs subject sid [reply] size")
        stop = self._payload_end(buf, pos, nxt, size_field(size_f))
        if stop < 0:
            return -1
        out.append((OP_MSG, text_field(subject), text_field(sid), reply, buf[nxt:stop]))
        return stop + 2

    def _payload_end(self, buf: bytes, pos: int, nxt: int, size: int) -> int:
        """Check a payload of ``size`` bytes at ``nxt``; return where it ends, or -1 to wait.

        :raises ProtocolError: over max_payload, or when the payload is not followed by CRLF.
        """
        if size > self.max_payload:
            raise ProtocolError(E_MAX_PAYLOAD, "Maximum Payload Violation")
        stop = nxt + size
        if stop + 2 > len(buf):
            self._wait(pos, stop + 2 - pos)
            return -1
        if buf[stop:stop + 2] != _CRLF:
            raise ProtocolError(E_UNKNOWN_OP, "payload not followed by CRLF")
        return stop

    def _hmsg(self, buf: bytes, pos: int, nxt: int, args: list[bytes], out: list[Event]) -> int:
        """Parse an HMSG line (client side), its header block and payload."""
        if len(args) == 4:
            subject, sid, reply, hs, ts = args[0], args[1], None, args[2], args[3]
        elif len(args) == 5:
            subject, sid, reply, hs, ts = args[0], args[1], text_field(args[2]), args[3], args[4]
        else:
            raise ProtocolError(E_BAD_ARGS, "HMSG needs subject sid [reply] hdr_size total_size")
        hsize, total = size_field(hs), size_field(ts)
        if hsize > total:
            raise ProtocolError(E_BAD_ARGS, "header size larger than total size")
        stop = self._payload_end(buf, pos, nxt, total)
        if stop < 0:
            return -1
        out.append((OP_HMSG, text_field(subject), text_field(sid), reply, buf[nxt:nxt + hsize],
                    buf[nxt + hsize:stop]))
        return stop + 2
