"""NATS server settings (nats-server's defaults) and the constants the server modules share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from mqhub.protocols.nats import codec
from mqhub.protocols.nats.mq9_common import BROADCAST as BROADCAST_PREFIX
from mqhub.protocols.nats.mq9_common import DEFAULT_MAX_MAILBOXES
from mqhub.protocols.nats.mq9_common import PREFIX as MQ9_PREFIX

__all__ = ["NatsSettings", "SERVER_VERSION", "WIRE_ERRORS", "CRLF", "MQ9_PREFIX",
           "BROADCAST_PREFIX", "READ_SIZE", "NO_RESPONDERS_BLOCK", "STALL_MIN", "STALL_MAX"]

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
#: seconds a publisher is not read after a read that left a subscriber above 3/4 of its
#: ``max_pending`` (from STALL_MIN at half the budget up to STALL_MAX at all of it), as
#: nats-server's fast-producer stall (2–5 ms)
STALL_MIN = 0.002
STALL_MAX = 0.005


@dataclass
class NatsSettings:
    """Server settings, nats-server's defaults: every ``--option nats.KEY=VALUE`` (``[nats]`` in
    the config file; ``mq9`` is the same plugin) is a field here (:mod:`mqhub.plugin_settings`).
    ``host``, ``port`` and ``tls_context`` are set by the service, not options."""

    #: largest PUB payload (HPUB: headers + payload), in bytes; announced in INFO
    max_payload: int = codec.DEFAULT_MAX_PAYLOAD
    #: longest protocol line (bytes)
    max_control_line: int = codec.MAX_CONTROL_LINE
    #: bytes of output that may wait for one connection (nats-server's max_pending); one byte
    #: more and it is cut as a slow consumer
    max_pending: int = 64 * 1024 * 1024
    #: seconds a connection may stay backed up (its socket refusing output) before it is cut as
    #: a slow consumer (nats-server's write_deadline); 0 turns the deadline off
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
    #: comma-separated public nkeys (U...) of users who sign the INFO nonce with their seed
    nkeys: str | None = None
    #: JSON file of nats-server's users = [...] entries (nkey or user/password users, each with
    #: optional publish/subscribe permissions)
    users: str | None = None
    #: operator JWTs or their files (comma-separated): operator mode, JWT users only
    operator: str | None = None
    #: the account resolver of operator mode; only nats-server's MEMORY is supported
    resolver: str = "MEMORY"
    #: account JWTs: a JSON object {"A...": "<jwt>"} (nats-server's resolver_preload) or a
    #: directory of *.jwt files
    resolver_preload: str | None = None
    #: the user a client that sends no credentials acts as (nats-server's no_auth_user)
    no_auth_user: str | None = None
    #: server_name in INFO
    server_name: str = "mqhub"
    #: PEM certificate (and key): INFO says tls_required and the connection upgrades to TLS
    #: right after INFO
    tls_cert: str | None = None
    #: PEM key when it is not in the tls_cert file
    tls_key: str | None = None
    #: PEM CA certificates client certificates must chain to (with tls_verify)
    tls_ca: str | None = None
    #: clients must present a certificate signed by a tls_ca CA (INFO says tls_verify)
    tls_verify: bool = False
    #: TLS starts at once, before INFO (nats-server's handshake_first)
    tls_handshake_first: bool = False
    #: WebSocket listener (--listen nats.ws=...): PEM certificate (and key) for wss://
    ws_tls_cert: str | None = None
    #: WebSocket listener: PEM key when it is not in the ws_tls_cert file
    ws_tls_key: str | None = None
    #: WebSocket listener: PEM CA certificates client certificates must chain to
    ws_tls_ca: str | None = None
    #: WebSocket listener: clients must present a certificate signed by a ws_tls_ca CA
    ws_tls_verify: bool = False
    #: WebSocket listener: allow plain ws:// off the loopback interface (nats-server's no_tls)
    ws_no_tls: bool = False
    #: WebSocket listener: accept permessage-deflate (nats-server's compression)
    ws_compression: bool = False
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
