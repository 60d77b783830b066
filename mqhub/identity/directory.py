"""The hub's identity directory: credentials to principals, sessions, reloads, denials.

One :class:`Directory` per hub (``hub.identity``). Without ``--users`` it is not *enforcing*:
protocols keep today's behaviour (every client may do everything, or a protocol's own auth
option decides) and create no session for ordinary connections. With a users file, every
protocol maps its own credentials onto a user here (``by_token``, ``by_password``,
``by_secret``, ``by_nkey``, ``by_tls_subject``, ``by_curve_key``, ``named``), or onto the
``[anonymous]`` rights when the client presents none.

The directory also keeps what operations needs: the denial counters
(``mqhub_auth_denied_total{protocol,action}``), a rate-limited denial log that names user,
protocol, action and address and never a credential, a per-peer slowdown of failed logins
(:class:`LoginThrottle`), and :meth:`Directory.reload` (SIGHUP, ``POST /api/users/reload``),
after which every live session gets its principal's new rights and is asked to drop what it
may no longer hold. The clock is injected; the only I/O is reading the users file.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import weakref
from collections import OrderedDict
from typing import Any

from twisted.logger import Logger

from mqhub.identity.guarded import GuardedCore
from mqhub.identity.passwords import check_password
from mqhub.identity.rights import NOTHING, Principal, Rights
from mqhub.identity.session import LOGIN, Session
from mqhub.identity.users import UserEntry, UsersFile, UsersFileError, normalize_subject

__all__ = ["Directory", "LoginThrottle", "Refusals", "UsersFileError"]

log = Logger(namespace="mqhub.identity")

#: denial log lines allowed per window; the rest are counted and summed up in one line
LOG_BURST = 20
LOG_WINDOW = 10.0
#: successful password checks remembered (per reload) so reconnects skip the KDF
VERIFIED_LIMIT = 10_000


class LoginThrottle:
    """Slows down repeated failed logins from one peer (an address, without the port).

    The first ``free`` failures cost nothing. After them, each further attempt from that peer
    is evaluated only at its turn: turns are ``base`` seconds apart, doubling with every
    failure up to ``cap``, so a peer trying passwords over many connections at once gets one
    evaluation per turn in total. A success forgets the peer; so does ``forget`` seconds of
    quiet. At most ``max_peers`` peers are remembered (the least recently seen go first).
    """

    def __init__(self, clock: Any, *, free: int = 3, base: float = 0.25, cap: float = 8.0,
                 forget: float = 600.0, max_peers: int = 10_000) -> None:
        """:param clock: IReactorTime."""
        self.clock = clock
        self.free, self.base, self.cap = free, base, cap
        self.forget, self.max_peers = forget, max_peers
        #: peer -> [failures, next turn, last seen]
        self._peers: OrderedDict[str, list[float]] = OrderedDict()

    def _spacing(self, failures: float) -> float:
        """Seconds between turns after ``failures`` failures."""
        return min(self.cap, self.base * 2.0 ** max(0.0, failures - self.free))

    def _state(self, peer: str, now: float) -> list[float] | None:
        """The peer's state, or None when it has nothing held against it."""
        state = self._peers.get(peer)
        if state is not None and now - state[2] > self.forget:
            del self._peers[peer]
            return None
        return state

    def wait(self, peer: str) -> float:
        """Seconds until this peer's next login attempt may be evaluated (0: now).

        Reserves that turn: call it once per attempt, then evaluate after the delay.
        """
        now = self.clock.seconds()
        state = self._state(peer, now)
        if state is None or state[0] < self.free:
            return 0.0
        turn = max(now, state[1])
        state[1] = turn + self._spacing(state[0])
        state[2] = now
        return turn - now

    def failed(self, peer: str) -> None:
        """Count one failed login of ``peer``."""
        now = self.clock.seconds()
        state = self._state(peer, now)
        if state is None:
            state = self._peers[peer] = [0.0, now, now]
            while len(self._peers) > self.max_peers:
                self._peers.popitem(last=False)
        state[0] += 1
        state[2] = now
        self._peers.move_to_end(peer)
        if state[0] >= self.free:
            state[1] = max(state[1], now + self._spacing(state[0]))

    def succeeded(self, peer: str) -> None:
        """A successful login: nothing is held against ``peer`` any more."""
        self._peers.pop(peer, None)


class Refusals:
    """Counts refusals by (protocol, action) and logs them, at most LOG_BURST lines per
    LOG_WINDOW seconds (then one line saying how many were not logged).

    :ivar counters: ``(protocol, action) -> refusals`` (``mqhub_auth_denied_total``).
    """

    def __init__(self, clock: Any) -> None:
        """Nothing counted yet."""
        self.clock = clock
        self.counters: dict[tuple[str, str], int] = {}
        self._logged = 0
        self._window_start = float("-inf")
        self._unlogged = 0

    def count(self, protocol: str, action: str, n: int = 1) -> None:
        """Add ``n`` to the counter of (protocol, action)."""
        key = (protocol, action)
        self.counters[key] = self.counters.get(key, 0) + n

    def log(self, text: str, **fields: Any) -> None:
        """Log one refusal line unless this window's lines are used up."""
        now = self.clock.seconds()
        if now - self._window_start >= LOG_WINDOW:
            if self._unlogged:
                log.warn("{n} more auth refusals were not logged (counted in "
                         "mqhub_auth_denied_total)", n=self._unlogged)
            self._window_start, self._logged, self._unlogged = now, 0, 0
        if self._logged >= LOG_BURST:
            self._unlogged += 1
            return
        self._logged += 1
        log.warn(text, **fields)

    def by_protocol(self) -> dict[str, dict[str, int]]:
        """``{protocol: {action: n}}`` for ``/api/stats``."""
        out: dict[str, dict[str, int]] = {}
        for (protocol, action), n in sorted(self.counters.items()):
            out.setdefault(protocol, {})[action] = n
        return out


class Directory:
    """Users, sessions, denials and login slowdown of one hub (see the module doc).

    :ivar enforcing: True when a users file is in force.
    :ivar refusals: the denial counters and log (:class:`Refusals`; actions: publish,
        subscribe, login, admin).
    """

    def __init__(self, clock: Any, path: str | None = None,
                 throttle: LoginThrottle | None = None) -> None:
        """:param path: the users file (None: no users file; call :meth:`load` to read it)."""
        self.clock = clock
        self.path = path
        self.enforcing = path is not None
        self.throttle = throttle or LoginThrottle(clock)
        self.refusals = Refusals(clock)
        #: ``(protocol, action) -> refusals`` (the Refusals' own dict)
        self.counters = self.refusals.counters
        self.generation = 0
        self.reloads = 0
        self._file: UsersFile | None = None
        self._principals: dict[str, Principal] = {}
        self._anonymous: Principal | None = None
        self._tokens: dict[bytes, UserEntry] = {}
        self._by_key: dict[tuple[str, str], UserEntry] = {}
        self._verified: OrderedDict[tuple[str, bytes], None] = OrderedDict()
        self._pepper = os.urandom(32)
        self._sessions: weakref.WeakSet[Session] = weakref.WeakSet()

    # loading ------------------------------------------------------------------------------

    def load(self) -> None:
        """Read the users file (nothing to do without one).

        :raises UsersFileError: when it cannot be read or is invalid.
        """
        if self.path is not None:
            self._install(UsersFile.load(self.path))

    def _install(self, users: UsersFile) -> None:
        """Make ``users`` the file in force and index its credentials."""
        self._file = users
        self.generation += 1
        self._principals = {name: Principal(name, u.rights) for name, u in users.users.items()}
        self._anonymous = (Principal(None, users.anonymous, "anonymous")
                           if users.anonymous is not None else None)
        self._tokens = {_digest(u.token): u for u in users.users.values() if u.token}
        self._by_key = {}
        for u in users.users.values():
            for kind in ("nkey", "tls_subject", "curve_key"):
                value = getattr(u, kind)
                if value is not None:
                    self._by_key[(kind, value)] = u
        self._verified.clear()

    def reload(self) -> dict[str, Any]:
        """Re-read the users file and re-check every live session.

        A session keeps its user (by name) with the new rights; a user no longer in the file
        keeps no rights; anonymous sessions get the new ``[anonymous]`` rights (none if it is
        gone). Each session's ``on_revoke`` then drops what it may no longer hold.

        :raises UsersFileError: when the new file is invalid (the rights in force stay).
        """
        if self.path is None:
            raise UsersFileError("no users file is configured (twistd mqhub --users FILE)")
        try:
            users = UsersFile.load(self.path)
        except UsersFileError as exc:
            log.error("users file not reloaded, the rights in force stay: {error}", error=exc)
            raise
        self._install(users)
        self.reloads += 1
        sessions = list(self._sessions)
        for session in sessions:
            old = session.principal
            if old.source == "users":
                new = self._principals.get(old.name or "") or Principal(old.name, Rights(NOTHING,
                                                                                         NOTHING))
            elif old.source == "anonymous":
                new = self._anonymous or Principal(None, Rights(), "anonymous")
            else:
                continue  # a protocol's own option or legacy file: not in the users file
            session.replace(new)
        for session in sessions:
            if session.on_revoke is not None:
                try:
                    session.on_revoke(session)
                except Exception:  # noqa: BLE001 - one adapter's bug must not stop the reload
                    log.failure("re-checking {session} after the reload failed", session=session)
        summary = {"users": len(users.users), "anonymous": users.anonymous is not None,
                   "sessions": len(sessions), "generation": self.generation}
        log.info("users file reloaded: {users} users, anonymous {anon}, {sessions} sessions "
                 "re-checked", users=summary["users"],
                 anon="allowed" if summary["anonymous"] else "refused",
                 sessions=summary["sessions"])
        return summary

    # principals ---------------------------------------------------------------------------

    @property
    def anonymous(self) -> Principal | None:
        """The principal of clients without credentials (None: they are refused)."""
        return self._anonymous

    @property
    def users(self) -> UsersFile | None:
        """The users file in force."""
        return self._file

    def named(self, name: str) -> Principal | None:
        """The user called ``name`` (a listener-level user, e.g. ``mqks.user``)."""
        return self._principals.get(name)

    def by_token(self, token: str) -> Principal | None:
        """The user whose ``token`` this is (compared in constant time)."""
        entry = self._tokens.get(_digest(token))
        if entry is None or entry.token is None or not hmac.compare_digest(
                entry.token.encode(), token.encode()):
            return None
        return self._principals.get(entry.name)

    def by_password(self, name: str, password: str) -> Principal | None:
        """The user ``name`` if ``password`` is right (a success is remembered until reload)."""
        entry = self._file.users.get(name) if self._file is not None else None
        if entry is None:
            return None
        key = (name, hmac.new(self._pepper, password.encode(), hashlib.sha256).digest())
        if key in self._verified:
            return self._principals.get(name)
        if entry.password_hash is not None:
            ok = check_password(password, entry.password_hash)
        elif entry.password is not None:
            ok = hmac.compare_digest(entry.password.encode(), password.encode())
        else:
            ok = False
        if not ok:
            return None
        self._verified[key] = None
        if len(self._verified) > VERIFIED_LIMIT:
            self._verified.popitem(last=False)
        return self._principals.get(name)

    def by_secret(self, secret: str) -> Principal | None:
        """NSQ's AUTH secret: a user's token, or ``NAME:PASSWORD``."""
        found = self.by_token(secret)
        if found is None and ":" in secret:
            name, _, password = secret.partition(":")
            found = self.by_password(name, password)
        return found

    def by_authorization(self, header: str) -> tuple[Principal | None, bool, str | None]:
        """An HTTP ``Authorization`` header (``Bearer TOKEN`` or ``Basic`` name:password).

        Returns ``(principal or None, whether credentials were given, the user name tried)``.
        """
        scheme, _, value = header.strip().partition(" ")
        value = value.strip()
        if scheme.lower() == "bearer" and value:
            return self.by_token(value), True, None
        if scheme.lower() == "basic" and value:
            try:
                text = base64.b64decode(value, validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                return None, True, None
            name, _, password = text.partition(":")
            return (self.by_password(name, password) if name else None), True, name or None
        return None, False, None

    def by_nkey(self, public_key: str) -> Principal | None:
        """The user with this NATS nkey (call only after its signature was verified)."""
        entry = self._by_key.get(("nkey", public_key))
        return self._principals.get(entry.name) if entry is not None else None

    def by_tls_subject(self, subject: str) -> Principal | None:
        """The user with this verified client certificate subject."""
        entry = self._by_key.get(("tls_subject", normalize_subject(subject)))
        return self._principals.get(entry.name) if entry is not None else None

    def by_curve_key(self, z85: str) -> Principal | None:
        """The user with this eMQP CURVE public key (Z85)."""
        entry = self._by_key.get(("curve_key", z85))
        return self._principals.get(entry.name) if entry is not None else None

    def has_credentials(self, *kinds: str) -> bool:
        """True when some user has one of ``kinds`` (token, password, nkey, tls_subject,
        curve_key) — e.g. whether NSQ should announce ``auth_required``."""
        if self._file is None:
            return False
        for u in self._file.users.values():
            for kind in kinds:
                if kind == "password" and (u.password or u.password_hash):
                    return True
                if kind != "password" and getattr(u, kind, None):
                    return True
        return False

    # sessions ------------------------------------------------------------------------------

    def session(self, protocol: str, principal: Principal, peer: str = "") -> Session:
        """A session for one connection acting as ``principal`` (re-checked on reload)."""
        session = Session(protocol, principal, peer, self.denied, GuardedCore)
        self._sessions.add(session)
        return session

    def anonymous_session(self, protocol: str, peer: str = "") -> Session | None:
        """A session with the anonymous rights, or None when anonymous clients are refused."""
        anon = self._anonymous
        return self.session(protocol, anon, peer) if anon is not None else None

    def session_count(self) -> int:
        """Live sessions."""
        return len(self._sessions)

    # denials and logins ------------------------------------------------------------------

    def denied(self, session: Session, action: str, address: str) -> None:
        """A session's refusal (the :class:`Session` callback): see :meth:`refused`."""
        self.refused(session.protocol, session.user, action, address)

    def refused(self, protocol: str, user: str, action: str, address: str) -> None:
        """Count and (rate-limited) log a refusal: user, protocol, action, address."""
        self.refusals.count(protocol, action)
        self.refusals.log("refused: user {user} protocol {protocol} action {action} "
                          "address {address}", user=user, protocol=protocol, action=action,
                          address=address[:256])

    def login_wait(self, peer: str) -> float:
        """Seconds a login attempt from ``peer`` must wait before it is evaluated."""
        return self.throttle.wait(peer)

    def login_failed(self, protocol: str, peer: str, user: str | None = None) -> None:
        """A failed login: counted, logged (the name tried, never a password) and held
        against the peer."""
        self.throttle.failed(peer)
        self.refusals.count(protocol, LOGIN)
        self.refusals.log("refused: login protocol {protocol} peer {peer} user {user}",
                          protocol=protocol, peer=peer, user=user if user is not None else "-")

    def login_succeeded(self, peer: str) -> None:
        """A successful login: the peer owes nothing."""
        self.throttle.succeeded(peer)

    def stats(self) -> dict[str, Any]:
        """The ``auth`` row of ``/api/stats``."""
        denied = self.refusals.by_protocol()
        users = self._file
        return {"enforcing": self.enforcing, "users": len(users.users) if users else 0,
                "anonymous": (users.anonymous is not None) if users else None,
                "sessions": len(self._sessions), "reloads": self.reloads, "denied": denied}


def _digest(token: str) -> bytes:
    """Index key of a token (the lookup itself leaks nothing about other tokens)."""
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
