"""The versioned due-row layout: round trips, old marshal rows, damaged rows."""

from __future__ import annotations

import marshal

import pytest

from mqhub.store import due_rows
from mqhub.store.records import make_entry

ENTRY = make_entry(2**63 + 5, b"\x00body\xff", "orders.eu", priority=7, attempts=3,
                   deliver_at=1700000000.25, expires_at=1700000100.5,
                   headers={"k": "v", "ü": "ß"}, origin="nsq")
PLAIN = make_entry(1, b"", "a")


@pytest.mark.parametrize("entry", [ENTRY, PLAIN])
def test_queue_row_round_trip(entry: tuple) -> None:
    """A queue row gives back the incarnation and an identical entry tuple."""
    payload = due_rows.encode_queue_row(2**64 - 1, entry)
    assert payload[0] == due_rows.QUEUE_ROW_V1
    assert due_rows.decode_queue_row(payload) == (2**64 - 1, entry)


def test_address_row_round_trip() -> None:
    """An address row gives back the address, every mark and the entry."""
    marks = (("q1", 9), ("päd/q", 2**63))
    payload = due_rows.encode_address_row("orders.*x", marks, ENTRY)
    assert payload[0] == due_rows.ADDRESS_ROW_V1
    assert due_rows.decode_address_row(payload) == ("orders.*x", marks, ENTRY)
    assert due_rows.decode_address_row(due_rows.encode_address_row("a", (), PLAIN)) == \
        ("a", (), PLAIN)


def test_rows_do_not_depend_on_marshal() -> None:
    """The new payloads are not marshal dumps (stable across Python versions)."""
    with pytest.raises((ValueError, EOFError, TypeError)):
        marshal.loads(due_rows.encode_queue_row(1, ENTRY))


def test_old_marshal_rows_still_read() -> None:
    """Rows an older version wrote with marshal decode to the same values."""
    assert due_rows.decode_queue_row(marshal.dumps((4, ENTRY))) == (4, ENTRY)
    old = marshal.dumps(("a.b", (("q", 3),), ENTRY))
    assert due_rows.decode_address_row(old) == ("a.b", (("q", 3),), ENTRY)


@pytest.mark.parametrize("payload", [b"", b"\x01", b"\x01" + b"\x00" * 20, b"\x02\x00\x09ab",
                                     b"\x01" + b"\x00" * 37 + b"\xff\xff\xff\xff", b"garbage"])
def test_damaged_rows_raise_value_error(payload: bytes) -> None:
    """Truncated or foreign payloads raise ValueError (the broker logs and drops them)."""
    with pytest.raises(ValueError):
        due_rows.decode_queue_row(payload)
    with pytest.raises(ValueError):
        due_rows.decode_address_row(payload)
