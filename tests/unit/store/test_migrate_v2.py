"""A store written in format 2 by older code opens, converts in place (to format 3 rows,
labelled with this code's format 4), and
delivers exactly what the previous code delivered from it; a kill during the conversion leaves
a store that finishes converting on the next open.

The fixture ``fixtures/format2/`` and the expected deliveries ``fixtures/format2.json`` were
written by the format-2 code of main (``fixtures/make_format2_store.py`` says how).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

import lmdb
import pytest

from mqhub.store import codec, migrate_v2
from tests.unit.store.fixtures import make_format2_store as fixture


@pytest.fixture
def expected() -> dict[str, Any]:
    """What the format-2 code delivered from the fixture."""
    return fixture.expected_deliveries(2)


def copy_fixture(tmp_path: Any) -> str:
    """A writable copy of the format-2 fixture."""
    return fixture.copy_fixture(tmp_path, 2)


def stored_format(path: str) -> str:
    """Return ``"format 2"``, ``"converting"`` (the current format written, the marker and the
    ``order`` database still there) or ``"converted"``; fail on anything else."""
    env = lmdb.open(os.path.join(path, "index"), max_dbs=codec.MAX_DBS, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            sysdb = env.open_db(b"sys", txn=txn)
            fmt = codec.U32.unpack(txn.get(b"format", db=sysdb))[0]
            names = {bytes(k) for k in txn.cursor().iternext(values=False)}
            marker = migrate_v2.converting(txn, sysdb)
    finally:
        env.close()
    state = (fmt, marker, codec.V2_ORDER_DB in names)
    v = codec.FORMAT_VERSION
    known = {(2, False, True): "format 2", (v, True, True): "converting",
             (v, False, False): "converted"}
    assert state in known, state
    return known[state]


def test_format_2_store_opens_and_delivers_what_the_old_code_did(
        tmp_path: Any, expected: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    """Every queue delivers the old code's messages (priorities, attempts, headers-bearing,
    segment and expiring bodies, delayed ones when due, short-TTL ones never) in its order."""
    path = copy_fixture(tmp_path)
    assert stored_format(path) == "format 2"
    caplog.set_level("INFO", logger="mqhub.store.migrate")
    got = fixture.deliveries(path, expected["closed_at"])
    assert got == expected["deliveries"]
    assert sum(len(p["now"]) + len(p["later"]) for p in got.values()) == 232
    assert stored_format(path) == "converted"
    assert f"converted to format {codec.FORMAT_VERSION}" in caplog.text


def test_partial_conversion_resumes(tmp_path: Any, expected: dict[str, Any]) -> None:
    """Stopped after 3 transactions of 40 rows, the store is marked as converting (current
    format, so the previous version refuses it rather than serve the unconverted part only) and the
    next open converts the rest: deliveries equal the old code's."""
    path = copy_fixture(tmp_path)
    env = lmdb.open(os.path.join(path, "index"), max_dbs=codec.MAX_DBS)
    with env.begin(write=True) as txn:
        dbs = {n: env.open_db(n, txn=txn) for n in codec.DB_NAMES}
    done = migrate_v2.migrate(env, dbs, chunk=40, stop_after=3)
    env.close()
    assert done["transactions"] == 3 and done["rows"] == 120
    assert stored_format(path) == "converting"
    from mqhub.errors import StoreError
    from mqhub.store.snapshot import take_snapshot
    with pytest.raises(StoreError, match="format 2"):
        take_snapshot(path, str(tmp_path / "refused"))
    assert fixture.deliveries(path, expected["closed_at"]) == expected["deliveries"]
    assert stored_format(path) == "converted"


CHILD = """
import os, sys, time, lmdb
from mqhub.store import codec, migrate_v2
env = lmdb.open(os.path.join(sys.argv[1], "index"), max_dbs=codec.MAX_DBS)
with env.begin(write=True) as txn:
    dbs = {n: env.open_db(n, txn=txn) for n in codec.DB_NAMES}
def progress(done):
    print(done["transactions"], flush=True)
    if done["transactions"] == 3:
        time.sleep(60)   # killed here by the test
migrate_v2.migrate(env, dbs, chunk=25, progress=progress)
"""


def test_kill_during_conversion_leaves_a_store_that_converts_on_the_next_open(
        tmp_path: Any, expected: dict[str, Any]) -> None:
    """A converting process killed with SIGKILL after its third transaction: the store opens,
    finishes converting and delivers what the old code did."""
    path = copy_fixture(tmp_path)
    child = subprocess.Popen([sys.executable, "-c", CHILD, path], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None
        lines = [child.stdout.readline().strip() for _ in range(3)]
        assert lines == ["1", "2", "3"]
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    assert stored_format(path) == "converting"
    assert fixture.deliveries(path, expected["closed_at"]) == expected["deliveries"]
    assert stored_format(path) == "converted"


def test_snapshots_of_format_2_are_read_and_unconverted_stores_are_not_copied(
        tmp_path: Any, expected: dict[str, Any]) -> None:
    """A format-2 snapshot (made by the old version) is read through its ``order`` rows; a
    format-2 store is not snapshotted until converted; after conversion the snapshot of the
    store lists the same entries in the same order."""
    from mqhub.errors import StoreError
    from mqhub.store.snapshot import MANIFEST, take_snapshot
    from mqhub.store.snapshot_reader import SnapshotReader
    old_snap = copy_fixture(tmp_path)
    with open(os.path.join(old_snap, MANIFEST), "w") as f:
        json.dump({"store_format": 2}, f)
    with SnapshotReader(old_snap) as snap:
        before = [(q, e[0], e[1], e[7]) for q, e in snap.iter_entries()]
        assert len(before) == sum(snap.queue_counts().values()) > 200
    store_dir = copy_fixture(tmp_path / "s")
    with pytest.raises(StoreError, match="format 2"):
        take_snapshot(store_dir, str(tmp_path / "refused"))
    from mqhub.store.lmdb import LmdbStore
    from mqhub.testing import result_of, start_clock
    store = LmdbStore(store_dir, clock=start_clock())
    store.open()
    result_of(store.close())
    take_snapshot(store_dir, str(tmp_path / "snap3"))
    with SnapshotReader(str(tmp_path / "snap3")) as snap:
        assert snap.verify() == []
        assert [(q, e[0], e[1], e[7]) for q, e in snap.iter_entries()] == before
