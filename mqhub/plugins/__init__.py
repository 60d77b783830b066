"""mqhub's own twisted.plugin package: tiny IProtocolPlugin descriptors, found by name.

Every module here is a drop-in in the sense of Twisted's plugin howto ("Alternate Plugin
Packages"): :func:`mqhub.discovery.load_plugins` and ``twisted.plugin.getPlugins(IProtocolPlugin,
mqhub.plugins)`` both read it. Directories given with ``--plugin-path DIR`` or
``MQHUB_PLUGIN_PATH`` contribute their ``DIR/mqhub/plugins`` folder to this package's path,
and so does any ``sys.path`` entry holding a ``mqhub/plugins`` folder without ``__init__.py``.
"""

from twisted.plugin import pluginPackagePaths

__path__.extend(pluginPackagePaths(__name__))  # noqa: F821
