"""A store written in format 3 by the previous code (main at 713ddca) opens after the upgrade
to format 4 without a rewrite, delivers exactly what the previous code delivered from it, and
takes packed groups from then on; a format-3 snapshot or store copy is still read.

The fixture ``fixtures/format3/`` and the expected deliveries ``fixtures/format3.json`` were
written by the format-3 code (``fixtures/make_format2_store.py`` says how).
"""

from __future__ import annotations

import os
from typing import Any

import lmdb
import pytest

from mqhub.store import codec
from tests.unit.store.fixtures import make_format2_store as fixture


@pytest.fixture
def expected() -> dict[str, Any]:
    """What the format-3 code delivered from the fixture."""
    return fixture.expected_deliveries(3)


def copy_fixture(tmp_path: Any) -> str:
    """A writable copy of the format-3 fixture."""
    return fixture.copy_fixture(tmp_path, 3)


def stored_format(path: str) -> tuple[int, bool]:
    """Return ``(format, whether a packs database exists)`` of the store in ``path``."""
    env = lmdb.open(os.path.join(path, "index"), max_dbs=codec.MAX_DBS, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            fmt = codec.U32.unpack(txn.get(b"format", db=env.open_db(b"sys", txn=txn)))[0]
            names = {bytes(k) for k in txn.cursor().iternext(values=False)}
    finally:
        env.close()
    return fmt, b"packs" in names


def test_format_3_store_opens_and_delivers_what_the_old_code_did(
        tmp_path: Any, expected: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    """Every queue delivers the old code's messages (priorities, attempts, headers-bearing,
    segment and expiring bodies, delayed ones when due, short-TTL ones never) in its order;
    the store is labelled format 4 (the format-3 code refuses it from then on)."""
    path = copy_fixture(tmp_path)
    assert stored_format(path) == (3, False)
    caplog.set_level("INFO", logger="mqhub.store.migrate")
    got = fixture.deliveries(path, expected["closed_at"])
    assert got == expected["deliveries"]
    assert sum(len(p["now"]) + len(p["later"]) for p in got.values()) == 232
    assert stored_format(path) == (codec.FORMAT_VERSION, True)
    assert "store index has format 3: marked as format 4" in caplog.text


def test_an_upgraded_store_mixes_old_rows_and_packed_groups(tmp_path: Any) -> None:
    """After the upgrade, new publishes on a queue holding format-3 rows are packed behind
    them; reads give both in order; a restart keeps both; FINs of both kinds work."""
    from mqhub.store.batch import WriteBatch
    from mqhub.store.records import make_entry
    from tests.unit.store.conftest import open_lmdb
    path = copy_fixture(tmp_path)
    h = open_lmdb(path, durability="none")
    before = h.result(h.store.read_entries("archive", None, 100))
    assert len(before) == 12
    top = max(e[0] for e in before)
    b = WriteBatch()
    b.put_entries("archive", [make_entry(top + i, b"new%d" % i, before[0][5], origin=before[0][8])
                              for i in range(1, 6)])
    h.result(h.store.commit(b))
    with h.store._env.begin() as txn:
        assert txn.stat(h.store._dbs[b"packs"])["entries"] == 1
    h.store.close()
    h = open_lmdb(path, durability="none")
    got = h.result(h.store.read_entries("archive", None, 100))
    assert [e[0] for e in got] == [e[0] for e in before] + [top + i for i in range(1, 6)]
    assert got[:12] == before
    b = WriteBatch()
    b.delete_entries("archive", [(0, e[0]) for e in got[::2]])
    h.result(h.store.commit(b))
    assert [e[0] for e in h.result(h.store.read_entries("archive", None, 100))] == \
        [e[0] for e in got[1::2]]
    assert h.result(h.store.count_entries("archive")) == len(got[1::2])
    h.store.close()


def test_format_3_store_and_snapshot_are_read_as_they_are(tmp_path: Any) -> None:
    """A snapshot of a format-3 store not yet opened by this version copies it as format 3;
    the snapshot reader lists its entries and verifies it; so does a format-3 snapshot dir."""
    from mqhub.store.snapshot import take_snapshot
    from mqhub.store.snapshot_reader import SnapshotReader
    path = copy_fixture(tmp_path)
    manifest = take_snapshot(path, str(tmp_path / "snap"))
    assert manifest["store_format"] == 3
    assert stored_format(path) == (3, False)
    with SnapshotReader(str(tmp_path / "snap")) as snap:
        assert snap.store_format == 3
        assert snap.verify() == []
        listed = [(q, e[0]) for q, e in snap.iter_entries()]
    assert len(listed) == sum(manifest["queues"].values()) > 200
