"""apply_settings: typed ``--option`` values on a settings dataclass."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from mqhub.errors import PluginError
from mqhub.plugin_settings import apply_settings


@dataclass
class Settings:
    flag: bool = False
    count: int = 1
    ratio: float = 0.5
    name: str | None = None


def test_values_take_the_type_of_the_default() -> None:
    s = apply_settings(Settings(), {"flag": "yes", "count": "7", "ratio": "2", "name": "x"}, "p")
    assert s == Settings(True, 7, 2.0, "x")
    assert apply_settings(Settings(name="x"), {"name": ""}, "p").name is None


def test_dashes_and_errors() -> None:
    assert apply_settings(Settings(), {"count": 3}, "p").count == 3
    with pytest.raises(PluginError, match="p: unknown option 'nope'"):
        apply_settings(Settings(), {"nope": 1}, "p")
    with pytest.raises(PluginError, match="expects a number"):
        apply_settings(Settings(), {"count": "many"}, "p")
