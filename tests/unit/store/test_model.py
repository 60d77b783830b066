"""Hypothesis: random batch sequences leave MemoryStore and LmdbStore in the same state."""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqhub.store.batch import WriteBatch
from tests.unit.store.conftest import Harness, open_lmdb, open_memory

QUEUES = ["a", "b", "c.d"]
ids = st.integers(min_value=1, max_value=40)
prios = st.integers(min_value=0, max_value=9)


@st.composite
def entries(draw: Any) -> tuple:
    """An entry whose body straddles the segment threshold and may expire.

    A msg_id names one message, so its body is a function of the id (the store's invariant).
    """
    msg_id = draw(ids)
    body = [b"", b"s", b"m" * 64, b"L" * 65, b"X" * 300][msg_id % 5]
    expires = draw(st.sampled_from([0.0, 100.0 + msg_id]))
    headers = draw(st.sampled_from([None, {"k": "v"}]))
    return (msg_id, draw(prios), draw(st.integers(0, 3)), 0.0, expires, "addr.x", headers,
            body, "t")


ops = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(QUEUES), st.lists(entries(), max_size=6),
              st.booleans()),
    st.tuples(st.just("delete"), st.sampled_from(QUEUES), st.lists(st.tuples(prios, ids), max_size=6)),
    # delete runs (WriteBatch.delete_ids): several of one priority in a batch, ids unsorted
    # and repeated (delete_entries above makes runs of several priorities)
    st.tuples(st.just("runs"), st.sampled_from(QUEUES), prios,
              st.lists(st.lists(ids, max_size=8), max_size=3)),
    st.tuples(st.just("attempts"), st.sampled_from(QUEUES),
              st.lists(st.tuples(prios, ids, st.integers(0, 9)), max_size=4)),
    st.tuples(st.just("purge"), st.sampled_from(QUEUES)),
    st.tuples(st.just("due"), st.sampled_from([b"k1", b"k2", b"k3"]), st.integers(1, 50)),
    st.tuples(st.just("undue"), st.sampled_from([b"k1", b"k2", b"k3"])),
)


def to_batch(op: tuple) -> WriteBatch:
    """Turn one drawn operation into a WriteBatch."""
    b = WriteBatch()
    kind = op[0]
    if kind == "put":
        b.put_entries(op[1], op[2], archive=op[3])
    elif kind == "delete":
        b.delete_entries(op[1], op[2])
    elif kind == "runs":
        for run in op[3]:
            b.delete_ids(op[1], op[2], run)
    elif kind == "attempts":
        b.set_attempts(op[1], op[2])
    elif kind == "purge":
        b.purge_queue(op[1])
    elif kind == "due":
        b.put_due(float(op[2]), op[1], b"p" + op[1])
    else:
        b.delete_due(op[1])
    return b


def state(h: Harness) -> tuple:
    """Everything observable through the interface."""
    s = h.store
    return (
        h.result(s.queue_names()),
        {q: h.result(s.read_entries(q, None, 1000)) for q in QUEUES},
        {q: h.result(s.count_entries(q)) for q in QUEUES},
        h.result(s.read_due(1e9, 100)),
        sorted(h.result(s.read_expired(1e9, 1000))),  # ties on expires_at: any order
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(ops, min_size=1, max_size=4), min_size=1, max_size=6))
def test_lmdb_matches_memory(turns: list[list[tuple]]) -> None:
    """Each turn commits its batches as one group in both stores; states stay equal."""
    tmp = tempfile.mkdtemp(prefix="mqhub-model-")
    try:
        mem = open_memory()
        lm = open_lmdb(tmp, durability="none")
        for turn in turns:
            for h in (mem, lm):
                ds = [h.store.commit(to_batch(op)) for op in turn]
                for d in ds:
                    h.result(d)
            assert state(lm) == state(mem)
        lm.store.close()
        lm2 = open_lmdb(tmp, durability="none")
        assert state(lm2) == state(mem)
        lm2.store.close()
    finally:
        shutil.rmtree(tmp)
