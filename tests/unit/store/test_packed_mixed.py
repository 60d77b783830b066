"""Store format 4 against MemoryStore with mixed batches: several queues and priorities in one
batch, put and FIN of the same ids in one batch or one group commit, headers, expiries and
segment bodies next to packed runs, repeated and missing ids, malformed batches in a group
(retried batch by batch), a tiny map (grown and retried), reopens between turns, snapshots."""

from __future__ import annotations

import queue as queue_mod
import shutil
import tempfile
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock

from mqhub.store import ready_groups
from mqhub.store.batch import WriteBatch
from mqhub.store.lmdb import LmdbStore
from mqhub.store.memory import MemoryStore
from mqhub.store.records import make_entry
from mqhub.store.snapshot import take_snapshot
from mqhub.store.snapshot_reader import SnapshotReader
from tests.unit.store.conftest import Harness, open_lmdb, open_memory, run_handed_back
from tests.unit.store.test_layout import ready_live

QUEUES = ["a", "b", "c"]
#: ids a turn draws from (moved up by 20 per turn, so later runs land above earlier ones)
SPAN = 20
#: bodies above this go to segment files (big runs' bodies stay under it, so a run of 240 of
#: them is cut by PACK_BYTES instead)
THRESHOLD = 300
#: a tiny map, so group commits hit MapFull, grow it and are applied again
MAP = 32 << 10


def open_store(path: str) -> Harness:
    """An LmdbStore on ``path`` with a tiny map and THRESHOLD."""
    return open_lmdb(path, durability="none", map_size=MAP, segment_threshold=THRESHOLD)


def entry(msg_id: int, kind: int, prio: int, attempts: int) -> tuple:
    """An entry of ``kind``: 0 a packable one, 1 with headers, 2 with an expiry, 3 with a body
    over the segment threshold (THRESHOLD)."""
    body = b"b%d" % msg_id
    if kind == 1:
        return make_entry(msg_id, body, "x", priority=prio, attempts=attempts, headers={"h": "1"})
    if kind == 2:
        return make_entry(msg_id, body, "x", priority=prio, attempts=attempts,
                          expires_at=1000.0 + msg_id)
    if kind == 3:
        body = body + b"-" * THRESHOLD
    return make_entry(msg_id, body, "x", priority=prio, attempts=attempts)


ids = st.integers(-SPAN, SPAN)  # negative: ids of the previous turn(s)
prios = st.sampled_from([0, 0, 3])

put_op = st.tuples(st.just("put"), st.sampled_from(QUEUES),
                   st.lists(st.tuples(ids, st.sampled_from([0, 0, 0, 1, 2, 3]), prios),
                            min_size=1, max_size=8),
                   st.integers(0, 1), st.booleans())
run_op = st.tuples(st.just("run"), st.lists(st.sampled_from(QUEUES), min_size=1, max_size=2,
                                            unique=True),
                   st.integers(0, SPAN - 1), st.integers(1, 12), prios, st.integers(0, 1))
del_op = st.tuples(st.just("del"), st.sampled_from(QUEUES),
                   st.lists(st.tuples(prios, ids), max_size=12))
fin_op = st.tuples(st.just("fin"), st.sampled_from(QUEUES), ids, st.integers(1, 16),
                   st.sampled_from([1, 2, 3]), prios)
att_op = st.tuples(st.just("att"), st.sampled_from(QUEUES),
                   st.lists(st.tuples(prios, ids, st.integers(0, 9)), max_size=3))
purge_op = st.tuples(st.just("purge"), st.sampled_from(QUEUES))
big_op = st.tuples(st.just("big"), st.sampled_from(QUEUES), st.sampled_from([40, 250, 300]),
                   prios)
bigfin_op = st.tuples(st.just("bigfin"), st.sampled_from(QUEUES), st.integers(-3 * SPAN, 0),
                      st.sampled_from([0, 33, 40, 50]), prios)
bad_op = st.tuples(st.just("bad"), st.sampled_from(QUEUES), ids)
op = st.one_of(run_op, run_op, put_op, fin_op, fin_op, del_op, att_op, purge_op, bad_op,
               big_op, bigfin_op)
#: a batch: one to three operations (a put then a FIN of the same ids is one batch then)
batch_ops = st.lists(op, min_size=1, max_size=3)


def fill(b: WriteBatch, o: tuple, base: int) -> None:
    """Add operation ``o`` of the turn whose ids start at ``base`` to batch ``b``."""
    kind = o[0]
    if kind == "put":
        _, queue, items, attempts, reverse = o
        got = [entry(base + i, k, p, attempts) for i, k, p in items]
        b.put_entries(queue, got[::-1] if reverse else got)
    elif kind == "run":
        _, queues, start, n, prio, attempts = o
        for queue in queues:  # fanout: the same ids on each queue
            b.put_entries(queue, [entry(base + start + i, 0, prio, attempts) for i in range(n)])
    elif kind == "big":  # bodies of 150 B: PACK_BYTES cuts a run before GROUP_MAX
        _, queue, n, prio = o
        b.put_entries(queue, [make_entry(base + i, b"%d" % i + b"." * 150, "x", priority=prio)
                              for i in range(n)])
    elif kind == "bigfin":  # FIN 300 ids but every ``keep``-th (none when 0)
        _, queue, start, keep, prio = o
        b.delete_entries(queue, [(prio, base + start + i) for i in range(300)
                                 if not keep or i % keep])
    elif kind == "del":
        b.delete_entries(o[1], [(p, base + i) for p, i in o[2]])
    elif kind == "fin":
        _, queue, start, n, step, prio = o
        b.delete_entries(queue, [(prio, base + start + i) for i in range(0, n, step)])
    elif kind == "att":
        b.set_attempts(o[1], [(p, base + i, a) for p, i, a in o[2]])
    elif kind == "purge":
        b.purge_queue(o[1])
    else:  # a malformed batch: its priority is out of range
        b.put_entries(o[1], [entry(base + o[2], 0, 0, 0), make_entry(base + o[2] + 1, b"x", "x",
                                                                      priority=12)])


def observe(h: Harness, base: int) -> tuple:
    """Everything a reader sees: entries in ready order, pages of 3 from every third key and
    from keys that may be gone (a consumer pages on from an id it has FIN'd since), counts,
    queue names, the expiry index."""
    s = h.store
    entries = {q: h.result(s.read_entries(q, None, 100_000)) for q in QUEUES}
    paged = {q: [h.result(s.read_entries(q, (e[1], e[0]), 3)) for e in got[::3]]
             for q, got in entries.items()}
    gone = {q: [h.result(s.read_entries(q, (p, i), 2)) for p in (0, 3)
                for i in range(base - 3 * SPAN, base + 300, 17)] for q in QUEUES}
    return (h.result(s.queue_names()), entries, paged, gone,
            {q: h.result(s.count_entries(q)) for q in QUEUES},
            h.result(s.read_expired(1e9, 1000)))


def run_turn(h: Harness, turn: list[list[tuple]], base: int) -> list[bool]:
    """Commit each batch of ``turn`` (one group commit); return which ones succeeded."""
    ds = []
    for ops_ in turn:
        b = WriteBatch()
        for o in ops_:
            fill(b, o, base)
        ds.append(h.store.commit(b))
    h.clock.advance(0)
    ok: list[bool] = []
    for d in ds:
        got: list[Any] = []
        d.addBoth(got.append)
        ok.append(got[0] is None)
    return ok


def packs_pair_up(h: Harness) -> bool:
    """Whether every ``packs`` row has its packed ``ready`` group (``ready_live`` checks the
    other way round)."""
    with h.store._env.begin() as txn:
        ready = h.store._dbs[b"ready"]
        for k, _ in txn.cursor(db=h.store._dbs[b"packs"]):
            group = txn.get(k, db=ready)
            if group is None or not ready_groups.is_packed(group):
                return False
    return True


def _sort_expired(state: tuple) -> tuple:
    """Expired rows in a fixed order (ties may come in any order)."""
    return (*state[:5], sorted(state[5]))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.lists(batch_ops, min_size=1, max_size=4), st.booleans(),
                          st.booleans()), min_size=1, max_size=7))
def test_mixed_batches_lmdb_matches_memory(turns: list[tuple[list[list[tuple]], bool, bool]]
                                           ) -> None:
    """After every turn (one group commit) LmdbStore equals MemoryStore, its groups are
    consistent and their live counts sum to the queue counts; after a reopen too. A turn may
    be committed twice (as a group the writer thread re-applies after a MapFull that hit it
    while it was committing it batch by batch): every operation must be idempotent."""
    tmp = tempfile.mkdtemp(prefix="mqhub-mixed-")
    try:
        mem = open_memory()
        lm = open_store(tmp)
        for n, (turn, reopen, replay) in enumerate(turns):
            base = SPAN * (n + 4)  # every id stays positive
            for _ in range(1 + replay):
                assert run_turn(lm, turn, base) == run_turn(mem, turn, base)
            want = _sort_expired(observe(mem, base))
            assert _sort_expired(observe(lm, base)) == want
            assert ready_live(lm) == sum(want[4].values())
            assert packs_pair_up(lm)
            if reopen:
                lm.result(lm.store.close())
                lm = open_store(tmp)
                assert _sort_expired(observe(lm, base)) == want
        lm.result(lm.store.close())
        manifest = take_snapshot(tmp, tmp + "-snap")
        entries = want[1]
        assert manifest["queues"] == {q: c for q, c in want[4].items() if c}
        with SnapshotReader(tmp + "-snap") as snap:
            assert snap.verify() == []
            per_queue: dict[str, list[tuple]] = {}
            for q, e in snap.iter_entries():
                per_queue.setdefault(q, []).append(e)
            assert per_queue == {q: got for q, got in entries.items() if got}
            assert [e for _, e in snap.iter_entries("a")] == entries["a"]
    finally:
        shutil.rmtree(tmp)
        shutil.rmtree(tmp + "-snap", ignore_errors=True)


def test_a_long_address_is_stored_unpacked(tmp_path: Any) -> None:
    """An address whose packed prefix would not fit the ``packs`` row's u16 prefix length (but
    whose ``entries`` value fits) is stored the plain way, not refused."""
    h = open_store(str(tmp_path / "d"))
    addr = "a" * 65520
    for ids in ([1], [2, 3]):
        b = WriteBatch()
        b.put_entries("q", [make_entry(i, b"m%d" % i, addr) for i in ids])
        h.result(h.store.commit(b))
    got = h.result(h.store.read_entries("q", None, 10))
    assert [(e[0], e[5] == addr, e[7]) for e in got] == [(i, True, b"m%d" % i) for i in (1, 2, 3)]
    assert ready_live(h) == 3
    h.result(h.store.close())


def test_writer_thread_reapplies_a_group_after_a_map_full(tmp_path: Any) -> None:
    """The writer thread commits a group holding a malformed batch batch by batch; the last
    batch overflows the map, so the reactor grows it and the whole group is applied again
    (its first batches a second time): the packed run, its FINs and the fanout copy end up
    exactly as MemoryStore has them, before and after a reopen; the bad batch alone fails."""
    done: queue_mod.Queue[tuple[Any, tuple]] = queue_mod.Queue()
    clock = Clock()
    store = LmdbStore(str(tmp_path / "d"), clock=clock, durability="none", writer="thread",
                      map_size=MAP, segment_threshold=THRESHOLD,
                      call_from_thread=lambda f, *a: done.put((f, a)))
    store.open()
    try:
        h = Harness(store, clock)
        mem = Harness(MemoryStore(clock), clock)
        mem.store.open()
        turn = [[("run", ["a", "b"], 0, 60, 0, 0)], [("fin", "a", 10, 30, 1, 0)],
                [("bad", "c", 5)], [("big", "c", 300, 0), ("del", "b", [(0, 3), (0, 3)])],
                [("fin", "b", 40, 16, 2, 0), ("att", "a", [(0, 50, 4)])]]
        want = run_turn(mem, turn, 100)
        ds = []
        for ops_ in turn:
            b = WriteBatch()
            for o in ops_:
                fill(b, o, 100)
            ds.append(store.commit(b))
        applied: list[WriteBatch] = []
        rows = store._committer._rows
        plain_apply = rows.apply
        rows.apply = lambda t, b: (applied.append(b), plain_apply(t, b))[1]  # type: ignore
        clock.advance(0)  # the group goes to the writer thread
        results: list[list[Any]] = [[] for _ in ds]
        for d, got in zip(ds, results, strict=True):
            d.addBoth(got.append)
        run_handed_back(done, lambda: all(results), 30)
        assert store.map_grows > 0
        # the group (5 batches) failed on its bad batch, was committed batch by batch until
        # the big one hit MapFull, and was then applied again: the first batch more than twice
        assert sum(b is applied[0] for b in applied) >= 3
        assert [r[0] is None for r in results] == want == [True, True, False, True, True]
        expected = _sort_expired(observe(mem, 100))
        assert _sort_expired(observe(h, 100)) == expected
        assert ready_live(h) == sum(expected[4].values())
    finally:
        d = store.close()
        while not d.called:
            f, args = done.get(timeout=10)
            f(*args)
    h = open_store(str(tmp_path / "d"))
    assert _sort_expired(observe(h, 100)) == expected
    h.result(h.store.close())
