"""LmdbStore: the durable IMessageStore (LMDB index and small bodies, segment files for big ones).

Layout under the data directory: ``index/`` (the LMDB environment, sub-databases described in
:mod:`mqhub.store.codec`) and ``segments/`` (:mod:`mqhub.store.segments`).

Group commit: ``commit`` queues a batch; one ``clock.callLater(0)`` per turn writes every
queued batch in one LMDB transaction and fires their Deferreds once, after that transaction is
durable in the configured mode. The write runs inline in the reactor (fastest when fsync is
cheap) or in one pipelined writer thread (``writer="thread"``: the reactor keeps accepting the
next group while the thread commits the previous one; best when fsync takes milliseconds).
The default, ``writer="auto"``, uses the thread from the start with ``sync`` durability (no
fsync holds the reactor); with ``batch`` or ``none`` it commits inline and moves to the thread
while the average commit takes longer than 2 ms, so a slow disk never stalls the reactor for long.

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

import fcntl
import logging
import os
import struct
from collections.abc import Callable
from typing import Any

import lmdb
from twisted.internet.defer import Deferred, fail, succeed
from zope.interface import implementer

from mqhub.errors import StoreClosed, StoreError
from mqhub.interfaces import IMessageStore
from mqhub.store import codec, migrate_v2
from mqhub.store.batch import WriteBatch
from mqhub.store.codec import ENTRY_KEY, FLAG_SEGMENT, MSG_REF, QUEUE_ROW, SEG_ROW, U32
from mqhub.store.group_commit import GroupCommitter
from mqhub.store.index_reads import IndexReader
from mqhub.store.index_state import IndexState
from mqhub.store.records import Entry, EntryKey
from mqhub.store.reserve import DiskReserve
from mqhub.store.row_writer import RowWriter
from mqhub.store.segments import CorruptRecord, SegmentLog, list_segments

log = logging.getLogger("mqhub.store.lmdb")

DURABILITY_MODES = ("sync", "batch", "none")
WRITER_MODES = ("inline", "thread", "auto")
#: ``auto`` moves commits to the writer thread when a commit takes longer than this on average
AUTO_THREAD_AFTER = 0.002
#: initial LMDB map size in bytes (it grows on demand)
DEFAULT_MAP_SIZE = 256 << 20
OWNER_LOCK = "store.lock"


@implementer(IMessageStore)
class LmdbStore:
    """The durable store: LMDB sub-databases plus append-only segment files.

    The parts: :class:`IndexState` (in-memory mirrors), :class:`RowWriter` (batches to rows),
    :class:`GroupCommitter` (one transaction per turn, inline or in the writer thread),
    :class:`IndexReader` (reads); this class opens, recovers, converts old formats and closes.
    """

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
            thread) or ``auto`` (the thread with ``sync`` durability; otherwise inline while
            commits are fast, the thread while their moving average exceeds
            AUTO_THREAD_AFTER; inline when the clock has no callFromThread).
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
        self._auto_threshold = auto_threshold
        self._call_from_thread = call_from_thread
        self._segments = SegmentLog(os.path.join(path, "segments"), max_size=segment_size,
                                    compress=compress)
        self._reserve = DiskReserve(os.path.join(path, "reserve"), reserve)
        self._state = IndexState()
        self._env: Any = None
        self._dbs: dict[bytes, Any] = {}
        self._committer: GroupCommitter | None = None
        self._reader: IndexReader | None = None
        self._open = False
        self._closing: Deferred[None] | None = None
        self._lock_fd: int | None = None
        self._owner_fd: int | None = None
        self._journal: Any = None
        self._on_commit: Any = None
        self.recovered_truncated_bytes = 0
        self.recovered_dropped_entries = 0
        #: what opening converted from an older store format (empty when nothing was)
        self.migrated: dict[str, int] = {}

    # counters and hooks the group committer holds -------------------------------------------

    @property
    def commits(self) -> int:
        """Group commits written."""
        return 0 if self._committer is None else self._committer.commits

    @property
    def batches(self) -> int:
        """Batches written by those commits."""
        return 0 if self._committer is None else self._committer.batches

    @property
    def failed_groups(self) -> int:
        """Groups whose write failed."""
        return 0 if self._committer is None else self._committer.failed_groups

    @property
    def map_grows(self) -> int:
        """Times the LMDB map was doubled."""
        return 0 if self._committer is None else self._committer.map_grows

    @property
    def last_commit_seconds(self) -> float:
        """Duration of the last group commit."""
        return 0.0 if self._committer is None else self._committer.last_commit_seconds

    @property
    def journal(self) -> Any:
        """The flow journal (mqhub.store.journal.Journal) written inside each group commit."""
        return self._journal

    @journal.setter
    def journal(self, value: Any) -> None:
        """Set the journal (taken over by the group committer at open)."""
        self._journal = value
        if self._committer is not None:
            self._committer.journal = value

    @property
    def on_commit(self) -> Any:
        """Called with each group commit's duration in seconds (admin /metrics histogram)."""
        return self._on_commit

    @on_commit.setter
    def on_commit(self, value: Any) -> None:
        """Set the commit hook (taken over by the group committer at open)."""
        self._on_commit = value
        if self._committer is not None:
            self._committer.on_commit = value

    @property
    def _pending(self) -> list[tuple[WriteBatch, Deferred[None]]]:
        """Batches queued for the next group commit (tests look at how many)."""
        return [] if self._committer is None else self._committer.pending

    # lifecycle -----------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        """Whether the store is open (admin /healthz)."""
        return self._open

    def open(self) -> None:
        """Open the environment, convert an older format, repair the segment tail, load queue
        counters; synchronous.

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
        if self._lock_fd is not None and not self._open:
            os.close(self._lock_fd)
            self._lock_fd = None
        if self._owner_fd is not None:
            os.close(self._owner_fd)
            self._owner_fd = None

    def _open_env(self, index: str) -> None:
        """Body of :meth:`open` once the owner lock is held."""
        sync = self.durability == "sync"
        self._env = lmdb.open(index, map_size=self._map_size, max_dbs=codec.MAX_DBS,
                              sync=sync, metasync=sync, readahead=False, max_readers=256)
        self._map_size = max(self._map_size, self._env.info()["map_size"])
        version = self._load_index()
        if version == 3:
            self.migrated = migrate_v2.relabel_format3(self._env, self._dbs)
        elif version != codec.FORMAT_VERSION:
            self.migrated = migrate_v2.migrate(self._env, self._dbs)
        self._lock_fd = os.open(os.path.join(self.path, codec.SEGMENT_LOCK),
                                os.O_RDWR | os.O_CREAT, 0o644)
        rows = RowWriter(self._dbs, self._segments, self._state, self._threshold)
        committer = GroupCommitter(
            self._env, self._dbs, self._segments, rows, self._state, self._reserve,
            self._clock, durability=self.durability, writer=self.writer,
            map_size=self._map_size, batch_interval=self._batch_interval,
            auto_threshold=self._auto_threshold, call_from_thread=self._call_from_thread,
            segment_lock_fd=self._lock_fd)
        committer.journal = self._journal
        committer.on_commit = self._on_commit
        self._recover_segments(committer)
        self._committer = committer
        self._reader = IndexReader(self._env, self._dbs, self._segments, self._state)
        self._open = True
        committer.start()

    def _load_index(self) -> int:
        """Open the sub-databases, check the format, load the mirrors; return the format."""
        state = self._state = IndexState()
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
            if migrate_v2.converting(txn, sysdb):
                version = codec.MIGRATES_FROM[0]  # a conversion a crash interrupted: resume it
            nq = txn.get(b"next_qid", db=sysdb)
            state.next_qid = U32.unpack(nq)[0] if nq else 1
            for k, v in txn.cursor(db=self._dbs[b"queues"]):
                qid, count = QUEUE_ROW.unpack(v)
                name = bytes(k).decode()
                state.qids[name] = qid
                state.counts[name] = count
            for k, v in txn.cursor(db=self._dbs[b"segments"]):
                live, end = SEG_ROW.unpack(v)
                state.seg_live[U32.unpack(k)[0]] = live
                state.seg_end[U32.unpack(k)[0]] = end
        return version

    def _recover_segments(self, committer: GroupCommitter) -> None:
        """Check the active segment against the index; drop entries whose bodies are damaged.

        Bytes past the committed length are cut. If a record inside the committed part is
        damaged, every referenced record from there on is checked one by one: entries whose
        body fails its CRC (or is missing) are dropped with a logged error, the rest are kept.
        Finally, segment files nothing references are deleted.
        """
        numbers = list_segments(self._segments.directory)
        active = numbers[-1] if numbers else 1
        committed = self._state.seg_end.get(active, 0)
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
            self._drop_entries_of(broken, committer)
            self._segments.truncate(new_end)
            with self._env.begin(write=True) as txn:
                row = txn.get(U32.pack(active), db=self._dbs[b"segments"])
                live = SEG_ROW.unpack(row)[0] if row is not None else 0
                txn.put(U32.pack(active), SEG_ROW.pack(live, new_end), db=self._dbs[b"segments"])
            self._state.seg_end[active] = new_end
        self.recovered_truncated_bytes = self._segments.truncated_bytes
        for number in numbers:
            if number != active and self._state.seg_live.get(number, 0) == 0:
                log.info("deleting unreferenced segment %d", number)
                self._segments.delete(number)

    def _drop_entries_of(self, broken: set[bytes], committer: GroupCommitter) -> None:
        """Remove every entry whose segment body was lost (logged as an error)."""
        if not broken:
            return
        victims: list[tuple[str, EntryKey]] = []
        names = self._state.names_by_qid()
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
        committer.write_group([batch])

    def close(self) -> Deferred[None]:
        """Write pending groups, sync, and close; fires when closed."""
        if not self._open:
            return succeed(None)
        if self._closing is not None:
            return self._closing
        d: Deferred[None] = Deferred()
        self._closing = d
        assert self._committer is not None
        self._committer.stop(self._finish_close)
        return d

    def _finish_close(self) -> None:
        """Close files once the group committer wrote everything and stopped."""
        self._segments.close()
        self._env.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        self._open = False
        self._release_owner()
        d, self._closing = self._closing, None
        assert d is not None
        d.callback(None)

    # writes --------------------------------------------------------------------------------

    def commit(self, batch: WriteBatch) -> Deferred[None]:
        """Queue ``batch`` for this turn's group commit; fire when it is durable."""
        if not self._open or self._closing is not None:
            return fail(StoreClosed("store is closed"))
        if self._reserve.refuses(batch, self._clock.seconds()):
            return fail(StoreError("the disk is full: new messages are refused for now "
                                   "(acknowledgements and deletes still commit)"))
        assert self._committer is not None
        return self._committer.submit(batch)

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
        qid = self._state.qids.get(queue)
        if qid is None or limit <= 0 or self._reader is None:
            return self._check_open() or succeed([])
        return self._guarded(self._reader.read_entries, qid, after, limit)

    def count_entries(self, queue: str) -> Deferred[int]:
        """Fire with the number of stored entries of ``queue``."""
        return self._check_open() or succeed(self._state.counts.get(queue, 0))

    def queue_names(self) -> Deferred[list[str]]:
        """Fire with the sorted names of queues holding entries."""
        return self._check_open() or succeed(sorted(self._state.counts))

    def read_due(self, until: float, limit: int) -> Deferred[list[tuple[float, bytes, bytes]]]:
        """Fire with up to ``limit`` due rows with ``when <= until``, earliest first."""
        return self._guarded(lambda: self._read().read_due(until, limit))

    def next_due(self) -> Deferred[float | None]:
        """Fire with the earliest due time, or None."""
        return self._guarded(lambda: self._read().next_due())

    def read_expired(self, until: float, limit: int) -> Deferred[list[tuple[str, EntryKey, float]]]:
        """Fire with up to ``limit`` ``(queue, (priority, msg_id), expires_at)`` expiring by ``until``.

        The TTL sweep's index (declared in IMessageStore; MemoryStore has it too).
        """
        return self._guarded(lambda: self._read().read_expired(until, limit))

    def get_meta(self, key: str) -> Deferred[bytes | None]:
        """Fire with the metadata value under ``key``, or None."""
        return self._guarded(lambda: self._read().get_meta(key))

    def scan_meta(self, prefix: str) -> Deferred[list[tuple[str, bytes]]]:
        """Fire with every ``(key, value)`` whose key starts with ``prefix``, in key order."""
        return self._guarded(lambda: self._read().scan_meta(prefix))

    def _read(self) -> IndexReader:
        """The reader of the open store (``_guarded`` checked that it is open)."""
        assert self._reader is not None
        return self._reader

    def stats(self) -> dict[str, Any]:
        """Return counters for introspection."""
        state = self._state
        with state.lock:
            entries = sum(state.counts.values())
            segments = set(state.seg_live) | {self._segments.active}
            segment_messages = sum(state.seg_live.values())
            queues = len(state.counts)
        c = self._committer
        out: dict[str, Any] = {
            "kind": "lmdb",
            "durability": self.durability,
            "writer": self.writer,
            "writer_now": "thread" if c is not None and c.threaded else "inline",
            "avg_commit_ms": round((c.avg_commit if c else 0.0) * 1000.0, 3),
            "queues": queues,
            "entries": entries,
            "commits": self.commits,
            "batches": self.batches,
            "failed_groups": self.failed_groups,
            "pending_batches": len(self._pending),
            "map_size": c.map_size if c else self._map_size,
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
