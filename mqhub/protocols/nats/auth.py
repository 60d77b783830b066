"""NATS authentication: the credentials a CONNECT carries -> an authenticated principal.

One seam for every way a NATS client proves who it is (sans-IO: no Twisted import). A
:class:`Credentials` record holds what the client sent (``auth_token``, ``user``/``pass``,
``nkey``, ``jwt``, ``sig``), the nonce the server put in INFO and the subject of a verified TLS
client certificate. An :class:`Authenticator` asks its checks in order; the first that claims
the credentials decides: it returns a :class:`Principal` (a name and its publish/subscribe
rights, and when it expires) or raises :class:`AuthError`. Each check is one small class with
``claims`` and ``authenticate`` (the :class:`CredentialCheck` protocol), so the hub-wide users
file (issue 24) plugs in as one more check.

Built-in checks, as nats-server's ``authorization {}`` and operator mode have them:

- :class:`TokenCheck` (``auth_token``) and :class:`PasswordCheck` (one ``user``/``pass``);
- :class:`NkeyCheck`: ``nkey`` users; the client signs the INFO nonce with its seed and CONNECT
  carries the public key and the signature (verified with the ``nkeys`` package);
- :class:`JwtCheck`: operator mode with a memory resolver. A user JWT in CONNECT must be signed
  by an account (or one of its signing keys) whose account JWT is preloaded and signed by the
  configured operator (or one of its signing keys); the nonce must be signed by the user's key;
  the JWT's ``exp``/``nbf`` and its ``pub``/``sub`` permissions are enforced.

Signatures are checked by PyNaCl (Ed25519) with the key decoded by ``nkeys``' own checksum and
prefix helpers: nothing here does crypto itself.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["AuthError", "Permissions", "Principal", "ANONYMOUS", "Credentials",
           "CredentialCheck", "TokenCheck", "PasswordCheck", "NkeyCheck", "JwtCheck",
           "Authenticator", "shared_secret_checks", "users_checks", "decode_jwt", "load_resolver_preload", "covers", "overlaps",
           "new_nonce"]

#: nats-server's -ERR text for every failed login (it never says which part was wrong)
AUTH_VIOLATION = "Authorization Violation"
#: the -ERR text of a connection whose credentials expired while connected
AUTH_EXPIRED = "User Authentication Expired"
#: decisions remembered per Permissions before the cache starts over (bounded memory)
CACHE_LIMIT = 4096


class AuthError(Exception):
    """Credentials refused; ``str(err)`` is for the log, the wire always gets AUTH_VIOLATION."""


def _tokens(subject: str) -> list[str]:
    """A subject or pattern's dot-separated tokens."""
    return subject.split(".")


def covers(pattern: str, subject: str) -> bool:
    """Whether every subject ``subject`` (itself possibly a wildcard pattern) can match also
    matches ``pattern``: ``foo.>`` covers ``foo.*`` and ``foo.bar``, ``foo.*`` does not cover
    ``foo.>``."""
    pt, st = _tokens(pattern), _tokens(subject)
    for i, tok in enumerate(pt):
        if tok == ">":
            return len(st) > i
        if i >= len(st):
            return False
        if st[i] == ">":
            return False
        if tok != "*" and (st[i] == "*" or tok != st[i]):
            return False
    return len(pt) == len(st)


def overlaps(a: str, b: str) -> bool:
    """Whether some literal subject matches both patterns ``a`` and ``b``."""
    at, bt = _tokens(a), _tokens(b)
    for i in range(max(len(at), len(bt))):
        x = at[i] if i < len(at) else None
        y = bt[i] if i < len(bt) else None
        if x == ">" or y == ">":
            return x is not None and y is not None
        if x is None or y is None:
            return False
        if x != "*" and y != "*" and x != y:
            return False
    return True


@dataclass(eq=False)
class Permissions:
    """Allow and deny lists of subject patterns for one direction (publish or subscribe).

    ``allow`` None means everything not denied. Publishing checks a literal subject; a
    subscription's pattern must be covered by an allowed pattern and must not overlap any
    denied one (mqhub refuses such a subscription outright where nats-server would filter the
    denied subjects out of it later: nothing denied can ever be delivered through it).
    """

    allow: tuple[str, ...] | None = None
    deny: tuple[str, ...] = ()
    _cache: dict[str, bool] = field(default_factory=dict, repr=False)

    def permits(self, subject: str) -> bool:
        """Whether the literal ``subject`` (or the subscription pattern ``subject``) is allowed;
        cached, so the hot path pays one dict lookup per subject."""
        known = self._cache.get(subject)
        if known is not None:
            return known
        ok = (self.allow is None or any(covers(p, subject) for p in self.allow)) and not any(
            overlaps(p, subject) for p in self.deny)
        if len(self._cache) >= CACHE_LIMIT:
            self._cache.clear()
        self._cache[subject] = ok
        return ok

    @classmethod
    def from_claim(cls, claim: Mapping[str, Any] | None) -> Permissions | None:
        """From a JWT / nats-server ``{"allow": [...], "deny": [...]}`` block (None: no limit)."""
        if not claim:
            return None
        allow = claim.get("allow")
        deny = claim.get("deny") or ()
        if not allow and not deny:
            return None
        return cls(tuple(allow) if allow else None, tuple(deny))


@dataclass(frozen=True)
class Principal:
    """Who a connection is: a name, its rights (None: unrestricted) and its expiry (POSIX s)."""

    name: str
    publish: Permissions | None = None
    subscribe: Permissions | None = None
    expires: float | None = None
    account: str = ""

    @property
    def restricted(self) -> bool:
        """Whether any publish or subscribe right is limited."""
        return self.publish is not None or self.subscribe is not None


#: the principal of a connection when no authentication is configured
ANONYMOUS = Principal("")


@dataclass(frozen=True)
class Credentials:
    """What one CONNECT offers, with the server-side context a check may need."""

    options: Mapping[str, Any]
    nonce: str | None = None
    tls_subject: str | None = None

    def get(self, key: str) -> str:
        """A CONNECT field as a string ("" when absent or not a string)."""
        value = self.options.get(key)
        return value if isinstance(value, str) else ""


class CredentialCheck(Protocol):
    """One way of authenticating (token, password, nkey, JWT, a users file...)."""

    #: whether this check needs a nonce in INFO (signature-based)
    needs_nonce: bool

    def claims(self, creds: Credentials) -> bool:
        """Whether ``creds`` are of this check's kind (it then decides alone)."""

    def authenticate(self, creds: Credentials, now: float) -> Principal:
        """The principal for ``creds``, or raise :class:`AuthError`."""


def _same(given: str, expected: str) -> bool:
    """Constant-time string equality."""
    return secrets.compare_digest(given.encode(), expected.encode())


@dataclass
class TokenCheck:
    """nats-server's ``authorization { token }``: one shared token."""

    token: str
    needs_nonce: bool = False

    def claims(self, creds: Credentials) -> bool:
        """Every CONNECT that is not an nkey/JWT one is judged by the token."""
        return True

    def authenticate(self, creds: Credentials, now: float) -> Principal:
        """Compare the token in constant time."""
        if not _same(creds.get("auth_token"), self.token):
            raise AuthError("bad token")
        return Principal("token")


@dataclass
class PasswordCheck:
    """nats-server's ``authorization { user, password }`` or ``users = [...]``.

    :param users: user name -> (password, principal).
    """

    users: dict[str, tuple[str, Principal]]
    needs_nonce: bool = False

    def claims(self, creds: Credentials) -> bool:
        """Every CONNECT that is not an nkey/JWT one is judged by user and password."""
        return True

    def authenticate(self, creds: Credentials, now: float) -> Principal:
        """Compare the password in constant time (against a dummy for an unknown user)."""
        password, principal = self.users.get(creds.get("user"), ("\0unknown", None))
        if not _same(creds.get("pass"), password) or principal is None:
            raise AuthError(f"bad user or password for {creds.get('user')!r}")
        return principal


def _decode_sig(sig: str) -> bytes:
    """A CONNECT ``sig``: base64 (URL-safe or standard alphabet, padded or not)."""
    text = sig.strip().replace("-", "+").replace("_", "/")
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


def _public_key_bytes(public_key: str) -> bytes:
    """The raw Ed25519 key inside an nkey public key (base32: role prefix, key, CRC-16), checked
    with the ``nkeys`` package's prefix and checksum helpers."""
    import nkeys  # imported on first use: only nkey/JWT deployments pay for it

    text = public_key.strip().encode()
    try:
        raw = base64.b32decode(text + b"=" * (-len(text) % 8))
    except (binascii.Error, ValueError) as exc:
        raise AuthError(f"not an nkey: {public_key!r}") from exc
    if len(raw) != 35 or not nkeys.valid_public_prefix_byte(raw[0]) \
            or nkeys.crc16_checksum(raw[:33]) != raw[33:]:
        raise AuthError(f"not an nkey public key: {public_key!r}")
    return raw[1:33]


def _verify(public_key: str, data: bytes, signature: bytes) -> bool:
    """Whether ``signature`` over ``data`` is by the nkey ``public_key`` (Ed25519 via PyNaCl)."""
    from nacl.exceptions import BadSignatureError
    from nacl.signing import VerifyKey

    try:
        VerifyKey(_public_key_bytes(public_key)).verify(data, signature)
    except (AuthError, BadSignatureError, ValueError, TypeError):
        return False
    return True


def _verify_nonce(public_key: str, creds: Credentials) -> None:
    """The client signed the INFO nonce with ``public_key``'s seed, or AuthError."""
    if not creds.nonce:
        raise AuthError("no nonce was issued")
    try:
        sig = _decode_sig(creds.get("sig"))
    except (binascii.Error, ValueError) as exc:
        raise AuthError("signature is not base64") from exc
    if not _verify(public_key, creds.nonce.encode(), sig):
        raise AuthError(f"bad nonce signature for {public_key}")


@dataclass
class NkeyCheck:
    """nats-server's ``authorization { users = [{nkey: U...}] }``: nkey users.

    :param users: public user key -> its principal (rights and name).
    """

    users: dict[str, Principal]
    needs_nonce: bool = True

    def claims(self, creds: Credentials) -> bool:
        """A CONNECT carrying an ``nkey`` (and no JWT)."""
        return bool(creds.get("nkey")) and not creds.get("jwt")

    def authenticate(self, creds: Credentials, now: float) -> Principal:
        """Known key, and the nonce signed by it."""
        key = creds.get("nkey")
        principal = self.users.get(key)
        if principal is None:
            raise AuthError(f"unknown nkey {key}")
        _verify_nonce(key, creds)
        return principal


def decode_jwt(token: str) -> tuple[dict[str, Any], bytes, bytes]:
    """Split a NATS JWT into (claims, signed part, signature) without checking anything.

    Version 2 JWTs (``nats.version`` 2) sign ``header.payload``; version 1 JWTs (a top-level
    ``type``, as nats.py's test fixtures still use) sign the encoded payload alone.
    """
    parts = token.strip().split(".")
    if len(parts) != 3:
        raise AuthError("not a JWT")
    try:
        header = json.loads(_b64url(parts[0]))
        claims = json.loads(_b64url(parts[1]))
        signature = _b64url(parts[2])
    except (binascii.Error, ValueError) as exc:
        raise AuthError("malformed JWT") from exc
    if not isinstance(header, dict) or not isinstance(claims, dict):
        raise AuthError("malformed JWT")
    if header.get("alg") not in ("ed25519-nkey", "ed25519"):
        raise AuthError(f"unsupported JWT algorithm {header.get('alg')!r}")
    if claims.get("type"):          # version 1
        return claims, parts[1].encode(), signature
    return claims, f"{parts[0]}.{parts[1]}".encode(), signature


def _kind(claims: Mapping[str, Any]) -> str:
    """A JWT's claim type (``user``, ``account``, ``operator``): top-level in version 1,
    under ``nats`` in version 2."""
    return str(claims.get("type") or (claims.get("nats") or {}).get("type") or "")


def _b64url(text: str) -> bytes:
    """Decode unpadded base64url."""
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _signing_keys(claims: Mapping[str, Any]) -> set[str]:
    """The subject key plus every signing key a JWT lists (plain strings or scoped objects)."""
    keys = {str(claims.get("sub", ""))}
    for entry in (claims.get("nats") or {}).get("signing_keys") or ():
        if isinstance(entry, str):
            keys.add(entry)
        elif isinstance(entry, dict) and isinstance(entry.get("key"), str):
            keys.add(entry["key"])
    return keys


def _check_times(claims: Mapping[str, Any], now: float, what: str) -> None:
    """Refuse a JWT that expired or is not valid yet."""
    exp = claims.get("exp")
    if isinstance(exp, (int, float)) and exp and now >= exp:
        raise AuthError(f"{what} JWT expired")
    nbf = claims.get("nbf")
    if isinstance(nbf, (int, float)) and nbf and now < nbf:
        raise AuthError(f"{what} JWT not valid yet")


def _verified(token: str, trusted: set[str], what: str, now: float) -> dict[str, Any]:
    """The claims of ``token`` when it is signed by one of ``trusted`` keys and in date."""
    claims, signed, signature = decode_jwt(token)
    issuer = str(claims.get("iss", ""))
    if issuer not in trusted:
        raise AuthError(f"{what} JWT issued by an untrusted key {issuer}")
    if not _verify(issuer, signed, signature):
        raise AuthError(f"{what} JWT signature is not valid")
    _check_times(claims, now, what)
    return claims


@dataclass
class JwtCheck:
    """Operator mode with nats-server's ``resolver: MEMORY``: account JWTs preloaded.

    :param operators: operator JWTs (self-signed; their signing keys sign accounts).
    :param accounts: account public key -> account JWT (``resolver_preload``).
    """

    operators: list[str]
    accounts: dict[str, str]
    needs_nonce: bool = True

    def claims(self, creds: Credentials) -> bool:
        """Every CONNECT is judged by JWT once an operator is configured (as nats-server)."""
        return True

    def _operator_keys(self, now: float) -> set[str]:
        """Every key an account JWT may be signed by."""
        keys: set[str] = set()
        for token in self.operators:
            claims, _, _ = decode_jwt(token)
            issuer = str(claims.get("iss", ""))
            keys |= _signing_keys(_verified(token, {issuer}, "operator", now))
        return keys

    def authenticate(self, creds: Credentials, now: float) -> Principal:
        """Verify user JWT, its account JWT, the operator chain and the nonce signature."""
        token = creds.get("jwt")
        if not token:
            raise AuthError("operator mode needs a user JWT")
        user, _, _ = decode_jwt(token)
        nats = user.get("nats") or {}
        if _kind(user) not in ("user", ""):
            raise AuthError("not a user JWT")
        account_key = str(nats.get("issuer_account") or user.get("iss", ""))
        account_jwt = self.accounts.get(account_key)
        if account_jwt is None:
            raise AuthError(f"unknown account {account_key}")
        account = _verified(account_jwt, self._operator_keys(now), "account", now)
        if account.get("sub") != account_key:
            raise AuthError("account JWT is not for the user's account")
        user = _verified(token, _signing_keys(account), "user", now)
        user_key = str(user.get("sub", ""))
        _verify_nonce(user_key, creds)
        exp = user.get("exp")
        return Principal(
            name=str(user.get("name") or user_key),
            publish=Permissions.from_claim(nats.get("pub")),
            subscribe=Permissions.from_claim(nats.get("sub")),
            expires=float(exp) if isinstance(exp, (int, float)) and exp else None,
            account=account_key)


def load_resolver_preload(path: str) -> dict[str, str]:
    """Account JWTs for the memory resolver: a JSON object ``{account key: JWT}`` (like
    nats-server's ``resolver_preload``) or a directory of ``*.jwt`` files (one account each)."""
    if os.path.isdir(path):
        found: dict[str, str] = {}
        for name in sorted(os.listdir(path)):
            if name.endswith(".jwt"):
                with open(os.path.join(path, name), encoding="utf-8") as f:
                    token = f.read().strip()
                claims, _, _ = decode_jwt(token)
                found[str(claims.get("sub", ""))] = token
        return found
    with open(path, encoding="utf-8") as f:
        table = json.load(f)
    if not isinstance(table, dict):
        raise ValueError(f"{path}: expected a JSON object of account key -> JWT")
    return {str(k): str(v).strip() for k, v in table.items()}


def shared_secret_checks(token: str | None, user: str | None,
                         password: str | None) -> list[CredentialCheck]:
    """The checks of nats-server's single ``token`` or ``user``/``password`` (token first)."""
    if token:
        return [TokenCheck(token)]
    if user:
        return [PasswordCheck({user: (password or "", Principal(user))})]
    return []


def _rights(block: Any) -> Permissions | None:
    """One direction of nats-server's ``permissions``: a list (allowed subjects) or
    ``{allow: [...], deny: [...]}``."""
    if isinstance(block, list):
        return Permissions(tuple(str(s) for s in block))
    if isinstance(block, dict):
        return Permissions.from_claim(block)
    if block is None:
        return None
    raise ValueError(f"permissions must be a list or an allow/deny object, got {block!r}")


def users_checks(entries: list[Any]) -> list[CredentialCheck]:
    """Checks for nats-server's ``users = [...]`` entries: ``{"nkey": "U..."}`` or
    ``{"user": ..., "password": ...}``, each with optional ``permissions`` (``publish`` and
    ``subscribe``, as lists or allow/deny objects).

    :raises ValueError: on an entry that is neither kind or malformed permissions.
    """
    nkey_users: dict[str, Principal] = {}
    password_users: dict[str, tuple[str, Principal]] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            raise ValueError(f"a user must be an object, got {entry!r}")
        perms = entry.get("permissions") or {}
        if not isinstance(perms, dict):
            raise ValueError(f"permissions must be an object, got {perms!r}")
        pub, sub = _rights(perms.get("publish")), _rights(perms.get("subscribe"))
        if entry.get("nkey"):
            key = str(entry["nkey"])
            if not key.startswith("U"):
                raise ValueError(f"nkey users need public user keys (U...), got {key!r}")
            nkey_users[key] = Principal(key, pub, sub)
        elif entry.get("user"):
            name = str(entry["user"])
            password_users[name] = (str(entry.get("password") or entry.get("pass") or ""),
                                    Principal(name, pub, sub))
        else:
            raise ValueError(f"a user needs nkey or user, got {entry!r}")
    checks: list[CredentialCheck] = []
    if nkey_users:
        checks.append(NkeyCheck(nkey_users))
    if password_users:
        checks.append(PasswordCheck(password_users))
    return checks


def new_nonce() -> str:
    """A fresh INFO nonce (unguessable, URL-safe text as nats-server sends)."""
    return secrets.token_urlsafe(11)


class Authenticator:
    """Asks each check in order; the first that claims the credentials decides.

    With no checks every client is :data:`ANONYMOUS`. Signature checks come first, so a client
    presenting an nkey is never judged by the token check.
    """

    def __init__(self, checks: Iterable[CredentialCheck] = ()) -> None:
        """Keep ``checks`` (signature-based ones are asked first)."""
        ordered = list(checks)
        self.checks: list[CredentialCheck] = (
            [c for c in ordered if c.needs_nonce] + [c for c in ordered if not c.needs_nonce])

    @property
    def required(self) -> bool:
        """Whether clients must authenticate (INFO ``auth_required``)."""
        return bool(self.checks)

    @property
    def needs_nonce(self) -> bool:
        """Whether INFO must carry a nonce (an nkey or JWT check is configured)."""
        return any(c.needs_nonce for c in self.checks)

    def named(self, name: str) -> Principal | None:
        """The user called ``name`` (a ``user`` of the password checks, or an nkey user's
        public key), or None: whom nats-server's ``no_auth_user`` may name."""
        for check in self.checks:
            if isinstance(check, PasswordCheck) and name in check.users:
                return check.users[name][1]
            if isinstance(check, NkeyCheck) and name in check.users:
                return check.users[name]
        return None

    def authenticate(self, creds: Credentials, now: float) -> Principal:
        """The principal of ``creds``, or raise :class:`AuthError`."""
        if not self.checks:
            return ANONYMOUS
        for check in self.checks:
            if check.claims(creds):
                return check.authenticate(creds, now)
        raise AuthError("no credentials this server accepts")
