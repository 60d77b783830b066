"""NATS server settings (nats-server's defaults) and the constants the server modules share."""

from __future__ import annotations

from typing import Any

from mqhub.protocols.nats import codec
from mqhub.protocols.nats.mq9_common import BROADCAST as BROADCAST_PREFIX
from mqhub.protocols.nats.mq9_common import PREFIX as MQ9_PREFIX

__all__ = ["NatsSettings", "flag", "SERVER_VERSION", "WIRE_ERRORS", "CRLF", "MQ9_PREFIX",
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


def flag(value: Any) -> bool:
    """A boolean option given as a bool or as text (true/false, yes/no, on/off, 1/0)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("", "0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {value!r}")


class NatsSettings:
    """Server settings (from plugin options), with nats-server's defaults."""

    def __init__(self, **kw: Any) -> None:
        """Accept keyword overrides of the defaults below."""
        self.max_payload: int = int(kw.get("max_payload", codec.DEFAULT_MAX_PAYLOAD))
        self.max_control_line: int = int(kw.get("max_control_line", codec.MAX_CONTROL_LINE))
        self.max_pending: int = int(kw.get("max_pending", 64 * 1024 * 1024))
        self.write_deadline: float = float(kw.get("write_deadline", 10.0))
        self.ping_interval: float = float(kw.get("ping_interval", 120.0))
        self.ping_max: int = int(kw.get("ping_max", 2))
        self.auth_timeout: float = float(kw.get("auth_timeout", 2.0))
        self.token: str | None = kw.get("token") or None
        self.user: str | None = kw.get("user") or None
        self.password: str | None = kw.get("password") or kw.get("pass") or None
        #: the user a client that sends no credentials acts as (nats-server's ``no_auth_user``)
        self.no_auth_user: str | None = kw.get("no_auth_user") or None
        self.tls_context: Any = kw.get("tls_context")
        #: client certificates are required and checked against the CA (INFO ``tls_verify``)
        self.tls_verify: bool = flag(kw.get("tls_verify", False))
        #: TLS starts at once, before INFO (nats-server's ``handshake_first``)
        self.tls_handshake_first: bool = flag(kw.get("tls_handshake_first", False))
        self.server_name: str = kw.get("server_name") or "mqhub"
        self.host: str = kw.get("host", "127.0.0.1")
        self.port: int = int(kw.get("port", 4222))

    @property
    def auth_required(self) -> bool:
        """True when a token or a user/password is configured."""
        return bool(self.token or self.user)
