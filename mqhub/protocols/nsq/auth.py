"""NSQ's identity: AUTH against the hub's users file and/or a local secrets file.

:class:`NsqGuard` is what the NSQ adapter asks: whether IDENTIFY announces ``auth_required``,
which session an AUTH secret opens (nsqd's auth-server reply shape: identity, identity_url,
permission_count), and which session a client that never AUTHs has (the users file's
``[anonymous]``, or none). A users-file secret is a user's ``token`` or ``NAME:PASSWORD``;
a secret the users file does not know is looked up in the secrets file.

The secrets file (``--nsq-auth-secrets``, kept as a shorthand) is JSON::

    {"secrets": {"<secret>": {"identity": "alice", "identity_url": "",
                              "authorizations": [{"topic": "^orders$", "channels": [".*"],
                                                  "permissions": ["subscribe", "publish"]}]}}}

``topic`` and each ``channels`` entry are regular expressions matched with ``re.search`` like
nsqd's Go ``MatchString``; such a secret becomes a principal whose grants are those regular
expressions (see :meth:`AuthState.principal`). No Twisted import.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from mqhub.errors import PluginError
from mqhub.identity import Grants, Principal, Rights, Session
from mqhub.protocols.nsq.events import ProtocolError


@dataclass(frozen=True)
class Authorization:
    """One grant: topics and channels matched by regex, and the permitted actions."""

    topic: re.Pattern[str]
    channels: tuple[re.Pattern[str], ...]
    permissions: frozenset[str]

    def allows(self, topic: str, channel: str | None, permission: str) -> bool:
        """True when this grant covers ``permission`` on ``topic`` (and ``channel`` if given)."""
        if permission not in self.permissions or not self.topic.search(topic):
            return False
        if channel is None:
            return True
        return any(c.search(channel) for c in self.channels)


@dataclass(frozen=True)
class AuthState:
    """What one secret grants a connection."""

    identity: str
    identity_url: str
    authorizations: tuple[Authorization, ...] = field(default=())
    #: permission_count of the reply (None: the number of authorizations)
    count: int | None = None

    def allows(self, topic: str, channel: str | None, permission: str) -> bool:
        """True when any grant covers the action."""
        return any(a.allows(topic, channel, permission) for a in self.authorizations)

    def reply(self) -> bytes:
        """nsqd's AUTH response body."""
        count = len(self.authorizations) if self.count is None else self.count
        return auth_reply(self.identity, self.identity_url, count)

    def principal(self) -> Principal:
        """This secret as a principal: its regular expressions are legacy grants, asked about
        the topic (and channel) an address belongs to."""
        def publish(address: str, group: str | None) -> bool:
            return self.allows(topic_of(address), None, "publish")

        def subscribe(address: str, group: str | None) -> bool:
            return self.allows(topic_of(address), group, "subscribe")

        return Principal(self.identity, Rights(Grants(matchers=(publish,)),
                                               Grants(matchers=(subscribe,))), "nsq-secrets")


def auth_reply(identity: str, identity_url: str, count: int) -> bytes:
    """nsqd's AUTH response body."""
    return json.dumps({"identity": identity, "identity_url": identity_url,
                       "permission_count": count}, separators=(",", ":")).encode()


def topic_of(address: str) -> str:
    """The NSQ topic that publishes to ``address`` (``topics.topic_address`` reversed)."""
    if "~" not in address:
        return address
    if address.endswith("~ephemeral"):
        address = address[: -len("~ephemeral")] + "#ephemeral"
    return ".".join("" if part == "~" else part for part in address.split("."))


class SecretsFile:
    """Secrets loaded from a JSON file; ``lookup(secret)`` returns its :class:`AuthState`."""

    def __init__(self, secrets: dict[str, AuthState]) -> None:
        """:param secrets: secret -> grants."""
        self._secrets = secrets

    @classmethod
    def load(cls, path: str) -> SecretsFile:
        """Read and compile ``path``.

        :raises PluginError: when the file is missing or malformed.
        """
        try:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
            return cls.parse(data)
        except (OSError, ValueError, TypeError, KeyError, re.error) as exc:
            raise PluginError(f"nsq: cannot load auth secrets {path}: {exc}") from exc

    @classmethod
    def parse(cls, data: dict[str, Any]) -> SecretsFile:
        """Compile the parsed JSON document."""
        secrets: dict[str, AuthState] = {}
        for secret, spec in data["secrets"].items():
            grants = tuple(
                Authorization(
                    topic=re.compile(a["topic"]),
                    channels=tuple(re.compile(c) for c in a.get("channels", [])),
                    permissions=frozenset(a.get("permissions", [])),
                )
                for a in spec.get("authorizations", [])
            )
            secrets[secret] = AuthState(spec.get("identity", ""), spec.get("identity_url", ""), grants)
        return cls(secrets)

    def lookup(self, secret: bytes) -> AuthState | None:
        """The grants of ``secret``, or None when it is unknown."""
        try:
            return self._secrets.get(secret.decode("utf-8"))
        except UnicodeDecodeError:
            return None


class NsqGuard:
    """Identity for NSQ connections: the hub's users (when enforcing) and the secrets file.

    :param identity: the hub's :class:`mqhub.identity.Directory`, or None.
    :param secrets: the ``--nsq-auth-secrets`` file, or None.
    """

    def __init__(self, identity: Any, secrets: SecretsFile | None) -> None:
        """Nothing is checked when neither is in force (:attr:`active` is False)."""
        self.identity = identity
        self.secrets = secrets
        self.enforcing = identity is not None and identity.enforcing
        #: False: every client may do everything (no session is made, nothing is checked)
        self.active = self.enforcing or secrets is not None

    @property
    def auth_required(self) -> bool:
        """What IDENTIFY announces: a secret is needed, or one can be given (pynsq sends AUTH
        only when told so; a client without a secret goes on as anonymous)."""
        if self.secrets is not None:
            return True
        return self.enforcing and (self.identity.anonymous is None or
                                   self.identity.has_credentials("token", "password"))

    def open(self, peer: str) -> Session | None:
        """The session of a client before AUTH: anonymous rights, or None (AUTH required)."""
        if not self.enforcing:
            return None
        return self.identity.anonymous_session("nsq", peer)

    def wait(self, peer: str) -> float:
        """Seconds an AUTH from ``peer`` waits before it is evaluated (failed-login slowdown)."""
        return self.identity.login_wait(peer) if self.identity is not None else 0.0

    def authenticate(self, secret: bytes, peer: str) -> tuple[Session, AuthState]:
        """The session an AUTH secret opens, and what the reply and /stats show.

        :raises ProtocolError: nsqd's fatal ``E_AUTH_DISABLED``, ``E_AUTH_FAILED`` or
            ``E_UNAUTHORIZED AUTH no authorizations found``.
        """
        if not self.active:
            raise ProtocolError("E_AUTH_DISABLED", "AUTH disabled")
        directory = self.identity
        principal: Principal | None = None
        try:
            text = secret.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if self.enforcing and text is not None:
            principal = directory.by_secret(text)
        if principal is not None:
            state = AuthState(principal.label, "")
            count = principal.rights.count
        else:
            legacy = self.secrets.lookup(secret) if self.secrets is not None else None
            if legacy is None:
                if directory is not None:
                    directory.login_failed("nsq", peer, _tried(text))
                raise ProtocolError("E_AUTH_FAILED", "AUTH failed")
            state, principal, count = legacy, legacy.principal(), len(legacy.authorizations)
        if directory is not None:
            directory.login_succeeded(peer)
        if not count:
            raise ProtocolError("E_UNAUTHORIZED", "AUTH no authorizations found")
        state = AuthState(state.identity, state.identity_url, state.authorizations, count)
        if directory is not None:
            return directory.session("nsq", principal, peer), state
        return Session("nsq", principal, peer), state


def _tried(secret: str | None) -> str | None:
    """The user name a ``NAME:PASSWORD`` secret names (logged; a bare token is not)."""
    if secret is None or ":" not in secret:
        return None
    return secret.partition(":")[0][:64] or None
