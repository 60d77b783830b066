"""The flow journal's record format: one columnar chunk per group commit (no Twisted, no numpy).

A chunk is the payload of one CRC-framed segment record (:mod:`mqhub.store.segments`). All
integers are little-endian. Layout::

    version:u8 = 1
    strings:  n:u32, then n times (len:u16, utf-8 bytes)       the chunk's string table
    runs:     n:u32, then columns of n values each:
              event u8 | ts_us i64 | queue u32 | address u32 | origin u32 | reason u32 | count u32
    rows:     n:u32 (= sum of run counts), then columns:
              msg_id u64 | size u32 | priority u8 | attempt u16
    counters: n:u32, then columns:
              second i64 | address u32 | origin u32 | kind u8 | messages u32 | bytes u64

A *run* is one batch-level call of the recorder (one event kind, one time, one queue, one
address and origin, one reason) covering ``count`` consecutive rows; per-message columns live
in *rows*. String indexes point into the chunk's own string table (index 0 is ``""``).
*Counters* count memory-tier traffic (no per-message rows) per address and second.
Readers expand runs with ``numpy.repeat``: see :func:`decode_chunk` and mqhub.analytics.
"""

from __future__ import annotations

import struct
import sys
from array import array
from typing import Any

VERSION = 1

#: event codes (the ``event`` column of the ``events`` table holds the names); ``purged``
#: (a message removed with its whole queue: a purge or a deletion) came with issue 27
PUBLISHED, DELIVERED, ACKED, REQUEUED, DEAD_LETTERED, EXPIRED, PURGED = range(7)
EVENT_NAMES = ("published", "delivered", "acked", "requeued", "dead_lettered", "expired",
               "purged")
#: counter kinds for memory-tier traffic
COUNTER_PUBLISHED, COUNTER_DELIVERED = 0, 1
COUNTER_NAMES = ("published", "delivered")

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")

RUN_COLUMNS = (("event", "B"), ("ts_us", "q"), ("queue", "I"), ("address", "I"),
               ("origin", "I"), ("reason", "I"), ("count", "I"))
ROW_COLUMNS = (("msg_id", "Q"), ("size", "I"), ("priority", "B"), ("attempt", "H"))
COUNTER_COLUMNS = (("second", "q"), ("address", "I"), ("origin", "I"), ("kind", "B"),
                   ("messages", "I"), ("bytes", "Q"))
#: numpy dtypes of the columns above (for readers that decode with numpy)
NUMPY_TYPES = {"B": "<u1", "H": "<u2", "I": "<u4", "Q": "<u8", "q": "<i8"}

_BIG_ENDIAN = sys.byteorder == "big"
#: array typecode for u64 columns: 'L' converts Python ints about 3x faster than 'Q' (CPython
#: 3.11) and is 8 bytes on LP64 platforms; 'Q' elsewhere
_U64 = "L" if array("L").itemsize == 8 else "Q"
#: the array typecodes of each group's columns (a chunk is built per group commit that carries
#: a publish: its fixed cost is kept to a few map() calls)
_RUN_CODES = tuple(code for _, code in RUN_COLUMNS)
_ROW_ARRAY_CODES = tuple(_U64 if code == "Q" else code for _, code in ROW_COLUMNS)
_COUNTER_CODES = tuple(_U64 if code == "Q" else code for _, code in COUNTER_COLUMNS)
_HEAD = _U8.pack(VERSION)


def _empty(codes: tuple[str, ...]) -> tuple[array[int], ...]:
    """One empty array per typecode."""
    return tuple([array(code) for code in codes])


class ChunkError(ValueError):
    """A journal chunk does not decode (wrong version or lengths)."""


class ChunkBuilder:
    """Accumulates the columns of one chunk; :meth:`encode` returns its bytes."""

    __slots__ = ("strings", "_index", "runs", "rows", "counters")

    def __init__(self) -> None:
        """Start an empty chunk."""
        self.strings: list[str] = [""]
        self._index: dict[str, int] = {"": 0}
        self.runs = _empty(_RUN_CODES)
        self.rows = _empty(_ROW_ARRAY_CODES)
        self.counters = _empty(_COUNTER_CODES)

    def string(self, text: str) -> int:
        """Return the index of ``text`` in the string table (adding it once)."""
        i = self._index.get(text)
        if i is None:
            i = self._index[text] = len(self.strings)
            self.strings.append(text)
        return i

    def add_run(self, event: int, ts_us: int, queue: str, address: str, origin: str,
                reason: str, msg_ids: Any, sizes: Any = None, priorities: Any = None,
                attempts: Any = None) -> None:
        """Append one run of ``len(msg_ids)`` rows sharing event, time, queue, address, origin.

        Columns are lists of ints (``priorities``: anything ``bytes()`` takes); ``sizes``,
        ``priorities`` and ``attempts`` may be None (zeros); ``msg_ids``, ``sizes`` and
        ``attempts`` may also be arrays made by :func:`column` or ``bytes`` made by
        :func:`repeated` (packed already, e.g. while the values were hot in another thread).
        """
        s = self.string
        n = len(msg_ids)
        for col, value in zip(self.runs, (event, ts_us, s(queue), s(address), s(origin),
                                          s(reason), n), strict=True):
            col.append(value)
        mid, size, prio, att = self.rows
        for col, values in ((mid, msg_ids), (size, sizes), (att, attempts)):
            if values is None:
                col.frombytes(bytes(col.itemsize * n))
            elif isinstance(values, list):
                col.fromlist(values)  # fromlist: about 2x faster than extend
            elif isinstance(values, bytes):
                col.frombytes(values)
            else:
                col.extend(values)  # an array made by column(): one copy
        prio.frombytes(bytes(n) if priorities is None else bytes(priorities))

    def add_counter(self, second: int, address: str, origin: str, kind: int, messages: int,
                    nbytes: int) -> None:
        """Append one memory-tier counter row."""
        s = self.string
        for col, value in zip(self.counters, (second, s(address), s(origin), kind, messages,
                                              nbytes), strict=True):
            col.append(value)

    def __bool__(self) -> bool:
        """True when the chunk holds a run or a counter."""
        return bool(len(self.runs[0]) or len(self.counters[0]))

    def encode(self) -> bytes:
        """Return the chunk's bytes (see the module docstring)."""
        parts = [_HEAD, _U32.pack(len(self.strings))]
        pack16 = _U16.pack
        for text in self.strings:
            raw = text.encode("utf-8", "surrogatepass")[:0xFFFF]
            parts += (pack16(len(raw)), raw)
        for group in (self.runs, self.rows, self.counters):
            parts.append(_U32.pack(len(group[0])))
            if _BIG_ENDIAN:  # pragma: no cover - the format is little-endian
                group = tuple(array(col.typecode, col) for col in group)
                for col in group:
                    col.byteswap()
            parts += map(array.tobytes, group)
        return b"".join(parts)


_ROW_CODES = {name: (_U64 if code == "Q" else code) for name, code in ROW_COLUMNS}


def removals_chunk(runs: list[tuple[str, int, str, list[int]]], ts_us: int) -> bytes:
    """One chunk of the messages whole-queue removals took out of the store: a run of
    ``(queue, event, reason, msg_ids)`` each (the store gathers them while it purges)."""
    chunk = ChunkBuilder()
    for queue, event, reason, ids in runs:
        chunk.add_run(event, ts_us, queue, "", "", reason, ids)
    return chunk.encode()


def column(name: str, values: list[int]) -> array:
    """``values`` packed for the rows column ``name`` ("msg_id", "size" or "attempt"): what
    :meth:`ChunkBuilder.add_run` takes instead of a list, copied there in one go."""
    out = array(_ROW_CODES[name])
    out.fromlist(values)
    return out


def repeated(name: str, value: int, count: int) -> bytes:
    """``count`` times ``value`` packed for the rows column ``name``, in the machine's order
    (what :meth:`ChunkBuilder.add_run` takes instead of a list)."""
    return array(_ROW_CODES[name], (value,)).tobytes() * count


def decode_chunk(payload: bytes) -> dict[str, Any]:
    """Decode one chunk into ``{"strings": [...], "runs": {...}, "rows": {...}, "counters": {...}}``.

    Columns are ``array.array`` objects (cheap to hand to numpy with ``numpy.frombuffer``).
    :raises ChunkError: when the payload is not a chunk of this version.
    """
    view = memoryview(payload)
    if not view or view[0] != VERSION:
        raise ChunkError(f"journal chunk version {view[0] if view else None} is not {VERSION}")
    pos = 1
    try:
        (n,) = _U32.unpack_from(view, pos)
        pos += 4
        strings = []
        for _ in range(n):
            (length,) = _U16.unpack_from(view, pos)
            pos += 2
            strings.append(bytes(view[pos:pos + length]).decode("utf-8", "replace"))
            pos += length
        out: dict[str, Any] = {"strings": strings}
        for name, columns in (("runs", RUN_COLUMNS), ("rows", ROW_COLUMNS),
                              ("counters", COUNTER_COLUMNS)):
            (n,) = _U32.unpack_from(view, pos)
            pos += 4
            group = {}
            for col, code in columns:
                a = array(code)
                end = pos + n * a.itemsize
                if end > len(view):
                    raise ChunkError("journal chunk is shorter than its columns")
                a.frombytes(view[pos:end])
                if _BIG_ENDIAN:  # pragma: no cover
                    a.byteswap()
                group[col] = a
                pos = end
            out[name] = group
    except struct.error as e:
        raise ChunkError(f"journal chunk is truncated: {e}") from e
    if sum(out["runs"]["count"]) != len(out["rows"]["msg_id"]):
        raise ChunkError("journal chunk run counts do not match its rows")
    return out

