"""``read_entries(after=...)``: any ``(priority, msg_id)`` position, in range or not, pages the
same in MemoryStore and LmdbStore (IMessageStore: ``after`` is a place in the ready order)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqhub.store.batch import WriteBatch
from mqhub.store.records import MAX_MSG_ID, make_entry
from tests.unit.store.conftest import Harness, open_lmdb, open_memory

#: ids at both ends of the u64 range and between, at priorities 0, 5 and 9
STORED = [(1, 0), (7, 0), (2, 5), (9, 5), (MAX_MSG_ID, 5), (0, 9), (3, 9)]


def fill(h: Harness) -> None:
    """Put the STORED entries on queue ``q`` (some in a second batch, so groups differ)."""
    for part in (STORED[:4], STORED[4:]):
        b = WriteBatch()
        b.put_entries("q", [make_entry(i, b"x", priority=p) for i, p in part])
        h.result(h.store.commit(b))


@pytest.fixture(scope="module")
def stores() -> Iterator[tuple[Harness, Harness]]:
    """A filled MemoryStore and a filled LmdbStore (read-only below)."""
    tmp = tempfile.mkdtemp()
    mem, lm = open_memory(), open_lmdb(tmp)
    fill(mem)
    fill(lm)
    yield mem, lm
    mem.store.close()
    lm.store.close()
    shutil.rmtree(tmp, ignore_errors=True)


def page(h: Harness, after: tuple[int, int], limit: int = 100) -> list[int]:
    """The msg_ids read after ``after``."""
    return [e[0] for e in h.result(h.store.read_entries("q", after, limit))]


@pytest.mark.parametrize("after, expected", [
    ((10, 0), [0, 3, 2, 9, MAX_MSG_ID, 1, 7]),       # above every priority: all entries
    ((255, 5), [0, 3, 2, 9, MAX_MSG_ID, 1, 7]),
    ((-1, 0), []),                                    # below every priority: nothing
    ((-300, 1 << 70), []),
    ((5, -1), [2, 9, MAX_MSG_ID, 1, 7]),             # id below 0: the whole priority
    ((9, -5), [0, 3, 2, 9, MAX_MSG_ID, 1, 7]),
    ((0, -1), [1, 7]),
    ((5, 1 << 64), [1, 7]),                           # id above u64: past the priority
    ((5, MAX_MSG_ID), [1, 7]),
    ((5, MAX_MSG_ID - 1), [MAX_MSG_ID, 1, 7]),
])
def test_out_of_range_after_pages_the_same(stores: tuple[Harness, Harness],
                                           after: tuple[int, int], expected: list[int]) -> None:
    """Both stores place an out-of-range ``after`` where the ready order puts it."""
    for h in stores:
        assert page(h, after) == expected


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(priority=st.integers(-20, 30) | st.integers(), msg_id=st.integers(-10, 12) | st.integers(),
       limit=st.integers(1, 8))
def test_any_after_reads_as_in_memory(stores: tuple[Harness, Harness], priority: int,
                                      msg_id: int, limit: int) -> None:
    """Whatever integers ``after`` holds, LMDB answers what MemoryStore does, with no error."""
    mem, lm = stores
    assert page(lm, (priority, msg_id), limit) == page(mem, (priority, msg_id), limit)
