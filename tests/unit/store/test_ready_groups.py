"""Format 3's ready groups: random puts (new and old ids, re-puts), deletes and purges keep the
groups exact, and ``read_entries`` pages through them in ready order like MemoryStore."""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqhub.store import ready_groups
from mqhub.store.batch import WriteBatch
from mqhub.store.records import make_entry
from tests.unit.store.conftest import Harness, open_lmdb, open_memory
from tests.unit.store.test_layout import ready_live

QUEUES = ["a", "b"]
ids = st.integers(min_value=1, max_value=60)
prios = st.integers(min_value=0, max_value=2)

ops = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(QUEUES),
              st.lists(st.tuples(ids, prios, st.booleans()), max_size=12)),
    st.tuples(st.just("delete"), st.sampled_from(QUEUES),
              st.lists(st.tuples(prios, ids), max_size=12)),
    st.tuples(st.just("purge"), st.sampled_from(QUEUES)),
)


def to_batch(op: tuple) -> WriteBatch:
    """One drawn operation as a WriteBatch (expiring entries take the per-entry path)."""
    b = WriteBatch()
    if op[0] == "put":
        b.put_entries(op[1], [make_entry(i, b"b%d" % i, "x", priority=p,
                                         expires_at=500.0 + i if exp else 0.0)
                              for i, p, exp in op[2]])
    elif op[0] == "delete":
        b.delete_entries(op[1], op[2])
    else:
        b.purge_queue(op[1])
    return b


def paged(h: Harness, queue: str, step: int) -> list[tuple[int, int]]:
    """Read ``queue`` ``step`` entries at a time through ``after``; return (priority, id)."""
    out: list[tuple[int, int]] = []
    after = None
    while True:
        got = h.result(h.store.read_entries(queue, after, step))
        assert len(got) <= step
        out += [(e[1], e[0]) for e in got]
        if len(got) < step:
            return out
        after = (got[-1][1], got[-1][0])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(turns=st.lists(st.lists(ops, min_size=1, max_size=3), min_size=1, max_size=8),
       step=st.integers(1, 7))
def test_groups_match_memory_through_restarts(turns: list[list[tuple]], step: int) -> None:
    """Groups of at most 3 ids (so runs split, fill and empty often): after every turn the
    groups are exact and full and paged reads equal MemoryStore's; likewise after a reopen."""
    saved = ready_groups.GROUP_MAX
    ready_groups.GROUP_MAX = 3
    tmp = tempfile.mkdtemp(prefix="mqhub-ready-")
    try:
        mem = open_memory()
        lm = open_lmdb(tmp, durability="none")
        for n, turn in enumerate(turns):
            for h in (mem, lm):
                for d in [h.store.commit(to_batch(op)) for op in turn]:
                    h.result(d)
            total = sum(h.result(mem.store.count_entries(q)) for q in QUEUES)
            assert ready_live(lm) == total
            for q in QUEUES:
                want = [(e[1], e[0]) for e in h.result(mem.store.read_entries(q, None, 1000))]
                assert paged(lm, q, step) == want
            if n % 3 == 2:
                lm.result(lm.store.close())
                lm = open_lmdb(tmp, durability="none")
        for q in QUEUES:
            assert h.result(lm.store.count_entries(q)) == h.result(mem.store.count_entries(q))
        lm.result(lm.store.close())
    finally:
        ready_groups.GROUP_MAX = saved
        shutil.rmtree(tmp)


def test_one_group_row_per_run_and_fins_shrink_it(tmp_path: Any,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """1,000 new ids in one commit take ceil(1000 / GROUP_MAX) rows; deleting all but one id
    of a group keeps it (live 1, read skips the gone ids); deleting that one removes it."""
    monkeypatch.setattr(ready_groups, "GROUP_MAX", 240)
    h = open_lmdb(str(tmp_path / "d"), durability="none")
    b = WriteBatch()
    b.put_entries("q", [make_entry(i, b"x", "a") for i in range(1, 1001)])
    h.result(h.store.commit(b))
    with h.store._env.begin() as txn:
        assert txn.stat(h.store._dbs[b"ready"])["entries"] == 5
    b = WriteBatch()
    b.delete_entries("q", [(0, i) for i in range(1, 240)])   # first group keeps id 240
    h.result(h.store.commit(b))
    assert ready_live(h) == 761
    assert [e[0] for e in h.result(h.store.read_entries("q", None, 3))] == [240, 241, 242]
    b = WriteBatch()
    b.delete_entries("q", [(0, 240)])
    h.result(h.store.commit(b))
    with h.store._env.begin() as txn:
        assert txn.stat(h.store._dbs[b"ready"])["entries"] == 4
    assert ready_live(h) == 760
    h.result(h.store.close())
