"""ACL globs of the VibeMQ users file."""

from __future__ import annotations

from mqhub.protocols.vibemq.auth import glob_matches


def test_glob_matches_case_insensitive_star_crosses_dots_rest_literal() -> None:
    """``*`` matches anything (dots too), case is ignored, other characters are literal."""
    assert glob_matches("Orders.*", "orders.eu.new")
    assert glob_matches("*", "anything.at.all")
    assert glob_matches("a*c", "ac") and glob_matches("a*c", "ABXC")
    assert not glob_matches("orders.*", "ordersXeu")  # the dot is literal, not any character
    assert not glob_matches("orders", "orders.eu")  # the whole name must match
    assert not glob_matches("a+b", "aab") and glob_matches("a+b", "A+B")
    for _ in range(2):  # the cached pattern answers the same the second time
        assert glob_matches("Orders.*", "ORDERS.x") and not glob_matches("Orders.*", "other")
