"""Decode a snapshot's journal and index into pyarrow RecordBatches (numpy, no Spark, no Twisted).

Tables (the schemas below are the contract of the data source and of the Parquet export):

- ``events``: one row per journaled message event (see mqhub.store.journal_format);
- ``counters``: memory-tier traffic per address, origin and second;
- ``messages``: what the snapshot's index holds now, one row per stored entry.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from mqhub.store.journal import iter_chunks
from mqhub.store.journal_format import (
    COUNTER_COLUMNS,
    COUNTER_NAMES,
    EVENT_NAMES,
    NUMPY_TYPES,
    ROW_COLUMNS,
    RUN_COLUMNS,
    decode_chunk,
)
from mqhub.store.snapshot import MANIFEST

EVENTS_DDL = ("event STRING, msg_id BIGINT, address STRING, queue STRING, origin STRING, "
              "size BIGINT, priority INT, attempt INT, reason STRING, ts TIMESTAMP")
COUNTERS_DDL = ("second TIMESTAMP, address STRING, origin STRING, kind STRING, "
                "messages BIGINT, bytes BIGINT")
MESSAGES_DDL = ("msg_id BIGINT, queue STRING, address STRING, origin STRING, priority INT, "
                "attempts INT, size BIGINT, published TIMESTAMP, deliver_at TIMESTAMP, "
                "expires_at TIMESTAMP")
DDL = {"events": EVENTS_DDL, "counters": COUNTERS_DDL, "messages": MESSAGES_DDL}
TABLES = tuple(DDL)
_MAX_BATCH = 1 << 20


def arrow_schema(table: str) -> Any:
    """The pyarrow schema of ``table`` (nullable fields, UTC microsecond timestamps)."""
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    types = {"STRING": pa.string(), "BIGINT": pa.int64(), "INT": pa.int32(), "TIMESTAMP": ts}
    fields = []
    for part in DDL[table].split(", "):
        name, kind = part.split(" ")
        fields.append(pa.field(name, types[kind]))
    return pa.schema(fields)


class _Strings:
    """A growing string table shared by the chunks of one file."""

    def __init__(self) -> None:
        """Start with ``""`` at 0 (decoded as null)."""
        self.values: list[str] = [""]
        self.index: dict[str, int] = {"": 0}

    def remap(self, strings: list[str]) -> Any:
        """Return a numpy array mapping a chunk's string indexes to this table's."""
        import numpy as np

        out = np.empty(len(strings), dtype=np.int64)
        for i, s in enumerate(strings):
            j = self.index.get(s)
            if j is None:
                j = self.index[s] = len(self.values)
                self.values.append(s)
            out[i] = j
        return out

    def column(self, indexes: Any) -> Any:
        """Return a string array (``""`` as null) for ``indexes``."""
        import pyarrow as pa

        dictionary = pa.array([None] + self.values[1:], type=pa.string())
        return dictionary.take(pa.array(indexes))


def _np(col: Any, code: str) -> Any:
    """View an ``array.array`` column as numpy."""
    import numpy as np

    return np.frombuffer(col, dtype=NUMPY_TYPES[code]) if len(col) else np.empty(0, NUMPY_TYPES[code])


def journal_file_batches(path: str, length: int | None = None,
                         max_rows: int = _MAX_BATCH) -> Iterator[tuple[str, Any]]:
    """Yield ``("events" | "counters", RecordBatch)`` for one journal file, in order.

    Chunks are decoded with numpy and gathered into batches of up to ``max_rows`` rows.
    """
    strings = _Strings()
    runs: dict[str, list[Any]] = {c: [] for c, _ in RUN_COLUMNS}
    rows: dict[str, list[Any]] = {c: [] for c, _ in ROW_COLUMNS}
    ctr: dict[str, list[Any]] = {c: [] for c, _ in COUNTER_COLUMNS}
    pending = 0
    for payload in iter_chunks(path, length):
        d = decode_chunk(payload)
        remap = strings.remap(d["strings"])
        for col, code in RUN_COLUMNS:
            a = _np(d["runs"][col], code)
            runs[col].append(remap[a] if col in ("queue", "address", "origin", "reason") else a)
        for col, code in ROW_COLUMNS:
            rows[col].append(_np(d["rows"][col], code))
        for col, code in COUNTER_COLUMNS:
            a = _np(d["counters"][col], code)
            ctr[col].append(remap[a] if col in ("address", "origin") else a)
        pending += len(d["rows"]["msg_id"]) + len(d["counters"]["kind"])
        if pending >= max_rows:
            yield from _emit(strings, runs, rows, ctr)
            strings = _Strings()
            runs = {c: [] for c in runs}
            rows = {c: [] for c in rows}
            ctr = {c: [] for c in ctr}
            pending = 0
    yield from _emit(strings, runs, rows, ctr)


def _emit(strings: _Strings, runs: dict[str, list[Any]], rows: dict[str, list[Any]],
          ctr: dict[str, list[Any]]) -> Iterator[tuple[str, Any]]:
    """Build the events and counters batches from gathered columns."""
    import numpy as np
    import pyarrow as pa

    if runs["count"] and sum(map(len, runs["count"])):
        counts = np.concatenate(runs["count"]).astype(np.int64)

        def rep(col: str) -> Any:
            return np.repeat(np.concatenate(runs[col]), counts)

        events = pa.array(list(EVENT_NAMES), type=pa.string()).take(pa.array(rep("event")))
        ts = pa.array(rep("ts_us"), type=pa.int64()).cast(pa.timestamp("us", tz="UTC"))
        cols = [
            events,
            pa.array(np.concatenate(rows["msg_id"]).astype(np.int64)),
            strings.column(rep("address")),
            strings.column(rep("queue")),
            strings.column(rep("origin")),
            pa.array(np.concatenate(rows["size"]).astype(np.int64)),
            pa.array(np.concatenate(rows["priority"]).astype(np.int32)),
            pa.array(np.concatenate(rows["attempt"]).astype(np.int32)),
            strings.column(rep("reason")),
            ts,
        ]
        yield "events", pa.RecordBatch.from_arrays(cols, schema=arrow_schema("events"))
    if ctr["kind"] and sum(map(len, ctr["kind"])):
        second = np.concatenate(ctr["second"]).astype(np.int64) * 1_000_000
        cols = [
            pa.array(second, type=pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            strings.column(np.concatenate(ctr["address"])),
            strings.column(np.concatenate(ctr["origin"])),
            pa.array(list(COUNTER_NAMES), type=pa.string()).take(
                pa.array(np.concatenate(ctr["kind"]))),
            pa.array(np.concatenate(ctr["messages"]).astype(np.int64)),
            pa.array(np.concatenate(ctr["bytes"]).astype(np.int64)),
        ]
        yield "counters", pa.RecordBatch.from_arrays(cols, schema=arrow_schema("counters"))


def read_manifest(snapdir: str) -> dict[str, Any]:
    """Return a snapshot's manifest (read it once and pass it to :func:`snapshot_journal_files`)."""
    import json

    with open(os.path.join(snapdir, MANIFEST)) as f:
        manifest: dict[str, Any] = json.load(f)
    return manifest


def snapshot_journal_files(snapdir: str,
                           manifest: dict[str, Any] | None = None) -> list[tuple[str, int]]:
    """Return ``(absolute path, length)`` of a snapshot's journal files (from its manifest).

    :param manifest: the snapshot's manifest when the caller has it already (else it is read).
    """
    if manifest is None:
        manifest = read_manifest(snapdir)
    journal = manifest.get("journal") or {}
    base = os.path.join(os.path.abspath(snapdir), "journal")
    return [(os.path.join(base, f["name"]), int(f["length"])) for f in journal.get("files", [])]


def table_batches(snapdir: str, table: str, part: Any = None) -> Iterator[Any]:
    """Yield the RecordBatches of ``table`` for one partition (a journal file) or all of them."""
    if table == "messages":
        from mqhub.store.snapshot_reader import SnapshotReader

        with SnapshotReader(snapdir) as snap:
            yield from message_batches(snap)
        return
    files = snapshot_journal_files(snapdir) if part is None else [part]
    for path, length in files:
        for name, batch in journal_file_batches(path, length):
            if name == table:
                yield batch


def message_batches(snap: Any, max_rows: int = 65536) -> Iterator[Any]:
    """Yield the ``messages`` table: the entries stored in the index of ``snap``, an open
    :class:`mqhub.store.snapshot_reader.SnapshotReader`."""
    import pyarrow as pa

    from mqhub.core.ids import id_time

    schema = arrow_schema("messages")
    cols: list[list[Any]] = [[] for _ in schema]

    def ts(value: float) -> int | None:
        return int(value * 1_000_000) if value else None

    def flush() -> Any:
        arrays = [pa.array(c, type=f.type) for c, f in zip(cols, schema, strict=True)]
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    for queue, e in snap.iter_entries():
        values = (e[0], queue, e[5], e[8] or None, e[1], e[2], len(e[7]),
                  ts(id_time(e[0])), ts(e[3]), ts(e[4]))
        for c, v in zip(cols, values, strict=True):
            c.append(v)
        if len(cols[0]) >= max_rows:
            yield flush()
            cols = [[] for _ in schema]
    if cols[0]:
        yield flush()
