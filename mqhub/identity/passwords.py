"""Password hashes for the users file: scrypt from the standard library, constant-time checks.

Format written by :func:`hash_password` (and ``mqhub users hash``)::

    scrypt$<log2 N>$<r>$<p>$<salt, base64>$<key, base64>

scrypt (``hashlib.scrypt``, OpenSSL's) is memory-hard; the defaults (N = 2^14, r = 8, p = 1:
16 MiB and about 50 ms on this machine class) are the scrypt paper's figures for interactive
logins. A broker checks a password once per connection and remembers a success
(:mod:`mqhub.identity.directory`), so the cost is paid per login, not per message.
VibeMQ's ``pbkdf2_sha256$<iterations>$<salt hex>$<hash hex>`` (written by its admin commands)
is verified too, so its users file keeps working. Pure module: no Twisted.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

__all__ = ["hash_password", "check_password", "is_hash", "PasswordError"]

SCRYPT = "scrypt"
PBKDF2 = "pbkdf2_sha256"
#: defaults of new hashes (N = 2**LOG_N)
LOG_N, R, P = 14, 8, 1
#: largest cost accepted from a file (N = 2**20 with r = 8 is 1 GiB of memory)
MAX_LOG_N, MAX_R, MAX_P = 20, 16, 4
MAX_PBKDF2_ITERATIONS = 10_000_000
KEY_BYTES = 32


class PasswordError(ValueError):
    """A stored hash cannot be read."""


def _b64(data: bytes) -> str:
    """Unpadded standard base64."""
    return base64.b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    """Decode unpadded base64."""
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


def _scrypt(password: str, salt: bytes, log_n: int, r: int, p: int, size: int) -> bytes:
    """The scrypt key (memory bound set from the parameters)."""
    return hashlib.scrypt(password.encode(), salt=salt, n=1 << log_n, r=r, p=p,
                          maxmem=(128 * r * (1 << log_n) * p) + (64 << 20), dklen=size)


def hash_password(password: str, *, log_n: int = LOG_N, r: int = R, p: int = P,
                  salt: bytes | None = None) -> str:
    """A new scrypt hash of ``password`` (random 16-byte salt)."""
    salt = os.urandom(16) if salt is None else salt
    key = _scrypt(password, salt, log_n, r, p, KEY_BYTES)
    return f"{SCRYPT}${log_n}${r}${p}${_b64(salt)}${_b64(key)}"


def parse_hash(stored: str) -> tuple[str, tuple[int, ...], bytes, bytes]:
    """``(algorithm, parameters, salt, key)`` of a stored hash.

    :raises PasswordError: when it is neither format, or its cost is out of bounds.
    """
    parts = stored.split("$")
    try:
        if parts[0] == SCRYPT and len(parts) == 6:
            log_n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
            if not (1 <= log_n <= MAX_LOG_N and 1 <= r <= MAX_R and 1 <= p <= MAX_P):
                raise PasswordError("scrypt cost out of bounds")
            salt, key = _unb64(parts[4]), _unb64(parts[5])
            if not key:
                raise PasswordError("empty key")
            return SCRYPT, (log_n, r, p), salt, key
        if parts[0] == PBKDF2 and len(parts) == 4:
            iterations = int(parts[1])
            if not 1 <= iterations <= MAX_PBKDF2_ITERATIONS:
                raise PasswordError("pbkdf2 iterations out of bounds")
            return PBKDF2, (iterations,), bytes.fromhex(parts[2]), bytes.fromhex(parts[3])
    except (ValueError, TypeError) as exc:
        if isinstance(exc, PasswordError):
            raise
        raise PasswordError(f"unreadable password hash: {exc}") from None
    raise PasswordError("a password hash starts with scrypt$ or pbkdf2_sha256$ "
                        "(make one with `mqhub users hash`)")


def is_hash(stored: str) -> bool:
    """True when ``stored`` is a readable hash."""
    try:
        parse_hash(stored)
    except PasswordError:
        return False
    return True


def check_password(password: str, stored: str) -> bool:
    """Whether ``password`` matches ``stored`` (constant-time comparison of the keys)."""
    try:
        algorithm, params, salt, key = parse_hash(stored)
    except PasswordError:
        return False
    if algorithm == SCRYPT:
        got = _scrypt(password, salt, params[0], params[1], params[2], len(key))
    else:
        got = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, params[0], len(key))
    return hmac.compare_digest(got, key)
