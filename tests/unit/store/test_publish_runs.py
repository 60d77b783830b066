"""A WriteBatch put marked as one publish run (``put_entries(run=True)``): the store skips
comparing the entries' shared fields, and the mark only lasts while the run is the queue's one
put in the batch. Both stores read back exactly what was put, marked or not."""

from __future__ import annotations

from typing import Any

import pytest

from mqhub.store.batch import WriteBatch
from mqhub.store.records import make_entry
from tests.unit.store.conftest import Harness, open_lmdb, open_memory


def run(first: int, n: int, address: str = "a", **fields: Any) -> list[tuple]:
    """``n`` entries sharing every field but the id and the (same-size) body."""
    return [make_entry(i, b"b%05d" % i, address, **fields) for i in range(first, first + n)]


def read(h: Harness, queue: str) -> list[tuple]:
    """Every entry of ``queue`` in ready order."""
    got: list[tuple] = h.result(h.store.read_entries(queue, None, 100_000))
    return got


def test_the_mark_lasts_only_while_the_run_is_the_queues_one_put() -> None:
    """A second put on the same queue (marked or not) drops the queue's mark; other queues
    keep theirs; an unmarked first put never gets one."""
    b = WriteBatch()
    b.put_entries("q", run(1, 3), run=True)
    b.put_entries("r", run(10, 3), run=True)
    b.put_entries("s", run(20, 3))
    assert b.publish_runs == {"q", "r"}
    b.put_entries("q", run(4, 2, "other"), run=True)
    assert b.publish_runs == {"r"}
    assert [e[0] for e in b.puts["q"]] == [1, 2, 3, 4, 5]


@pytest.fixture(params=["lmdb", "memory"])
def harness(request: Any, tmp_path: Any) -> Any:
    """An LmdbStore (small segment threshold) or a MemoryStore."""
    h = open_lmdb(str(tmp_path / "d"), durability="none") if request.param == "lmdb" \
        else open_memory()
    yield h
    h.store.close()


def test_marked_runs_read_back_like_unmarked_ones(harness: Harness) -> None:
    """The same publish runs, marked on one queue and not on the other, read back equal, with
    their shared fields; runs the store cannot pack (an expiry, headers, a body over the segment
    threshold, a priority) still read back whole."""
    runs = [run(100, 600, attempts=2, deliver_at=5.0, origin="nsq"),
            run(1000, 50, priority=7),
            run(2000, 20, expires_at=9e9),
            run(3000, 20, headers={"k": "v"}),
            [make_entry(i, b"x" * 300, "big") for i in range(4000, 4010)]]
    for entries in runs:
        b = WriteBatch()
        b.put_entries("marked", entries, run=True)
        b.put_entries("plain", entries)
        harness.result(harness.store.commit(b))
    want = sorted((e for r in runs for e in r), key=lambda e: (-e[1], e[0]))
    assert read(harness, "marked") == want
    assert read(harness, "plain") == want
    if harness.store.stats()["kind"] == "lmdb":  # the big bodies went to segments, both times
        assert harness.store.stats()["segment_messages"] == 10  # shared by both queues
        b = WriteBatch()
        b.put_entries("marked", [make_entry(i, b"y" * 300, "big") for i in range(5000, 5010)],
                      run=True)
        harness.result(harness.store.commit(b))
        assert harness.store.stats()["segment_messages"] == 20


def test_a_run_joined_by_another_put_is_compared_entry_by_entry(harness: Harness) -> None:
    """A run and a put of other fields to the same queue in one batch: each entry keeps its
    own address and attempts (the run's shared fields are not applied to the joined put)."""
    b = WriteBatch()
    first, second = run(1, 300), run(301, 300, "elsewhere", attempts=3)
    b.put_entries("q", first, run=True)
    b.put_entries("q", second)
    harness.result(harness.store.commit(b))
    assert read(harness, "q") == first + second
