"""The remembered tail's helpers (mqhub.core.tail) against plain list models (Hypothesis)."""

from __future__ import annotations

from collections import deque

from hypothesis import given
from hypothesis import strategies as st

from mqhub.core.tail import ENTRY_COST, pop_head, ready_key, sized, stays_sorted, tail_limit, trim
from mqhub.store.records import Entry


def _entry(key: tuple[int, int]) -> Entry:
    """An entry at ready-order position (priority, msg_id)."""
    prio, mid = key
    return (mid, prio, 0, 0.0, 0.0, "a", None, b"x", "t")


keys = st.lists(st.tuples(st.integers(0, 2), st.integers(1, 60)), max_size=40,
                unique_by=lambda k: k[1])
cut = st.one_of(st.none(), st.tuples(st.integers(-2, 0), st.integers(0, 61)))


@given(keys, st.integers(0, 50), cut)
def test_pop_head_takes_the_ready_order_prefix_before_the_cap(ks: list[tuple[int, int]],
                                                              room: int,
                                                              cap: tuple[int, int] | None) -> None:
    """pop_head of a sorted tail = the first ``room`` entries, cut before ``cap``; the rest (the
    entries put back included) stays in the tail in ready order."""
    plain = sorted((_entry(k) for k in ks), key=ready_key)
    tail = deque(plain, maxlen=len(plain) + 5)
    taken = pop_head(tail, room, cap)
    want = [e for e in plain[:room] if cap is None or ready_key(e) < cap]
    # the cap cuts a prefix: nothing after the first held entry is taken
    if cap is not None:
        first_held = next((i for i, e in enumerate(plain[:room]) if ready_key(e) >= cap), None)
        if first_held is not None:
            want = plain[:first_held]
    assert taken == want
    assert list(tail) == plain[len(want):]


@given(keys, st.tuples(st.integers(-2, 0), st.integers(0, 61)))
def test_trim_drops_what_a_page_read(ks: list[tuple[int, int]], upto: tuple[int, int]) -> None:
    """trim of a tail in ready order keeps exactly the entries after ``upto``, in order."""
    entries = sorted((_entry(k) for k in ks), key=ready_key)
    tail = deque(entries)
    trim(tail, upto)
    assert list(tail) == [e for e in entries if ready_key(e) > upto]


@given(keys, keys)
def test_stays_sorted_only_when_appending_keeps_ready_order(
        a: list[tuple[int, int]], b: list[tuple[int, int]]) -> None:
    """stays_sorted(tail, batch) is never True when tail + batch is out of ready order, and is
    True for a one-priority batch (in id order) that sorts after the tail (a tail in ready
    order); a batch of several priorities counts as out of order (the tail is sorted later)."""
    tail = deque(sorted((_entry(k) for k in a), key=ready_key))
    batch = sorted((_entry(k) for k in b if k[1] not in {x[1] for x in a}), key=lambda e: e[0])
    if not batch:
        return
    whole = list(tail) + batch
    in_order = whole == sorted(whole, key=ready_key)
    got = stays_sorted(tail, batch, False)
    assert not got or in_order
    if in_order and len({e[1] for e in batch}) == 1:
        assert got
        assert stays_sorted(tail, batch, True)


def test_the_limit_counts_each_entry_beside_its_body() -> None:
    """64 MiB holds ~322,000 entries of 16 B and ~55,000 of 1 KiB; never less than one."""
    assert tail_limit(64 << 20, 16) == (64 << 20) // (16 + ENTRY_COST)
    assert 300_000 < tail_limit(64 << 20, 16) < 340_000
    assert 50_000 < tail_limit(64 << 20, 1024) < 60_000
    assert tail_limit(10, 1 << 20) == 1
    d = sized([_entry((0, 1))], 3)
    assert d.maxlen == 3 and sized(d, 3) is d and sized(d, 4).maxlen == 4
