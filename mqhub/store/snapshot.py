"""Online snapshots of a running store, taken from another process (no Twisted import).

:func:`take_snapshot` opens the store's LMDB environment read-only and, inside ONE read
transaction, writes a compacted copy of it (``env.copy(compact=True, txn=...)``), records the
committed length of every referenced segment file, counts entries per queue and per address,
and copies each segment up to that length. While it runs it holds a shared lock on
``segments.lock`` so the broker postpones deleting unreferenced segments. The result::

    OUT/index/data.mdb      compacted LMDB copy
    OUT/segments/seg-*.seg  the referenced segments, cut at their committed length
    OUT/journal/seg-*.seg   the flow journal up to the ``journal_end`` the same read
                            transaction sees (:mod:`mqhub.store.journal`)
    OUT/manifest.json       format version, created_at, counts, segment list, journal files
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from typing import Any

import lmdb

from mqhub.errors import StoreError
from mqhub.store import codec, migrate_v2, packed_groups
from mqhub.store.journal import JOURNAL_DIR, JOURNAL_LOCK, journal_files, read_end
from mqhub.store.segments import segment_name

SNAPSHOT_FORMAT = 1
MANIFEST = "manifest.json"
_COPY_CHUNK = 1 << 20


def take_snapshot(data_dir: str, out_dir: str, *, now: float | None = None) -> dict[str, Any]:
    """Write a consistent snapshot of the store in ``data_dir`` to ``out_dir``; return the manifest.

    Safe while the broker writes. ``out_dir`` must not already hold a snapshot. ``data_dir``
    is the store's directory or the broker's ``--data-dir`` (whose store lives in ``store/``).
    :raises StoreError: when ``data_dir`` holds no store or the copy fails.
    """
    data_dir = resolve_store_dir(data_dir)
    index = os.path.join(data_dir, "index")
    if not os.path.exists(os.path.join(index, "data.mdb")):
        raise StoreError(f"no store in {data_dir!r}")
    if os.path.exists(os.path.join(out_dir, MANIFEST)):
        raise StoreError(f"{out_dir!r} already holds a snapshot")
    out_index = os.path.join(out_dir, "index")
    out_segments = os.path.join(out_dir, "segments")
    os.makedirs(out_index, exist_ok=True)
    os.makedirs(out_segments, exist_ok=True)
    lock_fd = os.open(os.path.join(data_dir, codec.SEGMENT_LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    journal_fd = os.open(os.path.join(data_dir, JOURNAL_LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_SH)
        fcntl.flock(journal_fd, fcntl.LOCK_SH)
        try:
            env = lmdb.open(index, readonly=True, max_dbs=codec.MAX_DBS, lock=True,
                            readahead=False)
        except lmdb.Error as e:
            raise StoreError(f"cannot open the store in {data_dir!r}: {e}") from e
        try:
            manifest = _copy_in_one_txn(env, data_dir, out_index, out_segments)
        except lmdb.Error as e:
            raise StoreError(f"snapshot failed: {e}") from e
        finally:
            env.close()
    finally:
        os.close(journal_fd)
        os.close(lock_fd)
    manifest["created_at"] = time.time() if now is None else now
    tmp = os.path.join(out_dir, MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(out_dir, MANIFEST))
    return manifest


def resolve_store_dir(data_dir: str) -> str:
    """Return the store directory for a store or broker data directory."""
    if not os.path.exists(os.path.join(data_dir, "index", "data.mdb")):
        nested = os.path.join(data_dir, "store")
        if os.path.exists(os.path.join(nested, "index", "data.mdb")):
            return nested
    return data_dir


def _copy_in_one_txn(env: Any, data_dir: str, out_index: str, out_segments: str) -> dict[str, Any]:
    """Copy the index and segments and count everything inside one read transaction."""
    with env.begin() as txn:
        sysdb = env.open_db(b"sys", txn=txn, create=False)
        fmt = txn.get(b"format", db=sysdb)
        version = codec.U32.unpack(fmt)[0] if fmt is not None else None
        if migrate_v2.converting(txn, sysdb):
            version = codec.MIGRATES_FROM[0]
    if version not in (codec.FORMAT_VERSION, 3):
        # format 2 (not yet opened by this version, or its conversion not finished): a copy
        # could hold a half-converted ready order, so only a converted store is copied.
        # Format 3 is a subset of format 4 (no packed groups): copied as it is.
        raise StoreError(f"the store in {data_dir!r} has format {version}; open it once with "
                         f"this version (which converts it to format {codec.FORMAT_VERSION}) "
                         f"or snapshot it with the version that wrote it")
    names = codec.DB_NAMES if version == codec.FORMAT_VERSION else codec.DB_NAMES_V3
    dbs = {name: env.open_db(name, create=False) for name in names}
    with env.begin() as txn:
        env.copy(out_index, compact=True, txn=txn)
        queues: dict[str, int] = {}
        qnames: dict[int, str] = {}
        for k, v in txn.cursor(db=dbs[b"queues"]):
            qid, count = codec.QUEUE_ROW.unpack(v)
            queues[bytes(k).decode()] = count
            qnames[qid] = bytes(k).decode()
        values = txn.cursor(db=dbs[b"entries"]).iternext(keys=False)
        if b"packs" in dbs:
            addresses = packed_groups.address_counts(txn, dbs[b"ready"], dbs[b"packs"], values)
        else:
            addresses = codec.count_addresses(values)
        segments = []
        for k, v in txn.cursor(db=dbs[b"segments"]):
            number = codec.U32.unpack(k)[0]
            live, end = codec.SEG_ROW.unpack(v)
            if live == 0:
                continue
            name = segment_name(number)
            _copy_prefix(os.path.join(data_dir, "segments", name),
                         os.path.join(out_segments, name), end)
            segments.append({"number": number, "name": name, "length": end, "messages": live})
        due = txn.stat(dbs[b"due"])["entries"]
        meta = txn.stat(dbs[b"meta"])["entries"]
        journal = _copy_journal(data_dir, os.path.dirname(out_index), read_end(txn, dbs[b"sys"]))
    return {
        "format_version": SNAPSHOT_FORMAT,
        "store_format": version,
        "entries": sum(queues.values()),
        "queues": queues,
        "addresses": addresses,
        "due": due,
        "meta": meta,
        "segments": segments,
        "journal": journal,
    }


def _copy_journal(data_dir: str, out_dir: str, end: tuple[int, int] | None) -> dict[str, Any]:
    """Copy the journal files up to the committed ``end``; return the manifest's journal part."""
    out = os.path.join(out_dir, JOURNAL_DIR)
    os.makedirs(out, exist_ok=True)
    files = []
    if end is not None:
        for path, length in journal_files(os.path.join(data_dir, JOURNAL_DIR), end):
            name = os.path.basename(path)
            _copy_prefix(path, os.path.join(out, name), length)
            files.append({"name": name, "length": length})
    return {"end": list(end) if end is not None else None, "files": files}


def _copy_prefix(src: str, dst: str, length: int) -> None:
    """Copy the first ``length`` bytes of ``src`` to ``dst`` and fsync it."""
    remaining = length
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        while remaining > 0:
            chunk = fin.read(min(_COPY_CHUNK, remaining))
            if not chunk:
                raise StoreError(f"segment {src} is shorter than its committed length")
            fout.write(chunk)
            remaining -= len(chunk)
        fout.flush()
        os.fsync(fout.fileno())
