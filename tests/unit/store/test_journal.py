"""The flow journal: recorder calls from the core, chunks written with the group commit,
snapshots that carry them, torn tails, rollback of uncommitted bytes and retention (Clock only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from mqhub.core.broker import Broker
from mqhub.store.journal import END_KEY, Journal, iter_chunks, journal_files
from mqhub.store.journal_format import ChunkBuilder, ChunkError, decode_chunk
from mqhub.store.journal_recorder import JournalRecorder
from mqhub.store.lmdb import LmdbStore
from mqhub.testing import CollectingTarget, result_of, start_clock

pa = pytest.importorskip("pyarrow")
from mqhub.analytics.arrow import journal_file_batches, table_batches  # noqa: E402


class Rig:
    """An LmdbStore with a journal and a broker on one Clock."""

    def __init__(self, path: str, **journal_kw: Any) -> None:
        """Open everything the way HubService does."""
        self.clock = start_clock()
        self.store = LmdbStore(path, clock=self.clock, writer="inline")
        self.store.open()
        self.recorder = JournalRecorder(self.clock)
        journal_kw.setdefault("max_delay", 0.0)  # a chunk with every commit
        self.journal = Journal(path, self.recorder, **journal_kw)
        self.journal.open()
        self.store.journal = self.journal
        self.recorder.start(self.store)
        self.broker = Broker(self.store, self.clock)
        self.broker.journal = self.recorder
        result_of(self.broker.start())

    def settle(self) -> None:
        """Run this turn's group commit."""
        for _ in range(3):
            self.clock.advance(0)

    def close(self) -> None:
        """Stop and close like HubService."""
        self.recorder.stop()
        self.settle()
        self.broker.stop()
        result_of(self.store.close())
        self.journal.close()


def events(path: str) -> list[dict[str, Any]]:
    """Every event row of the journal files under ``path``."""
    rows: list[dict[str, Any]] = []
    for f, length in journal_files(path):
        for name, batch in journal_file_batches(f, length):
            if name == "events":
                rows.extend(batch.to_pylist())
    return rows


def test_chunk_round_trip_and_bad_input() -> None:
    """A chunk decodes to what was added; truncated or foreign payloads raise ChunkError."""
    c = ChunkBuilder()
    c.add_run(1, 5, "q", "a.b", "nsq", "", [7, 8], [3, 4], [0, 9], [1, 2])
    c.add_counter(100, "x", "nats", 0, 5, 50)
    d = decode_chunk(c.encode())
    assert d["strings"][d["runs"]["queue"][0]] == "q"
    assert list(d["rows"]["msg_id"]) == [7, 8] and list(d["rows"]["attempt"]) == [1, 2]
    assert list(d["counters"]["bytes"]) == [50]
    for bad in (b"", b"\x09", c.encode()[:-3]):
        with pytest.raises(ChunkError):
            decode_chunk(bad)


def test_flow_is_journaled_per_batch(tmp_path: Any) -> None:
    """Publish, deliver, requeue, redeliver, ack, dead-letter and expire on durable queues
    become exact event rows; memory-tier publishes become counters; one chunk per commit."""
    rig = Rig(str(tmp_path / "s"))
    b = rig.broker
    q = b.declare_queue("work", max_attempts=2)
    b.bind_queue("jobs", "work")
    b.declare_queue("short", ttl=5.0)
    b.bind_queue("soon", "short")
    b.publish_batch("jobs", [b"a", b"bb", b"ccc"], origin="nsq")
    b.publish_batch("soon", [b"x"], origin="emqp")
    b.publish_batch("live.only", [b"12345"], origin="nats")  # no queue: a counter
    rig.settle()
    target = CollectingTarget()
    c = q.attach(target, ready=10)
    rig.settle()
    ids = [e[0] for e in target.entries]
    assert len(ids) == 3
    q.requeue(c, [ids[0]], error="retry")
    q.ack(c, ids[1:])
    rig.settle()
    redelivered = target.entries[-1]
    assert redelivered[0] == ids[0] and redelivered[2] == 2
    q.requeue(c, [ids[0]])  # attempt 2 of max 2: dead letter
    rig.clock.advance(6.0)
    b.sweep_ttl(rig.clock.seconds(), 100)
    rig.settle()
    rig.clock.advance(1.0)  # the recorder's idle flush
    rig.settle()
    rig.close()
    rows = events(str(tmp_path / "s" / "journal"))
    kinds = [(r["event"], r["queue"], r["msg_id"]) for r in rows]
    assert [k for k in kinds if k[0] == "published"] == [
        ("published", "work", i) for i in ids] + [("published", "short", ids[2] + 1)]
    assert sorted(r["attempt"] for r in rows if r["event"] == "delivered") == [1, 1, 1, 2]
    assert [(r["msg_id"], r["reason"]) for r in rows if r["event"] == "requeued"] == [
        (ids[0], "retry")]
    assert sorted(r["msg_id"] for r in rows if r["event"] == "acked") == ids[1:]
    assert [(r["msg_id"], r["reason"]) for r in rows if r["event"] == "dead_lettered"] == [
        (ids[0], "max_attempts")]
    assert [(r["queue"], r["msg_id"]) for r in rows if r["event"] == "expired"] == [
        ("short", ids[2] + 1)]
    pub = [r for r in rows if r["event"] == "published"]
    assert [r["size"] for r in pub] == [1, 2, 3, 1]
    assert {r["origin"] for r in pub} == {"nsq", "emqp"} and pub[0]["address"] == "jobs"
    counters = []
    for f, length in journal_files(str(tmp_path / "s" / "journal")):
        counters += [bt.to_pylist() for n, bt in journal_file_batches(f, length) if n == "counters"]
    flat = [r for part in counters for r in part]
    assert [(r["address"], r["origin"], r["kind"], r["messages"], r["bytes"]) for r in flat] == [
        ("live.only", "nats", "published", 1, 5)]


def test_snapshot_carries_the_committed_journal(tmp_path: Any) -> None:
    """A snapshot copies the journal up to the end its read transaction sees; bytes written
    later (or never committed) are not in it; the data source's reader reads it back."""
    rig = Rig(str(tmp_path / "s"))
    rig.broker.declare_queue("q")
    rig.broker.bind_queue("a", "q")
    rig.broker.publish_batch("a", [b"1", b"2"], origin="nsq")
    rig.settle()
    snap = str(tmp_path / "snap")
    done = subprocess.run([sys.executable, "-m", "mqhub.cli", "snapshot", "--data-dir",
                           str(tmp_path / "s"), "--out", snap], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    manifest = json.loads(done.stdout)["manifest"]
    rig.broker.publish_batch("a", [b"3"], origin="nsq")
    rig.settle()
    rig.close()
    files = manifest["journal"]["files"]
    assert len(files) == 1 and files[0]["length"] == manifest["journal"]["end"][1]
    got = [r for bt in table_batches(snap, "events") for r in bt.to_pylist()]
    assert [r["event"] for r in got] == ["published", "published"]
    msgs = [r for bt in table_batches(snap, "messages") for r in bt.to_pylist()]
    assert [(m["queue"], m["size"], m["origin"]) for m in msgs] == [("q", 1, "nsq")] * 2


def test_torn_tail_and_uncommitted_bytes_are_cut(tmp_path: Any) -> None:
    """Garbage after the last record (kill -9 mid-append) is truncated on open; a whole
    record the index never committed is cut before the next append; nothing crashes."""
    path = str(tmp_path / "s")
    rig = Rig(path)
    rig.broker.declare_queue("q")
    rig.broker.bind_queue("a", "q")
    rig.broker.publish_batch("a", [b"1"], origin="nsq")
    rig.settle()
    rig.close()
    jfile = journal_files(os.path.join(path, "journal"))[-1][0]
    good = os.path.getsize(jfile)
    c = ChunkBuilder()
    c.add_run(0, 1, "q", "a", "nsq", "", [99], [1], [0], [0])
    extra = __import__("mqhub.store.segments", fromlist=["frame"]).frame(c.encode())
    with open(jfile, "ab") as f:
        f.write(extra)          # a whole record past the committed end
        f.write(b"\x00\x00\x01\x00torn")  # and a torn one after it
    rig = Rig(path)
    assert os.path.getsize(jfile) == good + len(extra)  # scan cut the torn record
    rig.broker.publish_batch("a", [b"2"], origin="nsq")
    rig.settle()
    rig.close()
    ids = [r["msg_id"] for r in events(os.path.join(path, "journal"))]
    assert 99 not in ids and len(ids) == 2
    assert len(list(iter_chunks(jfile))) == 2


class OneChunk:
    """A recorder stand-in handing out numbered one-row chunks."""

    rows = 0
    force = True

    def __init__(self) -> None:
        """Start at id 1."""
        self.n = 0

    def take_chunk(self) -> bytes:
        """Return the next chunk."""
        self.n += 1
        c = ChunkBuilder()
        c.add_run(0, self.n, "q", "a", "nsq", "", [self.n], [1], [0], [0])
        return c.encode()


def test_aborted_transaction_rewrites_its_chunk(tmp_path: Any) -> None:
    """A chunk whose transaction aborted is cut and written again with the next commit, once."""
    import lmdb

    env = lmdb.open(str(tmp_path / "env"), max_dbs=2)
    sysdb = env.open_db(b"sys")
    journal = Journal(str(tmp_path), OneChunk(), max_delay=0.0)
    journal.open()
    txn = env.begin(write=True)
    journal.write(txn, sysdb)
    txn.abort()
    with env.begin(write=True) as txn:
        journal.write(txn, sysdb)
    journal.committed()
    journal.close()
    with env.begin() as txn:
        assert txn.get(END_KEY, db=sysdb) is not None
    env.close()
    assert [r["msg_id"] for r in events(str(tmp_path / "journal"))] == [1, 2]


def test_rotation_and_retention(tmp_path: Any) -> None:
    """Files roll over at max_file; closed files past the age or total size are deleted."""
    now = [1_000_000.0]
    rig = Rig(str(tmp_path / "s"), max_file=4096, retention_bytes=1 << 30,
              retention_seconds=3600.0, now=lambda: now[0])
    rig.broker.declare_queue("q")
    rig.broker.bind_queue("a", "q")
    for _ in range(40):
        rig.broker.publish_batch("a", [b"x" * 10] * 20, origin="nsq")
        rig.settle()
    jdir = str(tmp_path / "s" / "journal")
    files = journal_files(jdir)
    assert len(files) >= 4
    old = files[0][0]
    os.utime(old, (now[0] - 7200, now[0] - 7200))
    assert rig.journal.apply_retention() == 1
    assert not os.path.exists(old)
    rig.journal.retention_bytes = 4096 * 2
    assert rig.journal.apply_retention() >= 1
    total = sum(os.path.getsize(p) for p, _ in journal_files(jdir))
    assert total <= 4096 * 2 + 4096
    rig.close()


def test_published_records_ride_their_commit_the_others_wait(tmp_path: Any) -> None:
    """A commit that stores a publish carries its ``published`` records (a confirmed message
    always has its event, whatever max_rows and max_delay say); deliveries and acks wait for
    max_rows, or for a tick of the recorder (every 1 s) that saw no chunk since the last one,
    which forces them into the next commit."""
    rig = Rig(str(tmp_path / "s"), max_delay=3600.0, max_rows=50)
    q = rig.broker.declare_queue("q")
    rig.broker.bind_queue("a", "q")
    jdir = str(tmp_path / "s" / "journal")
    rig.broker.publish_batch("a", [b"1"] * 10, origin="nsq")
    rig.settle()
    assert [e["event"] for e in events(jdir)] == ["published"] * 10
    target = CollectingTarget()
    consumer = q.attach(target, ready=100)
    rig.settle()
    q.ack(consumer, [e[0] for e in target.entries])
    rig.settle()
    assert len(events(jdir)) == 10  # 20 rows (deliveries, acks) below max_rows wait
    for _ in range(2):  # the first tick sees the publish's chunk: the second forces one
        rig.clock.advance(1.0)
        rig.settle()
    assert sorted({e["event"] for e in events(jdir)}) == ["acked", "delivered", "published"]
    assert len(events(jdir)) == 30
    rig.broker.publish_batch("a", [b"2"] * 60, origin="nsq")
    rig.settle()
    assert len(events(jdir)) >= 90
    rig.close()
