"""LmdbStore beyond the conformance suite: recovery, segments, map growth, write failures, writers."""

from __future__ import annotations

import logging
import os
import queue
import resource
import signal
from collections.abc import Callable
from typing import Any

import pytest
from twisted.internet.task import Clock

from mqhub.errors import StoreError
from mqhub.store.batch import WriteBatch
from mqhub.store.lmdb import LmdbStore
from mqhub.store.records import make_entry
from mqhub.store.segments import list_segments
from tests.unit.store.conftest import Harness, make_lmdb, open_lmdb, run_handed_back


def commit(h: Harness, fill: Callable[[WriteBatch], None]) -> None:
    """Build a batch with ``fill`` and commit it, asserting success."""
    b = WriteBatch()
    fill(b)
    h.result(h.store.commit(b))


def reopen(h: Harness, path: str, **kw: Any) -> Harness:
    """Close the store and open a new one on the same directory."""
    h.result(h.store.close())
    return open_lmdb(path, **kw)


def seg_dir(path: str) -> str:
    """Return the segment directory of a store."""
    return os.path.join(path, "segments")


def test_reopen_recovers_everything(tmp_path: Any) -> None:
    """Entries (with attempts), due rows, meta and counts survive a close and reopen."""
    path = str(tmp_path / "d")
    h = open_lmdb(path)

    def fill(b: WriteBatch) -> None:
        """Entries, attempts, a due row and metadata in one batch."""
        b.put_entries("q", [make_entry(i, b"m" * (i * 30), "a.b", priority=i % 2) for i in range(1, 8)])
        b.put_entries("r", [make_entry(100, b"r", expires_at=9.0)])
        b.set_attempts("q", [(1, 1, 3)])
        b.put_due(5.0, b"k", b"p")
        b.put_meta("m", b"v")

    commit(h, fill)
    before = h.result(h.store.read_entries("q", None, 100))
    h2 = reopen(h, path)
    assert h2.result(h2.store.read_entries("q", None, 100)) == before
    assert [e for e in before if e[0] == 1][0][2] == 3  # attempts kept
    assert h2.result(h2.store.count_entries("q")) == 7
    assert h2.result(h2.store.queue_names()) == ["q", "r"]
    assert h2.result(h2.store.read_due(10.0, 10)) == [(5.0, b"k", b"p")]
    assert h2.result(h2.store.get_meta("m")) == b"v"
    assert h2.result(h2.store.read_expired(10.0, 10)) == [("r", (0, 100), 9.0)]
    h2.store.close()


def test_large_bodies_go_to_segments_once_per_message(tmp_path: Any) -> None:
    """A body above the threshold is written once to a segment, however many queues hold it."""
    path = str(tmp_path / "d")
    h = open_lmdb(path, segment_threshold=1000)
    big = os.urandom(5000)

    def fill(b: WriteBatch) -> None:
        """The same large message on three queues."""
        for q in ("a", "b", "c"):
            b.put_entries(q, [make_entry(1, big), make_entry(2, b"small")])

    commit(h, fill)
    size = os.path.getsize(os.path.join(seg_dir(path), "seg-0000000001.seg"))
    assert 5000 < size < 5100
    assert h.store.stats()["segment_messages"] == 1
    assert h.result(h.store.read_entries("c", None, 1))[0][7] == big
    h.store.close()


def test_unreferenced_segments_are_deleted(tmp_path: Any) -> None:
    """Rolled-over segments are deleted once nothing references them, and not before."""
    path = str(tmp_path / "d")
    h = open_lmdb(path, segment_threshold=100, segment_size=4096)
    commit(h, lambda b: b.put_entries("q", [make_entry(i, bytes([i]) * 1500) for i in range(10)]))
    numbers = list_segments(seg_dir(path))
    assert len(numbers) >= 4
    commit(h, lambda b: b.delete_entries("q", [(0, i) for i in range(5)]))
    remaining = list_segments(seg_dir(path))
    assert numbers[0] not in remaining and numbers[-1] in remaining
    got = h.result(h.store.read_entries("q", None, 100))
    assert [e[7] for e in got] == [bytes([i]) * 1500 for i in range(5, 10)]
    commit(h, lambda b: b.purge_queue("q"))
    assert list_segments(seg_dir(path)) == [numbers[-1]]  # only the active one is left
    h.store.close()


def _write_big(path: str, n: int, size: int = 300) -> None:
    """Write ``n`` entries whose bodies live in segments, then close."""
    h = open_lmdb(path, segment_threshold=100)
    commit(h, lambda b: b.put_entries("q", [make_entry(i, bytes([65 + i]) * size) for i in range(n)]))
    commit(h, lambda b: b.put_entries("q", [make_entry(100, b"inline")]))
    h.result(h.store.close())


def test_corrupt_tail_is_truncated_and_its_entry_dropped(tmp_path: Any, caplog: Any) -> None:
    """A flipped byte in the last record: recovery truncates it (warning) and drops its entry."""
    path = str(tmp_path / "d")
    _write_big(path, 3)
    seg = os.path.join(seg_dir(path), "seg-0000000001.seg")
    with open(seg, "r+b") as f:
        f.seek(-10, os.SEEK_END)
        byte = f.read(1)
        f.seek(-10, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))
    caplog.set_level(logging.WARNING)
    h = open_lmdb(path, segment_threshold=100)
    assert any("damaged record" in r.getMessage() for r in caplog.records)
    assert h.store.stats()["recovered_dropped_entries"] == 1
    got = h.result(h.store.read_entries("q", None, 10))
    assert [e[0] for e in got] == [0, 1, 100]
    assert got[1][7] == b"B" * 300
    assert h.result(h.store.count_entries("q")) == 3
    # the repaired store keeps working
    commit(h, lambda b: b.put_entries("q", [make_entry(200, b"Z" * 400)]))
    assert h.result(h.store.read_entries("q", (0, 100), 10))[0][7] == b"Z" * 400
    h.store.close()


def test_truncated_segment_is_recovered(tmp_path: Any, caplog: Any) -> None:
    """A segment cut in the middle of its last record is truncated to the last whole record."""
    path = str(tmp_path / "d")
    _write_big(path, 4)
    seg = os.path.join(seg_dir(path), "seg-0000000001.seg")
    full = os.path.getsize(seg)
    os.truncate(seg, full - 100)
    caplog.set_level(logging.WARNING)
    h = open_lmdb(path, segment_threshold=100)
    assert h.store.stats()["recovered_truncated_bytes"] == full - 100 - 3 * (300 + 9)
    assert [e[0] for e in h.result(h.store.read_entries("q", None, 10))] == [0, 1, 2, 100]
    h.store.close()


def test_flipped_byte_inside_the_active_segment_drops_only_that_entry(tmp_path: Any) -> None:
    """A flipped byte in an earlier record of the active segment: recovery checks every record
    from there on, drops the one damaged entry and keeps the intact ones after it."""
    path = str(tmp_path / "d")
    _write_big(path, 3)
    seg = os.path.join(seg_dir(path), "seg-0000000001.seg")
    size = os.path.getsize(seg)
    with open(seg, "r+b") as f:
        f.seek(9 + 5)
        f.write(b"\x00")
    h = open_lmdb(path, segment_threshold=100)
    assert h.store.stats()["recovered_dropped_entries"] == 1
    got = h.result(h.store.read_entries("q", None, 10))
    assert [(e[0], e[7][:1]) for e in got] == [(1, b"B"), (2, b"C"), (100, b"i")]
    assert os.path.getsize(seg) == size  # intact records after the damage are kept
    h.store.close()


def test_corruption_in_an_older_segment_fails_the_read(tmp_path: Any) -> None:
    """A flipped byte in a rolled-over segment is caught by its CRC when read: StoreError,
    and the entries after it stay readable."""
    path = str(tmp_path / "d")
    h = open_lmdb(path, segment_threshold=100, segment_size=1000)
    commit(h, lambda b: b.put_entries("q", [make_entry(i, bytes([65 + i]) * 600) for i in range(3)]))
    assert len(list_segments(seg_dir(path))) == 3
    with open(os.path.join(seg_dir(path), "seg-0000000001.seg"), "r+b") as f:
        f.seek(100)
        f.write(b"?")
    assert h.failure(h.store.read_entries("q", None, 10)).check(StoreError)
    got = h.result(h.store.read_entries("q", (0, 0), 10))
    assert [e[7] for e in got] == [b"B" * 600, b"C" * 600]
    h.store.close()


def test_map_grows_on_demand(tmp_path: Any) -> None:
    """Writes beyond the initial map size grow the map; every write is confirmed and readable."""
    h = open_lmdb(str(tmp_path / "d"), map_size=1 << 20, segment_threshold=1 << 16)
    for n in range(10):
        b = WriteBatch()
        b.put_entries("q", [make_entry(n * 1000 + i, b"g" * 200) for i in range(1000)])
        h.result(h.store.commit(b))
    assert h.store.stats()["map_grows"] >= 1
    assert h.result(h.store.count_entries("q")) == 10000
    assert len(h.result(h.store.read_entries("q", None, 20000))) == 10000
    h.store.close()


def test_disk_full_fails_the_write_and_reads_continue(tmp_path: Any) -> None:
    """A write the file system refuses (EFBIG past RLIMIT_FSIZE) fails with StoreError, is not
    applied, and the store keeps reading and later writes succeed."""
    path = str(tmp_path / "d")
    h = open_lmdb(path, segment_threshold=100)
    commit(h, lambda b: b.put_entries("q", [make_entry(1, b"kept")]))
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, old_limit[1]))
        b = WriteBatch()
        b.put_entries("q", [make_entry(i, b"x" * 4000) for i in range(2, 200)])
        f = h.failure(h.store.commit(b))
        assert f.check(StoreError)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert h.store.stats()["failed_groups"] == 1
    assert [e[0] for e in h.result(h.store.read_entries("q", None, 10))] == [1]
    assert h.result(h.store.count_entries("q")) == 1
    commit(h, lambda b: b.put_entries("q", [make_entry(2, b"y" * 500)]))
    h2 = reopen(h, path, segment_threshold=100)
    assert [e[7] for e in h2.result(h2.store.read_entries("q", None, 10))] == [b"kept", b"y" * 500]
    h2.store.close()


def test_batch_durability_syncs_on_the_clock(tmp_path: Any) -> None:
    """In batch mode commits confirm at once and an fsync runs every batch_interval."""
    path = str(tmp_path / "d")
    h = open_lmdb(path, durability="batch", batch_interval=0.05)
    commit(h, lambda b: b.put_entries("q", [make_entry(1, b"x" * 500)]))
    assert len(h.clock.getDelayedCalls()) == 1  # the periodic sync timer
    h.clock.advance(0.05)
    assert len(h.clock.getDelayedCalls()) == 1  # re-armed
    h2 = reopen(h, path)
    assert h2.result(h2.store.count_entries("q")) == 1
    h2.store.close()


def test_thread_writer_pipelines_groups(tmp_path: Any) -> None:
    """With writer='thread' commits run off the calling thread; the next group queues meanwhile."""
    results: queue.SimpleQueue[tuple[Any, tuple[Any, ...]]] = queue.SimpleQueue()
    clock = Clock()
    store = LmdbStore(str(tmp_path / "d"), clock=clock, writer="thread",
                      call_from_thread=lambda f, *a: results.put((f, a)))
    store.open()
    fired: list[int] = []

    def drain_until(cond: Callable[[], bool]) -> None:
        """Run what the writer thread handed back until ``cond`` holds (10 s deadline)."""
        run_handed_back(results, cond, 10, lambda: clock.advance(0))

    for n in range(3):
        b = WriteBatch()
        b.put_entries("q", [make_entry(n * 10 + i, b"t") for i in range(10)])
        store.commit(b).addCallback(lambda _, k: fired.append(k), n)
        if n == 0:
            clock.advance(0)  # group 1 goes to the thread; 2 and 3 wait for it
    drain_until(lambda: len(fired) == 3)
    assert fired == [0, 1, 2]
    assert store.stats()["commits"] == 2
    got: list[int] = []
    store.count_entries("q").addCallback(got.append)
    assert got == [30]
    closed: list[object] = []
    store.close().addCallback(closed.append)
    assert closed == [None]


def test_auto_writer_moves_slow_commits_to_the_thread(tmp_path: Any) -> None:
    """writer='auto' without an fsync per commit commits inline until the commit latency
    average passes its threshold, then hands groups to the writer thread; with a plain Clock
    and no hand-back it stays inline (even with ``sync`` durability)."""
    plain_clock = Clock()
    plain = LmdbStore(str(tmp_path / "p"), clock=plain_clock, auto_threshold=0.0)
    plain.open()
    h = Harness(plain, plain_clock)
    commit(h, lambda b: b.put_meta("k", b"v"))
    commit(h, lambda b: b.put_meta("k", b"w"))
    assert plain.stats()["writer_now"] == "inline"
    plain.close()

    results: queue.SimpleQueue[tuple[Any, tuple[Any, ...]]] = queue.SimpleQueue()
    clock = Clock()
    store = LmdbStore(str(tmp_path / "d"), clock=clock, auto_threshold=0.0, durability="none",
                      call_from_thread=lambda f, *a: results.put((f, a)))
    store.open()
    fired: list[object] = []
    b = WriteBatch()
    b.put_entries("q", [make_entry(1, b"one")])
    store.commit(b).addCallback(fired.append)
    clock.advance(0)
    assert fired == [None] and results.empty()  # first group: inline
    assert store.stats()["writer_now"] == "thread"
    b = WriteBatch()
    b.put_entries("q", [make_entry(2, b"two")])
    store.commit(b).addCallback(fired.append)
    clock.advance(0)
    f, a = results.get(timeout=10)  # second group: committed by the thread
    f(*a)
    assert fired == [None, None]
    store.close()


def test_auto_writer_with_sync_durability_commits_in_the_thread_from_the_start(
        tmp_path: Any) -> None:
    """writer='auto' with ``sync`` durability hands every group to the writer thread from the
    first one (an inline fsync would hold the reactor), and stays there however fast the
    commits are."""
    results: queue.SimpleQueue[tuple[Any, tuple[Any, ...]]] = queue.SimpleQueue()
    clock = Clock()
    store = LmdbStore(str(tmp_path / "d"), clock=clock, auto_threshold=1e9,
                      call_from_thread=lambda f, *a: results.put((f, a)))
    store.open()
    assert store.stats()["writer_now"] == "thread"
    fired: list[object] = []
    for i in range(1, 4):
        b = WriteBatch()
        b.put_entries("q", [make_entry(i, b"m")])
        store.commit(b).addCallback(fired.append)
        clock.advance(0)
        f, a = results.get(timeout=10)  # committed by the thread, handed back
        f(*a)
        assert fired == [None] * i
        assert store.stats()["writer_now"] == "thread"
    store.close()


def test_segment_deletion_waits_for_a_snapshot_lock(tmp_path: Any) -> None:
    """While a snapshot holds segments.lock (shared), unreferenced segments are kept; the next
    commit after it is released deletes them."""
    import fcntl

    path = str(tmp_path / "d")
    h = open_lmdb(path, segment_threshold=100, segment_size=2048)
    commit(h, lambda b: b.put_entries("q", [make_entry(i, os.urandom(1500)) for i in range(3)]))
    first = list_segments(seg_dir(path))[0]
    fd = os.open(os.path.join(path, "segments.lock"), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        commit(h, lambda b: b.delete_entries("q", [(0, 0)]))
        assert first in list_segments(seg_dir(path))
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    commit(h, lambda b: b.put_entries("q", [make_entry(9, os.urandom(1500))]))
    assert first not in list_segments(seg_dir(path))
    assert h.result(h.store.count_entries("q")) == 3
    h.store.close()


def test_reads_on_a_closed_store_fail(tmp_path: Any) -> None:
    """Every read of a closed LmdbStore fails with StoreError instead of touching LMDB."""
    h = open_lmdb(str(tmp_path / "d"))
    h.result(h.store.close())
    for d in (h.store.read_entries("q", None, 1), h.store.count_entries("q"),
              h.store.queue_names(), h.store.read_due(1.0, 1), h.store.next_due(),
              h.store.get_meta("k"), h.store.scan_meta(""), h.store.read_expired(1.0, 1)):
        assert h.failure(d).check(StoreError)


def test_a_store_is_opened_by_one_owner_at_a_time(tmp_path: Any) -> None:
    """A second LmdbStore on the same directory refuses to open while the first is open."""
    path = str(tmp_path / "d")
    first = make_lmdb(path, Clock())
    second = LmdbStore(path, clock=Clock())
    with pytest.raises(StoreError, match="in use"):
        second.open()
    first.close()
    second.open()
    second.close()
