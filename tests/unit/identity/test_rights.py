"""Grants: NATS-syntax patterns, nats-server's queue-group rule, and coverage of subscription
patterns (wildcards, mq9's '#', MQKS masks) checked against the core's matcher."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqhub.core.address import pattern_matches
from mqhub.identity.rights import Grants, RightsError, parse_grant
from mqhub.testing import property_examples


def test_literal_addresses_against_patterns() -> None:
    """`*` is one token, `>` one or more; a literal is only itself."""
    g = Grants.parse(["orders.>", "news.*", "exact"])
    assert g.allows("orders.eu") and g.allows("orders.eu.new")
    assert not g.allows("orders")            # '>' needs at least one more token
    assert g.allows("news.x") and not g.allows("news.x.y") and not g.allows("news")
    assert g.allows("exact") and not g.allows("exact.more") and not g.allows("payroll")


def test_subscription_patterns_must_be_covered() -> None:
    """A wildcard subscription is allowed only when every address it matches is allowed."""
    g = Grants.parse(["orders.>", "a.*.c"])
    assert g.covers("orders.*") and g.covers("orders.>") and g.covers("orders.#")
    assert not g.covers(">") and not g.covers("*.x") and not g.covers("orders")
    assert g.covers("a.*.c") and g.covers("a.b*.c")       # a mask is one token
    assert not g.covers("a.>") and not g.covers("a.*.*")
    assert Grants.parse(["a.b"]).covers("a.b") and not Grants.parse(["a.b"]).covers("a.*")
    assert not Grants.parse(["a.bc"]).covers("a.b*")       # a literal never covers a mask


def test_queue_group_rule_of_nats_server() -> None:
    """`PATTERN GROUP` grants decide for groups on the subjects they match; plain grants for
    the rest, and a subscription without a group needs a plain grant."""
    g = Grants.parse(["jobs.> workers", "feed.>"])
    assert g.covers("jobs.x", "workers") and not g.covers("jobs.x", "spies")
    assert not g.covers("jobs.x")                          # no plain grant for jobs
    assert g.covers("feed.x") and g.covers("feed.x", "anyone")
    both = Grants.parse(["jobs.>", "jobs.> w.*"])
    assert both.covers("jobs.x") and both.covers("jobs.x", "w.1")
    assert not both.covers("jobs.x", "other")              # group grants override for groups


def test_everything_and_nothing() -> None:
    """A plain `>` allows all (and is flagged so checks can be skipped); no grant allows none."""
    assert Grants.parse([">"]).everything and Grants.parse([">"]).covers(">", "g")
    assert not Grants.parse(["> g"]).everything
    assert not Grants().allows("a") and not Grants().covers("a.*")


def test_legacy_matchers_answer_literals_only() -> None:
    """Regex-style grants of the old files match literal addresses, never wildcards."""
    g = Grants(matchers=(lambda address, group: address.startswith("orders"),))
    assert g.allows("orders.eu") and g.allows("ordersX") and not g.allows("payroll")
    assert not g.covers("orders.*") and not g.covers(">")


@pytest.mark.parametrize("bad", ["", "a..b", "a.>.b", "ab*", "a.b>", " a", "a b c", "a  b",
                                 "a.b >.x"])
def test_bad_grants_are_refused(bad: str) -> None:
    """Only NATS syntax, whole-token wildcards, one optional group."""
    with pytest.raises(RightsError):
        parse_grant(bad)


_TOKENS = st.sampled_from(["a", "b", "c", "ab"])
_PAT_TOKENS = st.sampled_from(["a", "b", "c", "ab", "*", "a*", "*b"])


@st.composite
def _patterns(draw: st.DrawFn, tokens: st.SearchStrategy[str]) -> str:
    """A dotted pattern of 1..4 tokens, maybe ending in '>'."""
    parts = draw(st.lists(tokens, min_size=1, max_size=4))
    if draw(st.booleans()):
        parts.append(">")
    return ".".join(parts)


@settings(max_examples=property_examples(300), deadline=None)
@given(grant=_patterns(st.sampled_from(["a", "b", "ab", "*"])),
       wanted=_patterns(_PAT_TOKENS),
       addresses=st.lists(st.lists(_TOKENS, min_size=1, max_size=6).map(".".join), max_size=40))
def test_coverage_is_sound(grant: str, wanted: str, addresses: list[str]) -> None:
    """If a grant covers a pattern, every address the core routes to that pattern is allowed
    by the grant (no subscription can receive what its principal may not read)."""
    g = Grants.parse([grant])
    if not g.covers(wanted):
        return
    for address in addresses:
        if pattern_matches(wanted, address):
            assert pattern_matches(grant, address), (grant, wanted, address)
            assert g.allows(address)
