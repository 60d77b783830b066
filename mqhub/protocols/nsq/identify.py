"""IDENTIFY: validate a client's JSON like nsqd and build the 13-field negotiation reply.

Pure functions (no Twisted): the server applies the result (heartbeats, timeouts, upgrades).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mqhub.protocols.nsq.codec import ProtocolError
from mqhub.protocols.nsq.config import NsqConfig

_INT_FIELDS = ("heartbeat_interval", "output_buffer_size", "output_buffer_timeout",
               "deflate_level", "sample_rate", "msg_timeout")
_BOOL_FIELDS = ("feature_negotiation", "tls_v1", "snappy", "deflate")
_STR_FIELDS = ("client_id", "hostname", "user_agent", "short_id", "long_id")


@dataclass
class Identity:
    """What a connection negotiated (times in ms; -1 means disabled where nsqd allows it)."""

    client_id: str = ""
    hostname: str = ""
    user_agent: str = ""
    heartbeat_interval: int = 30_000
    output_buffer_size: int = 16384
    output_buffer_timeout: int = 250
    sample_rate: int = 0
    msg_timeout: int = 60_000
    feature_negotiation: bool = False
    tls_v1: bool = False
    deflate: bool = False
    deflate_level: int = 6
    snappy: bool = False


def default_identity(config: NsqConfig) -> Identity:
    """The settings of a connection that never sent IDENTIFY."""
    return Identity(heartbeat_interval=config.client_timeout // 2, msg_timeout=config.msg_timeout)


def _decode(body: bytes) -> dict[str, Any]:
    """Parse the JSON object with Go-like strictness on the field types nsqd reads."""
    bad = ProtocolError("E_BAD_BODY", "IDENTIFY failed to decode JSON body")
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise bad from None
    if not isinstance(data, dict):
        raise bad
    for name in _INT_FIELDS:
        value = data.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or value != int(value)):
            raise bad
    for name in _BOOL_FIELDS:
        if data.get(name) is not None and not isinstance(data[name], bool):
            raise bad
    for name in _STR_FIELDS:
        if data.get(name) is not None and not isinstance(data[name], str):
            raise bad
    return data


def _invalid(what: str, value: int) -> ProtocolError:
    """nsqd's ``E_BAD_BODY IDENTIFY <what> (<value>) is invalid``."""
    return ProtocolError("E_BAD_BODY", f"IDENTIFY {what} ({value}) is invalid")


def _ranged(data: dict[str, Any], name: str, what: str, low: int, high: int) -> int:
    """Field ``name``: 0 (absent) keeps the default, -1 disables, anything else must be in low..high.

    :raises ProtocolError: nsqd's ``E_BAD_BODY`` for a value outside the range.
    """
    value = int(data.get(name) or 0)
    if value not in (0, -1) and not low <= value <= high:
        raise _invalid(what, value)
    return value


def negotiate(
    body: bytes,
    config: NsqConfig,
    *,
    snappy_available: bool = False,
    auth_required: bool = False,
) -> tuple[Identity, bytes]:
    """Validate IDENTIFY ``body`` and return the negotiated identity and the reply data.

    The reply is ``b"OK"`` unless the client asked for feature negotiation, then nsqd's
    13-field JSON (times in ms).

    :raises ProtocolError: ``E_BAD_BODY`` for a bad value, ``E_IDENTIFY_FAILED`` for asking
        both deflate and snappy (both fatal, as in nsqd).
    """
    data = _decode(body)
    ident = default_identity(config)
    ident.client_id = data.get("client_id") or data.get("short_id") or ""
    ident.hostname = data.get("hostname") or data.get("long_id") or ""
    ident.user_agent = data.get("user_agent") or ""

    hb = _ranged(data, "heartbeat_interval", "heartbeat interval", 1000, config.max_heartbeat_interval)
    if hb:
        ident.heartbeat_interval = hb
    obs = _ranged(data, "output_buffer_size", "output buffer size", 64, config.max_output_buffer_size)
    if obs:
        ident.output_buffer_size = obs
    if obs == -1:
        ident.output_buffer_timeout = 0
    obt = _ranged(data, "output_buffer_timeout", "output buffer timeout", 25,
                  config.max_output_buffer_timeout)
    if obt:
        ident.output_buffer_timeout = obt

    rate = int(data.get("sample_rate") or 0)
    if rate < 0 or rate > 99:
        raise _invalid("sample rate", rate)
    ident.sample_rate = rate

    mto = int(data.get("msg_timeout") or 0)
    if mto != 0:
        if mto < 1000 or mto > config.max_msg_timeout:
            raise _invalid("msg timeout", mto)
        ident.msg_timeout = mto

    ident.feature_negotiation = bool(data.get("feature_negotiation"))
    if not ident.feature_negotiation:
        return ident, b"OK"

    want_deflate = bool(data.get("deflate"))
    want_snappy = bool(data.get("snappy"))
    ident.tls_v1 = config.tls_enabled and bool(data.get("tls_v1"))
    ident.deflate = config.deflate and want_deflate
    ident.snappy = config.snappy and snappy_available and want_snappy
    if ident.deflate and ident.snappy:
        raise ProtocolError("E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression")
    level = int(data.get("deflate_level") or 0) or 6
    ident.deflate_level = min(level, config.max_deflate_level)

    reply = {
        "max_rdy_count": config.max_rdy_count,
        "version": config.version,
        "max_msg_timeout": config.max_msg_timeout,
        "msg_timeout": ident.msg_timeout,
        "tls_v1": ident.tls_v1,
        "deflate": ident.deflate,
        "deflate_level": ident.deflate_level,
        "max_deflate_level": config.max_deflate_level,
        "snappy": ident.snappy,
        "sample_rate": ident.sample_rate,
        "auth_required": auth_required,
        "output_buffer_size": ident.output_buffer_size,
        "output_buffer_timeout": ident.output_buffer_timeout,
    }
    return ident, json.dumps(reply, separators=(",", ":")).encode()
