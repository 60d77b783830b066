"""The users file (``twistd -n mqhub --users FILE``): TOML read with the standard tomllib.

::

    [[user]]
    name = "alice"
    password_hash = "scrypt$14$8$1$..."   # or password = "..." (plain, for tests and local use)
    token = "..."                         # NATS auth_token, NSQ AUTH secret, admin Bearer token
    nkey = "U..."                         # NATS nkey public key
    tls_subject = "CN=alice"              # subject of a verified client certificate
    curve_key = "..."                     # eMQP CURVE public key (Z85, 40 characters)
    publish = ["orders.>"]                # NATS syntax: `*` one token, `>` the rest
    subscribe = ["orders.>", "_INBOX.>"]  # "PATTERN GROUP" limits the consumer group
    admin = false                         # admin API changes, `mqhub` admin commands, manhole

    [anonymous]                           # clients without credentials; absent = refused
    publish = []
    subscribe = ["public.>"]

Every key is checked: an unknown key, a duplicate name or credential, a bad pattern or hash
stops the start (or a reload keeps the rights in force) with the file, the user and the key
in the message. Pure module: no Twisted.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mqhub.identity.passwords import PasswordError, parse_hash
from mqhub.identity.rights import Grants, Rights, RightsError

__all__ = ["UserEntry", "UsersFile", "UsersFileError", "normalize_subject"]

USER_KEYS = frozenset({"name", "password_hash", "password", "token", "nkey", "tls_subject",
                       "curve_key", "publish", "subscribe", "admin"})
ANONYMOUS_KEYS = frozenset({"publish", "subscribe"})
#: a NATS user nkey: "U" then 55 base32 characters
_NKEY = re.compile(r"^U[A-Z2-7]{55}$")
#: a CURVE public key in Z85 (ZeroMQ's text form): 40 characters of its alphabet
_Z85 = re.compile(r"^[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}$")


class UsersFileError(ValueError):
    """The users file cannot be read or breaks a rule (the message names where)."""


def normalize_subject(subject: str) -> str:
    """A certificate subject in one spelling: ``CN=alice, O=Acme`` -> ``CN=alice,O=Acme``."""
    return ",".join(part.strip() for part in subject.split(","))


@dataclass(frozen=True)
class UserEntry:
    """One ``[[user]]`` of the file (credentials are compared, never logged)."""

    name: str
    rights: Rights
    password_hash: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    nkey: str | None = None
    tls_subject: str | None = None
    curve_key: str | None = None


@dataclass(frozen=True)
class UsersFile:
    """Every user of the file, and the anonymous rights (None: anonymous clients refused)."""

    users: Mapping[str, UserEntry]
    anonymous: Rights | None
    path: str | None = None

    @classmethod
    def load(cls, path: str) -> UsersFile:
        """Read and check ``path``.

        :raises UsersFileError: when it cannot be read or is invalid.
        """
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except OSError as exc:
            raise UsersFileError(f"users file {path}: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise UsersFileError(f"users file {path}: not TOML: {exc}") from None
        return cls.parse(data, path)

    @classmethod
    def parse(cls, data: Mapping[str, Any], path: str | None = None) -> UsersFile:
        """Check a parsed document.

        :raises UsersFileError: naming the user and key at fault.
        """
        where = f"users file {path}" if path else "users file"
        unknown = set(data) - {"user", "anonymous"}
        if unknown:
            raise UsersFileError(f"{where}: unknown section {sorted(unknown)[0]!r} "
                                 "(expected [[user]] and [anonymous])")
        records = data.get("user", [])
        if not isinstance(records, list):
            raise UsersFileError(f"{where}: users are [[user]] tables")
        users: dict[str, UserEntry] = {}
        seen: dict[tuple[str, str], str] = {}
        for i, record in enumerate(records):
            entry = _user(record, where, i + 1)
            if entry.name in users:
                raise UsersFileError(f"{where}: user {entry.name!r} is defined twice")
            for key in ("token", "nkey", "tls_subject", "curve_key"):
                value = getattr(entry, key)
                if value is not None:
                    other = seen.setdefault((key, value), entry.name)
                    if other != entry.name:
                        raise UsersFileError(
                            f"{where}: users {other!r} and {entry.name!r} share one {key}")
            users[entry.name] = entry
        anonymous = None
        if "anonymous" in data:
            section = data["anonymous"]
            if not isinstance(section, dict):
                raise UsersFileError(f"{where}: [anonymous] must be a table")
            bad = set(section) - ANONYMOUS_KEYS
            if bad:
                raise UsersFileError(f"{where}: [anonymous] has unknown key {sorted(bad)[0]!r} "
                                     "(allowed: publish, subscribe)")
            anonymous = Rights(_grants(section, "publish", f"{where}: [anonymous]"),
                               _grants(section, "subscribe", f"{where}: [anonymous]"))
        return cls(users, anonymous, path)


def _grants(record: Mapping[str, Any], key: str, where: str) -> Grants:
    """The ``publish`` or ``subscribe`` list of ``record`` as Grants."""
    value = record.get(key, [])
    if not isinstance(value, list):
        raise UsersFileError(f"{where}: {key} must be a list of patterns")
    try:
        return Grants.parse(value)
    except RightsError as exc:
        raise UsersFileError(f"{where}: {key}: {exc}") from None


def _text(record: Mapping[str, Any], key: str, where: str) -> str | None:
    """An optional non-empty string value."""
    value = record.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise UsersFileError(f"{where}: {key} must be a non-empty string")
    return value


def _user(record: Any, base: str, number: int) -> UserEntry:
    """Check one ``[[user]]`` table (the ``number``-th of the file ``base`` names)."""
    if not isinstance(record, dict):
        raise UsersFileError(f"{base}: user #{number} must be a table")
    name = record.get("name")
    if not isinstance(name, str) or not name or name != name.strip():
        raise UsersFileError(f"{base}: user #{number} needs a name (a non-empty string)")
    where = f"{base}: user {name!r}"
    unknown = set(record) - USER_KEYS
    if unknown:
        raise UsersFileError(f"{where}: unknown key {sorted(unknown)[0]!r} "
                             f"(allowed: {', '.join(sorted(USER_KEYS))})")
    password_hash = _text(record, "password_hash", where)
    password = _text(record, "password", where)
    if password_hash is not None and password is not None:
        raise UsersFileError(f"{where}: give password_hash or password, not both")
    if password_hash is not None:
        try:
            parse_hash(password_hash)
        except PasswordError as exc:
            raise UsersFileError(f"{where}: password_hash: {exc}") from None
    nkey = _text(record, "nkey", where)
    if nkey is not None and not _NKEY.match(nkey):
        raise UsersFileError(f"{where}: nkey must be a user public key (U + 55 characters)")
    curve_key = _text(record, "curve_key", where)
    if curve_key is not None and not _Z85.match(curve_key):
        raise UsersFileError(f"{where}: curve_key must be a Z85 public key (40 characters)")
    subject = _text(record, "tls_subject", where)
    admin = record.get("admin", False)
    if not isinstance(admin, bool):
        raise UsersFileError(f"{where}: admin must be true or false")
    rights = Rights(_grants(record, "publish", where), _grants(record, "subscribe", where), admin)
    return UserEntry(name, rights, password_hash, password, _text(record, "token", where), nkey,
                     normalize_subject(subject) if subject is not None else None, curve_key)
