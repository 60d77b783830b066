"""NATS identity: CONNECT's credentials onto the hub's users, and per-subject rights.

:class:`NatsGuard` answers CONNECT. With the hub's users file (``--users``) the order is
nats-server's: an ``nkey`` (its ``sig`` over the INFO ``nonce`` checked by
:attr:`NatsGuard.nkey_verifier`), ``user``/``pass``, ``auth_token``, then the subject of a
verified client certificate (the connection's ``verified_subject``), and a client with none of
them gets the ``[anonymous]`` rights (nats-server's ``no_auth_user``) or ``Authorization
Violation``. The plugin's own ``token`` / ``user`` + ``password`` options stay a shorthand: such
a client may do everything. Without a users file those options alone decide, as before.

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

import secrets as _secrets
from collections.abc import Callable
from typing import Any

from mqhub.identity import ALL_RIGHTS, Principal, Session

__all__ = ["NatsGuard", "PublishTables", "publish_violation", "subscribe_violation"]

#: a restricted publisher's tables are emptied past this many lines (like the server's)
TABLE_LIMIT = 65536

#: ``verify(public_nkey, signature, nonce) -> bool`` (nkeys support plugs in here)
NkeyVerifier = Callable[[str, str, str], bool]


def publish_violation(subject: str) -> str:
    """nats-server's -ERR text for a refused publish."""
    return f'Permissions Violation for Publish to "{subject}"'


def subscribe_violation(subject: str, queue: str | None) -> str:
    """nats-server's -ERR text for a refused subscription."""
    if queue:
        return f'Permissions Violation for Subscription to "{subject}" using queue "{queue}"'
    return f'Permissions Violation for Subscription to "{subject}"'


class NatsGuard:
    """Who a NATS CONNECT makes a connection (see the module doc).

    :param identity: the hub's :class:`mqhub.identity.Directory`, or None.
    :param settings: the server's NatsSettings (the ``token`` / ``user`` + ``password``
        shorthand options).
    """

    def __init__(self, identity: Any, settings: Any) -> None:
        """Nothing is checked when neither a users file nor an auth option is set."""
        self.identity = identity
        self.settings = settings
        self.enforcing = identity is not None and identity.enforcing
        #: checks an nkey's signature of the nonce (None: nkey users cannot log in)
        self.nkey_verifier: NkeyVerifier | None = None

    @property
    def required(self) -> bool:
        """INFO's ``auth_required`` (and whether CONNECT is checked at all)."""
        return self.enforcing or bool(self.settings.auth_required)

    def wait(self, peer: str) -> float:
        """Seconds a CONNECT from ``peer`` waits before it is checked (failed-login slowdown)."""
        return self.identity.login_wait(peer) if self.identity is not None else 0.0

    def connect(self, opts: dict[str, Any], peer: str, nonce: str | None = None,
                verified_subject: str | None = None) -> Session | None | bool:
        """Check CONNECT's credentials.

        Returns the connection's session (users file in force), None (accepted, nothing to
        check per subject), or False (``Authorization Violation``; counted and held against
        the peer).
        """
        principal = self._principal(opts, nonce, verified_subject)
        directory = self.identity
        if principal is False:
            if directory is not None:
                user = opts.get("user") or opts.get("nkey")
                directory.login_failed("nats", peer, str(user)[:64] if user else None)
            return False
        if directory is not None and _gave_credentials(opts):
            directory.login_succeeded(peer)
        if principal is None:
            return None
        return directory.session("nats", principal, peer)

    def _principal(self, opts: dict[str, Any], nonce: str | None,
                   verified_subject: str | None) -> Principal | None | bool:
        """The principal of these credentials; None: accepted without per-subject rights;
        False: refused."""
        s = self.settings
        user, password, token = opts.get("user"), opts.get("pass"), opts.get("auth_token")
        if s.auth_required and _shorthand_ok(s, user, password, token):
            return Principal("nats-option", ALL_RIGHTS, "option") if self.enforcing else None
        if not self.enforcing:
            return False
        directory = self.identity
        nkey = opts.get("nkey")
        if isinstance(nkey, str) and nkey:
            verify = self.nkey_verifier
            sig = opts.get("sig")
            if verify is None or nonce is None or not isinstance(sig, str) or \
                    not verify(nkey, sig, nonce):
                return False
            return directory.by_nkey(nkey) or False
        if user is not None or password is not None:
            if not isinstance(user, str) or not isinstance(password, str):
                return False
            return directory.by_password(user, password) or False
        if token is not None:
            return (directory.by_token(token) or False) if isinstance(token, str) else False
        if verified_subject is not None:
            return directory.by_tls_subject(verified_subject) or False
        return directory.anonymous or False


def _shorthand_ok(settings: Any, user: Any, password: Any, token: Any) -> bool:
    """Whether the plugin's own token or user/password option accepts these credentials."""
    if settings.token:
        return isinstance(token, str) and _secrets.compare_digest(
            token.encode(), settings.token.encode())
    return (isinstance(user, str) and isinstance(password, str)
            and _secrets.compare_digest(user.encode(), (settings.user or "").encode())
            and _secrets.compare_digest(password.encode(), (settings.password or "").encode()))


def _gave_credentials(opts: dict[str, Any]) -> bool:
    """True when CONNECT named a user, token or nkey."""
    return any(opts.get(k) for k in ("user", "pass", "auth_token", "nkey"))


class PublishTables:
    """A restricted publisher's own route tables (line routes, head routes, and per receiver
    the head table the frame scanner checks a stretch against).

    Only subjects the session may publish to get in, so a hit in the fast path is allowed;
    the tables empty themselves when the server's routing epoch moves on (or on reload), as
    the server's own do.
    """

    __slots__ = ("session", "routes", "head_routes", "receivers", "epoch")

    def __init__(self, session: Session) -> None:
        """Start empty."""
        self.session = session
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

    def clear(self) -> None:
        """Forget every route (the rights or the routing changed)."""
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
        self.head_routes[key] = (head[0], head[1], head[2], table)
