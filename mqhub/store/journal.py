"""The flow journal's files: writing with the group commit, rotation, retention, reading.

The journal lives in ``STORE/journal/seg-*.seg``: the segment framing of
:mod:`mqhub.store.segments` (``size | crc32 | flags | payload``) around one columnar chunk
(:mod:`mqhub.store.journal_format`) per group commit. Files roll over at ``max_file``
bytes; closed files older than ``retention_seconds`` or beyond ``retention_bytes`` in total
(oldest first) are deleted, unless a snapshot holds ``journal.lock``.

Consistency with the LMDB index: :meth:`Journal.write` runs inside the store's write
transaction, appends the chunk and puts ``journal_end = (file, offset)`` in the ``sys``
sub-database of that same transaction. A transaction that stores a durable publish always
carries its ``published`` record (the recorder has it before the batch reaches the store), so
a message is never confirmed before its event is in the journal; the other events (deliveries,
acks...) ride with the next due chunk (``max_rows`` or ``max_delay``). Bytes past the committed ``journal_end`` (a failed or
interrupted commit) are cut before the next append, and a snapshot copies exactly up to the
``journal_end`` its read transaction sees. A torn tail (``kill -9`` mid-write) is truncated
on open by the segment scan. Journal appends are not fsynced per commit: they survive a
process crash; an OS crash may lose the last few seconds of journal (never the messages).

No Twisted import.
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

from mqhub.store.journal_format import removals_chunk
from mqhub.store.segments import SegmentLog, list_segments, scan, segment_name

log = logging.getLogger("mqhub.store.journal")

JOURNAL_DIR = "journal"
JOURNAL_LOCK = "journal.lock"
#: key in the store's ``sys`` sub-database: (file number u32, end offset u64)
END_KEY = b"journal_end"
END_ROW = struct.Struct(">IQ")
DEFAULT_MAX_FILE = 16 << 20
DEFAULT_RETENTION_SECONDS = 7 * 86400.0
DEFAULT_RETENTION_BYTES = 1 << 30
#: how often (seconds) retention is checked after commits
RETENTION_EVERY = 60.0
#: a commit takes a chunk when this many rows wait, or this long (s) after the last chunk
DEFAULT_MAX_ROWS = 4096
DEFAULT_MAX_DELAY = 0.1


class Journal:
    """The journal files of one store, written from the store's group commit.

    :ivar recorder: where chunks come from (``take_chunk()``), a JournalRecorder.
    """

    def __init__(self, store_dir: str, recorder: Any, *, max_file: int = DEFAULT_MAX_FILE,
                 retention_seconds: float = DEFAULT_RETENTION_SECONDS,
                 retention_bytes: int = DEFAULT_RETENTION_BYTES,
                 max_rows: int = DEFAULT_MAX_ROWS, max_delay: float = DEFAULT_MAX_DELAY,
                 now: Callable[[], float] = time.time) -> None:
        """Configure; nothing is opened until :meth:`open`.

        :param max_rows: / :param max_delay: a group commit appends a chunk only when a
            durable publish waits, this many rows wait or ``max_delay`` seconds passed since
            the last chunk (or the recorder forces one): acks and deliveries pay the per-chunk
            cost once per many commits.
        """
        self.directory = os.path.join(store_dir, JOURNAL_DIR)
        self.lock_path = os.path.join(store_dir, JOURNAL_LOCK)
        self.recorder = recorder
        self.retention_seconds = retention_seconds
        self.retention_bytes = retention_bytes
        self._now = now
        self._log = SegmentLog(self.directory, max_size=max_file)
        self._inflight: list[bytes] = []
        #: this transaction's chunk of reported purges (see :meth:`write`)
        self._extra: bytes | None = None
        self._mark: tuple[int, int] | None = None
        self._checked = False
        self._written = False
        self._lock_fd: int | None = None
        self._next_retention = 0.0
        self.max_rows = max_rows
        self.max_delay = max_delay
        self._last_chunk = 0.0
        self.records = 0
        self.bytes_written = 0
        self.deleted_files = 0

    def open(self) -> None:
        """Open the directory, truncating a torn tail of the newest file, and apply retention."""
        bad = self._log.open()
        if bad is not None:
            log.warning("journal %s: torn or corrupt tail at byte %d of file %d, truncating",
                        self.directory, bad, self._log.active)
            self._log.truncate(bad)
        self._lock_fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        self._last_chunk = self._now()
        self.apply_retention()

    def close(self) -> None:
        """Sync and close the active file."""
        self._log.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- inside the store's write transaction --------------------------------------------------

    def write(self, txn: Any, sysdb: Any,
              removed: list[tuple[str, int, str, list[int]]] | None = None) -> None:
        """Append what the recorder holds and record the new end in ``txn`` (writer side).

        ``removed``: what this transaction's reported purges took out of the store (see
        ``WriteBatch.purge_queue``), appended as a chunk of its own. Unlike the recorder's
        chunks it is not kept for a retry when the transaction fails: the retried batch
        gathers it again.
        """
        if not self._checked:
            self._cut_to_committed(txn, sysdb)
        rec = self.recorder
        now = self._now()
        extra = removals_chunk(removed, int(now * 1_000_000)) if removed else None
        if extra is None and not self._inflight and not rec.force \
                and not rec.published_waiting and rec.rows < self.max_rows \
                and now - self._last_chunk < self.max_delay:
            return  # not due: these records ride with a later commit
        self._last_chunk = now
        if self._inflight and self._mark is not None:
            # the previous write's transaction never committed: drop its bytes, write it again
            self._log.rollback(self._mark)
        chunk = rec.take_chunk()
        if chunk is not None:
            self._inflight.append(chunk)
        self._written = False
        self._extra = extra
        if not self._inflight and extra is None:
            return
        self._mark = self._log.mark()
        try:
            for payload in self._inflight:
                self._log.append(payload)
            if extra is not None:
                self._log.append(extra)
        except OSError:
            # a full disk must not fail the message commit: keep the chunks for the next one
            log.exception("journal append failed; retrying with the next commit")
            try:
                self._log.rollback(self._mark)
            except OSError:
                log.exception("journal rollback failed")
            self._mark = None
            if extra is not None:      # the purge still commits: its events go with the next
                self._inflight.append(extra)
                self._extra = None
            return
        txn.put(END_KEY, END_ROW.pack(self._log.active, self._log.active_size), db=sysdb)
        self._written = True

    def committed(self) -> None:
        """The transaction of the last :meth:`write` committed: its chunks are final."""
        if self._written:
            self._written = False
            extra = [self._extra] if self._extra is not None else []
            self.records += len(self._inflight) + len(extra)
            self.bytes_written += sum(map(len, self._inflight + extra))
            self._inflight = []
            self._extra = None
            self._mark = None
        if self._now() >= self._next_retention:
            self.apply_retention()

    def _cut_to_committed(self, txn: Any, sysdb: Any) -> None:
        """First write after open: cut journal bytes the index never committed."""
        self._checked = True
        committed = read_end(txn, sysdb)
        if committed is None:
            return
        number, end = committed
        if (self._log.active, self._log.active_size) > (number, end):
            if os.path.exists(self._log.path(number)):
                log.warning("journal: cutting %s past the committed end (%d, %d)",
                            self.directory, number, end)
                self._log.rollback((number, min(end, os.path.getsize(self._log.path(number)))))

    # -- retention -----------------------------------------------------------------------------

    def apply_retention(self) -> int:
        """Delete closed files past the age or size limit (not while a snapshot copies)."""
        self._next_retention = self._now() + RETENTION_EVERY
        if self._lock_fd is None:
            return 0
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return 0  # a snapshot is copying the journal; try again later
        try:
            return self._retain()
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _retain(self) -> int:
        """Body of :meth:`apply_retention` (lock held)."""
        closed = [n for n in list_segments(self.directory) if n != self._log.active]
        sizes = {}
        for n in closed:
            try:
                st = os.stat(self._log.path(n))
            except FileNotFoundError:
                continue
            sizes[n] = (st.st_size, st.st_mtime)
        total = sum(s for s, _ in sizes.values()) + self._log.active_size
        cutoff = self._now() - self.retention_seconds
        deleted = 0
        for n in sorted(sizes):
            size, mtime = sizes[n]
            if mtime >= cutoff and total <= self.retention_bytes:
                break
            self._log.delete(n)
            total -= size
            deleted += 1
            log.info("journal retention: deleted %s", segment_name(n))
        self.deleted_files += deleted
        return deleted

    def stats(self) -> dict[str, Any]:
        """Counters for introspection."""
        return {"records": self.records, "bytes": self.bytes_written,
                "active_file": self._log.active, "deleted_files": self.deleted_files}


def read_end(txn: Any, sysdb: Any) -> tuple[int, int] | None:
    """Return the committed ``(file, offset)`` end of the journal as seen by ``txn``."""
    row = txn.get(END_KEY, db=sysdb)
    return None if row is None else END_ROW.unpack(bytes(row))


def journal_files(directory: str, end: tuple[int, int] | None = None) -> list[tuple[str, int]]:
    """Return ``(path, length)`` of the journal files up to ``end`` (all of them when None)."""
    out = []
    for n in list_segments(directory):
        path = os.path.join(directory, segment_name(n))
        if end is not None and n > end[0]:
            break
        length = os.path.getsize(path)
        if end is not None and n == end[0]:
            length = min(length, end[1])
        out.append((path, length))
    return out


def iter_chunks(path: str, length: int | None = None) -> Iterator[bytes]:
    """Yield the chunk payloads of one journal file (stopping at a torn or corrupt record)."""
    for offset, size, payload in scan(path):
        if payload is None or (length is not None and offset + size > length):
            return
        yield payload
