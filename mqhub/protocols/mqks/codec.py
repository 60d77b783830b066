"""Sans-IO codec for the MQKS text protocol (imports neither Twisted nor zope).

Wire format, as the original server (denis-ryzhkov/mqks 0.4.3) puts it on the wire:

- one request per line: ``{request_id} {action} {data}``. The server right-strips the line (all
  ASCII whitespace, so ``\\r\\n`` works and trailing spaces of data are lost) and splits it on
  the first two single spaces; fewer than three parts is an *unsplittable* line, answered with
  the literal id ``None``. Data is therefore mandatory (``x ping`` is unsplittable).
- ``--confirm `` (with its space) as the first 10 bytes of data sets the confirm flag and is
  removed; the confirm reply is ``{id} ok `` with a trailing space (the original client detects a
  confirm by empty data).
- responses ``{id} ok {data}`` and ``{id} error {error_id}``; an error id is 24 characters:
  the UTC time as ``%Y%m%d%H%M%S%f`` (20 digits) and 4 base62 characters.
- a TAB anywhere in a request closes the connection (no reply); mqhub adds a line-length limit
  (an over-long line is answered ``None error {error_id}`` and closes the connection).

:class:`LineReader` splits the byte stream into lines; the ``parse_*`` functions read the data of
the actions whose data has structure; the ``encode_*`` / ``render_*`` functions build replies.
"""

from __future__ import annotations

import json
import math
import random
import re
import time
from base64 import b64encode
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

DEFAULT_MAX_LINE: Final = 1024 * 1024
CONFIRM: Final = b"--confirm "
OK: Final = b" ok "
ERROR: Final = b" error "
NONE_ID: Final = b"None"

#: why a :class:`LineReader` stopped: a TAB in a request, or a line over the limit
FATAL_TAB: Final = "tab"
FATAL_TOO_LONG: Final = "too_long"

_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_UNSAFE = re.compile(rb"[\n\r\t]")


class RequestError(ValueError):
    """A request the original server would answer with ``{id} error {error_id}``."""


class LineReader:
    """Splits a byte stream into request lines (without their ``\\n``).

    :param max_line: the longest accepted line in bytes, its ``\\n`` excluded.
    :ivar fatal: None, :data:`FATAL_TAB` or :data:`FATAL_TOO_LONG` once the stream is unusable;
        after that :meth:`feed` returns nothing.
    """

    __slots__ = ("max_line", "fatal", "_buf")

    def __init__(self, max_line: int = DEFAULT_MAX_LINE) -> None:
        """Start with an empty buffer."""
        self.max_line = max_line
        self.fatal: str | None = None
        self._buf: bytes | bytearray = b""  # the incomplete line

    def feed(self, data: bytes) -> list[bytes]:
        """Return the complete lines of ``data`` (after what was buffered) in order.

        Lines before a bad one are returned; the bad one and everything after it are not, and
        :attr:`fatal` tells why. A TAB is detected as soon as it arrives, an over-long line as
        soon as the buffered part of it exceeds the limit. A line arriving in many reads grows a
        bytearray in place (no repeated copying when it trickles in byte by byte).
        """
        if self.fatal is not None:
            return []
        limit = self.max_line
        if b"\n" not in data:
            if b"\t" in data:
                return self._stop(FATAL_TAB, [])
            if len(self._buf) + len(data) > limit:
                return self._stop(FATAL_TOO_LONG, [])
            if not self._buf:
                self._buf = data
            else:
                if isinstance(self._buf, bytes):
                    self._buf = bytearray(self._buf)
                self._buf += data
            return []
        if self._buf:
            data = (bytes(self._buf) if isinstance(self._buf, bytearray) else self._buf) + data
        lines = data.split(b"\n")
        rest = lines.pop()
        if len(data) > limit or b"\t" in data:  # otherwise no line can be bad
            for i, line in enumerate(lines):
                if len(line) > limit:
                    return self._stop(FATAL_TOO_LONG, lines[:i])
                if b"\t" in line:
                    return self._stop(FATAL_TAB, lines[:i])
            if len(rest) > limit:
                return self._stop(FATAL_TOO_LONG, lines)
            if b"\t" in rest:
                return self._stop(FATAL_TAB, lines)
        self._buf = rest
        return lines

    def _stop(self, why: str, good: list[bytes]) -> list[bytes]:
        """Enter the fatal state ``why``; return the good lines that preceded the bad one."""
        self.fatal = why
        self._buf = b""
        return good

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete line held so far."""
        return len(self._buf)


def split_request(line: bytes) -> tuple[bytes, bytes, bytes] | None:
    """``(request_id, action, data)`` of a line as the original splits it, or None.

    The line is right-stripped and split on the first two single spaces; a line with fewer
    than three parts is unsplittable (answered ``None error ...``).
    """
    parts = line.rstrip().split(b" ", 2)
    if len(parts) != 3:
        return None
    return parts[0], parts[1], parts[2]


def take_confirm(data: bytes) -> tuple[bool, bytes]:
    """``(confirm, data)``: the ``--confirm `` prefix is recognised only at the start of data."""
    if data[:10] == CONFIRM:
        return True, data[10:]
    return False, data


def make_error_id(now: float, rng: random.Random | None = None) -> bytes:
    """A 24-character error id: UTC ``%Y%m%d%H%M%S%f`` of ``now`` plus 4 base62 characters."""
    r = rng or random
    micros = int(round((now - math.floor(now)) * 1_000_000))
    whole = int(math.floor(now))
    if micros >= 1_000_000:
        whole += 1
        micros -= 1_000_000
    stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime(whole)) + f"{micros:06d}"
    return (stamp + "".join(r.choice(_BASE62) for _ in range(4))).encode()


def encode_ok(request_id: bytes, data: bytes = b"") -> bytes:
    """``{id} ok {data}\\n`` (data empty: the confirm reply, with its trailing space)."""
    return request_id + OK + data + b"\n"


def encode_error(request_id: bytes, error_id: bytes) -> bytes:
    """``{id} error {error_id}\\n``."""
    return request_id + ERROR + error_id + b"\n"


# -- action data ---------------------------------------------------------------------------------


def split2(data: bytes) -> tuple[bytes, bytes]:
    """``data.split(' ', 1)`` that must give two parts (publish, ack, reject).

    :raises RequestError: when there is no space.
    """
    head, sep, tail = data.partition(b" ")
    if not sep:
        raise RequestError("expected two space-separated parts")
    return head, tail


def text(raw: bytes) -> str:
    """Decode a name (queue, event) as UTF-8.

    :raises RequestError: on bytes that are not UTF-8.
    """
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise RequestError("names must be UTF-8") from None


@dataclass
class ConsumeArgs:
    """What ``consume`` asks for (see :func:`parse_consume`).

    ``delete_when_unused``: None (flag absent), True (flag without value) or the seconds.
    """

    queue: str
    replace: list[str] = field(default_factory=list)
    add: list[str] = field(default_factory=list)
    adding: bool = False
    delete_when_unused: bool | float | None = None
    manual_ack: bool = False


def parse_seconds(raw: str) -> float:
    """A ``--delete-queue-when-unused=`` value: a finite number of seconds ≥ 0.

    :raises RequestError: on anything else (the original's ``float()`` raised for most).
    """
    if not _NUMBER.fullmatch(raw):
        raise RequestError(f"bad seconds {raw!r}")
    value = float(raw)
    if not math.isfinite(value) or value < 0:
        raise RequestError(f"bad seconds {raw!r}")
    return value


def parse_consume(data: bytes) -> ConsumeArgs:
    """Parse ``{queue} [ev..] [--add ev..] [--delete-queue-when-unused[=s]] [--manual-ack]``.

    Tokens after the queue may come in any order; events before ``--add`` replace the
    queue's bindings, events after it are added; empty tokens (double spaces) are skipped.

    :raises RequestError: on an unknown ``--flag``, a bad number, an empty queue or non-UTF-8.
    """
    queue, _, rest = text(data).partition(" ")
    if not queue:
        raise RequestError("consume needs a queue")
    args = ConsumeArgs(queue)
    for part in rest.split(" "):
        if part.startswith("--"):
            if part == "--add":
                args.adding = True
            elif part == "--delete-queue-when-unused":
                args.delete_when_unused = True
            elif part.startswith("--delete-queue-when-unused="):
                args.delete_when_unused = parse_seconds(part[len("--delete-queue-when-unused="):])
            elif part == "--manual-ack":
                args.manual_ack = True
            else:
                raise RequestError(f"unknown flag {part!r}")
        elif part:
            (args.add if args.adding else args.replace).append(part)
    return args


@dataclass
class RebindArgs:
    """What ``rebind`` asks for; applied as replace → remove → remove-mask → add."""

    queue: str
    replace: list[str] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)
    remove_mask: list[str] = field(default_factory=list)
    add: list[str] = field(default_factory=list)


_REBIND_FLAGS = {"--replace": "replace", "--remove": "remove", "--remove-mask": "remove_mask",
                 "--add": "add"}


def parse_rebind(data: bytes) -> RebindArgs:
    """Parse ``{queue} [ev..] [--remove ev..] [--remove-mask m..] [--add ev..]``.

    At least one token after the queue is required (``rebind q1`` is an error, as in the
    original). ``--replace`` is accepted like the original's flag table does.

    :raises RequestError: on a missing token, an unknown ``--flag`` or non-UTF-8.
    """
    queue, sep, rest = text(data).partition(" ")
    if not sep or not queue:
        raise RequestError("rebind needs a queue and at least one token")
    args = RebindArgs(queue)
    target = args.replace
    for part in rest.split(" "):
        if part.startswith("--"):
            name = _REBIND_FLAGS.get(part)
            if name is None:
                raise RequestError(f"unknown flag {part!r}")
            target = getattr(args, name)
        elif part:
            target.append(part)
    return args


def mask_regex(masks: Iterable[str]) -> re.Pattern[str]:
    """One regexp for ``--remove-mask`` masks: ``*`` = a run of non-dot characters, anchored."""
    return re.compile("|".join("[^.]*".join(re.escape(p) for p in m.split("*")) + "$"
                               for m in masks), re.DOTALL)


def apply_rebind(old: set[str], replace: list[str], remove: list[str], remove_mask: list[str],
                 add: list[str]) -> set[str]:
    """The queue's new event set: replace → remove → remove-mask → add, in that fixed order.

    Masks only ever test events that contain a dot (the original's rule).
    """
    new = set(replace) if replace else set(old)
    if remove and new:
        new.difference_update(remove)
    if remove_mask and new:
        rx = mask_regex(remove_mask)
        new.difference_update([e for e in new if "." in e and rx.match(e)])
    if add:
        new.update(add)
    return new


def format_seconds(value: float) -> str:
    """A float as Python 2's ``str(float)`` prints it (``5.0``, ``1.5``, ``1e+20``)."""
    out = format(value, ".12g")
    if not any(c in out for c in ".enai"):
        out += ".0"
    return out


def render_update(queue: str, events: Iterable[str], delete_when_unused: bool | float | None,
                  manual_ack: bool) -> bytes:
    """The data of a ``--update`` notice: ``--update {queue} [sorted events] [flags]``."""
    parts = ["--update", queue]
    parts.extend(sorted(events))
    if delete_when_unused is True:
        parts.append("--delete-queue-when-unused")
    elif delete_when_unused is not None and delete_when_unused is not False:
        parts.append("--delete-queue-when-unused=" + format_seconds(float(delete_when_unused)))
    if manual_ack:
        parts.append("--manual-ack")
    return " ".join(parts).encode()


# -- message bodies ------------------------------------------------------------------------------


def render_body(body: bytes) -> tuple[bytes, bytes]:
    """``(extra_props, data)`` for a body published by another protocol.

    A body MQKS can carry (UTF-8 without LF, CR or TAB) goes as it is. A UTF-8 body with LF, CR
    or TAB becomes a JSON string literal and the property ``enc=json``; any other body becomes
    base64 with ``enc=base64``. Nothing is dropped.
    """
    if _UNSAFE.search(body) is None:
        try:
            body.decode()
            return b"", body
        except UnicodeDecodeError:
            return b",enc=base64", b64encode(body)
    try:
        decoded = body.decode()
    except UnicodeDecodeError:
        return b",enc=base64", b64encode(body)
    return b",enc=json", json.dumps(decoded, ensure_ascii=False).encode()


def render_message(consumer_id: bytes, msg_id: bytes, event: bytes, retry: int,
                   data: bytes) -> bytes:
    """One delivery line: ``{cid} ok {msg_id} event={event}[,retry={n}] {data}\\n``."""
    props = b"event=" + event if not retry else b"event=%s,retry=%d" % (event, retry)
    return consumer_id + OK + msg_id + b" " + props + b" " + data + b"\n"
