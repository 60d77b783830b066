"""Typed plugin settings: one dataclass per plugin defines its options, once.

A plugin's settings dataclass is the only definition of its ``--option NAME.KEY=VALUE`` keys
and of its ``[NAME]`` section in the config file: each field is an option (its name the key,
its default the default, its type the accepted values) and the ``#:`` comment above a field is
its help text (the same comments Sphinx reads). :func:`apply_settings` reads option strings into
it, :func:`describe` lists its options for ``mqhub config example`` and the config file's checks.
A plugin names its dataclass in its descriptor's ``settings`` attribute, as ``"module:Class"``
(imported only when needed, so descriptors stay import-light).
"""

from __future__ import annotations

import importlib
import inspect
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from mqhub.errors import PluginError

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")
#: a field line of a class body (``name: type = default``) and a ``#:`` help comment line
_FIELD = re.compile(r"^\s+(\w+)\s*:")
_HELP = re.compile(r"^\s+#:\s?(.*)$")


@dataclass(frozen=True)
class Setting:
    """One plugin option: its key, default, kind (``bool``, ``int``, ``float`` or ``str``),
    whether it may be unset (None) and its help text."""

    key: str
    default: Any
    kind: str
    optional: bool
    help: str


def flag(value: Any) -> bool:
    """A boolean option given as a bool or as text (true/false, yes/no, on/off, 1/0; empty is
    false).

    :raises ValueError: on any other text (a typo must not switch a feature off silently).
    """
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"expected true or false, got {value!r}")


def _aliases(config: Any) -> Mapping[str, str]:
    """Other accepted names of the settings' keys (alias -> field), from ``ALIASES``."""
    return getattr(config, "ALIASES", None) or {}


def apply_settings(config: Any, raw: Mapping[str, Any], plugin: str) -> Any:
    """Set each ``raw`` key (dashes allowed for underscores) on the dataclass ``config``.

    A value is converted to the type of the field's current value: bool (:func:`flag`), int,
    float, or str (empty = None). Keys listed in the class's ``ALIASES`` (alias -> field)
    are accepted too. Returns ``config``.

    :raises PluginError: on an unknown key, or a value that is not a number or a boolean where
        one is needed.
    """
    names = {f.name for f in fields(config) if f.init}
    aliases = _aliases(config)
    for key, value in raw.items():
        key = key.replace("-", "_")
        key = aliases.get(key, key)
        if key not in names:
            raise PluginError(f"{plugin}: unknown option {key!r}")
        default = getattr(config, key)
        try:
            if isinstance(default, bool):
                parsed: Any = flag(value)
            elif isinstance(default, int):
                parsed = int(value)
            elif isinstance(default, float):
                parsed = float(value)
            else:
                parsed = None if value in (None, "") else str(value)
        except ValueError:
            wanted = "true or false" if isinstance(default, bool) else "a number"
            raise PluginError(f"{plugin}: option {key} expects {wanted}, got {value!r}") from None
        setattr(config, key, parsed)
    return config


def settings_class(plugin: Any) -> type | None:
    """The settings dataclass a plugin descriptor names in ``settings`` (None: it has none).

    :raises PluginError: when the named class cannot be imported or is not a dataclass.
    """
    path = getattr(plugin, "settings", None)
    if not path:
        return None
    module_name, _, attr = str(path).partition(":")
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise PluginError(f"{plugin.name}: settings {path!r} cannot be loaded: {exc}") from exc
    if not (isinstance(found, type) and is_dataclass(found)):
        raise PluginError(f"{plugin.name}: settings {path!r} is not a dataclass")
    return found


def describe(cls: type) -> list[Setting]:
    """The options a settings dataclass defines, in field order (fields with ``init=False``
    are the plugin's own state, not options)."""
    hints = typing.get_type_hints(cls)
    helps = _help_comments(cls)
    out = []
    for f in fields(cls):
        if not f.init:
            continue
        default = cls().__dict__[f.name]  # default_factory fields too
        kind, optional = _kind(hints.get(f.name), default)
        out.append(Setting(f.name, default, kind, optional, helps.get(f.name, "")))
    return out


def _kind(hint: Any, default: Any) -> tuple[str, bool]:
    """(kind, optional) of a field from its type hint (or its default's type)."""
    args = typing.get_args(hint)
    optional = type(None) in args or default is None
    base = next((a for a in args if a is not type(None)), hint) if args else hint
    for kind in (bool, int, float, str):
        if base is kind or (base is None and isinstance(default, kind)):
            return kind.__name__, optional
    return "str", optional


def _help_comments(cls: type) -> dict[str, str]:
    """Field name -> the ``#:`` comment lines right above it in the class body."""
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    pending: list[str] = []
    for line in lines:
        comment = _HELP.match(line)
        if comment:
            pending.append(comment.group(1).strip())
            continue
        found = _FIELD.match(line)
        if found and pending:
            out.setdefault(found.group(1), " ".join(pending))
        pending = []
    return out
