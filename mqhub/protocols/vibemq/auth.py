"""VibeMQ users: the ``--vibemq-users`` JSON file, password checks, ACL globs, admin edits.

File format (``password`` is plain text written by an operator; the broker rewrites users it
creates or changes with ``passwordHash``, PBKDF2-SHA256)::

    {"users": [
      {"username": "admin", "password": "secret", "superuser": true},
      {"username": "app", "passwordHash": "pbkdf2_sha256$20000$<salt hex>$<hash hex>",
       "permissions": [{"queuePattern": "orders.*", "operations": ["Publish", "Subscribe"]}]}
    ]}

With the hub's users file (``--users``) a Connect's username and password are checked there
first; this file (``--vibemq-users``) is kept as a shorthand and answers for names the users
file does not know. Its users become principals whose grants are their Publish and Subscribe
globs (:meth:`User.principal`); their other operations keep this file's per-operation ACL.
:class:`VibeGuard` is what the adapter asks. No Twisted import.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from mqhub.identity import ALL_RIGHTS, Grants, Principal, Rights, Session

OPERATIONS = ("Publish", "Subscribe", "CreateQueue", "DeleteQueue", "PurgeQueue",
              "GetQueueInfo", "ListQueues")
_OPS_LOWER = {op.lower(): op for op in OPERATIONS}
ITERATIONS = 20_000


class UsersError(ValueError):
    """The users file or an admin request is invalid."""


def hash_password(password: str, salt: bytes | None = None, iterations: int = ITERATIONS) -> str:
    """``pbkdf2_sha256$<iterations>$<salt hex>$<hash hex>`` for ``password``."""
    salt = salt if salt is not None else os.urandom(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    return f"pbkdf2_sha256${iterations}${salt.hex()}${digest.hex()}"


def check_hash(password: str, stored: str) -> bool:
    """Whether ``password`` matches a :func:`hash_password` string."""
    try:
        algo, iterations, salt, digest = stored.split("$")
        if algo != "pbkdf2_sha256":
            return False
        got = hashlib.pbkdf2_hmac("sha256", password.encode(), bytes.fromhex(salt),
                                  int(iterations))
    except ValueError:
        return False
    return hmac.compare_digest(got.hex(), digest)


def normalize_operation(op: Any) -> str:
    """The canonical operation name of ``op`` (a name in any case, or its enum number)."""
    if isinstance(op, int) and not isinstance(op, bool) and 0 <= op < len(OPERATIONS):
        return OPERATIONS[op]
    if isinstance(op, str) and op.lower() in _OPS_LOWER:
        return _OPS_LOWER[op.lower()]
    raise UsersError(f"unknown operation {op!r}")


def glob_matches(pattern: str, queue: str) -> bool:
    """Case-insensitive ACL glob: ``*`` matches anything, dots included."""
    return _glob_regex(pattern).fullmatch(queue.lower()) is not None


@lru_cache(maxsize=1024)
def _glob_regex(pattern: str) -> re.Pattern[str]:
    """The compiled regex of an ACL glob (built once per pattern, not on every publish)."""
    return re.compile("".join(".*" if ch == "*" else re.escape(ch) for ch in pattern.lower()))


@dataclass
class User:
    """One user: a password hash (or operator-written plain password) and its grants."""

    username: str
    password_hash: str | None = None
    password: str | None = None
    superuser: bool = False
    permissions: dict[str, set[str]] = field(default_factory=dict)

    def check(self, password: str) -> bool:
        """Whether ``password`` is this user's."""
        if self.password_hash:
            return check_hash(password, self.password_hash)
        return self.password is not None and hmac.compare_digest(self.password, password)

    def allowed(self, operation: str, queue: str | None) -> bool:
        """Whether this user may do ``operation`` on ``queue`` (None: any queue)."""
        if self.superuser:
            return True
        for pattern, ops in self.permissions.items():
            if operation in ops and (queue is None or glob_matches(pattern, queue)):
                return True
        return False

    def principal(self) -> Principal:
        """This user as a principal: its Publish and Subscribe globs (read at each decision,
        so admin commands take effect at once) are legacy grants; a superuser may do all."""
        if self.superuser:
            return Principal(self.username, ALL_RIGHTS, "vibemq-users")

        def publish(address: str, group: str | None) -> bool:
            return self.allowed("Publish", address)

        def subscribe(address: str, group: str | None) -> bool:
            return self.allowed("Subscribe", address)

        return Principal(self.username, Rights(Grants(matchers=(publish,)),
                                               Grants(matchers=(subscribe,))), "vibemq-users")

    def to_json(self) -> dict[str, Any]:
        """The file record of this user."""
        out: dict[str, Any] = {"username": self.username}
        if self.password_hash:
            out["passwordHash"] = self.password_hash
        elif self.password is not None:
            out["password"] = self.password
        if self.superuser:
            out["superuser"] = True
        if self.permissions:
            out["permissions"] = [{"queuePattern": p, "operations": sorted(ops)}
                                  for p, ops in self.permissions.items()]
        return out


class UserStore:
    """The users of one broker, loaded from (and saved back to) a JSON file."""

    def __init__(self, users: dict[str, User], path: str | None = None) -> None:
        """:param path: where admin changes are saved (None: kept in memory only)."""
        self.users = users
        self.path = path
        self._ok: set[tuple[str, str]] = set()

    @classmethod
    def load(cls, path: str) -> UserStore:
        """Read ``path``.

        :raises UsersError: when it cannot be read or is malformed.
        """
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError) as exc:
            raise UsersError(f"cannot read users file {path}: {exc}") from exc
        users: dict[str, User] = {}
        try:
            for rec in data["users"]:
                name = rec["username"]
                if not isinstance(name, str) or not name:
                    raise UsersError("every user needs a username")
                perms: dict[str, set[str]] = {}
                for p in rec.get("permissions", ()):
                    perms.setdefault(p["queuePattern"], set()).update(
                        normalize_operation(op) for op in p["operations"])
                users[name] = User(name, rec.get("passwordHash"), rec.get("password"),
                                   bool(rec.get("superuser", False)), perms)
        except (KeyError, TypeError) as exc:
            raise UsersError(f"malformed users file {path}: {exc!r}") from exc
        return cls(users, path)

    def authenticate(self, username: str, password: str) -> User | None:
        """The user if the password is right (successful checks are cached by digest)."""
        user = self.users.get(username)
        if user is None:
            return None
        key = (username, hashlib.sha256(password.encode()).hexdigest())
        if key in self._ok:
            return user
        if user.check(password):
            self._ok.add(key)
            return user
        return None

    def save(self) -> None:
        """Write the users back atomically (no-op without a path)."""
        self._ok.clear()
        if self.path is None:
            return
        directory = os.path.dirname(os.path.abspath(self.path))
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".vibemq-users")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"users": [u.to_json() for u in self.users.values()]}, fh, indent=2)
        os.replace(tmp, self.path)

    # admin operations (raise UsersError with the VibeMQ code as args[0]) ------------------------

    def create(self, username: str, password: str) -> None:
        """AdminCreateUser."""
        if username in self.users:
            raise UsersError("USER_EXISTS", f"User '{username}' already exists.")
        self.users[username] = User(username, hash_password(password))
        self.save()

    def delete(self, username: str, actor: str) -> None:
        """AdminDeleteUser (a user cannot delete itself)."""
        if username not in self.users:
            raise UsersError("USER_NOT_FOUND", f"User '{username}' not found.")
        if username == actor:
            raise UsersError("FORBIDDEN", "Cannot delete yourself.")
        del self.users[username]
        self.save()

    def change_password(self, username: str, password: str) -> None:
        """AdminChangePassword."""
        user = self._get(username)
        user.password_hash, user.password = hash_password(password), None
        self.save()

    def grant(self, username: str, pattern: str, operations: list[Any]) -> None:
        """AdminGrantPermission."""
        user = self._get(username)
        ops = {normalize_operation(op) for op in operations}
        user.permissions.setdefault(pattern, set()).update(ops)
        self.save()

    def revoke(self, username: str, pattern: str) -> None:
        """AdminRevokePermission (every operation on that pattern)."""
        self._get(username).permissions.pop(pattern, None)
        self.save()

    def _get(self, username: str) -> User:
        """The user or USER_NOT_FOUND."""
        user = self.users.get(username)
        if user is None:
            raise UsersError("USER_NOT_FOUND", f"User '{username}' not found.")
        return user


#: operations answered from the users file's rights: the queue's address must be ...
NEEDS_PUBLISH_OR_SUBSCRIBE = frozenset({"CreateQueue", "GetQueueInfo", "ListQueues"})
NEEDS_SUBSCRIBE = frozenset({"Subscribe", "DeleteQueue", "PurgeQueue"})


class VibeGuard:
    """Identity for VibeMQ connections: the hub's users (when enforcing) and the users file.

    :param identity: the hub's :class:`mqhub.identity.Directory`, or None.
    :param users: the ``--vibemq-users`` file, or None.
    """

    def __init__(self, identity: Any, users: UserStore | None) -> None:
        """Nothing is checked when neither is in force (:attr:`active` is False)."""
        self.identity = identity
        self.users = users
        self.enforcing = identity is not None and identity.enforcing
        #: False: the open broker of the original's default (no Connect needed)
        self.active = self.enforcing or users is not None

    def wait(self, peer: str) -> float:
        """Seconds a Connect from ``peer`` waits before it is checked (failed-login slowdown)."""
        return self.identity.login_wait(peer) if self.identity is not None else 0.0

    def connect(self, name: str | None, password: str | None,
                peer: str) -> tuple[Session | None, User | None] | str:
        """The session (and legacy user) a Connect opens, or the error code to answer
        (``AUTH_REQUIRED``: credentials missing and no anonymous rights; ``AUTH_FAILED``)."""
        directory = self.identity
        if not name or not password:
            if self.enforcing and directory.anonymous is not None:
                return directory.anonymous_session("vibemq", peer), None
            return "AUTH_REQUIRED"
        principal = directory.by_password(name, password) if self.enforcing else None
        user: User | None = None
        if principal is None and self.users is not None:
            user = self.users.authenticate(name, password)
            principal = user.principal() if user is not None else None
        if principal is None:
            if directory is not None:
                directory.login_failed("vibemq", peer, name[:64])
            return "AUTH_FAILED"
        if directory is None:
            return Session("vibemq", principal, peer), user
        directory.login_succeeded(peer)
        return directory.session("vibemq", principal, peer), user


def allowed(session: Session, user: User | None, operation: str, queue: str | None) -> bool:
    """May this connection do ``operation`` on ``queue`` (None: any)? A refusal is counted.

    A ``--vibemq-users`` user keeps that file's per-operation ACL. For a users-file principal:
    Publish needs publish on the queue's address, Subscribe, DeleteQueue and PurgeQueue need
    subscribe, CreateQueue, GetQueueInfo and ListQueues either right.
    """
    if user is not None:
        ok = user.allowed(operation, queue)
    elif queue is None:
        ok = operation in NEEDS_PUBLISH_OR_SUBSCRIBE or operation == "Publish"
    elif operation == "Publish":
        ok = session.may_publish(queue)
    elif operation in NEEDS_SUBSCRIBE:
        ok = session.may_subscribe(queue)
    else:
        ok = session.may_publish(queue) or session.may_subscribe(queue)
    if not ok:
        session.refuse("publish" if operation == "Publish" else "subscribe",
                       f"{queue or '*'} ({operation})")
    return ok


__all__ = ["UserStore", "User", "UsersError", "OPERATIONS", "VibeGuard", "allowed",
           "hash_password", "check_hash", "glob_matches", "normalize_operation"]
