"""The SSH manhole (twisted.conch): a Python shell inside the running broker, key login only.

Off unless ``--manhole ENDPOINT`` is given, and refused at start without ``--manhole-keys FILE``
(an OpenSSH authorized_keys file; every key in it may log in as any user name — with a users
file, only as a user with ``admin = true``, docs/security.md). The shell runs
on the reactor thread: an expression blocks the broker for as long as it runs, so the helpers
return what the core already holds (no store scans) and dead-letter reads return Deferreds the
shell prints when they fire.

Namespace: ``hub``, ``store``, ``scheduler``, ``broker``, ``inspector`` and the helpers
``stats()``, ``queues()``, ``queue(name)``, ``dlq(name, limit=100)``, ``replay(name, n=None)``,
``connections()``.
"""

from __future__ import annotations

import os
import re
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from twisted.conch import manhole, manhole_ssh
from twisted.conch.checkers import SSHPublicKeyChecker
from twisted.conch.insults import insults
from twisted.conch.ssh import keys
from twisted.cred import portal
from twisted.internet.defer import Deferred
from zope.interface import implementer

from mqhub.introspect import Inspector
from mqhub.listener import ListenerService

try:  # Twisted names the interface IAuthorizedKeysDB
    from twisted.conch.checkers import IAuthorizedKeysDB
except ImportError:  # pragma: no cover
    from zope.interface import Interface as IAuthorizedKeysDB  # type: ignore[assignment]

LOOPBACK_HOSTS = ("127.", "::1", "localhost", "0:0:0:0:0:0:0:1")


class ManholeError(ValueError):
    """The manhole cannot be configured as asked (the message says why)."""


def endpoint_is_loopback(endpoint: str) -> bool:
    """Whether a server endpoint string only accepts local clients (loopback or unix socket).

    Twisted escapes colons inside a value (``interface=\\:\\:1``); they are unescaped here.
    """
    fields = [f.replace("\\:", ":") for f in re.split(r"(?<!\\):", endpoint)]
    kind = fields[0].lower()
    if kind == "unix":
        return True
    interface = ""
    for part in fields[1:]:
        if part.startswith("interface="):
            interface = part[len("interface="):]
    if not interface:
        return False  # tcp without an interface binds every address
    return interface.startswith(LOOPBACK_HOSTS)


def read_authorized_keys(path: str) -> list[keys.Key]:
    """The public keys of an OpenSSH authorized_keys file (comments and bad lines skipped).

    :raises ManholeError: when the file cannot be read or holds no key.
    """
    try:
        with open(path, "rb") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise ManholeError(f"--manhole-keys: cannot read {path}: {exc.strerror}") from None
    found = []
    for line in lines:
        line = line.strip()
        if not line or line.startswith(b"#"):
            continue
        try:
            found.append(keys.Key.fromString(line))
        except (keys.BadKeyError, ValueError, IndexError):
            continue
    if not found:
        raise ManholeError(f"--manhole-keys: {path} holds no usable public key")
    return found


def check_config(endpoint: str, key_file: str | None) -> list[keys.Key]:
    """Validate ``--manhole``/``--manhole-keys``; return the authorised keys.

    :raises ManholeError: no key file (the message says whether the endpoint is exposed).
    """
    if not key_file:
        if not endpoint_is_loopback(endpoint):
            raise ManholeError(
                f"refusing to open the manhole on {endpoint!r}: it is not a loopback endpoint "
                "and no --manhole-keys file was given")
        raise ManholeError("--manhole needs --manhole-keys FILE (key authentication only)")
    return read_authorized_keys(key_file)


@implementer(IAuthorizedKeysDB)
class KeyList:
    """An IAuthorizedKeysDB holding one list of keys valid for every user name — or, with a
    users file (``--users``), only for the names of its users with ``admin = true`` (asked
    at each login, so a reload applies)."""

    def __init__(self, authorized: list[keys.Key], identity: Any = None) -> None:
        """Accept ``authorized``; ``identity``: the hub's Directory (None: any name)."""
        self.authorized = authorized
        self.identity = identity

    def getAuthorizedKeys(self, username: bytes) -> list[keys.Key]:
        """Every key for an allowed user name, else none (a refused login is counted)."""
        identity = self.identity
        if identity is None or not identity.enforcing:
            return list(self.authorized)
        name = username.decode("utf-8", "replace")
        user = identity.named(name)
        if user is None or not user.rights.admin:
            identity.refused("manhole", name[:64], "login", "manhole")
            return []
        return list(self.authorized)


def host_key(data_dir: str | None) -> keys.Key:
    """The manhole's SSH host key: DATA_DIR/manhole_host_key, made on first use (ECDSA P-256).

    Without a data directory a fresh key is made per process.
    """
    path = os.path.join(data_dir, "manhole_host_key") if data_dir else None
    if path and os.path.exists(path):
        with open(path, "rb") as f:
            return keys.Key.fromString(f.read())
    private = ec.generate_private_key(ec.SECP256R1())
    pem = private.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.TraditionalOpenSSL,
                                serialization.NoEncryption())
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
    return keys.Key.fromString(pem)


def namespace(hub: Any, inspector: Inspector) -> dict[str, Any]:
    """The shell's globals: the hub's parts and the one-line helpers."""
    broker = hub.broker

    def stats() -> dict[str, Any]:
        """The /api/stats document."""
        return inspector.stats()

    def queues() -> list[Any]:
        """Every queue (core Queue objects)."""
        return list(broker.queues())

    def queue(name: str) -> Any:
        """The queue called ``name`` (None when there is none)."""
        return broker.queue(name)

    def dlq(name: str, limit: int = 100) -> Deferred[list[Any]]:
        """The first ``limit`` dead letters of queue ``name`` (a Deferred the shell prints)."""
        return broker.dead_letters(name, limit=limit)

    def replay(name: str, n: int | None = None) -> Deferred[int]:
        """Replay every dead letter of ``name``, or its oldest ``n``; fires with how many."""
        if n is None:
            return broker.replay_dead_letters(name)
        d = broker.dead_letters(name, limit=max(0, int(n)))
        return d.addCallback(lambda letters: broker.replay_dead_letters(
            name, [x.msg_id for x in letters]) if letters else 0)

    def connections() -> list[dict[str, Any]]:
        """Every open client connection."""
        return inspector.connections()

    return {
        "hub": hub, "store": hub.store, "scheduler": hub.scheduler, "broker": broker,
        "inspector": inspector, "stats": stats, "queues": queues, "queue": queue,
        "dlq": dlq, "replay": replay, "connections": connections,
    }


def make_manhole_factory(hub: Any, inspector: Inspector,
                         authorized: list[keys.Key]) -> manhole_ssh.ConchFactory:
    """The SSH factory: key-checked portal, terminal realm, colour manhole over ``namespace``."""
    names = namespace(hub, inspector)

    def terminal() -> insults.ServerProtocol:
        """One manhole session's terminal protocol."""
        return insults.ServerProtocol(manhole.ColoredManhole, names)

    realm = manhole_ssh.TerminalRealm()
    realm.chainedProtocolFactory = terminal  # type: ignore[assignment]
    checker = SSHPublicKeyChecker(KeyList(authorized, getattr(hub, "identity", None)))
    factory = manhole_ssh.ConchFactory(portal.Portal(realm, [checker]))  # type: ignore[arg-type]
    key = host_key(hub.data_dir)
    public: Any = key.public()
    private: Any = key
    factory.publicKeys = {key.sshType(): public}
    factory.privateKeys = {key.sshType(): private}
    factory.noisy = False
    return factory


def make_manhole_service(hub: Any, root: Any, endpoint: str, key_file: str | None) -> ListenerService:
    """The manhole ListenerService (built, not started).

    :raises ManholeError: see :func:`check_config`.
    """
    authorized = check_config(endpoint, key_file)
    inspector = Inspector(hub, root)
    service = ListenerService(endpoint, make_manhole_factory(hub, inspector, authorized),
                              reactor=hub.reactor, observer=True)
    service.setName("manhole")
    return service
