"""Online snapshots: taken from this process while a child process keeps writing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from twisted.internet.task import Clock

from mqhub.errors import StoreError
from mqhub.store.batch import WriteBatch
from mqhub.store.lmdb import LmdbStore
from mqhub.store.records import BODY, MSG_ID, make_entry
from mqhub.store.snapshot import take_snapshot
from mqhub.store.snapshot_reader import SnapshotReader
from tests.unit.store.child import ROOT, StoreChild
from tests.unit.store.crash_child import body_for


def test_snapshot_while_writing_matches_its_manifest(tmp_path: Any) -> None:
    """Two snapshots taken during continuous writes each open with the reader, and their
    entries, per-queue and per-address counts, bodies and segments match their manifests."""
    data = str(tmp_path / "data")
    child = StoreChild(data, 1000)
    try:
        child.wait_for(lambda lines: sum(x.startswith("D ") for x in lines) >= 3)
        manifests = []
        for n in range(2):
            out = str(tmp_path / f"snap{n}")
            manifests.append(take_snapshot(data, out))
            child.wait_for_lines(len(child.lines) + 21)
    finally:
        child.kill()
    assert manifests[1]["entries"] != manifests[0]["entries"]  # writes went on in between
    for n, manifest in enumerate(manifests):
        out = str(tmp_path / f"snap{n}")
        with open(os.path.join(out, "manifest.json")) as f:
            assert json.load(f) == manifest
        assert manifest["format_version"] == 1 and manifest["created_at"] > 0
        assert manifest["segments"], "the child writes segment-sized bodies"
        with SnapshotReader(out) as snap:
            assert snap.verify() == []
            assert snap.queue_counts() == manifest["queues"]
            per_queue: dict[str, int] = {}
            for queue, entry in snap.iter_entries():
                per_queue[queue] = per_queue.get(queue, 0) + 1
                assert entry[BODY] == body_for(entry[MSG_ID])
            assert per_queue == manifest["queues"]
            assert sum(per_queue.values()) == manifest["entries"]
            assert snap.address_counts() == manifest["addresses"] == {"crash.test": manifest["entries"]}
            assert sum(1 for _ in snap.iter_entries("b")) == manifest["queues"].get("b", 0)


def test_reader_imports_no_twisted() -> None:
    """The snapshot reader (and what it imports) loads without Twisted or zope."""
    code = ("import sys, mqhub.store.snapshot_reader, mqhub.store.snapshot; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('twisted', 'zope')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_snapshot_refuses_a_missing_store_and_an_existing_snapshot(tmp_path: Any) -> None:
    """No store -> StoreError; an out dir that already holds a snapshot -> StoreError."""
    with pytest.raises(StoreError):
        take_snapshot(str(tmp_path / "nothing"), str(tmp_path / "out"))
    with pytest.raises(StoreError):
        SnapshotReader(str(tmp_path / "nothing"))
    clock = Clock()
    store = LmdbStore(str(tmp_path / "d"), clock=clock)
    store.open()
    b = WriteBatch()
    b.put_entries("q", [make_entry(1, b"x", "addr")])
    b.put_due(7.0, b"k", b"p")
    b.put_meta("m", b"v")
    store.commit(b)
    clock.advance(0)
    store.close()  # py-lmdb opens an environment once per process; the CLI runs in another
    take_snapshot(str(tmp_path / "d"), str(tmp_path / "out"), now=123.0)
    with pytest.raises(StoreError):
        take_snapshot(str(tmp_path / "d"), str(tmp_path / "out"))
    with SnapshotReader(str(tmp_path / "out")) as snap:
        assert snap.manifest["created_at"] == 123.0
        assert snap.manifest["segments"] == [] and snap.manifest["queues"] == {"q": 1}
        assert snap.due_rows() == [(7.0, b"k", b"p")]
        assert snap.meta() == {"m": b"v"}
        assert [e for _, e in snap.iter_entries()] == [make_entry(1, b"x", "addr")]
