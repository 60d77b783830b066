"""Time-ordered 64-bit ids."""

from __future__ import annotations

import pytest
from twisted.internet.task import Clock

from mqhub.core.ids import IdGenerator, first_id_at, format_id, id_time, parse_id


def test_ids_are_time_ordered_and_strictly_increasing() -> None:
    """Ids grow with time, within a millisecond, and when the clock steps back."""
    clock = Clock()
    clock.advance(1767225600.0)
    gen = IdGenerator(clock)
    a = gen.next_id()
    first = gen.reserve(100)
    assert first > a
    assert gen.last == first + 99
    assert abs(id_time(a) - 1767225600.0) < 0.002
    clock.advance(1.0)
    b = gen.next_id()
    assert b > gen.last - 1 and abs(id_time(b) - 1767225601.0) < 0.002
    clock.rightNow -= 10.0
    c = gen.next_id()
    assert c == b + 1
    gen.observe(c + 1000)
    assert gen.next_id() == c + 1001
    assert b < (1 << 64)


def test_first_id_at_splits_ids_by_their_time() -> None:
    """Ids made at or after ``t`` are >= first_id_at(t); ids made earlier are below it."""
    clock = Clock()
    clock.advance(1767225600.0)
    gen = IdGenerator(clock)
    early = gen.next_id()
    clock.advance(0.5)
    late = gen.next_id()
    cut = first_id_at(1767225600.5)
    assert early < cut <= late
    assert id_time(cut) == 1767225600.5


def test_format_and_parse() -> None:
    """Ids render as 16 hex characters and parse back; bad text raises ValueError."""
    assert format_id(255) == "00000000000000ff"
    assert parse_id("00000000000000ff") == 255
    assert parse_id(b"00000000000000ff") == 255
    for bad in ["ff", "zzzzzzzzzzzzzzzz", ""]:
        with pytest.raises(ValueError):
            parse_id(bad)
