"""Typed plugin settings: apply ``--option NAME.KEY=VALUE`` strings to a settings dataclass."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from mqhub.errors import PluginError

_TRUE = ("1", "true", "yes", "on")


def apply_settings(config: Any, raw: Mapping[str, Any], plugin: str) -> Any:
    """Set each ``raw`` key (dashes allowed for underscores) on the dataclass ``config``.

    A value is converted to the type of the field's current value: bool (``1/true/yes/on``),
    int, float, or str (empty = None). Returns ``config``.

    :raises PluginError: on an unknown key or a value that is not a number where one is needed.
    """
    names = {f.name for f in fields(config)}
    for key, value in raw.items():
        key = key.replace("-", "_")
        if key not in names:
            raise PluginError(f"{plugin}: unknown option {key!r}")
        default = getattr(config, key)
        try:
            if isinstance(default, bool):
                parsed: Any = value if isinstance(value, bool) else str(value).lower() in _TRUE
            elif isinstance(default, int):
                parsed = int(value)
            elif isinstance(default, float):
                parsed = float(value)
            else:
                parsed = None if value in (None, "") else str(value)
        except ValueError:
            raise PluginError(f"{plugin}: option {key} expects a number, got {value!r}") from None
        setattr(config, key, parsed)
    return config
