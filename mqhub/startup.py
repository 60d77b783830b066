"""Fast start: the global reactor imported without pyOpenSSL when nothing of a start uses TLS.

Twisted's reactor imports its TLS support whether or not anything uses it: ``posixbase``
imports ``twisted.internet.ssl`` and ``tcp`` imports ``twisted.protocols.tls``, which pull in
pyOpenSSL, cryptography's X.509 layer and service_identity: 45–80 ms of a 250 ms start to the
first NATS ``INFO`` on the 2-vCPU machines (benchmarks/results/startup.md). Both imports are
guarded by ``except ImportError`` in Twisted, which then runs without TLS. So when the
parsed options name no TLS setting and every endpoint is plain TCP, :func:`import_reactor`
imports the reactor while ``import OpenSSL`` fails, and lets it import again right after
(so a library that wants it later, such as autobahn, still gets it). That process then has
no TLS transports, which nothing in it asked for; :func:`tls_available` tells
:mod:`mqhub.tls` so, which refuses to build a TLS context with a clear error instead of a
failing handshake.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping, Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from typing import Any

from mqhub.listener import PLAIN_TCP

__all__ = ["import_reactor", "needs_tls", "tls_available"]

#: option names (any level) that mean "this start serves or checks TLS" when set
TLS_WORDS = ("tls", "ssl")

#: set when this process's reactor was imported without TLS support
_without_tls = False


class _NoPyOpenSSL(MetaPathFinder):
    """Makes ``import OpenSSL`` fail (while the reactor is imported)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: Any = None) -> ModuleSpec | None:
        """Refuse pyOpenSSL; leave every other module to the other finders."""
        if fullname == "OpenSSL" or fullname.startswith("OpenSSL."):
            raise ImportError(f"{fullname}: not imported, no TLS in this start (mqhub.startup)")
        return None


def _settings(value: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """Every (name, value) pair in nested option mappings and lists."""
    if isinstance(value, Mapping):
        for name, inner in value.items():
            yield from _settings(inner, str(name))
    elif isinstance(value, (list, tuple)):
        for inner in value:
            yield from _settings(inner, key)
    else:
        yield key, value


def needs_tls(options: Mapping[str, Any], endpoints: Sequence[str]) -> bool:
    """Whether a start with ``options`` (twistd's parsed options, plugin settings included)
    and listening on ``endpoints`` may use TLS: any set option whose name says TLS or SSL
    (``--admin-tls-cert``, ``nats.tls_cert``, ``nats.ws_tls_key``, NSQ's ``tls_cert``...), or
    any endpoint that is not plain TCP (``ssl:``, and to stay on the safe side everything
    else but ``tcp:PORT[:interface=...][:backlog=...]``)."""
    for name, value in _settings(dict(options)):
        if value not in (None, False, "", 0) and any(w in name.lower() for w in TLS_WORDS):
            return True
    return not all(PLAIN_TCP.fullmatch(e) for e in endpoints)


def import_reactor(options: Mapping[str, Any], endpoints: Sequence[str]) -> Any:
    """The global reactor, imported without pyOpenSSL unless :func:`needs_tls` says this
    start may use TLS (or the reactor module is already loaded, e.g. by ``--reactor``)."""
    global _without_tls
    loaded = "twisted.internet.posixbase" in sys.modules or "OpenSSL" in sys.modules
    if loaded or needs_tls(options, endpoints):
        from twisted.internet import reactor
        return reactor
    blocker = _NoPyOpenSSL()
    sys.meta_path.insert(0, blocker)
    try:
        from twisted.internet import reactor
    finally:
        sys.meta_path.remove(blocker)
    _without_tls = "OpenSSL" not in sys.modules
    return reactor


def tls_available() -> bool:
    """False when this process's reactor was imported without TLS support."""
    return not _without_tls
