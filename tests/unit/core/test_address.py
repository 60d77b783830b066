"""Address validation and the token trie, with property tests against the brute-force matcher."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqhub.core.address import (
    AddressTrie,
    is_pattern,
    pattern_matches,
    validate_address,
    validate_pattern,
)
from mqhub.errors import InvalidName

TOKENS = ["a", "b", "c", "ab", "user", "users", "log", "x1"]
token = st.sampled_from(TOKENS)
address = st.lists(token, min_size=1, max_size=5).map(".".join)


def _pattern_token(draw: st.DrawFn) -> str:
    """One pattern token of any kind (literal, ``*``, an MQKS mask)."""
    kind = draw(st.sampled_from(["lit", "lit", "star", "mask"]))
    if kind == "lit":
        return draw(token)
    if kind == "star":
        return "*"
    base = draw(token)
    cut = draw(st.integers(0, len(base)))
    return base[:cut] + "*" + base[cut:]


@st.composite
def patterns(draw: st.DrawFn) -> str:
    """A pattern of every kind: literal, ``*``, masks, and a trailing ``>`` or ``#``."""
    n = draw(st.integers(1, 4))
    toks = [_pattern_token(draw) for _ in range(n)]
    tail = draw(st.sampled_from(["", "", ">", "#"]))
    if tail:
        toks.append(tail)
    return ".".join(toks)


def test_reference_matcher_examples() -> None:
    """The reference matcher follows NATS, MQKS and mq9 rules."""
    assert pattern_matches("a.*.c", "a.b.c")
    assert not pattern_matches("a.*.c", "a.b.b.c")
    assert pattern_matches("a.>", "a.b.c")
    assert not pattern_matches("a.>", "a")
    assert pattern_matches("a.#", "a.b")
    assert pattern_matches("*.updated", "user.updated")
    assert pattern_matches("user.*.connected", "user.57e8.connected")
    assert pattern_matches("us*", "users")
    assert pattern_matches("us*", "us")
    assert not pattern_matches("us*", "user.x")
    assert pattern_matches("*s", "users")
    assert not pattern_matches("a.b", "a.b.c")
    assert pattern_matches(">", "anything.at.all")


def test_validation() -> None:
    """Bad addresses and patterns raise InvalidName."""
    validate_address("a.b.c")
    validate_pattern("a.*.>")
    validate_pattern("a.us*r.#")
    for bad in ["", "a..b", ".a", "a.", "a b", "a.*", "a.>", "a\x00b"]:
        with pytest.raises(InvalidName):
            validate_address(bad)
    for bad in ["", "a.>.b", "a..b", "a.#.b", "a.b>", "a b"]:
        with pytest.raises(InvalidName):
            validate_pattern(bad)
    assert is_pattern("a.*") and is_pattern("a.>") and is_pattern("#")
    assert not is_pattern("a#")
    assert not is_pattern("a.b")


@settings(max_examples=300, deadline=None)
@given(st.lists(patterns(), min_size=1, max_size=25), st.lists(address, min_size=1, max_size=10))
def test_trie_matches_like_brute_force(pats: list[str], addrs: list[str]) -> None:
    """For every pattern kind the trie returns exactly what the brute-force matcher says."""
    trie = AddressTrie()
    values = [(i, p) for i, p in enumerate(pats)]
    for v in values:
        trie.add(v[1], v)
    for a in addrs:
        got = sorted(trie.match(a))
        want = sorted(v for v in values if pattern_matches(v[1], a))
        assert got == want, (a, pats)


@settings(max_examples=150, deadline=None)
@given(st.lists(patterns(), min_size=1, max_size=20), st.data())
def test_trie_remove_keeps_the_rest(pats: list[str], data: st.DataObject) -> None:
    """Removing some patterns leaves exactly the others matching, and prunes to empty."""
    trie = AddressTrie()
    values = [(i, p) for i, p in enumerate(pats)]
    for v in values:
        trie.add(v[1], v)
    gone = data.draw(st.sets(st.sampled_from(range(len(values)))))
    for i in gone:
        assert trie.remove(values[i][1], values[i])
        assert not trie.remove(values[i][1], values[i])
    kept = [v for i, v in enumerate(values) if i not in gone]
    assert len(trie) == len(kept)
    for a in data.draw(st.lists(address, min_size=1, max_size=8)):
        assert sorted(trie.match(a)) == sorted(v for v in kept if pattern_matches(v[1], a))
    for v in kept:
        trie.remove(v[1], v)
    assert len(trie) == 0 and trie._root.is_empty()


@pytest.mark.parametrize(("patterns", "addresses"), [
    (("a.*", "a.>"), ["a.b"]),
    ((">", "a.>"), ["a.b.c", "a.zz"]),   # tails at two levels, also when the walk stops early
])
def test_value_under_two_patterns_is_reported_once(patterns: tuple[str, str],
                                                   addresses: list[str]) -> None:
    """A value bound under two patterns that both match an address appears once."""
    trie = AddressTrie()
    v = object()
    for pattern in patterns:
        trie.add(pattern, v)
    for a in addresses:
        assert trie.match(a) == [v]
