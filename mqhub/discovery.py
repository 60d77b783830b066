"""Finding protocol plugins: mqhub.plugins plus drop-in directories, failures reported by file.

Strategy: the modules are the ones ``twisted.plugin.getPlugins(IProtocolPlugin, mqhub.plugins)``
would read (every module on ``mqhub.plugins.__path__``, providers found by ``IPlugin.providedBy``
and adapted to IProtocolPlugin). We import them ourselves instead of going through
``getPlugins`` because Twisted logs a bare traceback for a module that fails to import and
keeps going; mqhub must name the broken file and its error in one line, and load the rest.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twisted.plugin import IPlugin
from twisted.python.modules import getModule

import mqhub.plugins
from mqhub.interfaces import IProtocolPlugin

ENV_PLUGIN_PATH = "MQHUB_PLUGIN_PATH"


@dataclass
class Discovery:
    """What plugin discovery found.

    :ivar plugins: plugin name -> provider, sorted by name.
    :ivar aliases: every accepted name or alias -> canonical plugin name.
    :ivar failures: ``(file name, one-line error)`` for every module that could not be loaded.
    """

    plugins: dict[str, Any] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    failures: list[tuple[str, str]] = field(default_factory=list)


def plugin_dirs(extra: Iterable[str] = (), environ: dict[str, str] | None = None) -> list[str]:
    """Drop-in roots from ``--plugin-path`` values followed by ``MQHUB_PLUGIN_PATH`` entries."""
    env = os.environ if environ is None else environ
    roots = [str(d) for d in extra]
    roots.extend(p for p in env.get(ENV_PLUGIN_PATH, "").split(os.pathsep) if p)
    return roots


def add_plugin_dirs(roots: Sequence[str]) -> list[str]:
    """Add ``ROOT/mqhub/plugins`` of each root to ``mqhub.plugins.__path__``; return those added.

    A root may also name the ``mqhub/plugins`` folder itself, or any folder of ``.py`` files.
    """
    added = []
    for root in roots:
        base = Path(root).resolve()
        candidate = base / "mqhub" / "plugins"
        folder = str(candidate if candidate.is_dir() else base)
        if folder not in mqhub.plugins.__path__:
            mqhub.plugins.__path__.append(folder)
            added.append(folder)
    return added


def _one_line(exc: BaseException) -> str:
    """``Type: message`` on one line."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def load_plugins(roots: Sequence[str] = ()) -> Discovery:
    """Load every plugin module on ``mqhub.plugins.__path__`` (plus ``roots``), sorted by name.

    A module that fails to import, or a provider whose name clashes with one already found, is
    recorded in ``failures`` and everything else still loads.
    """
    add_plugin_dirs(roots)
    importlib.invalidate_caches()
    found = Discovery()
    providers: list[Any] = []
    package = getModule(mqhub.plugins.__name__)
    for module_info in package.iterModules():
        module_name = module_info.name
        file_name = module_info.filePath.path
        try:
            module = sys.modules.get(module_name) or importlib.import_module(module_name)
        except BaseException as exc:  # noqa: BLE001 - a drop-in may raise anything
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            sys.modules.pop(module_name, None)
            found.failures.append((file_name, _one_line(exc)))
            continue
        for value in vars(module).values():
            if not IPlugin.providedBy(value):
                continue
            plugin = IProtocolPlugin(value, None)
            if plugin is not None and plugin not in providers:
                providers.append(plugin)
    for plugin in sorted(providers, key=lambda p: p.name):
        names = [plugin.name, *getattr(plugin, "aliases", ())]
        clash = [n for n in names if n in found.aliases]
        if clash:
            found.failures.append(
                (plugin.name, f"name {clash[0]!r} is already taken by {found.aliases[clash[0]]}")
            )
            continue
        found.plugins[plugin.name] = plugin
        for n in names:
            found.aliases[n] = plugin.name
    return found
