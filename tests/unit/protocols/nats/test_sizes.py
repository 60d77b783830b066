"""The fast path's size-field cache (``sizes.py``): odd size fields on known subjects, mixed
sizes split anywhere, behave exactly as the general parser does."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from mqhub.protocols.nats.sizes import MAX_DIGITS, size_of
from tests.unit.protocols.nats.helpers import Client, make_server

#: how a size is written on the line: plain, zero-padded, signed, or with a stray character
FORMS = st.sampled_from(["{}", "00{}", "+{}", "{}_0", "{} ", "0x{}", "{}\t", "{:012d}"])


@given(st.binary(max_size=14))
@example(b"12\r")
@example(b"\r")
@example(b"0123456789\r")
@example(b"01234567890\r")
@example(b"+1\r")
def test_size_of_takes_only_ascii_digits_and_a_cr(field: bytes) -> None:
    """A canonical digit field of 1..MAX_DIGITS digits (no leading zero) ending in CR is its
    value; anything else -1."""
    digits = field[:-1]
    ok = (field.endswith(b"\r") and 0 < len(digits) <= MAX_DIGITS
          and all(48 <= c <= 57 for c in digits) and (digits == b"0" or digits[:1] != b"0"))
    assert size_of(field) == (int(digits) if ok else -1)


def _run(stream: bytes, cuts: list[int], fast: bool) -> tuple[list[tuple], bool]:
    """What a ``bench.>`` subscriber gets (parsed), and whether the publisher was closed, when
    ``stream`` arrives in pieces; ``fast=False`` takes the general parser (echo off)."""
    srv = make_server(max_payload=4096)
    sub = Client(srv)
    sub.send(b"SUB bench.> 1\r\n")
    sub.events()
    pub = Client(srv, None if fast else {"echo": False})
    assert pub.proto.fast is fast
    warm = b"".join(b"PUB bench.%d 1\r\nx\r\n" % k for k in range(3))
    pub.send(warm)             # the subjects' head routes exist: later lines are "new sizes"
    at = 0
    for cut in cuts:
        pub.send(stream[at:at + cut])
        at += cut
    pub.send(stream[at:])
    return sub.events(), pub.closed


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2100), FORMS, st.booleans()),
                min_size=1, max_size=25),
       st.lists(st.integers(1, 5000), max_size=8))
@example([(0, 10, "{}", False), (1, 2000, "{}", False), (0, 10, "+{}", False)], [])
@example([(2, 7, "{:012d}", False), (2, 7, "00{}", False)], [3, 20])
def test_mixed_sizes_and_odd_size_fields_split_anywhere_match_the_general_parser(
        spec: list[tuple[int, int, str, bool]], cuts: list[int]) -> None:
    """Known subjects with new sizes (some fields malformed, some lines without CR), read in
    arbitrary pieces: the subscriber gets the same messages the general parser delivers, and
    the publisher is closed in both or neither."""
    frames = []
    for k, (s, size, form, no_cr) in enumerate(spec):
        payload = bytes([97 + k % 26]) * size
        field = form.format(size).encode()
        frames.append(b"PUB bench.%d %s%s%s\r\n" % (s, field, b"\n" if no_cr else b"\r\n",
                                                    payload))
    stream = b"".join(frames)
    assert _run(stream, cuts, True) == _run(stream, cuts, False)
