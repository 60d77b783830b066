"""Store format 4's packed groups: one ``ready`` and one ``packs`` row per uniform publish run;
FINs clear bits (a FIN'd id never comes back after a restart); attempts updates, re-puts and
older ids unpack a group; purges, paging, snapshots and MemoryStore parity (Hypothesis)."""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqhub.store import codec, packed_groups, ready_groups
from mqhub.store.batch import WriteBatch
from mqhub.store.records import make_entry
from tests.unit.store.conftest import Harness, open_lmdb, open_memory
from tests.unit.store.test_layout import entry_rows, ready_live


def open_store(path: str) -> Harness:
    """An LmdbStore (``none`` durability; segment threshold 64 B) on ``path``."""
    return open_lmdb(path, durability="none")


def put(h: Harness, queue: str, ids: list[int], prio: int = 0, attempts: int = 0) -> None:
    """Commit one uniform publish run of ``ids`` (bodies ``b"m<id>"``)."""
    b = WriteBatch()
    b.put_entries(queue, [make_entry(i, b"m%d" % i, "addr", priority=prio, attempts=attempts)
                          for i in ids])
    h.result(h.store.commit(b))


def commit(h: Harness, fill: Any) -> None:
    """Commit one batch filled by ``fill(batch)``."""
    b = WriteBatch()
    fill(b)
    h.result(h.store.commit(b))


def read(h: Harness, queue: str, after: tuple[int, int] | None = None,
         limit: int = 10_000) -> list[tuple]:
    """Entries of ``queue`` in ready order."""
    got: list[tuple] = h.result(h.store.read_entries(queue, after, limit))
    return got


def groups(h: Harness) -> list[tuple[bool, tuple[int, ...]]]:
    """Every ``ready`` group as ``(packed?, ids)``."""
    with h.store._env.begin() as txn:
        return [(ready_groups.is_packed(bytes(v)), ready_groups.group_ids(bytes(v)))
                for _, v in txn.cursor(db=h.store._dbs[b"ready"])]


def test_a_publish_run_is_one_group_and_fins_survive_a_restart(tmp_path: Any) -> None:
    """600 messages in one run: three packed groups (GROUP_MAX ids each at most), no
    ``entries`` row. FINs of a scattered subset clear bits; after a restart exactly the rest
    is read, in order, with bodies and attempts intact; a fully FIN'd group and its
    ``packs`` row are gone."""
    path = str(tmp_path / "d")
    h = open_store(path)
    put(h, "q", list(range(1000, 1600)), attempts=2)
    assert [(p, len(ids)) for p, ids in groups(h)] == [(True, 240), (True, 240), (True, 120)]
    assert entry_rows(h) == 0
    assert [e[7] for e in read(h, "q")] == [b"m%d" % i for i in range(1000, 1600)]
    gone = set(range(1000, 1240)) | set(range(1300, 1600, 3)) | {1599}
    commit(h, lambda b: b.delete_entries("q", [(0, i) for i in sorted(gone, reverse=True)]))
    commit(h, lambda b: b.delete_entries("q", [(0, 1300), (0, 77), (3, 1301)]))  # repeat, missing
    left = [i for i in range(1000, 1600) if i not in gone]
    assert h.result(h.store.count_entries("q")) == len(left)
    assert ready_live(h) == len(left)
    with h.store._env.begin() as txn:
        assert txn.stat(h.store._dbs[b"packs"])["entries"] == 2
    h.store.close()
    h = open_store(path)
    got = read(h, "q")
    assert [e[0] for e in got] == left
    assert got[0] == (left[0], 0, 2, 0.0, 0.0, "addr", None, b"m%d" % left[0], "")
    assert [e[7] for e in got] == [b"m%d" % i for i in left]
    assert h.result(h.store.count_entries("q")) == len(left)
    commit(h, lambda b: b.delete_entries("q", [(0, i) for i in left]))
    assert h.result(h.store.queue_names()) == []
    with h.store._env.begin() as txn:
        assert txn.stat(h.store._dbs[b"packs"])["entries"] == 0
        assert txn.stat(h.store._dbs[b"ready"])["entries"] == 0
    h.store.close()


def test_paging_inside_a_packed_group_skips_gaps(tmp_path: Any) -> None:
    """``read_entries`` pages through packed groups with holes and across priorities."""
    h = open_store(str(tmp_path / "d"))
    put(h, "q", list(range(1, 21)))
    put(h, "q", [30, 31], prio=5)
    commit(h, lambda b: b.delete_entries("q", [(0, i) for i in (3, 4, 5, 9)]))
    order = [e[0] for e in read(h, "q")]
    assert order == [30, 31, 1, 2, 6, 7, 8, *range(10, 21)]
    assert [e[0] for e in read(h, "q", (5, 31), 3)] == [1, 2, 6]
    assert [e[0] for e in read(h, "q", (0, 4), 4)] == [6, 7, 8, 10]
    assert [e[7] for e in read(h, "q", (0, 19))] == [b"m20"]
    h.store.close()


def test_attempts_update_unpacks_the_group_and_is_kept(tmp_path: Any) -> None:
    """Setting attempts on a packed id turns its group into a plain one (every live id gets
    its ``entries`` row); the attempts survive a restart and FINs still work."""
    path = str(tmp_path / "d")
    h = open_store(path)
    put(h, "q", list(range(1, 11)))
    commit(h, lambda b: b.delete_entries("q", [(0, 2)]))
    commit(h, lambda b: b.set_attempts("q", [(0, 5, 3), (0, 2, 9), (0, 99, 1)]))
    assert groups(h) == [(False, tuple(range(1, 11)))]
    assert entry_rows(h) == 9 and ready_live(h) == 9
    h.store.close()
    h = open_store(path)
    got = {e[0]: e[2] for e in read(h, "q")}
    assert got == {i: (3 if i == 5 else 0) for i in range(1, 11) if i != 2}
    commit(h, lambda b: b.delete_entries("q", [(0, 5), (0, 6)]))
    assert h.result(h.store.count_entries("q")) == 7 and ready_live(h) == 7
    h.store.close()


def test_re_puts_and_older_ids_unpack_without_double_counting(tmp_path: Any) -> None:
    """A re-put of a packed id replaces its body (count unchanged); an older id put inside a
    packed group's range (a dead-letter move does that) lands in order; an id after the last
    packed group starts a new group instead of extending it."""
    h = open_store(str(tmp_path / "d"))
    put(h, "q", [10, 12, 14, 16])
    put(h, "q", [20, 21])
    commit(h, lambda b: b.put_entries("q", [make_entry(12, b"new12", "addr")]))
    assert h.result(h.store.count_entries("q")) == 6
    commit(h, lambda b: b.put_entries("q", [make_entry(13, b"m13", "addr", headers={"h": "1"}),
                                             make_entry(11, b"m11", "addr")]))
    commit(h, lambda b: b.put_entries("q", [make_entry(22, b"m22", "addr", expires_at=1e12)]))
    got = read(h, "q")
    assert [e[0] for e in got] == [10, 11, 12, 13, 14, 16, 20, 21, 22]
    assert {e[0]: e[7] for e in got}[12] == b"new12"
    assert got[3][6] == {"h": "1"}
    assert h.result(h.store.count_entries("q")) == 9 and ready_live(h) == 9
    assert [p for p, _ in groups(h)] == [False, True, False]
    h.store.close()


def test_a_nearly_finished_group_is_unpacked(tmp_path: Any) -> None:
    """A FIN that leaves 1/32 or less of a packed group live (here 7 of 240) unpacks it: the
    ``packs`` row is freed, the 7 get ``entries`` rows and stay readable across a restart; one
    that leaves 8 keeps the group packed."""
    path = str(tmp_path / "d")
    h = open_store(path)
    put(h, "q", list(range(1, 241)))
    put(h, "q", list(range(301, 541)))
    keep = [5, 50, 100, 150, 200, 239, 240]
    commit(h, lambda b: b.delete_entries("q", [(0, i) for i in range(1, 241) if i not in keep]))
    keep2 = sorted(keep + [220])
    commit(h, lambda b: b.delete_entries("q", [(0, i) for i in range(301, 541)
                                              if i - 300 not in keep2]))
    assert [p for p, _ in groups(h)] == [False, True]
    assert entry_rows(h) == 7 and ready_live(h) == 15
    with h.store._env.begin() as txn:
        assert txn.stat(h.store._dbs[b"packs"])["entries"] == 1
    h.store.close()
    h = open_store(path)
    assert [e[0] for e in read(h, "q")] == keep + [300 + i for i in keep2]
    commit(h, lambda b: b.delete_entries("q", [(0, i) for i in keep]))
    assert h.result(h.store.count_entries("q")) == 8 and entry_rows(h) == 0
    h.store.close()


def test_purge_removes_packed_and_plain_groups(tmp_path: Any) -> None:
    """A purge drops packed groups with their ``packs`` rows and plain ones with their rows."""
    h = open_store(str(tmp_path / "d"))
    put(h, "q", list(range(1, 50)))
    put(h, "q", [60], prio=3)
    commit(h, lambda b: b.put_entries("q", [make_entry(70, b"e", "addr", expires_at=1e12)]))
    put(h, "other", [1, 2, 3])
    commit(h, lambda b: b.purge_queue("q"))
    assert h.result(h.store.queue_names()) == ["other"]
    with h.store._env.begin() as txn:
        assert txn.stat(h.store._dbs[b"packs"])["entries"] == 1
        assert txn.stat(h.store._dbs[b"expiry"])["entries"] == 0
    assert entry_rows(h) == 0 and ready_live(h) == 3
    h.store.close()


def test_snapshot_reader_lists_packed_entries(tmp_path: Any) -> None:
    """A snapshot of a store with packed and plain groups verifies, and its reader yields
    every entry (and the address counts) as the store reads them."""
    from mqhub.store.snapshot import take_snapshot
    from mqhub.store.snapshot_reader import SnapshotReader
    path = str(tmp_path / "d")
    h = open_store(path)
    put(h, "q", list(range(1, 30)))
    commit(h, lambda b: b.put_entries("q", [make_entry(40, b"x" * 100, "other")]))
    commit(h, lambda b: b.delete_entries("q", [(0, 7), (0, 8)]))
    want = [("q", e) for e in read(h, "q")]
    h.store.close()
    manifest = take_snapshot(path, str(tmp_path / "snap"))
    assert manifest["store_format"] == codec.FORMAT_VERSION
    assert manifest["addresses"] == {"addr": 27, "other": 1}
    with SnapshotReader(str(tmp_path / "snap")) as snap:
        assert snap.verify() == []
        assert list(snap.iter_entries()) == want
        assert list(snap.iter_entries("q")) == want


QUEUES = ["a", "b"]


@st.composite
def runs(draw: Any) -> tuple:
    """A put of a uniform run (one queue, priority and attempts; ids ascending or not)."""
    queue = draw(st.sampled_from(["a", "a", "b"]))
    prio = draw(st.sampled_from([0, 0, 4]))
    ids = draw(st.lists(st.integers(1, 24), min_size=1, max_size=8))
    if draw(st.booleans()):
        ids = sorted(set(ids))
    attempts = draw(st.integers(0, 1))
    return ("put", queue, [make_entry(i, b"b%d" % i, "x", priority=prio, attempts=attempts)
                           for i in ids])


@st.composite
def fins(draw: Any) -> tuple:
    """A FIN of a range of ids (every other one, or all) at one priority."""
    start = draw(st.integers(1, 12))
    step = draw(st.sampled_from([1, 2]))
    prio = draw(st.sampled_from([0, 0, 4]))
    keys = [(prio, i) for i in range(start, start + 8, step)]
    return ("fin", draw(st.sampled_from(["a", "a", "b"])), keys, draw(st.integers(0, 1)))


ops = st.one_of(
    runs(), runs(), fins(),
    st.tuples(st.just("delete"), st.sampled_from(QUEUES),
              st.lists(st.tuples(st.sampled_from([0, 4]), st.integers(1, 24)), max_size=10)),
    st.tuples(st.just("attempts"), st.sampled_from(QUEUES),
              st.lists(st.tuples(st.sampled_from([0, 4]), st.integers(1, 24), st.integers(0, 5)),
                       max_size=2)),
    st.tuples(st.just("purge"), st.sampled_from(QUEUES)),
)


def to_batch(op: tuple, base: int) -> WriteBatch:
    """Turn one drawn operation of turn ``base // 30`` into a WriteBatch: runs of new ids
    (ascending) are moved up by ``base`` (above the earlier turns' runs: packed), FINs onto
    this turn's or the previous turn's ids."""
    b = WriteBatch()
    if op[0] == "put":
        items = op[2]
        if all(x[0] < y[0] for x, y in zip(items, items[1:], strict=False)):
            items = [(e[0] + base, *e[1:7], b"b%d" % (e[0] + base), e[8]) for e in items]
        b.put_entries(op[1], items)
    elif op[0] == "fin":
        shift = max(0, base - 30 * op[3])
        b.delete_entries(op[1], [(p, i + shift) for p, i in op[2]])
    elif op[0] == "delete":
        b.delete_entries(op[1], op[2])
    elif op[0] == "attempts":
        b.set_attempts(op[1], op[2])
    else:
        b.purge_queue(op[1])
    return b


def state(h: Harness) -> tuple:
    """Everything observable through the interface, plus paging from a middle key."""
    s = h.store
    entries = {q: h.result(s.read_entries(q, None, 1000)) for q in QUEUES}
    paged = {q: h.result(s.read_entries(q, (got[len(got) // 2][1], got[len(got) // 2][0]), 3))
             for q, got in entries.items() if got}
    return (h.result(s.queue_names()), entries, paged,
            {q: h.result(s.count_entries(q)) for q in QUEUES})


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(ops, min_size=1, max_size=4), min_size=1, max_size=8))
def test_packed_lmdb_matches_memory(turns: list[list[tuple]]) -> None:
    """Uniform runs (mostly packed), FINs, attempts, purges in groups of batches: LmdbStore
    equals MemoryStore after every turn and after a reopen; the groups stay consistent."""
    tmp = tempfile.mkdtemp(prefix="mqhub-packed-")
    try:
        mem = open_memory()
        lm = open_store(tmp)
        for n, turn in enumerate(turns):
            for h in (mem, lm):
                ds = [h.store.commit(to_batch(op, 30 * n)) for op in turn]
                for d in ds:
                    h.result(d)
            assert state(lm) == state(mem)
            assert ready_live(lm) == sum(state(mem)[3].values())
        lm.store.close()
        lm2 = open_store(tmp)
        assert state(lm2) == state(mem)
        lm2.store.close()
    finally:
        shutil.rmtree(tmp)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=80), st.lists(st.binary(max_size=40), min_size=1, max_size=30),
       st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=240, unique=True),
       st.integers(0, 2**240 - 1))
def test_pack_and_group_rows_round_trip(prefix: bytes, bodies: list[bytes], ids: list[int],
                                        bits: int) -> None:
    """``packs`` values give back their prefix and bodies; packed group rows their ids, live
    bitmap and count (the count is the number of set bits, whatever the bitmap)."""
    pack = codec.encode_pack(prefix, bodies)
    got_prefix, offsets = codec.decode_pack(pack)
    assert got_prefix == prefix
    assert [pack[a:b] for a, b in zip(offsets, offsets[1:], strict=False)] == bodies
    ids = sorted(ids)
    row = ready_groups.packed_row(bits, ready_groups.pack_ids(ids))
    assert ready_groups.is_packed(row) and not ready_groups.is_packed(
        ready_groups.group_row(ids))
    assert list(ready_groups.group_ids(row)) == ids
    assert ready_groups.packed_bits(row) == bits
    assert ready_groups.live_count(row) == bin(bits).count("1")
    assert ready_groups.last_id(row) == ids[-1]


def check_spans(sizes: list[int]) -> None:
    """``group_spans(sizes)`` covers the run in order; each group holds one body at least, at
    most GROUP_MAX, fits PACK_BYTES (bodies plus their 4-byte length column) unless it is a
    single body, and could not take the next body without breaking one of those bounds."""
    spans = packed_groups.group_spans(sizes)
    assert [s for s, _ in spans] == [0, *(e for _, e in spans)][:len(spans)]
    assert (spans[-1][1] if spans else 0) == len(sizes)
    for start, end in spans:
        size = sum(sizes[start:end]) + 4 * (end - start)
        assert 1 <= end - start <= codec.GROUP_MAX
        assert size <= codec.PACK_BYTES or end - start == 1
        if end < len(sizes):
            assert (end - start == codec.GROUP_MAX
                    or size + sizes[end] + 4 > codec.PACK_BYTES)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 64), st.integers(0, codec.PACK_BYTES + 8)),
                max_size=1_000))
def test_group_spans_cut_runs_into_the_longest_fitting_groups(sizes: list[int]) -> None:
    """Runs of mixed body sizes are cut as :func:`check_spans` states."""
    check_spans(sizes)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.integers(0, 300), st.integers(0, codec.PACK_BYTES + 8)),
       st.integers(0, 1_500))
def test_group_spans_of_one_body_size(size: int, n: int) -> None:
    """Runs of one body size (their own arithmetic path) are cut the same way."""
    check_spans([size] * n)
