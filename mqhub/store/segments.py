"""Append-only segment files for large bodies and the archive tier (no Twisted, no zope).

A segment is a file ``seg-<number>.seg`` of records, each framed as::

    size:u32 | crc32:u32 | flags:u8 | payload[size]

where ``crc32`` covers the flags byte and the payload, and ``flags & 1`` means the payload is
brotli-compressed. Files roll over once they reach ``max_size``. On open the active (last)
segment is scanned and a torn or corrupt tail is truncated with a logged warning; a corrupt
record found later, on read, raises :class:`CorruptRecord`. The LMDB index decides which
segments are still referenced; :meth:`SegmentLog.delete` removes one that no longer is.
"""

from __future__ import annotations

import logging
import os
import re
import struct
import zlib
from collections.abc import Iterator

import brotli

from mqhub.errors import StoreError

log = logging.getLogger("mqhub.store.segments")

RECORD_HEAD = struct.Struct(">IIB")
HEAD_SIZE = RECORD_HEAD.size
FLAG_BROTLI = 1
_NAME = re.compile(r"^seg-(\d{10})\.seg$")


class CorruptRecord(StoreError):
    """A segment record failed its length or CRC check."""


def segment_name(number: int) -> str:
    """Return the file name of segment ``number``."""
    return f"seg-{number:010d}.seg"


def list_segments(directory: str) -> list[int]:
    """Return the numbers of the segment files in ``directory``, ascending."""
    if not os.path.isdir(directory):
        return []
    found = []
    for name in os.listdir(directory):
        m = _NAME.match(name)
        if m:
            found.append(int(m.group(1)))
    return sorted(found)


def frame(payload: bytes, compress: bool = False) -> bytes:
    """Return one framed record holding ``payload`` (brotli-compressed when it helps)."""
    flags = 0
    if compress:
        packed = brotli.compress(payload, quality=4)
        if len(packed) < len(payload):
            payload, flags = packed, FLAG_BROTLI
    crc = zlib.crc32(payload, zlib.crc32(bytes((flags,))))
    return RECORD_HEAD.pack(len(payload), crc, flags) + payload


def unframe(record: bytes) -> bytes:
    """Check one framed record and return its (decompressed) payload."""
    if len(record) < HEAD_SIZE:
        raise CorruptRecord("segment record is truncated")
    size, crc, flags = RECORD_HEAD.unpack_from(record)
    payload = record[HEAD_SIZE:]
    if len(payload) != size:
        raise CorruptRecord("segment record is truncated")
    if zlib.crc32(payload, zlib.crc32(bytes((flags,)))) != crc:
        raise CorruptRecord("segment record fails its CRC check")
    if flags & FLAG_BROTLI:
        return brotli.decompress(payload)
    return payload


def scan(path: str) -> Iterator[tuple[int, int, bytes | None]]:
    """Yield ``(offset, record_size, payload)`` for each record of a file, in order.

    Stops at the first torn or corrupt record, yielding ``(offset, 0, None)`` for it.
    """
    with open(path, "rb") as f:
        data = f.read()
    offset, end = 0, len(data)
    while offset < end:
        if end - offset < HEAD_SIZE:
            yield offset, 0, None
            return
        size = RECORD_HEAD.unpack_from(data, offset)[0]
        rec_end = offset + HEAD_SIZE + size
        if rec_end > end:
            yield offset, 0, None
            return
        try:
            payload = unframe(data[offset:rec_end])
        except (CorruptRecord, brotli.error):
            yield offset, 0, None
            return
        yield offset, rec_end - offset, payload
        offset = rec_end


class SegmentLog:
    """The segment files of one store directory: append, read, sync, truncate, delete."""

    def __init__(self, directory: str, *, max_size: int = 64 << 20, compress: bool = False,
                 readonly: bool = False) -> None:
        """:param max_size: roll over to a new file once the active one reaches this size."""
        self.directory = directory
        self.max_size = max_size
        self.compress = compress
        self.readonly = readonly
        self.active = 0
        self.active_size = 0
        self._fd: int | None = None
        self._readers: dict[int, int] = {}
        self._dirty: set[int] = set()
        self.truncated_bytes = 0

    # lifecycle -----------------------------------------------------------------------------

    def open(self, committed_end: int | None = None) -> int | None:
        """Open the directory and check the active (last) segment.

        :param committed_end: the active segment's length according to the index; bytes past
            it were never committed (a crash between append and index commit) and are cut.
        :returns: None when the file is sound up to ``committed_end``, else the offset of the
            first bad record inside the committed part (the caller decides what survives, then
            calls :meth:`truncate`).
        """
        numbers = list_segments(self.directory)
        if self.readonly:
            self.active = numbers[-1] if numbers else 0
            return None
        os.makedirs(self.directory, exist_ok=True)
        self.active = numbers[-1] if numbers else 1
        path = self.path(self.active)
        self._fd = self._open_active()
        actual = os.path.getsize(path)
        good = 0
        for offset, size, payload in scan(path):
            if payload is None or (committed_end is not None and offset >= committed_end):
                break
            good = offset + size
        end = actual if committed_end is None else committed_end
        self.active_size = actual
        if good < end:
            return good
        if actual > good:
            log.warning("segment %s: torn, corrupt or uncommitted tail at byte %d, "
                        "truncating %d bytes", path, good, actual - good)
            self.truncate(good)
        return None

    def truncate(self, size: int) -> None:
        """Cut the active segment to ``size`` bytes (recovery) and fsync it."""
        assert self._fd is not None
        if size < self.active_size:
            self.truncated_bytes += self.active_size - size
        os.ftruncate(self._fd, size)
        os.fsync(self._fd)
        self.active_size = size

    def close(self) -> None:
        """Sync and close every file."""
        if self._fd is not None:
            self.sync()
            os.close(self._fd)
            self._fd = None
        for fd in self._readers.values():
            os.close(fd)
        self._readers.clear()

    def path(self, number: int) -> str:
        """Return the path of segment ``number``."""
        return os.path.join(self.directory, segment_name(number))

    # writes --------------------------------------------------------------------------------

    def mark(self) -> tuple[int, int]:
        """Return the current end, to :meth:`rollback` to if the index commit fails."""
        return (self.active, self.active_size)

    def append(self, payload: bytes) -> tuple[int, int, int]:
        """Append one record; return ``(segment, offset, record_size)``."""
        assert self._fd is not None, "segment log is not open for writing"
        record = frame(payload, self.compress)
        if self.active_size and self.active_size + len(record) > self.max_size:
            self._roll()
        offset = self.active_size
        os.write(self._fd, record)
        self.active_size += len(record)
        self._dirty.add(self.active)
        return (self.active, offset, len(record))

    def _roll(self) -> None:
        """Start the next segment file (the old one is synced with the next :meth:`sync`)."""
        assert self._fd is not None
        os.fsync(self._fd)
        self._dirty.discard(self.active)
        os.close(self._fd)
        self.active += 1
        self.active_size = 0
        self._fd = self._open_active()

    def _open_active(self) -> int:
        """Open (creating it if needed) the active segment for appending; return its fd."""
        return os.open(self.path(self.active), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def sync(self) -> None:
        """fsync the active file if anything was appended since the last sync."""
        if self._dirty and self._fd is not None:
            os.fsync(self._fd)
            self._dirty.clear()

    def rollback(self, mark: tuple[int, int]) -> None:
        """Undo appends made after ``mark`` (their index transaction failed)."""
        number, size = mark
        while self.active > number:
            assert self._fd is not None
            os.close(self._fd)
            try:
                os.unlink(self.path(self.active))
            except FileNotFoundError:
                pass
            self.active -= 1
            self._fd = os.open(self.path(self.active), os.O_WRONLY | os.O_APPEND)
        if self._fd is not None and self.active_size != size:
            os.ftruncate(self._fd, size)
        self.active_size = size

    def delete(self, number: int) -> None:
        """Remove segment ``number`` (never the active one)."""
        if number == self.active and not self.readonly:
            return
        fd = self._readers.pop(number, None)
        if fd is not None:
            os.close(fd)
        try:
            os.unlink(self.path(number))
        except FileNotFoundError:
            pass

    # reads ---------------------------------------------------------------------------------

    def read(self, number: int, offset: int, size: int) -> bytes:
        """Read, check and return the payload of the record at ``(number, offset, size)``."""
        fd = self._readers.get(number)
        if fd is None:
            try:
                fd = os.open(self.path(number), os.O_RDONLY)
            except FileNotFoundError as e:
                raise CorruptRecord(f"segment {number} is missing") from e
            self._readers[number] = fd
        try:
            record = os.pread(fd, size, offset)
        except OSError as e:  # e.g. deleted by the writer thread after this read began
            raise CorruptRecord(f"segment {number} cannot be read: {e}") from e
        try:
            return unframe(record)
        except brotli.error as e:
            raise CorruptRecord(f"segment {number} record at {offset} does not decompress") from e
