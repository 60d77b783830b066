"""eMQP identity: a CURVE client key is a user; without CURVE every peer is anonymous.

With the hub's users file (``--users``) and CURVE (``--option emqp.curve_secret_file=...``),
the ZAP handler lets in the keys of users that have a ``curve_key``, the keys of
``emqp.curve_clients`` (those act as anonymous), and, when ``[anonymous]`` exists, any other
key (as anonymous). ZeroMQ stamps each message with its sender's key (the ZAP User-Id), so a
peer is its key's user. Without CURVE ZeroMQ authenticates nobody: every peer is anonymous.

Rights, in the model's terms (eMQP queue ``Q`` is address ``emqp.jobs.Q``):

- REQUEST and SCHEDULE to ``Q`` need publish on ``emqp.jobs.Q``; a refused REQUEST is
  answered with a result REPLY ``{"value": "PermissionError: ..."}`` (eMQP has no error frame;
  that is what a failed job looks like to the client); a refused SCHEDULE is dropped;
- a worker's INFORM serves only the queues it may subscribe to (``emqp.jobs.Q``); the others
  are left out, and a worker left with none gets no ACK;
- PUBLISH to a topic needs publish on the topic (refused: dropped, there is no reply path);
- the PUB socket sends to whoever is connected, so a topic goes out on it only when every
  principal that can connect may subscribe to it: anonymous (unless CURVE lets in only
  known keys) and every user with a ``curve_key``.

Refusals are counted and logged by the directory like every protocol's. No Twisted import.
"""

from __future__ import annotations

import os
from typing import Any

from mqhub.identity import Rights, Session

__all__ = ["EmqpGuard", "refusal_result"]

#: peers whose key is remembered per socket before the table starts over
PEER_LIMIT = 50_000


def refusal_result(what: str) -> bytes:
    """The result a refused REQUEST's client gets (a failed job's shape)."""
    text = what.replace("\\", "\\\\").replace('"', '\\"')
    return b'{"value": "PermissionError: ' + text.encode("utf-8", "replace") + b'"}'


class EmqpGuard:
    """Sessions of eMQP peers (by their CURVE key) and the PUB audience's rights.

    :param identity: the hub's :class:`mqhub.identity.Directory`, or None.
    :param clients_dir: ``emqp.curve_clients`` (public certificates let in), or None.
    :param curve: whether the sockets speak CURVE.
    """

    def __init__(self, identity: Any, curve: bool = False, clients_dir: str | None = None) -> None:
        """Nothing is checked without a users file (:attr:`enforcing` False)."""
        self.identity = identity
        self.enforcing = identity is not None and identity.enforcing
        self.curve = curve
        self._dir_keys = _certificate_keys(clients_dir) if clients_dir else frozenset()
        self.open_dir = curve and clients_dir is None
        #: routing id -> the sender's key (Z85), kept per socket by the sockets' reads
        self.keys: dict[str, dict[bytes, str]] = {}
        self._sessions: dict[str, Session | None] = {}
        self._audience: dict[str, bool] = {}
        self._generation = -1
        self._on_change: list[Any] = []

    # ZAP (the authenticator thread calls this) ---------------------------------------------

    def callback(self, domain: str, key: bytes) -> bool:
        """pyzmq's CURVE credentials provider: may the client with this Z85 key connect?"""
        z85 = key.decode("ascii", "replace")
        if not self.enforcing:
            return self.open_dir or z85 in self._dir_keys
        if z85 in self._dir_keys:
            return True
        directory = self.identity
        return directory.by_curve_key(z85) is not None or directory.anonymous is not None

    # sessions ------------------------------------------------------------------------------

    def table(self, role: str) -> dict[bytes, str] | None:
        """The routing id -> key table a socket fills (None: keys are not needed)."""
        if not (self.enforcing and self.curve):
            return None
        return self.keys.setdefault(role, {})

    def session(self, role: str, peer: bytes) -> Session | None:
        """The session of ``peer`` on socket ``role`` (None: refused — no anonymous rights)."""
        self._fresh()
        table = self.keys.get(role)
        key = table.get(peer, "") if table is not None else ""
        if len(table or ()) > PEER_LIMIT and table is not None:
            table.clear()
        found = self._sessions.get(key, False)
        if found is not False:
            return found  # type: ignore[return-value]
        directory = self.identity
        principal = directory.by_curve_key(key) if key else None
        if principal is None:
            principal = directory.anonymous
        session = directory.session("emqp", principal) if principal is not None else None
        if session is not None:
            session.on_revoke = self._revoked
        self._sessions[key] = session
        return session

    def on_change(self, callback: Any) -> None:
        """Call ``callback()`` after a reload changed the rights (the router re-checks workers)."""
        self._on_change.append(callback)

    def _revoked(self, session: Session) -> None:
        """A reload: forget the PUB audience's answers, let the router re-check its workers."""
        self._audience.clear()
        for callback in self._on_change:
            callback()

    def _fresh(self) -> None:
        """Drop the cached sessions when the users file was reloaded (users may be new)."""
        generation = self.identity.generation
        if generation != self._generation:
            self._generation = generation
            self._sessions.clear()
            self._audience.clear()

    def may_publish(self, role: str, peer: bytes, address: str) -> bool:
        """May ``peer`` publish to ``address`` (refusal counted)?"""
        session = self.session(role, peer)
        if session is None:
            self.identity.refused("emqp", "(anonymous)", "publish", address)
            return False
        return session.check_publish(address)

    def may_receive(self, role: str, peer: bytes, address: str) -> bool:
        """May ``peer`` receive what is published to ``address`` (refusal counted)?"""
        session = self.session(role, peer)
        if session is None:
            self.identity.refused("emqp", "(anonymous)", "subscribe", address)
            return False
        return session.check_subscribe(address)

    def audience_may(self, address: str) -> bool:
        """May every principal that can connect to PUB read ``address``? (cached)"""
        self._fresh()
        ok = self._audience.get(address)
        if ok is None:
            ok = self._audience_decides(address)
            if len(self._audience) >= PEER_LIMIT:
                self._audience.clear()
            self._audience[address] = ok
            if not ok:
                self.identity.refused("emqp", "(PUB subscribers)", "subscribe", address)
        return ok

    def _audience_decides(self, address: str) -> bool:
        """Work out :meth:`audience_may` (see the module doc)."""
        directory = self.identity
        readers: list[Rights] = []
        anonymous_can_connect = not self.curve or bool(self._dir_keys) or \
            directory.anonymous is not None
        if anonymous_can_connect:
            if directory.anonymous is None:
                return False
            readers.append(directory.anonymous.rights)
        users = directory.users
        if self.curve and users is not None:
            readers.extend(u.rights for u in users.users.values() if u.curve_key)
        return all(r.subscribe.allows(address) for r in readers)


def _certificate_keys(directory: str) -> frozenset[str]:
    """The Z85 public keys of the certificates in ``directory``."""
    import zmq.auth

    keys: set[str] = set()
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if not name.endswith(".key") or not os.path.isfile(path):
            continue
        try:
            public, _ = zmq.auth.load_certificate(path)
        except (OSError, ValueError):
            continue
        keys.add(public.decode("ascii"))
    return frozenset(keys)

