"""The address length rule: the core refuses an address over MAX_ADDRESS characters wherever it
is accepted (``publish_batch`` and ``route``, whose cached routes ``publish_batch`` trusts), and
anything it accepts fits the store's entry meta field, which refuses only what is left over
(headers) with a clear message."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from mqhub.core.address import MAX_ADDRESS
from mqhub.errors import InvalidName
from mqhub.hub import Hub
from mqhub.store import codec, due_rows
from mqhub.store.lmdb import LmdbStore
from mqhub.testing import advance, memory_hub, result_of, settle, start_clock

#: a character of four UTF-8 bytes: the longest accepted address in bytes
WIDE = "\U0001d11e"
LONGEST = WIDE * MAX_ADDRESS
ORIGIN = "o" * 255


@pytest.fixture
def hub(tmp_path: Any) -> Iterator[Hub]:
    """A hub over a real LmdbStore, a durable queue ``q`` bound to every address (``>``)."""
    clock = start_clock()
    store = LmdbStore(str(tmp_path / "data"), clock=clock, durability="sync")
    store.open()
    h = memory_hub(clock, store=store)
    h.broker.declare_queue("q")
    h.broker.bind_queue(">", "q")
    yield h
    h.broker.stop()
    store.close()


def stored_addresses(h: Hub) -> list[str]:
    """The address of every entry stored on ``q``."""
    return [e[5] for e in result_of(h.store.read_entries("q", None, 100))]


@pytest.mark.parametrize("via_route", [False, True])
def test_longest_address_is_stored_and_one_more_character_refused(hub: Hub,
                                                                  via_route: bool) -> None:
    """MAX_ADDRESS four-byte characters publish and come back from LMDB; one character more
    is InvalidName, also when the route was asked for first (it used to be cached unchecked,
    and publish_batch then stored the address: 65,533 bytes on failed as a malformed batch)."""
    b = hub.broker
    if via_route:
        b.route(LONGEST)
    d = b.publish_batch(LONGEST, [b"x"], origin=ORIGIN)
    settle(hub)
    assert result_of(d) is None
    too_long = LONGEST + "a"
    with pytest.raises(InvalidName):
        if via_route:
            b.route(too_long)
        b.publish_batch(too_long, [b"y"])
    with pytest.raises(InvalidName):
        b.publish_batch("b" * 70000, [b"z"])
    settle(hub)
    assert stored_addresses(hub) == [LONGEST]


def test_meta_field_edge() -> None:
    """The meta blob holds exactly MAX_META bytes; one byte more is a ValueError that names the
    limit (the store then refuses that batch alone); the longest accepted address with the
    longest origin is far inside it."""
    room = codec.MAX_META - codec.META_HEAD.size
    assert len(codec.encode_meta("a" * room, None, "")) == codec.MAX_META
    assert len(codec.encode_meta("a" * (room - 255), None, ORIGIN)) == codec.MAX_META
    with pytest.raises(ValueError, match="65535 bytes an entry holds"):
        codec.encode_meta("a" * (room + 1), None, "")
    with pytest.raises(ValueError, match="65535 bytes an entry holds"):
        codec.encode_meta("a", {"k": "v" * room}, "")
    with pytest.raises(ValueError, match="255"):
        codec.encode_meta("a", None, ORIGIN + "o")
    assert len(codec.encode_meta(LONGEST, None, ORIGIN)) < codec.MAX_META // 8


def test_a_due_publish_stored_before_the_rule_is_still_routed(hub: Hub) -> None:
    """A delayed publish (``da/`` row) whose address is over the limit (stored through the
    old unchecked route) is routed when due like any other, not refused and retried forever:
    the rule is checked where an address is accepted, not on what the store already holds."""
    address = "a" * (MAX_ADDRESS + 1)
    now = hub.clock.seconds()
    entry = (77, 0, 0, now + 1, 0.0, address, None, b"late", "t")
    row = due_rows.encode_address_row(address, (("q", hub.broker.queue("q").incarnation),), entry)
    hub.scheduler.call_at(now + 1, b"da/" + (77).to_bytes(8, "big"), row)
    advance(hub.clock, 3)
    assert stored_addresses(hub) == [address]
    assert result_of(hub.store.read_due(now + 1e6, 10)) == []
