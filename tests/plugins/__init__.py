"""Test-only drop-in plugins, laid out as a plugin path: tests/plugins/mqhub/plugins/*.py.

The ``mqhub/plugins`` folders below have no ``__init__.py`` on purpose: they are a plugin
directory added to ``mqhub.plugins.__path__``, never a package of their own.
"""
