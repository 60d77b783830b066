"""LmdbStore format 4: appends fill pages, odd orders still land, ready groups (plain and
packed) stay exact, format 1 is refused."""

from __future__ import annotations

import os
from typing import Any

import lmdb
import pytest

from mqhub.errors import StoreError
from mqhub.store import codec, ready_groups
from mqhub.store.batch import WriteBatch
from mqhub.store.records import make_entry
from tests.unit.store.conftest import Harness, open_lmdb

KIB = b"k" * 1024


def open_store(path: str, **kw: Any) -> Harness:
    """Open an LmdbStore on ``path`` (``none`` durability: these tests check layout, not fsync)."""
    kw.setdefault("durability", "none")
    kw.setdefault("segment_threshold", 64 << 10)
    return open_lmdb(path, **kw)


def put(h: Harness, queues: list[str], ids: list[int], body: bytes = KIB, prio: int = 0) -> None:
    """Commit one batch putting ``ids`` on every queue in ``queues``."""
    b = WriteBatch()
    for q in queues:
        b.put_entries(q, [make_entry(i, body + str(i).encode(), "a", priority=prio) for i in ids])
    h.result(h.store.commit(b))


def entries_pages(h: Harness) -> int:
    """Return how many pages the ``entries``, ``ready`` and ``packs`` tables occupy (leaf +
    branch + overflow): where the messages are, whichever row kind holds them."""
    env = h.store._env
    total = 0
    with env.begin() as txn:
        for name in (b"entries", b"ready", b"packs"):
            st = txn.stat(h.store._dbs[name])
            total += int(st["leaf_pages"] + st["branch_pages"] + st["overflow_pages"])
    return total


def entry_rows(h: Harness) -> int:
    """Return how many ``entries`` rows the store holds."""
    with h.store._env.begin() as txn:
        return int(txn.stat(h.store._dbs[b"entries"])["entries"])


def ready_live(h: Harness) -> int:
    """Check every ``ready`` group (ids ascending, no overlap within a queue and priority, no
    empty group; a plain group's live count = its ids whose entry exists; a packed group's =
    its set bits, none of its ids has an ``entries`` row, its ``packs`` row exists and holds
    one body per id); return the total live count."""
    total = 0
    with h.store._env.begin() as txn:
        entries = h.store._dbs[b"entries"]
        packs = h.store._dbs[b"packs"]
        last: dict[bytes, int] = {}
        for k, v in txn.cursor(db=h.store._dbs[b"ready"]):
            qid, pbyte, first = codec.READY_KEY.unpack(k)
            ids = ready_groups.group_ids(v)
            assert list(ids) == sorted(set(ids)) and ids[0] == first
            assert last.get(bytes(k[:5]), -1) < first
            last[bytes(k[:5])] = ids[-1]
            rows = sum(txn.get(codec.ENTRY_KEY.pack(i, qid, pbyte), db=entries) is not None
                       for i in ids)
            if ready_groups.is_packed(v):
                assert rows == 0
                live = ready_groups.packed_bits(v).bit_count()
                assert ready_groups.packed_bits(v) >> len(ids) == 0
                pack = txn.get(k, db=packs)
                assert pack is not None and len(codec.decode_pack(pack)[1]) == len(ids) + 1
            else:
                live = rows
            assert live == ready_groups.live_count(v) > 0
            total += live
    return total


def test_in_order_appends_fill_pages(tmp_path: Any) -> None:
    """6,000 1 KiB entries on two queues (fan-out: same ids) use ~1.4 KiB of pages each, not 2.

    Format 1 split every full page in half (two 1 KiB entries per 4 KiB page); MDB_APPEND on
    the msg_id-first key keeps three per page.
    """
    h = open_store(str(tmp_path / "d"))
    for start in range(0, 3000, 300):
        put(h, ["q1", "q2"], list(range(start, start + 300)))
    assert h.result(h.store.count_entries("q1")) == 3000
    assert h.result(h.store.count_entries("q2")) == 3000
    per_entry = entries_pages(h) * 4096 / 6000
    assert per_entry < 1.5 * 1024, per_entry
    got = h.result(h.store.read_entries("q2", None, 5000))
    assert [e[0] for e in got] == list(range(3000))
    assert got[7][7] == KIB + b"7"
    h.result(h.store.close())


def test_out_of_order_and_repeated_puts_all_land(tmp_path: Any) -> None:
    """Old ids after new ones, re-puts, a key repeated in one batch: none lost or double-counted."""
    h = open_store(str(tmp_path / "d"))
    put(h, ["q"], list(range(100, 200)))
    b = WriteBatch()
    b.put_entries("q", [make_entry(i, b"old%d" % i, "a") for i in range(0, 50)])
    b.put_entries("q", [make_entry(i, b"new%d" % i, "a") for i in range(150, 250)])
    b.put_entries("q", [make_entry(300, b"first", "a"), make_entry(300, b"second", "a")])
    b.put_entries("r", [make_entry(5, b"r5", "a", priority=3)])
    h.result(h.store.commit(b))
    assert h.result(h.store.count_entries("q")) == 50 + 150 + 1
    assert h.result(h.store.count_entries("r")) == 1
    got = {e[0]: e[7] for e in h.result(h.store.read_entries("q", None, 1000))}
    assert sorted(got) == list(range(0, 50)) + list(range(100, 250)) + [300]
    assert got[10] == b"old10" and got[120] == KIB + b"120" and got[170] == b"new170"
    assert got[300] == b"second"
    b = WriteBatch()
    b.delete_entries("q", [(0, i) for i in range(0, 250, 2)])
    h.result(h.store.commit(b))
    assert h.result(h.store.count_entries("q")) == 101
    assert ready_live(h) == 102
    h.result(h.store.close())


def test_priorities_and_paging_follow_the_order_index(tmp_path: Any) -> None:
    """Ready order is priority first, then msg_id; ``after`` pages through it."""
    h = open_store(str(tmp_path / "d"))
    put(h, ["q"], [1, 2, 3])
    put(h, ["q"], [4, 5], prio=9)
    put(h, ["q"], [6], prio=4)
    first = h.result(h.store.read_entries("q", None, 3))
    assert [(e[1], e[0]) for e in first] == [(9, 4), (9, 5), (4, 6)]
    rest = h.result(h.store.read_entries("q", (4, 6), 10))
    assert [e[0] for e in rest] == [1, 2, 3]
    h.result(h.store.close())


def test_format_1_store_is_refused(tmp_path: Any) -> None:
    """A store written in format 1 fails to open with a StoreError naming both formats."""
    path = str(tmp_path / "d")
    h = open_store(path)
    put(h, ["q"], [1])
    h.result(h.store.close())
    env = lmdb.open(os.path.join(path, "index"), max_dbs=codec.MAX_DBS)
    with env.begin(write=True) as txn:
        txn.put(b"format", codec.U32.pack(1), db=env.open_db(b"sys", txn=txn))
    env.close()
    with pytest.raises(StoreError, match="format 1.*format 4"):
        open_store(path)
    # the refused open released its lock: a later open (after an upgrade) is not blocked by it
    with pytest.raises(StoreError, match="format 1"):
        open_store(path)


def test_batched_deletes_drop_every_row_and_reference(tmp_path: Any) -> None:
    """One delete batch over mixed priorities, expiring and segment entries, repeated and
    missing keys: exactly the named entries go, with their order, expiry and segment rows."""
    h = open_store(str(tmp_path / "d"), segment_threshold=256)
    b = WriteBatch()
    b.put_entries("q", [make_entry(i, b"p%d" % i, "a", priority=i % 3) for i in range(1, 31)])
    b.put_entries("q", [make_entry(i, b"e%d" % i, "a", expires_at=1e12) for i in range(31, 41)])
    b.put_entries("q", [make_entry(i, KIB, "a", priority=5) for i in range(41, 51)])
    h.result(h.store.commit(b))
    assert h.result(h.store.count_entries("q")) == 50
    gone = [(i % 3, i) for i in range(1, 31, 2)] + [(0, i) for i in range(31, 41, 2)]
    gone += [(5, i) for i in range(41, 51, 2)]
    b = WriteBatch()
    b.delete_entries("q", gone + gone[:3] + [(0, 999), (7, 2)])   # repeats, missing, wrong prio
    h.result(h.store.commit(b))
    left = sorted(e[0] for e in h.result(h.store.read_entries("q", None, 100)))
    assert left == list(range(2, 51, 2))
    assert h.result(h.store.count_entries("q")) == 25
    assert ready_live(h) == 25
    with h.store._env.begin() as txn:
        assert txn.stat(h.store._dbs[b"expiry"])["entries"] == 5
        assert txn.stat(h.store._dbs[b"messages"])["entries"] == 5
    h.result(h.store.close())
