"""LmdbStore: the durable IMessageStore (LMDB index and small bodies, segment files for big ones).

Layout under the data directory: ``index/`` (the LMDB environment, sub-databases described in
:mod:`mqhub.store.codec`) and ``segments/`` (:mod:`mqhub.store.segments`).

Group commit: ``commit`` queues a batch; one ``clock.callLater(0)`` per turn writes every
queued batch in one LMDB transaction and fires their Deferreds once, after that transaction is
durable in the configured mode. The write runs inline in the reactor (fastest when fsync is
cheap) or in one pipelined writer thread (``writer="thread"``: the reactor keeps accepting the
next group while the thread commits the previous one; best when fsync takes milliseconds).
The default, ``writer="auto"``, commits inline and moves to the thread while the average
commit takes longer than 2 ms, so a slow disk never stalls the reactor for long.

Durability: ``sync`` fsyncs segments then LMDB on every group commit; ``batch`` commits without
fsync and fsyncs every ``batch_interval`` seconds (confirmed writes survive a process crash, an
OS crash may lose the last interval); ``none`` never fsyncs until close.

Bodies above ``segment_threshold`` (and every archive-tier put) are stored once per message in a
segment file and shared by every entry with that ``msg_id``: a hub id names one message, so
entries with the same id are expected to carry the same body.

Failures: a full map grows the map and retries; any other LMDB or OS error (a full disk) fails
that group's Deferreds with :class:`mqhub.errors.StoreError` and rolls back its segment appends,
so nothing unstored is confirmed; reads keep working.
"""

from __future__ import annotations

import bisect
import fcntl
import logging
import os
import queue as queue_mod
import struct
import threading
import time
from collections.abc import Callable
from operator import itemgetter, lt
from typing import Any

import lmdb
from twisted.internet.defer import Deferred, fail, succeed
from zope.interface import implementer

from mqhub.errors import StoreClosed, StoreError
from mqhub.interfaces import IMessageStore
from mqhub.store import codec, migrate_v2, ready_groups
from mqhub.store.batch import WriteBatch
from mqhub.store.codec import (
    ENTRY_KEY,
    F64,
    FLAG_EXPIRES,
    FLAG_SEGMENT,
    HEAD_SIZE,
    MSG_REF,
    ORDER_KEY,
    QUEUE_ROW,
    SEG_ROW,
    U32,
    U64,
    VALUE_HEAD,
)
from mqhub.store.records import (
    ADDRESS,
    ATTEMPTS,
    BODY,
    DELIVER_AT,
    EXPIRES_AT,
    HEADERS,
    MAX_PRIORITY,
    MIN_PRIORITY,
    MSG_ID,
    ORIGIN,
    PRIORITY,
    Entry,
    EntryKey,
)
from mqhub.store.reserve import DiskReserve
from mqhub.store.segments import CorruptRecord, SegmentLog, list_segments

log = logging.getLogger("mqhub.store.lmdb")

DURABILITY_MODES = ("sync", "batch", "none")
WRITER_MODES = ("inline", "thread", "auto")
#: ``auto`` moves commits to the writer thread when a commit takes longer than this on average
AUTO_THREAD_AFTER = 0.002
#: initial LMDB map size in bytes (it grows on demand)
DEFAULT_MAP_SIZE = 256 << 20
OWNER_LOCK = "store.lock"


_KEY0 = itemgetter(0)


def _append_tail(txn: Any, db: Any, rows: list[tuple[bytes, bytes]]
                 ) -> tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]]]:
    """Write the rows of sorted ``rows`` that sort after ``db``'s last key with MDB_APPEND.

    Return ``(appended, rest)``: ``rest`` (keys not above the last key, or every row when the
    tail repeats a key) is left for the caller to write normally. py-lmdb's append mode skips a
    key that is out of order and only reports a lower count, so the count is checked and a row
    that did not land is handed back in ``rest``: none is ever lost.
    """
    cur = txn.cursor(db=db)
    i = bisect.bisect_right(rows, cur.key(), key=_KEY0) if cur.last() else 0
    tail = rows[i:] if i else rows
    if not tail:
        return [], rows
    keys = list(map(_KEY0, tail))
    if not all(map(lt, keys, keys[1:])):  # a repeated key: MDB_APPEND would skip it
        return [], rows
    added = cur.putmulti(tail, append=True)[1]
    if added == len(tail):
        return tail, rows[:i]
    landed: list[tuple[bytes, bytes]] = []
    missing: list[tuple[bytes, bytes]] = []
    for r in tail:
        (missing if txn.get(r[0], db=db) is None else landed).append(r)
    log.warning("MDB_APPEND stored %d of %d rows; writing the rest normally", added, len(tail))
    return landed, rows[:i] + missing


_HEAD = itemgetter(slice(8, 13))
_ID8 = itemgetter(slice(0, 8))
_HEAD_STRUCT = struct.Struct(">IB")


def head_unpack(head: bytes) -> tuple[int, int]:
    """Return ``(qid, priority byte)`` of the 5-byte tail ``qid | 9-priority`` of an entries key."""
    qid, pbyte = _HEAD_STRUCT.unpack(head)
    return qid, pbyte


def _note_new(t: _Txn, keys: list[bytes]) -> None:
    """Note new ``entries`` keys (ascending) for :meth:`LmdbStore._flush_ready`."""
    heads = set(map(_HEAD, keys))
    new = t.ready_new
    if len(heads) == 1:
        h = heads.pop()
        raw = new.get(h)
        if raw is None:
            new[h] = raw = []
        raw.extend(map(_ID8, keys))
        return
    for k in keys:
        h = k[8:13]
        raw = new.get(h)
        if raw is None:
            new[h] = raw = []
        raw.append(k[:8])


def _ids_by_head(keys: list[bytes]) -> dict[bytes, list[int]]:
    """Group ``entries`` keys by ``qid | 9-priority``: ``{head: ascending unique msg_ids}``."""
    heads = set(map(_HEAD, keys))
    if len(heads) == 1:
        groups = {heads.pop(): list(map(_ID8, keys))}
    else:
        groups = {}
        for k in keys:
            groups.setdefault(k[8:13], []).append(k[:8])
    return {h: sorted(set(struct.unpack(f">{len(raw)}Q", b"".join(raw))))
            for h, raw in groups.items()}


class _MapFull(Exception):
    """Internal: the LMDB map is full; grow it and retry the group."""


class _Txn:
    """Changes one write transaction makes to the in-memory mirrors, applied after commit."""

    __slots__ = ("txn", "qids", "counts", "seg_delta", "seg_end", "next_qid", "plain",
                 "plain_q", "ready_new")

    def __init__(self, txn: Any, next_qid: int) -> None:
        """Start tracking changes of ``txn``."""
        self.txn = txn
        self.qids: dict[str, int] = {}
        self.counts: dict[str, int] = {}
        self.seg_delta: dict[int, int] = {}
        self.seg_end: dict[int, int] = {}
        self.next_qid = next_qid
        #: plain ``entries`` rows gathered for one batch, and ``{qid bytes: queue}`` they go to
        self.plain: list[tuple[bytes, bytes]] = []
        self.plain_q: dict[bytes, str] = {}
        #: new entries whose ``ready`` groups are still to be written: ``{qid|pbyte: [id8]}``
        self.ready_new: dict[bytes, list[bytes]] = {}


@implementer(IMessageStore)
class LmdbStore:
    """The durable store: LMDB sub-databases plus append-only segment files."""

    def __init__(self, path: str, *, clock: Any, durability: str = "sync",
                 writer: str = "auto", map_size: int = DEFAULT_MAP_SIZE,
                 segment_threshold: int = 64 << 10, segment_size: int = 64 << 20,
                 compress: bool = False, batch_interval: float = 0.05,
                 call_from_thread: Callable[..., None] | None = None,
                 auto_threshold: float = AUTO_THREAD_AFTER, reserve: int = 0) -> None:
        """Configure (nothing is opened until :meth:`open`).

        :param path: data directory (created if missing).
        :param clock: IReactorTime used to group commits per turn and to time ``batch`` syncs.
        :param durability: ``sync``, ``batch`` or ``none``.
        :param writer: ``inline`` (commit in the reactor), ``thread`` (pipelined writer
            thread) or ``auto`` (inline while commits are fast, the thread while their moving
            average exceeds AUTO_THREAD_AFTER; inline when the clock has no callFromThread).
        :param segment_threshold: bodies longer than this go to segment files.
        :param call_from_thread: how the writer thread hands results back (defaults to
            ``clock.callFromThread``, i.e. the reactor's).
        :param reserve: bytes of disk held back for acks on a full disk (see DiskReserve).
        """
        if durability not in DURABILITY_MODES:
            raise ValueError(f"durability must be one of {DURABILITY_MODES}")
        if writer not in WRITER_MODES:
            raise ValueError(f"writer must be one of {WRITER_MODES}")
        self.path = path
        self.durability = durability
        self.writer = writer
        self._clock = clock
        self._map_size = map_size
        self._threshold = segment_threshold
        self._batch_interval = batch_interval
        self._segments = SegmentLog(os.path.join(path, "segments"), max_size=segment_size,
                                    compress=compress)
        self._call_from_thread = call_from_thread
        self._reserve = DiskReserve(os.path.join(path, "reserve"), reserve)
        self._env: Any = None
        self._dbs: dict[bytes, Any] = {}
        self._qids: dict[str, int] = {}
        self._counts: dict[str, int] = {}
        self._next_qid = 1
        self._seg_live: dict[int, int] = {}
        self._seg_end: dict[int, int] = {}
        self._unlink_pending: set[int] = set()
        self._pending: list[tuple[WriteBatch, Deferred[None]]] = []
        self._flush_call: Any = None
        self._sync_call: Any = None
        self._writing = False
        self._open = False
        self._closing: Deferred[None] | None = None
        self._jobs: queue_mod.Queue[Any] = queue_mod.Queue()
        self._thread: threading.Thread | None = None
        self._lock_fd: int | None = None
        self._owner_fd: int | None = None
        self._mirror_lock = threading.Lock()
        self._threaded = False
        self._auto_threshold = auto_threshold
        self._avg_commit = 0.0
        self.commits = 0
        self.batches = 0
        self.failed_groups = 0
        self.map_grows = 0
        self.recovered_truncated_bytes = 0
        self.recovered_dropped_entries = 0
        #: what opening converted from an older store format (empty when nothing was)
        self.migrated: dict[str, int] = {}
        self.last_commit_seconds = 0.0
        #: called with each group commit's duration in seconds (admin /metrics histogram)
        self.on_commit: Any = None
        #: the flow journal (mqhub.store.journal.Journal) written inside each group commit
        self.journal: Any = None

    # lifecycle -----------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        """Whether the store is open (admin /healthz)."""
        return self._open

    def open(self) -> None:
        """Open the environment, repair the segment tail, load queue counters; synchronous.

        :raises StoreError: when another process has this store open, or it cannot be opened.
        """
        index = os.path.join(self.path, "index")
        os.makedirs(index, exist_ok=True)
        owner = os.open(os.path.join(self.path, OWNER_LOCK), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(owner)
            raise StoreError(f"store {self.path!r} is in use by another process") from e
        self._owner_fd = owner
        try:
            self._open_env(index)
            self._reserve.restore()
        except lmdb.Error as e:
            self._release_owner()
            raise StoreError(f"cannot open store {self.path!r}: {e}") from e
        except BaseException:
            self._release_owner()
            raise

    def _release_owner(self) -> None:
        """Drop the exclusive owner lock (and an environment a failed open left behind)."""
        if self._env is not None and not self._open:
            self._env.close()
            self._env = None
        if self._owner_fd is not None:
            os.close(self._owner_fd)
            self._owner_fd = None

    def _open_env(self, index: str) -> None:
        """Body of :meth:`open` once the owner lock is held."""
        sync = self.durability == "sync"
        self._env = lmdb.open(index, map_size=self._map_size, max_dbs=codec.MAX_DBS,
                              sync=sync, metasync=sync, readahead=False, max_readers=256)
        info = self._env.info()
        self._map_size = max(self._map_size, info["map_size"])
        with self._env.begin(write=True) as txn:
            for db_name in codec.DB_NAMES:
                self._dbs[db_name] = self._env.open_db(db_name, txn=txn)
            sysdb = self._dbs[b"sys"]
            fmt = txn.get(b"format", db=sysdb)
            version = codec.FORMAT_VERSION if fmt is None else U32.unpack(fmt)[0]
            if fmt is None:
                txn.put(b"format", U32.pack(codec.FORMAT_VERSION), db=sysdb)
            elif version != codec.FORMAT_VERSION and version not in codec.MIGRATES_FROM:
                raise StoreError(
                    f"store {self.path!r} has format {version}; this version reads format "
                    f"{codec.FORMAT_VERSION} and converts format "
                    f"{', '.join(map(str, codec.MIGRATES_FROM))} (export it with the version "
                    f"that wrote it and import it here)")
            nq = txn.get(b"next_qid", db=sysdb)
            self._next_qid = U32.unpack(nq)[0] if nq else 1
            for k, v in txn.cursor(db=self._dbs[b"queues"]):
                qid, count = QUEUE_ROW.unpack(v)
                name = bytes(k).decode()
                self._qids[name] = qid
                self._counts[name] = count
            for k, v in txn.cursor(db=self._dbs[b"segments"]):
                live, end = SEG_ROW.unpack(v)
                self._seg_live[U32.unpack(k)[0]] = live
                self._seg_end[U32.unpack(k)[0]] = end
        if version != codec.FORMAT_VERSION:
            self.migrated = migrate_v2.migrate(self._env, self._dbs)
        self._recover_segments()
        self._lock_fd = os.open(os.path.join(self.path, codec.SEGMENT_LOCK), os.O_RDWR | os.O_CREAT, 0o644)
        self._open = True
        if self.writer == "thread":
            self._start_thread()
        if self.durability == "batch":
            self._sync_call = self._clock.callLater(self._batch_interval, self._periodic_sync)

    def _start_thread(self) -> None:
        """Start the writer thread and route group commits to it."""
        if self._call_from_thread is None:
            self._call_from_thread = self._clock.callFromThread
        if self._thread is None:
            self._thread = threading.Thread(target=self._writer_loop, name="mqhub-store-writer",
                                            daemon=True)
            self._thread.start()
        self._threaded = True

    def _adapt(self) -> None:
        """``auto`` writer: follow the commit latency (moving average) between inline and thread."""
        self._avg_commit = 0.8 * self._avg_commit + 0.2 * self.last_commit_seconds
        if self.writer != "auto":
            return
        if not self._threaded and self._avg_commit > self._auto_threshold:
            if self._call_from_thread is not None or hasattr(self._clock, "callFromThread"):
                log.info("store commits average %.1f ms: moving them to the writer thread",
                         self._avg_commit * 1000)
                self._start_thread()
        elif self._threaded and self._avg_commit < self._auto_threshold / 4:
            self._threaded = False

    def _recover_segments(self) -> None:
        """Check the active segment against the index; drop entries whose bodies are damaged.

        Bytes past the committed length are cut. If a record inside the committed part is
        damaged, every referenced record from there on is checked one by one: entries whose
        body fails its CRC (or is missing) are dropped with a logged error, the rest are kept.
        Finally, segment files nothing references are deleted.
        """
        numbers = list_segments(self._segments.directory)
        active = numbers[-1] if numbers else 1
        committed = self._seg_end.get(active, 0)
        damaged_from = self._segments.open(committed)
        if damaged_from is not None:
            log.warning("segment %d: damaged record at byte %d of %d committed bytes",
                        active, damaged_from, committed)
            broken: set[bytes] = set()
            new_end = damaged_from
            with self._env.begin(db=self._dbs[b"messages"]) as txn:
                for k, v in txn.cursor():
                    seg, off, rsize, _ = MSG_REF.unpack(v)
                    if seg != active or off < damaged_from:
                        continue
                    try:
                        self._segments.read(seg, off, rsize)
                        new_end = max(new_end, off + rsize)
                    except CorruptRecord:
                        broken.add(bytes(k))
            self._drop_entries_of(broken)
            self._segments.truncate(new_end)
            with self._env.begin(write=True) as txn:
                row = txn.get(U32.pack(active), db=self._dbs[b"segments"])
                live = SEG_ROW.unpack(row)[0] if row is not None else 0
                txn.put(U32.pack(active), SEG_ROW.pack(live, new_end), db=self._dbs[b"segments"])
            self._seg_end[active] = new_end
        self.recovered_truncated_bytes = self._segments.truncated_bytes
        for number in numbers:
            if number != active and self._seg_live.get(number, 0) == 0:
                log.info("deleting unreferenced segment %d", number)
                self._segments.delete(number)

    def _drop_entries_of(self, broken: set[bytes]) -> None:
        """Remove every entry whose segment body was lost (logged as an error)."""
        if not broken:
            return
        victims: list[tuple[str, EntryKey]] = []
        names = {qid: name for name, qid in self._qids.items()}
        with self._env.begin(db=self._dbs[b"entries"]) as txn:
            for k, v in txn.cursor():
                if v[0] & FLAG_SEGMENT and bytes(k[codec.KEY_MSG_ID]) in broken:
                    mid, qid, pb = ENTRY_KEY.unpack(k)
                    victims.append((names.get(qid, ""), (9 - pb, mid)))
        log.error("segment tail lost: dropping %d entries whose bodies were not recoverable",
                  len(victims))
        self.recovered_dropped_entries = len(victims)
        batch = WriteBatch()
        for name, key in victims:
            batch.delete_entries(name, [key])
        self._write_group([batch])

    def close(self) -> Deferred[None]:
        """Write pending groups, sync, and close; fires when closed."""
        if not self._open:
            return succeed(None)
        if self._closing is not None:
            return self._closing
        d: Deferred[None] = Deferred()
        self._closing = d
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        self._flush_call = None
        if self._sync_call is not None and self._sync_call.active():
            self._sync_call.cancel()
        self._sync_call = None
        if not self._writing:
            self._finish_close()
        return d

    def _finish_close(self) -> None:
        """Flush what is left synchronously, stop the writer thread and close files."""
        if self._pending:
            group, self._pending = self._pending, []
            self._fire(group, self._run_group([b for b, _ in group]))
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None
        self._env.sync(True)
        self._segments.sync()
        self._do_unlinks()
        self._segments.close()
        self._env.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        self._release_owner()
        self._open = False
        d, self._closing = self._closing, None
        assert d is not None
        d.callback(None)

    # group commit --------------------------------------------------------------------------

    def commit(self, batch: WriteBatch) -> Deferred[None]:
        """Queue ``batch`` for this turn's group commit; fire when it is durable."""
        if not self._open or self._closing is not None:
            return fail(StoreClosed("store is closed"))
        if self._reserve.refuses(batch, self._clock.seconds()):
            return fail(StoreError("the disk is full: new messages are refused for now "
                                   "(acknowledgements and deletes still commit)"))
        d: Deferred[None] = Deferred()
        self._pending.append((batch, d))
        if self._flush_call is None and not self._writing:
            self._flush_call = self._clock.callLater(0, self._flush)
        return d

    def _flush(self) -> None:
        """Write every batch queued this turn as one group (inline or handed to the thread)."""
        self._flush_call = None
        if not self._pending or self._writing:
            return
        group, self._pending = self._pending, []
        if self._threaded:
            self._writing = True
            self._jobs.put(group)
            return
        self._fire(group, self._run_group([b for b, _ in group]))
        self._adapt()

    def _run_group(self, batches: list[WriteBatch]) -> Any:
        """Write ``batches`` in one transaction, growing the map as needed; return errors.

        In the writer thread a full map is raised instead: only the reactor thread, where no
        read transaction can be open at that moment, may resize the map. Every WriteBatch
        operation is idempotent, so a group re-submitted after a resize applies correctly
        even if some of its batches were already committed one by one.
        """
        while True:
            try:
                self._write_group(batches)
                return None
            except _MapFull:
                if threading.current_thread() is self._thread:
                    raise
                self._grow_map()
            except StoreError as e:
                return e
            except Exception as e:  # noqa: BLE001 - a bug fails the group, never hangs it
                log.exception("store group commit failed")
                return StoreError(f"store write failed: {e!r}")

    def _fire(self, group: list[tuple[WriteBatch, Deferred[None]]], result: Any) -> None:
        """Fire the Deferreds of a written group with ``result`` (None, error, or per batch)."""
        errors = result.results if isinstance(result, _PerBatch) else [result]
        if any(isinstance(e, _WriteFailed) for e in errors):
            self._reserve.write_failed(self._clock.seconds())
        elif result is None:
            self._reserve.write_succeeded(self._clock.seconds())
        if isinstance(result, _PerBatch):
            result = result.results
        if isinstance(result, list):
            for (_, d), err in zip(group, result, strict=True):
                if err is None:
                    d.callback(None)
                else:
                    d.errback(err)
            return
        for _, d in group:
            if result is None:
                d.callback(None)
            else:
                d.errback(result)

    def _writer_loop(self) -> None:
        """Writer thread: commit each group it is handed, then report back to the reactor."""
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if job == "sync":
                try:
                    self._sync_now()
                except Exception:  # noqa: BLE001 - reported, never kills the writer
                    log.exception("periodic store sync failed")
                continue
            try:
                self._write_group([b for b, _ in job])
                result: Any = None
            except _MapFull:
                result = _MapFull()
            except StoreError as e:
                result = e
            except Exception as e:  # noqa: BLE001 - a bug must not kill the writer thread
                result = StoreError(f"store writer failed: {e!r}")
            assert self._call_from_thread is not None
            self._call_from_thread(self._group_done, job, result)

    def _group_done(self, group: list[tuple[WriteBatch, Deferred[None]]], result: Any) -> None:
        """Reactor side of a thread commit: grow and retry, or fire, then start the next group."""
        if isinstance(result, _MapFull):
            self._grow_map()
            self._jobs.put(group)
            return
        self._writing = False
        self._fire(group, result)
        self._adapt()
        if self._closing is not None:
            self._finish_close()
        elif self._pending and self._flush_call is None:
            self._flush()

    def _grow_map(self) -> None:
        """Double the LMDB map (no transaction of this process is open here)."""
        self._map_size *= 2
        self._env.set_mapsize(self._map_size)
        self.map_grows += 1
        log.info("store map grown to %d MiB", self._map_size >> 20)

    def _write_group(self, batches: list[WriteBatch]) -> None:
        """Apply ``batches`` in one write transaction and commit it (durably per the mode).

        Raises _MapFull (nothing applied) or StoreError. If a batch itself is malformed, the
        other batches are committed one transaction each so only the bad one fails.
        """
        started = time.perf_counter()
        mark = self._segments.mark()
        try:
            txn = self._env.begin(write=True)
        except lmdb.Error as e:
            raise StoreError(f"cannot begin a store transaction: {e}") from e
        t = _Txn(txn, self._next_qid)
        try:
            for batch in batches:
                self._apply(t, batch)
            self._finish_txn(t)
            if self.journal is not None:
                self.journal.write(txn, self._dbs[b"sys"])
            if self.durability == "sync":
                self._segments.sync()
            txn.commit()
        except lmdb.MapFullError:
            txn.abort()
            self._segments.rollback(mark)
            raise _MapFull() from None
        except (lmdb.Error, OSError) as e:
            txn.abort()
            self._safe_rollback(mark)
            self.failed_groups += 1
            raise _WriteFailed(f"store write failed: {e}") from e
        except (ValueError, TypeError, AttributeError, KeyError, OverflowError,
                struct.error) as e:
            txn.abort()
            self._safe_rollback(mark)
            if len(batches) == 1:
                self.failed_groups += 1
                raise StoreError(f"malformed store batch: {e!r}") from e
            raise _PerBatch(self._write_each(batches)) from None
        except BaseException:
            txn.abort()
            self._safe_rollback(mark)
            self.failed_groups += 1
            raise
        self._after_commit(t)
        if self.journal is not None:
            self.journal.committed()
        self.commits += 1
        self.batches += len(batches)
        self.last_commit_seconds = time.perf_counter() - started
        if self.on_commit is not None:
            self.on_commit(self.last_commit_seconds)

    def _write_each(self, batches: list[WriteBatch]) -> list[StoreError | None]:
        """Commit each batch alone; return each one's error or None."""
        return [self._run_group([batch]) for batch in batches]

    def _safe_rollback(self, mark: tuple[int, int]) -> None:
        """Roll segment appends back, logging (not raising) if even that fails."""
        try:
            self._segments.rollback(mark)
        except OSError:
            log.exception("could not roll back segment appends")

    def _after_commit(self, t: _Txn) -> None:
        """Apply a committed transaction's changes to the in-memory mirrors."""
        with self._mirror_lock:
            self._update_mirrors(t)
        if t.seg_delta or t.seg_end:
            # batch mode deletes after its periodic fsync, so an index rolled back by an OS
            # crash never points into a deleted file; sync is already on disk; none promises
            # nothing across an OS crash and must not let segments pile up until close
            if self.durability != "batch":
                self._do_unlinks()

    def _update_mirrors(self, t: _Txn) -> None:
        """Counts, queue ids and segment counters after commit (under the mirror lock)."""
        self._next_qid = t.next_qid
        for name, qid in t.qids.items():
            self._qids[name] = qid
        for name, count in t.counts.items():
            if count:
                self._counts[name] = count
            else:
                self._counts.pop(name, None)
                self._qids.pop(name, None)
        if t.seg_delta or t.seg_end:
            for seg, delta in t.seg_delta.items():
                self._seg_live[seg] = self._seg_live.get(seg, 0) + delta
            self._seg_end.update(t.seg_end)
            active = self._segments.active
            for seg, live in list(self._seg_live.items()):
                if live <= 0 and seg != active:
                    del self._seg_live[seg]
                    self._seg_end.pop(seg, None)
                    self._unlink_pending.add(seg)

    def _do_unlinks(self) -> None:
        """Delete unreferenced segments once no snapshot holds the segment lock."""
        with self._mirror_lock:
            self._unlink_locked()

    def _unlink_locked(self) -> None:
        """Body of :meth:`_do_unlinks` (mirror lock held)."""
        if not self._unlink_pending or self._lock_fd is None:
            return
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return  # a snapshot is copying; try again after a later commit
        try:
            for seg in sorted(self._unlink_pending):
                if seg != self._segments.active:
                    self._segments.delete(seg)
            self._unlink_pending.clear()
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _periodic_sync(self) -> None:
        """``batch`` mode: fsync everything committed so far, then re-arm."""
        self._sync_call = self._clock.callLater(self._batch_interval, self._periodic_sync)
        if self._threaded:
            self._jobs.put("sync")
        else:
            try:
                self._sync_now()
            except (lmdb.Error, OSError):
                log.exception("periodic store sync failed")

    def _sync_now(self) -> None:
        """fsync segments and LMDB, then delete segments that became unreferenced."""
        self._segments.sync()
        self._env.sync(True)
        self._do_unlinks()

    # applying a batch ----------------------------------------------------------------------

    def _qid(self, t: _Txn, queue: str, create: bool) -> int | None:
        """Return the id of ``queue``, allocating one inside ``t`` when ``create``."""
        qid = t.qids.get(queue)
        if qid is None:
            qid = self._qids.get(queue)
        if qid is None and create:
            if len(queue.encode()) > 500:
                raise ValueError("queue name too long")
            qid = t.next_qid
            t.next_qid += 1
            t.qids[queue] = qid
            t.counts.setdefault(queue, 0)
        return qid

    def _count(self, t: _Txn, queue: str) -> int:
        """Current entry count of ``queue`` as seen inside ``t``."""
        c = t.counts.get(queue)
        return self._counts.get(queue, 0) if c is None else c

    def _apply(self, t: _Txn, batch: WriteBatch) -> None:
        """Apply one batch's operations in WriteBatch's documented order."""
        txn = t.txn
        entries = self._dbs[b"entries"]
        for queue in batch.purges:
            self._purge(t, queue)
        archive = batch.archive
        for queue, items in batch.puts.items():
            self._put(t, queue, items, queue in archive)
        self._flush_plain(t)
        self._flush_ready(t)
        for queue, updates in batch.attempts.items():
            qid = self._qid(t, queue, False)
            if qid is None:
                continue
            for priority, msg_id, attempts in updates:
                k = ENTRY_KEY.pack(msg_id, qid, 9 - priority)
                v = txn.get(k, db=entries)
                if v is not None:
                    txn.put(k, codec.with_attempts(v, attempts), db=entries)
        for queue, keys in batch.deletes.items():
            qid = self._qid(t, queue, False)
            if qid is None:
                continue
            pack = ENTRY_KEY.pack
            pop = txn.cursor(db=entries).pop
            gone: list[bytes] = []
            for priority, msg_id in keys:
                k = pack(msg_id, qid, 9 - priority)
                v = pop(k)
                if v is not None:
                    gone.append(k)
                    if v[0]:
                        self._release(t, k, v)
            if gone:
                t.counts[queue] = self._count(t, queue) - len(gone)
                for head, ids in _ids_by_head(gone).items():
                    ready_groups.remove_ids(txn, self._dbs[b"ready"], qid, head[4], ids)
        due, due_keys = self._dbs[b"due"], self._dbs[b"due_keys"]
        for when, key, payload in batch.due_puts:
            old = txn.get(key, db=due_keys)
            if old is not None:
                txn.delete(old + key, db=due)
            tk = codec.time_key(when)
            txn.put(tk + key, payload, db=due)
            txn.put(key, tk, db=due_keys)
        for key in batch.due_deletes:
            old = txn.pop(key, db=due_keys)
            if old is not None:
                txn.delete(old + key, db=due)
        meta = self._dbs[b"meta"]
        for mkey, value in batch.meta_puts:
            txn.put(mkey.encode(), value, db=meta)
        for mkey in batch.meta_deletes:
            txn.delete(mkey.encode(), db=meta)

    def _put(self, t: _Txn, queue: str, items: list[Entry], archive: bool) -> None:
        """Store entries of one queue: plain ones are gathered for :meth:`_flush_plain`."""
        qid = self._qid(t, queue, True)
        assert qid is not None
        t.plain_q[U32.pack(qid)] = queue
        pack_key = ENTRY_KEY.pack
        pack_head = VALUE_HEAD.pack
        encode_meta = codec.encode_meta
        threshold = self._threshold
        if not archive and items:
            fast = self._uniform_values(qid, items)
            if fast is not None:
                t.plain.extend(fast)
                return
        plain = t.plain
        prefixes: dict[tuple[int, float, str, str], bytes] = {}
        added = 0
        for e in items:
            msg_id, priority, attempts, d_at, e_at, address, headers, body, origin = e
            if not 0 <= priority <= 9:
                raise ValueError(f"priority {priority!r} is outside 0..9")
            k = pack_key(msg_id, qid, 9 - priority)
            if e_at or archive or len(body) > threshold:
                if plain:  # keep list order: a later put of the same key must win
                    self._flush_plain(t)
                    t.plain_q[U32.pack(qid)] = queue
                    plain = t.plain
                added += self._put_special(t, k, e, archive)
                continue
            if headers is None:
                # value prefix shared by a publish batch: same attempts/deliver_at/address/origin
                ck = (attempts, d_at, address, origin)
                pre = prefixes.get(ck)
                if pre is None:
                    meta = encode_meta(address, None, origin)
                    pre = prefixes[ck] = pack_head(0, attempts, d_at, 0.0, len(meta)) + meta
            else:
                meta = encode_meta(address, headers, origin)
                pre = pack_head(0, attempts, d_at, 0.0, len(meta)) + meta
            plain.append((k, pre + body))
        if added:
            t.counts[queue] = self._count(t, queue) + added

    def _uniform_values(self, qid: int, items: list[Entry]) -> list[tuple[bytes, bytes]] | None:
        """Fast path for a typical publish batch: build every row with comprehensions.

        Applies when every entry is small, has no expiry or headers, and shares attempts,
        deliver_at, address and origin; returns None otherwise (the general loop handles it).
        """
        first = items[0]
        shape = (first[ATTEMPTS], first[DELIVER_AT], first[ADDRESS], first[ORIGIN])
        if (any(e[EXPIRES_AT] or e[HEADERS] is not None for e in items)
                or max(map(len, [e[BODY] for e in items])) > self._threshold
                or any((e[ATTEMPTS], e[DELIVER_AT], e[ADDRESS], e[ORIGIN]) != shape
                       for e in items)):
            return None
        prios = [e[PRIORITY] for e in items]
        if min(prios) < MIN_PRIORITY or max(prios) > MAX_PRIORITY:
            raise ValueError(f"priority is outside {MIN_PRIORITY}..{MAX_PRIORITY}")
        meta = codec.encode_meta(first[ADDRESS], None, first[ORIGIN])
        pre = VALUE_HEAD.pack(0, first[ATTEMPTS], first[DELIVER_AT], 0.0, len(meta)) + meta
        pack_key = ENTRY_KEY.pack
        return [(pack_key(e[MSG_ID], qid, MAX_PRIORITY - e[PRIORITY]), pre + e[BODY])
                for e in items]

    def _flush_plain(self, t: _Txn) -> None:
        """Write the gathered plain rows (inline bodies, no expiry) and their ``order`` rows.

        The rows are sorted by key; those above the table's last key (new messages: hub ids
        are time-ordered) go in with MDB_APPEND, which fills leaf pages; the rest (re-puts,
        old ids) are written one by one, releasing what a replaced value referenced.
        """
        rows = t.plain
        if not rows:
            t.plain_q.clear()
            return
        names = t.plain_q
        t.plain = []
        t.plain_q = {}
        txn = t.txn
        entries = self._dbs[b"entries"]
        rows.sort(key=_KEY0)
        appended, rest = _append_tail(txn, entries, rows)
        new: dict[bytes, int] = {}
        if appended:
            keys = list(map(_KEY0, appended))
            if len(names) == 1:
                new[next(iter(names))] = len(appended)
            else:
                for k in keys:
                    q = k[8:12]
                    new[q] = new.get(q, 0) + 1
            _note_new(t, keys)
        replace = txn.replace
        fresh: list[bytes] = []
        for k, v in rest:
            old = replace(k, v, db=entries)
            if old is None:
                q = k[8:12]
                new[q] = new.get(q, 0) + 1
                fresh.append(k)
            elif old[0]:
                self._release(t, k, old)
        if fresh:
            _note_new(t, fresh)
        for q, n in new.items():
            queue = names[q]
            t.counts[queue] = self._count(t, queue) + n

    def _flush_ready(self, t: _Txn) -> None:
        """Write the ``ready`` groups of the new entries noted so far in ``t``."""
        if not t.ready_new:
            return
        heads, t.ready_new = t.ready_new, {}
        ready = self._dbs[b"ready"]
        for head, raw in heads.items():
            ids = sorted(set(struct.unpack(f">{len(raw)}Q", b"".join(raw))))
            qid, pbyte = head_unpack(head)
            ready_groups.add_ids(t.txn, ready, qid, pbyte, ids)

    def _put_special(self, t: _Txn, k: bytes, e: Entry, archive: bool) -> int:
        """Store one entry with an expiry and/or a segment body; return 1 if it is new."""
        txn = t.txn
        msg_id, priority, attempts, d_at, e_at, address, headers, body, origin = e
        flags = 0
        if e_at:
            flags |= FLAG_EXPIRES
        if archive or len(body) > self._threshold:
            flags |= FLAG_SEGMENT
            self._ref_body(t, msg_id, body)
            body = b""
        v = codec.encode_value(flags, attempts, d_at, e_at,
                               codec.encode_meta(address, headers, origin), body)
        entries = self._dbs[b"entries"]
        old = txn.replace(k, v, db=entries)
        if old is not None and old[0]:
            self._release(t, k, old)
        if e_at:
            txn.put(codec.time_key(e_at) + k[8:] + k[:8], b"", db=self._dbs[b"expiry"])
        if old is not None:
            return 0
        _note_new(t, [k])
        return 1

    def _ref_body(self, t: _Txn, msg_id: int, body: bytes) -> None:
        """Add a reference to ``msg_id``'s segment body, appending the body the first time."""
        txn = t.txn
        messages = self._dbs[b"messages"]
        mk = U64.pack(msg_id)
        row = txn.get(mk, db=messages)
        if row is not None:
            seg, off, size, refs = MSG_REF.unpack(row)
            txn.put(mk, MSG_REF.pack(seg, off, size, refs + 1), db=messages)
        else:
            seg, off, size = self._segments.append(bytes(body))
            txn.put(mk, MSG_REF.pack(seg, off, size, 1), db=messages)
            t.seg_end[seg] = off + size
        self._seg_change(t, seg, 1 if row is None else 0)

    def _seg_change(self, t: _Txn, seg: int, delta: int) -> None:
        """Record a change of ``seg``'s live-message count and write its row."""
        if delta:
            t.seg_delta[seg] = t.seg_delta.get(seg, 0) + delta
        live = self._seg_live.get(seg, 0) + t.seg_delta.get(seg, 0)
        end = t.seg_end.get(seg, self._seg_end.get(seg, 0))
        t.txn.put(U32.pack(seg), codec.SEG_ROW.pack(max(live, 0), end), db=self._dbs[b"segments"])

    def _release(self, t: _Txn, k: bytes, v: bytes) -> None:
        """Drop what a removed ``entries`` row ``k`` referenced: its expiry row, segment body."""
        txn = t.txn
        flags = v[0]
        if flags & FLAG_EXPIRES:
            e_at = F64.unpack_from(v, codec.EXPIRES_OFFSET)[0]
            txn.delete(codec.time_key(e_at) + codec.to_order_key(bytes(k)), db=self._dbs[b"expiry"])
        if flags & FLAG_SEGMENT:
            messages = self._dbs[b"messages"]
            mk = bytes(k[codec.KEY_MSG_ID])
            row = txn.get(mk, db=messages)
            if row is None:
                return
            seg, off, size, refs = MSG_REF.unpack(row)
            if refs > 1:
                txn.put(mk, MSG_REF.pack(seg, off, size, refs - 1), db=messages)
                return
            txn.delete(mk, db=messages)
            self._seg_change(t, seg, -1)
            if self._seg_live.get(seg, 0) + t.seg_delta.get(seg, 0) <= 0 \
                    and seg != self._segments.active:
                txn.delete(U32.pack(seg), db=self._dbs[b"segments"])

    def _purge(self, t: _Txn, queue: str) -> None:
        """Remove every entry of ``queue``."""
        qid = self._qid(t, queue, False)
        if qid is None:
            return
        self._flush_ready(t)
        txn = t.txn
        entries = self._dbs[b"entries"]
        ready = self._dbs[b"ready"]
        removed = 0
        pack = ENTRY_KEY.pack
        for gkey, pbyte, ids in list(ready_groups.iter_queue_groups(txn, ready, qid)):
            for msg_id in ids:
                k = pack(msg_id, qid, pbyte)
                v = txn.pop(k, db=entries)
                if v is not None:
                    if v[0]:
                        self._release(t, k, v)
                    removed += 1
            txn.delete(gkey, db=ready)
        if removed:
            t.counts[queue] = self._count(t, queue) - removed

    def _finish_txn(self, t: _Txn) -> None:
        """Write the queue rows and the id counter the transaction changed."""
        txn = t.txn
        queues = self._dbs[b"queues"]
        for name, count in t.counts.items():
            qid = t.qids.get(name) or self._qids.get(name)
            if count:
                txn.put(name.encode(), QUEUE_ROW.pack(qid, count), db=queues)
            else:
                txn.delete(name.encode(), db=queues)
        if t.next_qid != self._next_qid:
            txn.put(b"next_qid", U32.pack(t.next_qid), db=self._dbs[b"sys"])

    # reads ---------------------------------------------------------------------------------

    def _check_open(self) -> Deferred[Any] | None:
        """Return a failed Deferred when the store is closed, else None."""
        if not self._open:
            return fail(StoreClosed("store is closed"))
        return None

    def _guarded(self, fn: Callable[..., Any], *args: Any) -> Deferred[Any]:
        """Run a synchronous read; fire with its result, or fail with StoreError only."""
        closed = self._check_open()
        if closed is not None:
            return closed
        try:
            return succeed(fn(*args))
        except StoreError as e:
            return fail(e)
        except (lmdb.Error, OSError, ValueError, struct.error, UnicodeDecodeError) as e:
            return fail(StoreError(f"store read failed: {e!r}"))

    def read_entries(self, queue: str, after: EntryKey | None, limit: int) -> Deferred[list[Entry]]:
        """Fire with up to ``limit`` entries of ``queue`` after ``after``, in ready order."""
        qid = self._qids.get(queue)
        if qid is None or limit <= 0:
            return self._check_open() or succeed([])
        return self._guarded(self._read_entries, qid, after, limit)

    def _read_entries(self, qid: int, after: EntryKey | None, limit: int) -> list[Entry]:
        """Synchronous body of :meth:`read_entries`: walk the ``ready`` groups, fetch their
        rows with ``getmulti`` (which leaves out ids whose entry is gone)."""
        out: list[Entry] = []
        append = out.append
        unpack_key = ENTRY_KEY.unpack
        unpack_head = VALUE_HEAD.unpack_from
        pack_key = ENTRY_KEY.pack
        decode_meta = codec.decode_meta
        messages = self._dbs[b"messages"]
        h = HEAD_SIZE
        start = None if after is None else (9 - after[0], after[1])
        with self._env.begin() as txn:
            getmulti = txn.cursor(db=self._dbs[b"entries"]).getmulti
            keys: list[bytes] = []
            groups = ready_groups.iter_ready(txn, self._dbs[b"ready"], qid, start)
            while len(out) < limit:
                group = next(groups, None)
                if group is not None:
                    pbyte, ids = group
                    keys += [pack_key(i, qid, pbyte) for i in ids]
                    if len(keys) < limit - len(out):
                        continue
                if not keys:
                    break
                for k, v in getmulti(keys):
                    mid, _, pb = unpack_key(k)
                    flags, att, d_at, e_at, ml = unpack_head(v)
                    address, headers, origin = decode_meta(v[h:h + ml])
                    if flags & FLAG_SEGMENT:
                        body = codec.segment_body(txn, messages, self._segments, mid)
                    else:
                        body = v[h + ml:]
                    append((mid, 9 - pb, att, d_at, e_at, address, headers, body, origin))
                keys = []
        del out[limit:]
        return out

    def count_entries(self, queue: str) -> Deferred[int]:
        """Fire with the number of stored entries of ``queue``."""
        return self._check_open() or succeed(self._counts.get(queue, 0))

    def queue_names(self) -> Deferred[list[str]]:
        """Fire with the sorted names of queues holding entries."""
        return self._check_open() or succeed(sorted(self._counts))

    def read_due(self, until: float, limit: int) -> Deferred[list[tuple[float, bytes, bytes]]]:
        """Fire with up to ``limit`` due rows with ``when <= until``, earliest first."""
        return self._guarded(self._read_due, until, limit)

    def _read_due(self, until: float, limit: int) -> list[tuple[float, bytes, bytes]]:
        """Synchronous body of :meth:`read_due`."""
        out: list[tuple[float, bytes, bytes]] = []
        with self._env.begin(db=self._dbs[b"due"]) as txn:
            for k, v in txn.cursor():
                when = F64.unpack_from(k)[0]
                if when > until or len(out) >= limit:
                    break
                out.append((when, bytes(k[8:]), bytes(v)))
        return out

    def next_due(self) -> Deferred[float | None]:
        """Fire with the earliest due time, or None."""
        return self._guarded(self._next_due)

    def _next_due(self) -> float | None:
        """Synchronous body of :meth:`next_due`."""
        with self._env.begin(db=self._dbs[b"due"]) as txn:
            cur = txn.cursor()
            if not cur.first():
                return None
            return float(F64.unpack_from(cur.key())[0])

    def read_expired(self, until: float, limit: int) -> Deferred[list[tuple[str, EntryKey, float]]]:
        """Fire with up to ``limit`` ``(queue, (priority, msg_id), expires_at)`` expiring by ``until``.

        The TTL sweep's index (declared in IMessageStore; MemoryStore has it too).
        """
        return self._guarded(self._read_expired, until, limit)

    def _read_expired(self, until: float, limit: int) -> list[tuple[str, EntryKey, float]]:
        """Synchronous body of :meth:`read_expired`."""
        with self._mirror_lock:
            names = {qid: name for name, qid in self._qids.items()}
        out: list[tuple[str, EntryKey, float]] = []
        with self._env.begin(db=self._dbs[b"expiry"]) as txn:
            for k in txn.cursor().iternext(values=False):
                when = F64.unpack_from(k)[0]
                if when > until or len(out) >= limit:
                    break
                qid, pb, mid = ORDER_KEY.unpack_from(k, 8)
                out.append((names.get(qid, ""), (9 - pb, mid), when))
        return out

    def get_meta(self, key: str) -> Deferred[bytes | None]:
        """Fire with the metadata value under ``key``, or None."""
        return self._guarded(self._get_meta, key)

    def _get_meta(self, key: str) -> bytes | None:
        """Synchronous body of :meth:`get_meta`."""
        with self._env.begin(db=self._dbs[b"meta"]) as txn:
            value: bytes | None = txn.get(key.encode())
            return value

    def scan_meta(self, prefix: str) -> Deferred[list[tuple[str, bytes]]]:
        """Fire with every ``(key, value)`` whose key starts with ``prefix``, in key order."""
        return self._guarded(self._scan_meta, prefix)

    def _scan_meta(self, prefix: str) -> list[tuple[str, bytes]]:
        """Synchronous body of :meth:`scan_meta`."""
        p = prefix.encode()
        out = []
        with self._env.begin(db=self._dbs[b"meta"]) as txn:
            cur = txn.cursor()
            if cur.set_range(p):
                for k, v in cur:
                    if not k.startswith(p):
                        break
                    out.append((bytes(k).decode(), bytes(v)))
        return out

    def stats(self) -> dict[str, Any]:
        """Return counters for introspection."""
        with self._mirror_lock:
            entries = sum(self._counts.values())
            segments = set(self._seg_live) | {self._segments.active}
            segment_messages = sum(self._seg_live.values())
        out: dict[str, Any] = {
            "kind": "lmdb",
            "durability": self.durability,
            "writer": self.writer,
            "writer_now": "thread" if self._threaded else "inline",
            "avg_commit_ms": round(self._avg_commit * 1000.0, 3),
            "queues": len(self._counts),
            "entries": entries,
            "commits": self.commits,
            "batches": self.batches,
            "failed_groups": self.failed_groups,
            "pending_batches": len(self._pending),
            "map_size": self._map_size,
            "map_grows": self.map_grows,
            "segments": len(segments),
            "segment_messages": segment_messages,
            "last_commit_ms": round(self.last_commit_seconds * 1000.0, 3),
            "recovered_truncated_bytes": self.recovered_truncated_bytes,
            "recovered_dropped_entries": self.recovered_dropped_entries,
        }
        if self._env is not None and self._open:
            info = self._env.info()
            out["used_bytes"] = (info["last_pgno"] + 1) * self._env.stat()["psize"]
        return out


class _WriteFailed(StoreError):
    """Internal: LMDB or the file system refused a group's write (disk full, I/O error)."""


class _PerBatch(StoreError):
    """Internal: a group was retried batch by batch; carries each batch's result."""

    def __init__(self, results: list[StoreError | None]) -> None:
        """Keep the per-batch results."""
        super().__init__("group retried per batch")
        self.results = results
