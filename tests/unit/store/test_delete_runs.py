"""Deletes held by columns (``WriteBatch.delete_ids``: one ``(priority, ids)`` run per call)
remove exactly their entries on MemoryStore and LmdbStore: packed groups, plain rows, segment
bodies and expiring entries; one run, several runs of one priority, several priorities."""

from __future__ import annotations

from mqhub.store.batch import WriteBatch
from mqhub.store.records import make_entry
from tests.unit.store.conftest import SMALL_THRESHOLD, Harness

BASE = 1 << 40


def stored(h: Harness, queue: str = "q") -> set[tuple[int, int]]:
    """The ``(priority, msg_id)`` keys ``queue`` holds."""
    return {(e[1], e[0]) for e in h.result(h.store.read_entries(queue, None, 10_000))}


def fill(h: Harness) -> set[tuple[int, int]]:
    """Put a packed run (priority 0), plain, segment-bodied and expiring entries (priority 4)
    and a few of priority 9 on ``q``; return their keys."""
    b = WriteBatch()
    b.put_entries("q", [make_entry(BASE + i, b"p%03d" % i) for i in range(300)])
    h.result(h.store.commit(b))
    b = WriteBatch()
    b.put_entries("q", [make_entry(BASE + 1000 + i, b"x" * (SMALL_THRESHOLD + 10 if i % 3 == 0
                                                              else 5),
                                   priority=4, expires_at=5000.0 if i % 4 < 2 else 0.0)
                        for i in range(40)])
    b.put_entries("q", [make_entry(BASE + 2000 + i, b"n", priority=9) for i in range(10)])
    h.result(h.store.commit(b))
    keys = stored(h)
    assert len(keys) == 350
    if hasattr(h.store, "_env"):   # LmdbStore: the priority-0 run went into packed groups
        with h.store._env.begin() as txn:
            assert txn.stat(h.store._dbs[b"packs"])["entries"] >= 1
    return keys


def test_one_run_deletes_exactly_its_ids(harness: Harness) -> None:
    """A FIN-shaped batch: one ascending run of one priority, part of a packed run."""
    h = harness
    keys = fill(h)
    gone = [BASE + i for i in range(0, 300, 3)]
    b = WriteBatch()
    b.delete_ids("q", 0, gone)
    assert b.deletes == {"q": [(0, gone)]} and len(b) == 100
    h.result(h.store.commit(b))
    assert stored(h) == keys - {(0, i) for i in gone}
    assert h.result(h.store.count_entries("q")) == 250


def test_runs_of_several_priorities_and_repeats(harness: Harness) -> None:
    """Several runs in one batch: two of one priority (overlapping, out of order), plain and
    segment rows, expiring entries, missing ids, and a run naming ids of another priority
    (which stays)."""
    h = harness
    keys = fill(h)
    b = WriteBatch()
    b.delete_ids("q", 0, [BASE + i for i in range(10, 60)])
    b.delete_ids("q", 0, [BASE + i for i in (299, 55, 40, 7, 7, 100_000)])
    b.delete_ids("q", 4, [BASE + 1000 + i for i in range(0, 40, 2)] + [BASE + 5])
    b.delete_ids("q", 7, [BASE + 2001, BASE + 1001])   # stored at priority 9 and 4: stay
    b.delete_ids("q", 9, [])
    b.delete_ids("other", 0, [BASE])
    b.delete_entries("q", [(9, BASE + 2003), (4, BASE + 1003), (9, BASE + 2003)])
    h.result(h.store.commit(b))
    gone = ({(0, BASE + i) for i in [*range(10, 60), 299, 7]}
            | {(4, BASE + 1000 + i) for i in [*range(0, 40, 2), 3]} | {(9, BASE + 2003)})
    assert stored(h) == keys - gone
    assert h.result(h.store.count_entries("q")) == 350 - len(gone)
    expiring = {k for _, k, _ in h.result(h.store.read_expired(10_000.0, 100))}
    assert expiring == {(4, BASE + 1000 + i) for i in range(1, 40, 4)}   # odd ones stay
    assert h.result(h.store.queue_names()) == ["q"]


def test_mixed_priority_keys_become_one_run_per_priority(harness: Harness) -> None:
    """``delete_entries`` with keys of several priorities stores one run per priority (no key
    per id) and deletes exactly those entries; the last delete empties the queue."""
    h = harness
    keys = fill(h)
    b = WriteBatch()
    mixed = sorted(keys)[::2]
    b.delete_entries("q", mixed)
    assert sorted(p for p, _ in b.deletes["q"]) == [0, 4, 9]
    assert len(b) == len(mixed)
    h.result(h.store.commit(b))
    assert stored(h) == keys - set(mixed)
    b = WriteBatch()
    b.delete_entries("q", iter(sorted(keys - set(mixed))))
    h.result(h.store.commit(b))
    assert h.result(h.store.count_entries("q")) == 0
    assert h.result(h.store.queue_names()) == []
