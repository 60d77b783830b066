"""GroupCommitter: the write side of LmdbStore, one LMDB transaction per reactor turn.

``submit`` queues a batch; one ``clock.callLater(0)`` per turn writes every queued batch in one
transaction and fires their Deferreds once, after that transaction is durable in the
configured mode (``sync``: segments then LMDB fsync'd before the Deferreds fire). The write
runs inline in the reactor or in one pipelined writer thread; ``auto`` uses the thread from the
start when every commit fsyncs (``sync``) and otherwise moves between them by the average
commit time. A full map grows and retries; any other LMDB or OS error fails that
group's Deferreds with StoreError and rolls back its segment appends; a malformed batch fails
alone (the rest of its group is committed batch by batch).
"""

from __future__ import annotations

import fcntl
import logging
import queue as queue_mod
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import lmdb
from twisted.internet.defer import Deferred

from mqhub.errors import StoreError
from mqhub.store.batch import WriteBatch
from mqhub.store.index_state import IndexState, TxnChanges
from mqhub.store.reserve import DiskReserve
from mqhub.store.row_writer import RowWriter
from mqhub.store.segments import SegmentLog

log = logging.getLogger("mqhub.store.lmdb")

Group = list[tuple[WriteBatch, Deferred[None]]]


class MapFull(Exception):
    """The LMDB map is full; grow it and retry the group."""


class WriteFailed(StoreError):
    """LMDB or the file system refused a group's write (disk full, I/O error)."""


class PerBatch(StoreError):
    """A group was retried batch by batch; carries each batch's result."""

    def __init__(self, results: list[StoreError | None]) -> None:
        """Keep the per-batch results."""
        super().__init__("group retried per batch")
        self.results = results


class GroupCommitter:
    """Queues batches, writes each turn's group in one transaction, fires their Deferreds."""

    def __init__(self, env: Any, dbs: dict[bytes, Any], segments: SegmentLog, rows: RowWriter,
                 state: IndexState, reserve: DiskReserve, clock: Any, *, durability: str,
                 writer: str, map_size: int, batch_interval: float, auto_threshold: float,
                 call_from_thread: Callable[..., None] | None, segment_lock_fd: int) -> None:
        """Write through ``rows`` into ``env``/``dbs``; see LmdbStore for the options."""
        self._env = env
        self._dbs = dbs
        self._segments = segments
        self._rows = rows
        self._state = state
        self._reserve = reserve
        self._clock = clock
        self.durability = durability
        self.writer = writer
        self.map_size = map_size
        self._batch_interval = batch_interval
        self._auto_threshold = auto_threshold
        self._call_from_thread = call_from_thread
        #: results can be handed back from a writer thread (else commits stay inline)
        self._can_thread = call_from_thread is not None or hasattr(clock, "callFromThread")
        #: ``auto`` keeps every commit in the thread (see :meth:`start`)
        self._auto_thread = writer == "auto" and durability == "sync" and self._can_thread
        self._lock_fd = segment_lock_fd
        self.pending: Group = []
        self._flush_call: Any = None
        self._sync_call: Any = None
        self._writing = False
        self._on_stopped: Callable[[], None] | None = None
        self._jobs: queue_mod.Queue[Any] = queue_mod.Queue()
        self._thread: threading.Thread | None = None
        self.threaded = False
        self.avg_commit = 0.0
        self.commits = 0
        self.batches = 0
        self.failed_groups = 0
        self.map_grows = 0
        self.last_commit_seconds = 0.0
        #: called with each group commit's duration in seconds (admin /metrics histogram)
        self.on_commit: Any = None
        #: the flow journal (mqhub.store.journal.Journal) written inside each group commit
        self.journal: Any = None

    def start(self) -> None:
        """Start the writer thread (``thread`` mode, and ``auto`` with ``sync`` durability when
        the clock can take results back from a thread) and the periodic fsync (``batch``).

        ``auto`` with ``sync`` keeps its commits in the thread for good: an inline commit holds
        the reactor for its fsync, and its confirmations come back in the same turn, so a
        pipelined publisher gets a full read in per turn while a consumer gets one RDY's worth
        out. Measured with ``mqhub bench nsq`` (MPUB 16 B) on a fresh broker: while ``auto``
        was still inline (its first ~1 s, until the average commit passed 2 ms) the backlog
        grew by ~700,000 messages, which then went through the remembered tail and pages read
        back (benchmarks/results/nsq.md part 9)."""
        if self.writer == "thread" or self._auto_thread:
            self._start_thread()
        if self.durability == "batch":
            self._sync_call = self._clock.callLater(self._batch_interval, self._periodic_sync)

    def submit(self, batch: WriteBatch) -> Deferred[None]:
        """Queue ``batch`` for this turn's group commit; fire when it is durable."""
        d: Deferred[None] = Deferred()
        self.pending.append((batch, d))
        if self._flush_call is None and not self._writing:
            self._flush_call = self._clock.callLater(0, self._flush)
        return d

    def stop(self, on_stopped: Callable[[], None]) -> None:
        """Write what is queued, stop the thread, fsync; then call ``on_stopped`` (at once, or
        when the group the writer thread is committing comes back)."""
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        self._flush_call = None
        if self._sync_call is not None and self._sync_call.active():
            self._sync_call.cancel()
        self._sync_call = None
        self._on_stopped = on_stopped
        if not self._writing:
            self._drain()

    def _drain(self) -> None:
        """Body of :meth:`stop` once no group is in the writer thread."""
        if self.pending:
            group, self.pending = self.pending, []
            self._fire(group, self._run_group([b for b, _ in group]))
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None
        self._env.sync(True)
        self._segments.sync()
        self.do_unlinks()
        done, self._on_stopped = self._on_stopped, None
        assert done is not None
        done()

    def _start_thread(self) -> None:
        """Start the writer thread and route group commits to it."""
        if self._call_from_thread is None:
            self._call_from_thread = self._clock.callFromThread
        if self._thread is None:
            self._thread = threading.Thread(target=self._writer_loop, name="mqhub-store-writer",
                                            daemon=True)
            self._thread.start()
        self.threaded = True

    def _adapt(self) -> None:
        """``auto`` writer: follow the commit latency (moving average) between inline and thread
        (with ``sync`` durability it stays in the thread, :meth:`start`)."""
        self.avg_commit = 0.8 * self.avg_commit + 0.2 * self.last_commit_seconds
        if self.writer != "auto" or self._auto_thread:
            return
        if not self.threaded and self.avg_commit > self._auto_threshold:
            if self._can_thread:
                log.info("store commits average %.1f ms: moving them to the writer thread",
                         self.avg_commit * 1000)
                self._start_thread()
        elif self.threaded and self.avg_commit < self._auto_threshold / 4:
            self.threaded = False

    def _flush(self) -> None:
        """Write every batch queued this turn as one group (inline or handed to the thread)."""
        self._flush_call = None
        if not self.pending or self._writing:
            return
        group, self.pending = self.pending, []
        if self.threaded:
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
                self.write_group(batches)
                return None
            except MapFull:
                if threading.current_thread() is self._thread:
                    raise
                self._grow_map()
            except StoreError as e:
                return e
            except Exception as e:  # noqa: BLE001 - a bug fails the group, never hangs it
                log.exception("store group commit failed")
                return StoreError(f"store write failed: {e!r}")

    def _fire(self, group: Group, result: Any) -> None:
        """Fire the Deferreds of a written group with ``result`` (None, error, or per batch)."""
        errors = result.results if isinstance(result, PerBatch) else [result] * len(group)
        if any(isinstance(e, WriteFailed) for e in errors):
            self._reserve.write_failed(self._clock.seconds())
        elif result is None:
            self._reserve.write_succeeded(self._clock.seconds())
        for (_, d), err in zip(group, errors, strict=True):
            if err is None:
                d.callback(None)
            else:
                d.errback(err)

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
                self.write_group([b for b, _ in job])
                result: Any = None
            except MapFull:
                result = MapFull()
            except StoreError as e:
                result = e
            except Exception as e:  # noqa: BLE001 - a bug must not kill the writer thread
                result = StoreError(f"store writer failed: {e!r}")
            assert self._call_from_thread is not None
            self._call_from_thread(self._group_done, job, result)

    def _group_done(self, group: Group, result: Any) -> None:
        """Reactor side of a thread commit: grow and retry, or fire, then start the next group."""
        if isinstance(result, MapFull):
            self._grow_map()
            self._jobs.put(group)
            return
        self._writing = False
        self._fire(group, result)
        self._adapt()
        if self._on_stopped is not None:
            self._drain()
        elif self.pending and self._flush_call is None:
            self._flush()

    def _grow_map(self) -> None:
        """Double the LMDB map (no transaction of this process is open here)."""
        self.map_size *= 2
        self._env.set_mapsize(self.map_size)
        self.map_grows += 1
        log.info("store map grown to %d MiB", self.map_size >> 20)

    def write_group(self, batches: list[WriteBatch]) -> None:
        """Apply ``batches`` in one write transaction and commit it (durably per the mode).

        Raises MapFull (nothing applied) or StoreError. If a batch itself is malformed, the
        other batches are committed one transaction each so only the bad one fails.
        """
        started = time.perf_counter()
        mark = self._segments.mark()
        try:
            txn = self._env.begin(write=True)
        except lmdb.Error as e:
            raise StoreError(f"cannot begin a store transaction: {e}") from e
        t = TxnChanges(txn, self._state.next_qid)
        try:
            for batch in batches:
                self._rows.apply(t, batch)
            self._rows.finish(t)
            if self.journal is not None:
                self.journal.write(txn, self._dbs[b"sys"], t.removed)
            if self.durability == "sync":
                self._segments.sync()
            txn.commit()
        except lmdb.MapFullError:
            txn.abort()
            self._segments.rollback(mark)
            raise MapFull() from None
        except (lmdb.Error, OSError) as e:
            txn.abort()
            self._safe_rollback(mark)
            self.failed_groups += 1
            raise WriteFailed(f"store write failed: {e}") from e
        except (ValueError, TypeError, AttributeError, KeyError, OverflowError,
                struct.error) as e:
            txn.abort()
            self._safe_rollback(mark)
            if len(batches) == 1:
                self.failed_groups += 1
                raise StoreError(f"malformed store batch: {e!r}") from e
            raise PerBatch(self._write_each(batches)) from None
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

    def _after_commit(self, t: TxnChanges) -> None:
        """Apply a committed transaction's changes to the in-memory mirrors."""
        self._state.apply(t, self._segments.active)
        if t.seg_delta or t.seg_end:
            # batch mode deletes after its periodic fsync, so an index rolled back by an OS
            # crash never points into a deleted file; sync is already on disk; none promises
            # nothing across an OS crash and must not let segments pile up until close
            if self.durability != "batch":
                self.do_unlinks()

    def do_unlinks(self) -> None:
        """Delete unreferenced segments once no snapshot holds the segment lock."""
        with self._state.lock:
            pending = self._state.unlink_pending
            if not pending:
                return
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return  # a snapshot is copying; try again after a later commit
            try:
                for seg in sorted(pending):
                    if seg != self._segments.active:
                        self._segments.delete(seg)
                pending.clear()
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _periodic_sync(self) -> None:
        """``batch`` mode: fsync everything committed so far, then re-arm."""
        self._sync_call = self._clock.callLater(self._batch_interval, self._periodic_sync)
        if self.threaded:
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
        self.do_unlinks()
