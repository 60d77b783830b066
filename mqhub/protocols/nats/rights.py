"""NATS identity: CONNECT's credentials onto the hub's users, and per-subject rights.

:class:`NatsGuard` answers CONNECT. With the hub's users file (``--users``) it is asked first, in
nats-server's order: an ``nkey`` (its ``sig`` over the INFO nonce verified by
:class:`~mqhub.protocols.nats.auth.NkeyCheck`), ``user``/``pass``, ``auth_token``, then the
subject of a verified client certificate; a client that names none of them gets the
``[anonymous]`` rights, or with the ``no_auth_user`` option acts as that user (of the users
file, or of the plugin's ``users``/``user``: nats-server's ``no_auth_user``). Credentials the
users file does not
know go to the plugin's own checks (:class:`~mqhub.protocols.nats.auth.Authenticator`: the
``token`` / ``user`` options, nkey and ``users`` lists, operator JWTs), whose principal becomes
a shorthand user: its NATS permissions (allow and deny lists) are its grants. Without a users
file those checks alone decide, as before. Either way the rights are one
:class:`mqhub.identity.Session` per connection.

Rights are nats-server's: a PUB to a subject the user may not publish to is answered
``-ERR 'Permissions Violation for Publish to "x"'``, a SUB whose subject (wildcards included)
the user's subscribe grants do not cover ``-ERR 'Permissions Violation for Subscription to
"x"'`` (``... using queue "q"`` for a queue group); the connection stays open.

A publisher whose rights are not "everything" routes through :class:`PublishTables`: its own
copies of the server's route tables that only hold subjects it may publish to, so the fast
path's one dict lookup per line is also its rights check (a miss goes the slow way, where the
subject is checked once and, when allowed, its route copied in). The whole-read frame scanner
checks every frame of a stretch against the receiver's head table; such a publisher gets its
own copy of that table too, holding only the heads it may publish.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from mqhub.identity import EVERYTHING, Grants, Principal, Rights, Session
from mqhub.protocols.nats.auth import (
    ANONYMOUS,
    Authenticator,
    AuthError,
    Credentials,
    NkeyCheck,
    Permissions,
)
from mqhub.protocols.nats.auth import Principal as NatsPrincipal
from mqhub.protocols.nats.router import fold_counts

__all__ = ["Admitted", "NatsGuard", "PublishTables", "publish_violation",
           "subscribe_violation"]

#: a restricted publisher's tables are emptied past this many lines (like the server's)
TABLE_LIMIT = 65536
#: CONNECT fields that carry credentials
CREDENTIAL_FIELDS = ("user", "pass", "auth_token", "nkey", "jwt")


def publish_violation(subject: str) -> str:
    """nats-server's -ERR text for a refused publish."""
    return f'Permissions Violation for Publish to "{subject}"'


def subscribe_violation(subject: str, queue: str | None) -> str:
    """nats-server's -ERR text for a refused subscription."""
    if queue:
        return f'Permissions Violation for Subscription to "{subject}" using queue "{queue}"'
    return f'Permissions Violation for Subscription to "{subject}"'


class Admitted(NamedTuple):
    """What an accepted CONNECT makes of a connection."""

    #: who it is for monitoring (name, account) and when its credentials expire
    principal: NatsPrincipal
    #: what it may do (None: nothing is checked per subject)
    session: Session | None


class NatsGuard:
    """Who a NATS CONNECT makes a connection (see the module doc).

    :param identity: the hub's :class:`mqhub.identity.Directory`, or None.
    :param auth: the plugin's own credential checks.
    :param no_auth_user: the user a CONNECT without credentials acts as (nats-server's
        ``no_auth_user``), or None.
    """

    def __init__(self, identity: Any, auth: Authenticator,
                 no_auth_user: str | None = None) -> None:
        """Nothing is checked when neither a users file nor a check of the plugin is set."""
        self.identity = identity
        self.auth = auth
        self.no_auth_user = no_auth_user
        self.enforcing = identity is not None and identity.enforcing

    @property
    def required(self) -> bool:
        """INFO's ``auth_required`` (and whether CONNECT is checked at all)."""
        return self.enforcing or self.auth.required

    @property
    def needs_nonce(self) -> bool:
        """Whether INFO carries a nonce (an nkey or JWT check, or nkey users in the file)."""
        return self.auth.needs_nonce or (self.enforcing and self.identity.has_credentials("nkey"))

    def wait(self, peer: str) -> float:
        """Seconds a CONNECT from ``peer`` waits before it is checked (failed-login slowdown)."""
        return self.identity.login_wait(peer) if self.identity is not None else 0.0

    def connect(self, opts: dict[str, Any], peer: str, nonce: str | None,
                tls_subject: str | None, now: float) -> Admitted | None:
        """Check CONNECT's credentials: what the connection is, or None (``Authorization
        Violation``; the failure is counted, logged and held against the peer)."""
        creds = Credentials(opts, nonce, tls_subject)
        directory = self.identity
        try:
            admitted = self._admit(creds, now)
        except AuthError as exc:
            if directory is not None:
                user = creds.get("user") or creds.get("nkey")
                directory.login_failed("nats", peer, f"{user[:64] or '-'} ({exc})"[:160])
            return None
        if directory is not None and any(creds.get(k) for k in CREDENTIAL_FIELDS):
            directory.login_succeeded(peer)
        return admitted

    def knows(self, name: str) -> bool:
        """Whether ``name`` is a user of the users file or of the plugin's checks."""
        return (self.enforcing and self.identity.named(name) is not None) \
            or self.auth.named(name) is not None

    def _admit(self, creds: Credentials, now: float) -> Admitted:
        """The users file first, then the plugin's checks (``no_auth_user`` for a CONNECT
        without credentials).

        :raises AuthError: refused.
        """
        if self.no_auth_user is not None and self._bare(creds):
            return self._as_user(self.no_auth_user)
        if self.enforcing:
            found = self._users_file(creds, now)
            if found is not None:
                return Admitted(NatsPrincipal(found.name or ""),
                                self.identity.session("nats", found))
        if not self.auth.required:
            if self.enforcing:
                raise AuthError("no user of the users file, and anonymous clients are refused")
            return Admitted(ANONYMOUS, None)
        principal = self.auth.authenticate(creds, now)
        return Admitted(principal, self._shorthand_session(principal))

    def _bare(self, creds: Credentials) -> bool:
        """No credentials: no CONNECT field, no certificate subject the users file maps."""
        if any(creds.get(k) for k in CREDENTIAL_FIELDS):
            return False
        return creds.tls_subject is None or not self.enforcing \
            or self.identity.by_tls_subject(creds.tls_subject) is None

    def _as_user(self, name: str) -> Admitted:
        """Admit as the user ``name`` without its credentials (``no_auth_user``).

        :raises AuthError: no such user (any more: a reloaded users file dropped it).
        """
        if self.enforcing:
            found = self.identity.named(name)
            if found is not None:
                return Admitted(NatsPrincipal(found.name or ""),
                                self.identity.session("nats", found))
        principal = self.auth.named(name)
        if principal is None:
            raise AuthError(f"no_auth_user {name!r} is no user")
        return Admitted(principal, self._shorthand_session(principal))

    def _users_file(self, creds: Credentials, now: float) -> Principal | None:
        """The users-file principal these credentials name (None: the file does not know them).

        :raises AuthError: credentials the file knows, but wrong.
        """
        directory = self.identity
        nkey, user, token = creds.get("nkey"), creds.get("user"), creds.get("auth_token")
        if nkey and not creds.get("jwt"):
            found = directory.by_nkey(nkey)
            if found is not None:   # the nonce signed by that key (nkeys + PyNaCl)
                NkeyCheck({nkey: NatsPrincipal(nkey)}).authenticate(creds, now)
            return found
        if user:
            if directory.users is not None and user in directory.users.users:
                found = directory.by_password(user, creds.get("pass"))
                if found is None:
                    raise AuthError(f"bad password for {user!r}")
                return found
            return None
        if token:
            return directory.by_token(token)
        if creds.tls_subject is not None:
            found = directory.by_tls_subject(creds.tls_subject)
            if found is not None:
                return found
        if not any(creds.get(k) for k in CREDENTIAL_FIELDS):
            return directory.anonymous
        return None

    def _shorthand_session(self, principal: NatsPrincipal) -> Session | None:
        """A principal of the plugin's own checks as a user: its NATS permissions are its
        grants (None when it may do everything and no users file is in force)."""
        if not principal.restricted and not self.enforcing:
            return None
        rights = Rights(_grants(principal.publish), _grants(principal.subscribe))
        user = Principal(principal.name or None, rights, "option")
        if self.identity is not None:
            return self.identity.session("nats", user)
        return Session("nats", user)


def _grants(permissions: Permissions | None) -> Grants:
    """NATS allow/deny lists as grants (None: every subject)."""
    if permissions is None:
        return EVERYTHING
    return Grants(oracles=(lambda pattern, group: permissions.permits(pattern),))


class PublishTables:
    """A restricted publisher's own route tables (line routes, head routes, and per receiver
    the head table the frame scanner checks a stretch against).

    Only subjects the session may publish to get in, so a hit in the fast path is allowed;
    the tables empty themselves when the server's routing epoch moves on (or on reload), as
    the server's own do.
    """

    __slots__ = ("session", "routes", "head_routes", "receivers", "epoch", "stats")

    def __init__(self, session: Session, stats: dict[str, int]) -> None:
        """Start empty; delivery counts of dropped routes go to ``stats`` (the server's)."""
        self.session = session
        self.stats = stats
        self.routes: dict[bytes, tuple] = {}
        self.head_routes: dict[bytes, tuple] = {}
        #: receiving connection -> head -> MSG head, for the allowed heads only
        self.receivers: dict[Any, dict[bytes, bytes]] = {}
        self.epoch = -1

    def tables(self, epoch: int) -> tuple[dict[bytes, tuple], dict[bytes, tuple]]:
        """The tables for routing epoch ``epoch`` (emptied when it changed)."""
        if epoch != self.epoch:
            self.epoch = epoch
            self.clear()
        return self.routes, self.head_routes

    def fold(self, stats: dict[str, int]) -> None:
        """Fold the delivery counts of these copies (``router.fold_counts``): they share the
        server's count cells, but may outlive the server's dropping of a route."""
        fold_counts(self.routes.values(), stats)
        fold_counts(self.head_routes.values(), stats)

    def clear(self) -> None:
        """Forget every route (the rights or the routing changed)."""
        self.fold(self.stats)
        self.routes.clear()
        self.head_routes.clear()
        self.receivers.clear()

    def keep(self, hit: tuple, route: tuple, server_heads: dict[bytes, tuple]) -> None:
        """Copy an allowed line's route (and its head route, if the server made one)."""
        line = hit[0]
        routes = self.routes
        if len(routes) >= TABLE_LIMIT:
            self.clear()
        routes[line] = route
        sp = line.rfind(b" ")
        if sp <= 0:
            return
        key = line[:sp]
        head = server_heads.get(key)
        if head is None:
            return
        table = None
        if head[2] is not None and head[3] is not None and key in head[3]:
            # one receiver: the scanner checks a stretch against this publisher's copy of its
            # head table, which holds only heads this publisher may publish
            table = self.receivers.setdefault(head[2][0], {})
            table[key] = head[3][key]
        self.head_routes[key] = (head[0], head[1], head[2], table, head[4])
