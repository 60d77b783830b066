"""The IMessageStore conformance suite, run over MemoryStore and LmdbStore alike."""

from __future__ import annotations

import pytest
from zope.interface.verify import verifyObject

from mqhub.errors import StoreClosed, StoreError
from mqhub.interfaces import IMessageStore
from mqhub.store.batch import WriteBatch
from mqhub.store.records import make_entry
from tests.unit.store.conftest import SMALL_THRESHOLD, Harness


def put(h: Harness, queue: str, *entries: tuple) -> None:
    """Commit one batch putting ``entries`` on ``queue``."""
    b = WriteBatch()
    b.put_entries(queue, entries)
    h.result(h.store.commit(b))


def ids(h: Harness, queue: str, after: tuple[int, int] | None = None, limit: int = 100) -> list[int]:
    """Return the msg_ids read from ``queue``."""
    return [e[0] for e in h.result(h.store.read_entries(queue, after, limit))]


def test_provides_the_interface(harness: Harness) -> None:
    """Both stores provide IMessageStore completely."""
    assert verifyObject(IMessageStore, harness.store)
    assert harness.store.durability in ("sync", "batch", "none")


def test_commit_is_confirmed_only_after_the_turn_and_groups_batches(harness: Harness) -> None:
    """Batches of one turn commit together; nothing is confirmed or visible before that."""
    h = harness
    before = h.store.stats()["commits"]
    fired: list[object] = []
    for i in range(3):
        b = WriteBatch()
        b.put_entries("q", [make_entry(i + 1, b"m%d" % i)])
        h.store.commit(b).addCallback(fired.append)
    assert fired == []
    assert h.result(h.store.count_entries("q")) == 0
    h.clock.advance(0)
    assert h.result(h.store.count_entries("q")) == 3
    assert fired == [None, None, None]
    assert h.store.stats()["commits"] == before + 1


def test_ready_order_is_priority_then_id_and_pages(harness: Harness) -> None:
    """Entries come back by priority descending then id ascending, and page with ``after``."""
    h = harness
    put(h, "q", *[make_entry(i, b"x", priority=i % 3) for i in range(1, 13)])
    order = ids(h, "q")
    assert order == [2, 5, 8, 11, 1, 4, 7, 10, 3, 6, 9, 12]
    assert ids(h, "q", None, 5) == order[:5]
    assert ids(h, "q", (1, 1), 3) == [4, 7, 10]
    assert ids(h, "q", (0, 12), 3) == []
    assert ids(h, "q", (2, 6), 2) == [8, 11]  # a key that is not stored still positions
    assert ids(h, "other") == []


def test_fields_round_trip(harness: Harness) -> None:
    """Every field of an entry comes back as stored, small and large bodies alike."""
    h = harness
    big = bytes(range(256)) * 4
    assert len(big) > SMALL_THRESHOLD
    e1 = make_entry(7, b"", "a.b.c", priority=9, attempts=3, deliver_at=12.5,
                    headers={"k": "v", "\u00e9": "x"}, origin="nats")
    e2 = make_entry(8, big, "\u00fcber.x", priority=0, expires_at=99.25, origin="nsq")
    put(h, "q", e1, e2)
    assert h.result(h.store.read_entries("q", None, 10)) == [e1, e2]


def test_overwrite_keeps_the_count(harness: Harness) -> None:
    """Putting an existing key again replaces it and does not add an entry."""
    h = harness
    put(h, "q", make_entry(1, b"a"), make_entry(2, b"b" * 200, expires_at=5.0))
    put(h, "q", make_entry(1, b"A"), make_entry(2, b"B", attempts=4))
    assert h.result(h.store.count_entries("q")) == 2
    got = h.result(h.store.read_entries("q", None, 10))
    assert [(e[0], e[7], e[2]) for e in got] == [(1, b"A", 0), (2, b"B", 4)]
    assert h.result(h.store.read_expired(100.0, 10)) == []


def test_attempts_update_and_missing_are_ignored(harness: Harness) -> None:
    """set_attempts changes stored attempts and ignores unknown entries and queues."""
    h = harness
    put(h, "q", make_entry(1, b"a", priority=2), make_entry(2, b"b" * 100))
    b = WriteBatch()
    b.set_attempts("q", [(2, 1, 5), (0, 2, 1), (0, 99, 7)])
    b.set_attempts("nope", [(0, 1, 1)])
    h.result(h.store.commit(b))
    got = h.result(h.store.read_entries("q", None, 10))
    assert [(e[0], e[2]) for e in got] == [(1, 5), (2, 1)]
    assert got[1][7] == b"b" * 100
    assert h.result(h.store.count_entries("q")) == 2


def test_delete_counts_and_empty_queue_disappears(harness: Harness) -> None:
    """Deletes remove entries (missing keys ignored); an emptied queue leaves queue_names."""
    h = harness
    put(h, "q", *[make_entry(i, b"x" * (i * 20), priority=1) for i in range(1, 6)])
    put(h, "r", make_entry(1, b"r"))
    assert h.result(h.store.queue_names()) == ["q", "r"]
    b = WriteBatch()
    b.delete_entries("q", [(1, 2), (1, 4), (0, 3), (1, 42)])
    b.delete_entries("missing", [(0, 1)])
    h.result(h.store.commit(b))
    assert ids(h, "q") == [1, 3, 5]
    assert h.result(h.store.count_entries("q")) == 3
    b = WriteBatch()
    b.delete_entries("q", [(1, 1), (1, 3), (1, 5)])
    h.result(h.store.commit(b))
    assert h.result(h.store.count_entries("q")) == 0
    assert h.result(h.store.queue_names()) == ["r"]


def test_purge_then_put_in_one_batch(harness: Harness) -> None:
    """A purge applies before the same batch's puts."""
    h = harness
    put(h, "q", *[make_entry(i, b"y" * 100, expires_at=float(i)) for i in range(1, 4)])
    b = WriteBatch()
    b.purge_queue("q")
    b.put_entries("q", [make_entry(10, b"new")])
    b.purge_queue("never-existed")
    h.result(h.store.commit(b))
    assert ids(h, "q") == [10]
    assert h.result(h.store.count_entries("q")) == 1
    assert h.result(h.store.read_expired(100.0, 10)) == []


def test_operation_order_within_a_batch(harness: Harness) -> None:
    """Puts precede attempt updates and deletes within one batch."""
    h = harness
    b = WriteBatch()
    b.put_entries("q", [make_entry(1, b"a"), make_entry(2, b"b")])
    b.set_attempts("q", [(0, 1, 2)])
    b.delete_entries("q", [(0, 2)])
    h.result(h.store.commit(b))
    got = h.result(h.store.read_entries("q", None, 10))
    assert [(e[0], e[2]) for e in got] == [(1, 2)]


def test_due_rows_replace_delete_and_order(harness: Harness) -> None:
    """Due rows are read in time order up to a limit; a key's row is replaced or deleted."""
    h = harness
    b = WriteBatch()
    b.put_due(30.0, b"c", b"3")
    b.put_due(10.0, b"a", b"1")
    b.put_due(20.0, b"b", b"2")
    h.result(h.store.commit(b))
    assert h.result(h.store.next_due()) == 10.0
    assert h.result(h.store.read_due(20.0, 10)) == [(10.0, b"a", b"1"), (20.0, b"b", b"2")]
    assert h.result(h.store.read_due(100.0, 1)) == [(10.0, b"a", b"1")]
    b = WriteBatch()
    b.put_due(40.0, b"a", b"1b")
    b.delete_due(b"b")
    b.delete_due(b"zz")
    h.result(h.store.commit(b))
    assert h.result(h.store.read_due(100.0, 10)) == [(30.0, b"c", b"3"), (40.0, b"a", b"1b")]
    b = WriteBatch()
    b.delete_due(b"a")
    b.delete_due(b"c")
    h.result(h.store.commit(b))
    assert h.result(h.store.next_due()) is None
    assert h.result(h.store.read_due(100.0, 10)) == []


def test_meta_get_scan_delete(harness: Harness) -> None:
    """Metadata is stored per key, scanned by prefix in key order, and deleted."""
    h = harness
    b = WriteBatch()
    for k in ("q/b", "q/a", "qq", "r/x"):
        b.put_meta(k, k.encode())
    h.result(h.store.commit(b))
    assert h.result(h.store.get_meta("q/a")) == b"q/a"
    assert h.result(h.store.get_meta("none")) is None
    assert h.result(h.store.scan_meta("q/")) == [("q/a", b"q/a"), ("q/b", b"q/b")]
    b = WriteBatch()
    b.put_meta("q/a", b"new")
    b.delete_meta("q/b")
    h.result(h.store.commit(b))
    assert h.result(h.store.scan_meta("q")) == [("q/a", b"new"), ("qq", b"qq")]


def test_expiry_index(harness: Harness) -> None:
    """read_expired lists entries whose expires_at has passed, earliest first."""
    h = harness
    put(h, "q", make_entry(1, b"a", expires_at=50.0), make_entry(2, b"b"),
        make_entry(3, b"c" * 200, priority=4, expires_at=20.0))
    put(h, "r", make_entry(4, b"d", expires_at=30.0))
    assert h.result(h.store.read_expired(40.0, 10)) == [("q", (4, 3), 20.0), ("r", (0, 4), 30.0)]
    assert h.result(h.store.read_expired(100.0, 1)) == [("q", (4, 3), 20.0)]
    b = WriteBatch()
    b.delete_entries("q", [(4, 3)])
    h.result(h.store.commit(b))
    assert [r[1] for r in h.result(h.store.read_expired(100.0, 10))] == [(0, 4), (0, 1)]


def test_archive_flag_round_trips(harness: Harness) -> None:
    """Archive-tier puts read back like any other entry."""
    h = harness
    b = WriteBatch()
    b.put_entries("audit", [make_entry(1, b"small", "x"), make_entry(2, b"z" * 500, "x")],
                  archive=True)
    h.result(h.store.commit(b))
    got = h.result(h.store.read_entries("audit", None, 10))
    assert [e[7] for e in got] == [b"small", b"z" * 500]


def test_fan_out_copies_are_independent(harness: Harness) -> None:
    """The same message on two queues (large body) survives deleting one copy."""
    h = harness
    body = b"f" * 1000
    b = WriteBatch()
    b.put_entries("a", [make_entry(5, body)])
    b.put_entries("b", [make_entry(5, body)])
    h.result(h.store.commit(b))
    b = WriteBatch()
    b.delete_entries("a", [(0, 5)])
    h.result(h.store.commit(b))
    assert h.result(h.store.read_entries("b", None, 10))[0][7] == body
    assert h.result(h.store.queue_names()) == ["b"]


def test_a_bad_batch_fails_alone(harness: Harness) -> None:
    """A batch with an out-of-range priority fails with StoreError; its turn-mates commit."""
    h = harness
    good, bad = WriteBatch(), WriteBatch()
    good.put_entries("q", [make_entry(1, b"ok")])
    bad.put_entries("q", [make_entry(2, b"bad", priority=10)])
    d_good = h.store.commit(good)
    d_bad = h.store.commit(bad)
    assert h.failure(d_bad).check(StoreError)
    assert h.result(d_good) is None
    assert ids(h, "q") == [1]


def test_closed_store_refuses_writes(harness: Harness) -> None:
    """After close, commit fails with StoreClosed (a StoreError)."""
    h = harness
    h.result(h.store.close())
    b = WriteBatch()
    b.put_meta("k", b"v")
    f = h.failure(h.store.commit(b))
    assert f.check(StoreClosed) and issubclass(StoreClosed, StoreError)


@pytest.mark.parametrize("n", [1, 250])
def test_stats_report_entries(harness: Harness, n: int) -> None:
    """stats() reports the number of stored entries."""
    h = harness
    put(h, "q", *[make_entry(i, b"s") for i in range(n)])
    assert h.store.stats()["entries"] == n
