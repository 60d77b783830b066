"""Test-only drop-in plugins, laid out as a plugin path: tests/plugins/mqhub/plugins/*.py.

The ``mqhub/plugins`` folders below have no ``__init__.py`` on purpose: they are a plugin
directory added to ``mqhub.plugins.__path__``, never a package of their own.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import mqhub.plugins

TEST_PLUGINS = Path(__file__).resolve().parent
EXAMPLE_PLUGINS = TEST_PLUGINS.parent.parent / "plugins"


@contextmanager
def isolated_plugin_path() -> Iterator[None]:
    """Restore ``mqhub.plugins.__path__`` and forget drop-in modules loaded meanwhile."""
    saved_path = list(mqhub.plugins.__path__)
    saved_modules = {n for n in sys.modules if n.startswith("mqhub.plugins.")}
    try:
        yield
    finally:
        mqhub.plugins.__path__[:] = saved_path
        for name in [n for n in sys.modules if n.startswith("mqhub.plugins.")]:
            if name not in saved_modules:
                del sys.modules[name]
