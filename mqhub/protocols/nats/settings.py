"""NATS server settings (nats-server's defaults) and the constants the server modules share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from mqhub.protocols.nats import codec
from mqhub.protocols.nats.mq9_common import BROADCAST as BROADCAST_PREFIX
from mqhub.protocols.nats.mq9_common import DEFAULT_MAX_MAILBOXES
from mqhub.protocols.nats.mq9_common import PREFIX as MQ9_PREFIX

__all__ = ["NatsSettings", "SERVER_VERSION", "WIRE_ERRORS", "CRLF", "MQ9_PREFIX",
           "BROADCAST_PREFIX", "READ_SIZE", "NO_RESPONDERS_BLOCK"]

CRLF = b"\r\n"
SERVER_VERSION = "2.10.0"
NO_RESPONDERS_BLOCK = b"NATS/1.0 503\r\n\r\n"

#: ProtocolError code -> -ERR text, or None for a silent close
WIRE_ERRORS: dict[str, str | None] = {
    codec.E_UNKNOWN_OP: "Unknown Protocol Operation",
    codec.E_MAX_CONTROL: "maximum control line exceeded",
    codec.E_MAX_PAYLOAD: "Maximum Payload Violation",
    codec.E_BAD_ARGS: None,
    codec.E_BAD_CONNECT: None,
    codec.E_INVALID_SUBJECT: "Invalid Subject",
}

#: bytes read per turn: bigger reads = bigger mq9 groups per store commit, fewer turns for core
READ_SIZE = 256 * 1024


@dataclass
class NatsSettings:
    """Server settings, nats-server's defaults: every ``--option nats.KEY=VALUE`` (``[nats]`` in
    the config file; ``mq9`` is the same plugin) is a field here (:mod:`mqhub.plugin_settings`).
    ``host``, ``port`` and ``tls_context`` are set by the service, not options."""

    #: largest PUB payload (HPUB: headers + payload), in bytes; announced in INFO
    max_payload: int = codec.DEFAULT_MAX_PAYLOAD
    #: longest protocol line (bytes)
    max_control_line: int = codec.MAX_CONTROL_LINE
    #: bytes that may pile up for one subscriber before it is closed as a slow consumer
    max_pending: int = 64 * 1024 * 1024
    #: backed-up bytes at which publishers stop being read (capped at 75 % of max_pending)
    stall_bytes: int = 8 * 1024 * 1024
    #: seconds a subscriber may stay backed up past stall_bytes before it is closed as a slow
    #: consumer
    write_deadline: float = 10.0
    #: seconds between server PINGs (0 = none)
    ping_interval: float = 120.0
    #: unanswered PINGs after which the connection closes ('Stale Connection')
    ping_max: int = 2
    #: seconds a client has to send CONNECT when authentication is required
    auth_timeout: float = 2.0
    #: clients must send this auth_token (also as auth_token)
    token: str | None = None
    #: clients must send this user (with password)
    user: str | None = None
    #: the password of user (also as pass)
    password: str | None = None
    #: server_name in INFO
    server_name: str = "mqhub"
    #: PEM certificate (and key): INFO says tls_required and the connection upgrades to TLS
    #: right after INFO
    tls_cert: str | None = None
    #: PEM key when it is not in the tls_cert file
    tls_key: str | None = None
    #: mq9: seconds between TTL sweeps
    sweep_interval: float = 1.0
    #: mq9: unread messages a mailbox holds; beyond it INBOX publishes get an error
    max_unread: int = 1_000_000
    #: mq9: live mailboxes; beyond it CREATE replies {"error":"too many mailboxes"}
    max_mailboxes: int = DEFAULT_MAX_MAILBOXES
    tls_context: Any = field(default=None, init=False, repr=False)
    host: str = field(default="127.0.0.1", init=False)
    port: int = field(default=4222, init=False)

    #: other names accepted for some keys (CONNECT's own field names)
    ALIASES: ClassVar[dict[str, str]] = {"pass": "password", "auth_token": "token"}

    @property
    def auth_required(self) -> bool:
        """True when a token or a user/password is configured."""
        return bool(self.token or self.user)
