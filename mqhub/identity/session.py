"""One connection's principal and its cached decisions (the per-connection decision cache).

A protocol adapter holds one :class:`Session` per authenticated connection when rights are in
force, and None otherwise (no users file, no protocol auth option: every client may do
everything, and nothing is checked). A decision is made once per address (or subscription
pattern and group) and kept in a dict, so the hot path pays a dict lookup, not a pattern
match; a reload of the users file empties the caches. Pure module: no Twisted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mqhub.identity.rights import Principal

__all__ = ["Session", "PUBLISH", "SUBSCRIBE", "LOGIN", "ADMIN"]

#: actions counted in ``mqhub_auth_denied_total{protocol,action}``
PUBLISH, SUBSCRIBE, LOGIN, ADMIN = "publish", "subscribe", "login", "admin"
#: decisions one session remembers before it starts over (bounds a client that names many)
CACHE_LIMIT = 4096

Refused = Callable[["Session", str, str], None]
#: makes a connection's handle on the core (mqhub.identity.guarded.GuardedCore)
Guard = Callable[[Any, "Session"], Any]
#: the cache key of "may receive, in some group" decisions (no group name holds a NUL)
ANY_GROUP = "\x00any"


class Session:
    """Who one connection is, what it may do, and what it has been told.

    :ivar protocol: the adapter's protocol name (a label of the denial counters).
    :ivar principal: the :class:`Principal` the connection acts as (replaced on reload).
    :ivar peer: the client's address, for logs.
    :ivar on_revoke: called after a reload changed the rights (the adapter drops what the
        connection may no longer hold); None: nothing to re-check.
    :ivar publish_all: the principal may publish anywhere (adapters may skip the check).
    :ivar subscribe_all: the principal may subscribe to anything.
    """

    __slots__ = ("protocol", "principal", "peer", "on_revoke", "publish_all", "subscribe_all",
                 "_refused", "_guard", "_publish", "_subscribe", "__weakref__")

    def __init__(self, protocol: str, principal: Principal, peer: str = "",
                 refused: Refused | None = None, guard: Guard | None = None) -> None:
        """:param refused: called with (session, action, address) for every refusal (the
        directory counts and logs it).
        :param guard: makes this session's handle on the core (:meth:`handle`)."""
        self.protocol = protocol
        self.peer = peer
        self.on_revoke: Callable[[Session], None] | None = None
        self._refused = refused
        self._guard = guard
        self._publish: dict[str, bool] = {}
        self._subscribe: dict[tuple[str, str | None], bool] = {}
        self.principal = principal
        self.publish_all = principal.rights.publish.everything
        self.subscribe_all = principal.rights.subscribe.everything

    def __repr__(self) -> str:
        """Protocol and user (never a credential)."""
        return f"<Session {self.protocol} {self.principal.label}>"

    @property
    def user(self) -> str:
        """The principal's name for logs and admin rows."""
        return self.principal.label

    def may_publish(self, address: str) -> bool:
        """May this connection publish to ``address``? (cached)"""
        ok = self._publish.get(address)
        if ok is None:
            ok = _remember(self._publish, address, self.principal.rights.publish.allows(address))
        return ok

    def may_subscribe(self, pattern: str, group: str | None = None) -> bool:
        """May this connection receive everything ``pattern`` matches (as ``group``)? (cached)"""
        key = (pattern, group)
        ok = self._subscribe.get(key)
        if ok is None:
            ok = _remember(self._subscribe, key,
                           self.principal.rights.subscribe.covers(pattern, group))
        return ok

    def may_receive(self, pattern: str) -> bool:
        """May this connection receive everything ``pattern`` matches, in some group? (cached;
        the core seam's question when a queue is bound or attached)"""
        key = (pattern, ANY_GROUP)
        ok = self._subscribe.get(key)
        if ok is None:
            ok = _remember(self._subscribe, key, self.principal.rights.subscribe.reaches(pattern))
        return ok

    def handle(self, core: Any) -> Any:
        """This connection's handle on ``core`` (``ICore.session(session)`` returns it): the
        rights enforced at the seam (:mod:`mqhub.identity.guarded`), or the core itself when
        the session was made without a guard."""
        return self._guard(core, self) if self._guard is not None else core

    @property
    def admin(self) -> bool:
        """May this connection administer the hub?"""
        return self.principal.rights.admin

    def refuse(self, action: str, address: str) -> None:
        """Count and log one refusal of ``action`` on ``address``."""
        if self._refused is not None:
            self._refused(self, action, address)

    def check_publish(self, address: str) -> bool:
        """:meth:`may_publish`, counting a refusal."""
        if self.publish_all or self.may_publish(address):
            return True
        self.refuse(PUBLISH, address)
        return False

    def check_subscribe(self, pattern: str, group: str | None = None) -> bool:
        """:meth:`may_subscribe`, counting a refusal."""
        if self.subscribe_all or self.may_subscribe(pattern, group):
            return True
        self.refuse(SUBSCRIBE, pattern if group is None else f"{pattern} {group}")
        return False

    def replace(self, principal: Principal) -> None:
        """Act as ``principal`` from now on (a reload): forget every cached decision."""
        self.principal = principal
        self.publish_all = principal.rights.publish.everything
        self.subscribe_all = principal.rights.subscribe.everything
        self._publish.clear()
        self._subscribe.clear()


def _remember(cache: dict[Any, bool], key: Any, ok: bool) -> bool:
    """Keep one decision (the cache starts over past CACHE_LIMIT); return it."""
    if len(cache) >= CACHE_LIMIT:
        cache.clear()
    cache[key] = ok
    return ok
