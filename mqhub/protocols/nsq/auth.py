"""AUTH against a local secrets file (the shape of nsqd's auth-server reply, without HTTP).

The file is JSON::

    {"secrets": {"<secret>": {"identity": "alice", "identity_url": "",
                              "authorizations": [{"topic": "^orders$", "channels": [".*"],
                                                  "permissions": ["subscribe", "publish"]}]}}}

``topic`` and each ``channels`` entry are regular expressions matched with ``re.search`` like
nsqd's Go ``MatchString``. Pure module: no Twisted.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from mqhub.errors import PluginError


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

    def allows(self, topic: str, channel: str | None, permission: str) -> bool:
        """True when any grant covers the action."""
        return any(a.allows(topic, channel, permission) for a in self.authorizations)

    def reply(self) -> bytes:
        """nsqd's AUTH response body."""
        return json.dumps({"identity": self.identity, "identity_url": self.identity_url,
                           "permission_count": len(self.authorizations)},
                          separators=(",", ":")).encode()


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
