"""Read-only access to a snapshot written by :func:`mqhub.store.snapshot.take_snapshot`.

Imports neither Twisted nor zope, so analytics jobs (PySpark) and scripts can use it::

    with SnapshotReader("/backups/snap1") as snap:
        for queue, entry in snap.iter_entries():
            ...
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import lmdb

from mqhub.errors import StoreError
from mqhub.store import codec, packed_groups, ready_groups
from mqhub.store.segments import SegmentLog
from mqhub.store.snapshot import MANIFEST


class SnapshotReader:
    """A snapshot opened read-only: its manifest, queues, entries, due rows and metadata."""

    def __init__(self, path: str) -> None:
        """Open the snapshot in ``path``.

        :raises StoreError: when ``path`` is not a snapshot.
        """
        self.path = path
        try:
            with open(os.path.join(path, MANIFEST)) as f:
                self.manifest: dict[str, Any] = json.load(f)
        except (OSError, ValueError) as e:
            raise StoreError(f"{path!r} is not a readable snapshot: {e}") from e
        fmt = self.manifest.get("store_format")
        if fmt != codec.FORMAT_VERSION and fmt not in codec.MIGRATES_FROM:
            raise StoreError(f"snapshot {path!r} holds store format {fmt}; this version reads "
                             f"formats {codec.FORMAT_VERSION} and "
                             f"{', '.join(map(str, codec.MIGRATES_FROM))}")
        #: the snapshot's store format (4; 3, which has no packed groups; or 2, read through
        #: its ``order`` rows)
        self.store_format: int = fmt
        names: tuple[bytes, ...]
        if fmt == codec.FORMAT_VERSION:
            names = codec.DB_NAMES
        elif fmt == 3:
            names = codec.DB_NAMES_V3
        else:
            names = tuple(codec.V2_ORDER_DB if n == b"ready" else n for n in codec.DB_NAMES_V3)
        try:
            self._env = lmdb.open(os.path.join(path, "index"), readonly=True, lock=False,
                                  max_dbs=codec.MAX_DBS, readahead=False)
            self._dbs = {n: self._env.open_db(n, create=False) for n in names}
        except lmdb.Error as e:
            raise StoreError(f"cannot open snapshot index in {path!r}: {e}") from e
        self._segments = SegmentLog(os.path.join(path, "segments"), readonly=True)
        self._segments.open()

    def __enter__(self) -> SnapshotReader:
        """Use as a context manager."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close on leaving the block."""
        self.close()

    def close(self) -> None:
        """Release the files."""
        self._segments.close()
        self._env.close()

    def queue_counts(self) -> dict[str, int]:
        """Return ``{queue: entry count}`` as stored in the snapshot's index."""
        with self._env.begin(db=self._dbs[b"queues"]) as txn:
            return {bytes(k).decode(): codec.QUEUE_ROW.unpack(v)[1] for k, v in txn.cursor()}

    def _queue_ids(self) -> dict[int, str]:
        """Return ``{qid: queue name}``."""
        with self._env.begin(db=self._dbs[b"queues"]) as txn:
            return {codec.QUEUE_ROW.unpack(v)[0]: bytes(k).decode() for k, v in txn.cursor()}

    def iter_entries(self, queue: str | None = None) -> Iterator[tuple[str, tuple]]:
        """Yield ``(queue, entry)`` for every entry (of one queue), in queue then ready order."""
        names = self._queue_ids()
        prefix = b""
        if queue is not None:
            ids = [qid for qid, name in names.items() if name == queue]
            if not ids:
                return
            prefix = codec.U32.pack(ids[0])
        with self._env.begin() as txn:
            for k, packed in self._ready_keys(txn, prefix):
                if packed is not None:
                    yield names.get(codec.U32.unpack_from(k)[0], ""), packed
                    continue
                v = txn.get(k, db=self._dbs[b"entries"])
                if v is None:
                    continue
                body = None
                msg_id, qid, _ = codec.ENTRY_KEY.unpack(k)
                if v[0] & codec.FLAG_SEGMENT:
                    body = codec.segment_body(txn, self._dbs[b"messages"], self._segments, msg_id)
                yield names.get(qid, ""), codec.decode_entry(k, v, body)

    def _ready_keys(self, txn: lmdb.Transaction, prefix: bytes
                    ) -> Iterator[tuple[bytes, tuple | None]]:
        """Yield the entries of queues whose qid starts with ``prefix``, in queue then ready
        order, as ``(entries key, None)`` (the row to read) or ``(group key, entry)`` (an entry
        of a packed group); format 3/4 from the ``ready`` groups, format 2 from ``order``."""
        if self.store_format == 2:
            cur = txn.cursor(db=self._dbs[codec.V2_ORDER_DB])
            if cur.set_range(prefix):
                for ok in cur.iternext(values=False):
                    if not bytes(ok).startswith(prefix):
                        break
                    yield codec.to_entry_key(bytes(ok)), None
            return
        cur = txn.cursor(db=self._dbs[b"ready"])
        if not cur.set_range(prefix):
            return
        packs = self._dbs.get(b"packs")
        for gk, value in cur:
            gk = bytes(gk)
            if not gk.startswith(prefix):
                break
            qid, pbyte = codec.U32.unpack_from(gk)[0], gk[4]
            value = bytes(value)
            ids = ready_groups.group_ids(value)
            if ready_groups.is_packed(value):
                for e in packed_groups.group_entries(txn, packs, gk, ids, 0,
                                                     ready_groups.packed_bits(value), len(ids)):
                    yield gk, e
                continue
            for msg_id in ids:
                yield codec.ENTRY_KEY.pack(msg_id, qid, pbyte), None

    def address_counts(self) -> dict[str, int]:
        """Return ``{address: entry count}`` computed from the entries."""
        with self._env.begin(db=self._dbs[b"entries"]) as txn:
            values = txn.cursor().iternext(keys=False)
            if b"packs" not in self._dbs:
                return codec.count_addresses(values)
            return packed_groups.address_counts(txn, self._dbs[b"ready"], self._dbs[b"packs"],
                                                values)

    def due_rows(self) -> list[tuple[float, bytes, bytes]]:
        """Return every scheduler row ``(when, key, payload)`` in time order."""
        with self._env.begin(db=self._dbs[b"due"]) as txn:
            return [(codec.F64.unpack_from(k)[0], bytes(k[8:]), bytes(v)) for k, v in txn.cursor()]

    def meta(self) -> dict[str, bytes]:
        """Return every metadata row."""
        with self._env.begin(db=self._dbs[b"meta"]) as txn:
            return {bytes(k).decode(): bytes(v) for k, v in txn.cursor()}

    def verify(self) -> list[str]:
        """Check the index against the manifest; return a list of mismatches (empty = good)."""
        problems = []
        counts = self.queue_counts()
        if counts != self.manifest.get("queues"):
            problems.append(f"queue counts {counts} != manifest {self.manifest.get('queues')}")
        actual: dict[str, int] = {}
        for name, _ in self.iter_entries():
            actual[name] = actual.get(name, 0) + 1
        if actual != counts:
            problems.append(f"entries per queue {actual} != index counts {counts}")
        if self.address_counts() != self.manifest.get("addresses"):
            problems.append("address counts differ from the manifest")
        for seg in self.manifest.get("segments", []):
            p = os.path.join(self.path, "segments", seg["name"])
            if not os.path.exists(p) or os.path.getsize(p) != seg["length"]:
                problems.append(f"segment {seg['name']} missing or of the wrong length")
        return problems
