"""MqksConfig from twistd options: defaults, --option mqks.KEY=VALUE, --mqks-eval, bad values."""

from __future__ import annotations

import pytest

from mqhub.errors import PluginError
from mqhub.protocols.mqks.config import MqksConfig


def test_defaults_and_options() -> None:
    """prefetch 1000, 1 MiB lines, _eval off; options and the flag override them."""
    assert MqksConfig.from_options({}) == MqksConfig(1000, 1 << 20, "off", 50_000)
    got = MqksConfig.from_options({"plugin_options": {"mqks": {"prefetch": "5", "max-line": "64"}},
                                   "mqks-eval": "stats"})
    assert (got.prefetch, got.max_line, got.eval) == (5, 64, "stats")


@pytest.mark.parametrize("options", [
    {"plugin_options": {"mqks": {"nope": "1"}}},
    {"plugin_options": {"mqks": {"prefetch": "x"}}},
    {"plugin_options": {"mqks": {"prefetch": "0"}}},
    {"plugin_options": {"mqks": {"window": "0"}}},
    {"mqks-eval": "python"},
])
def test_bad_options_are_refused(options: dict[str, object]) -> None:
    """Unknown keys, non-numbers, zero and unknown eval modes stop the broker from starting."""
    with pytest.raises(PluginError):
        MqksConfig.from_options(options)
