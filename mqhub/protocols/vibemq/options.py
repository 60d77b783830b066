"""VibeMQ JSON payloads: QueueOptions (CreateQueue), QueueInfo, .NET TimeSpan/DateTime text.

Enums are integers, property names camelCase, null properties omitted, exactly as the .NET
client's ``ProtocolSerializer`` writes them. No Twisted import.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

MODE_ROUND_ROBIN, MODE_FANOUT_ACK, MODE_FANOUT_NO_ACK, MODE_PRIORITY = 0, 1, 2, 3
MODES = (MODE_ROUND_ROBIN, MODE_FANOUT_ACK, MODE_FANOUT_NO_ACK, MODE_PRIORITY)
DROP_OLDEST, DROP_NEWEST, BLOCK_PUBLISHER, REDIRECT_TO_DLQ = 0, 1, 2, 3
OVERFLOWS = (DROP_OLDEST, DROP_NEWEST, BLOCK_PUBLISHER, REDIRECT_TO_DLQ)

#: priority header names (case-insensitive), as the original's ``MessagePriority`` enum
PRIORITY_NAMES = {"low": 0, "normal": 1, "high": 2, "critical": 3}
NORMAL_PRIORITY = 1
MAX_PRIORITY = 9

_TIMESPAN = re.compile(r"^(-)?(?:(\d+)\.)?(\d{1,2}):(\d{1,2}):(\d{1,2})(?:\.(\d{1,7}))?$")


class PayloadError(ValueError):
    """A JSON payload that cannot be read (bad JSON, wrong type, unknown enum value)."""


def parse_timespan(text: str) -> float:
    """Seconds in a .NET "c" TimeSpan string ``[-][d.]hh:mm:ss[.fffffff]``.

    :raises PayloadError: when ``text`` is not in that format.
    """
    m = _TIMESPAN.match(text) if isinstance(text, str) else None
    if m is None:
        raise PayloadError(f"invalid TimeSpan {text!r}")
    sign, days, hours, minutes, seconds, frac = m.groups()
    if int(hours) > 23 or int(minutes) > 59 or int(seconds) > 59:
        raise PayloadError(f"invalid TimeSpan {text!r}")
    total = (int(days or 0) * 86400 + int(hours) * 3600 + int(minutes) * 60 + int(seconds)
             + (int(frac.ljust(7, "0")) / 1e7 if frac else 0.0))
    return -total if sign else total


def format_timespan(seconds: float) -> str:
    """The .NET "c" text of ``seconds`` (``1.00:00:00``, ``00:00:01.5000000``)."""
    ticks = round(abs(seconds) * 1e7)
    whole, frac = divmod(ticks, 10_000_000)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    if days:
        text = f"{days}.{text}"
    if frac:
        text += f".{frac:07d}"
    return ("-" if seconds < 0 else "") + text


def format_datetime(posix: float) -> str:
    """ISO-8601 UTC with up to 7 fractional digits (trailing zeros trimmed) and ``Z``."""
    dt = datetime.fromtimestamp(posix, tz=UTC)
    text = dt.strftime("%Y-%m-%dT%H:%M:%S")
    frac = f"{dt.microsecond:06d}0".rstrip("0")
    return text + ("." + frac if frac else "") + "Z"


def parse_priority(value: str | None) -> int:
    """Core priority (0–9) of a ``priority`` header.

    Low 0, Normal 1, High 2, Critical 3 (any case) or an integer clamped to 0–9; no header
    or an unparseable value gives Normal (the original gave Low to unparseable values).
    """
    if value is None:
        return NORMAL_PRIORITY
    p = PRIORITY_NAMES.get(value.strip().lower())
    if p is not None:
        return p
    try:
        n = int(value.strip())
    except ValueError:
        return NORMAL_PRIORITY
    return 0 if n < 0 else MAX_PRIORITY if n > MAX_PRIORITY else n


@dataclass
class QueueOptions:
    """A VibeMQ queue's settings (the CreateQueue payload)."""

    mode: int = MODE_ROUND_ROBIN
    max_queue_size: int = 10_000
    message_ttl: float | None = None
    enable_dead_letter_queue: bool = False
    dead_letter_queue_name: str | None = None
    overflow_strategy: int = DROP_OLDEST
    max_retry_attempts: int = 3

    @classmethod
    def from_json(cls, raw: bytes | None) -> QueueOptions:
        """Parse a CreateQueue payload (None = defaults).

        :raises PayloadError: bad JSON, a wrong type, or an enum value out of range.
        """
        if raw is None:
            return cls()
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise PayloadError(f"invalid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise PayloadError("QueueOptions must be a JSON object")
        opts = cls()
        opts.mode = _enum(data, "mode", MODES, opts.mode)
        opts.max_queue_size = _int(data, "maxQueueSize", opts.max_queue_size)
        if opts.max_queue_size < 0:
            raise PayloadError("maxQueueSize must not be negative")
        ttl = data.get("messageTtl")
        if ttl is not None:
            opts.message_ttl = parse_timespan(ttl)
        dlq = data.get("enableDeadLetterQueue", False)
        if not isinstance(dlq, bool):
            raise PayloadError("enableDeadLetterQueue must be a boolean")
        opts.enable_dead_letter_queue = dlq
        name = data.get("deadLetterQueueName")
        if name is not None and not isinstance(name, str):
            raise PayloadError("deadLetterQueueName must be a string")
        opts.dead_letter_queue_name = name or None
        opts.overflow_strategy = _enum(data, "overflowStrategy", OVERFLOWS,
                                       opts.overflow_strategy)
        opts.max_retry_attempts = _int(data, "maxRetryAttempts", opts.max_retry_attempts)
        if opts.max_retry_attempts < 0:
            raise PayloadError("maxRetryAttempts must not be negative")
        return opts

    def to_json(self) -> bytes:
        """The payload exactly as the .NET client serializes it (C# property order)."""
        data: dict[str, Any] = {"mode": self.mode, "maxQueueSize": self.max_queue_size}
        if self.message_ttl is not None:
            data["messageTtl"] = format_timespan(self.message_ttl)
        data["enableDeadLetterQueue"] = self.enable_dead_letter_queue
        if self.dead_letter_queue_name is not None:
            data["deadLetterQueueName"] = self.dead_letter_queue_name
        data["overflowStrategy"] = self.overflow_strategy
        data["maxRetryAttempts"] = self.max_retry_attempts
        return json.dumps(data, separators=(",", ":")).encode()

    def to_record(self) -> dict[str, Any]:
        """A plain dict for the store."""
        return {"mode": self.mode, "max_queue_size": self.max_queue_size,
                "message_ttl": self.message_ttl, "dlq": self.enable_dead_letter_queue,
                "dlq_name": self.dead_letter_queue_name, "overflow": self.overflow_strategy,
                "retries": self.max_retry_attempts}

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> QueueOptions:
        """The inverse of :meth:`to_record`."""
        return cls(rec["mode"], rec["max_queue_size"], rec["message_ttl"], rec["dlq"],
                   rec["dlq_name"], rec["overflow"], rec["retries"])


def _int(data: dict[str, Any], key: str, default: int) -> int:
    """An integer property (bools are not integers here)."""
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise PayloadError(f"{key} must be an integer")
    return value


def _enum(data: dict[str, Any], key: str, allowed: tuple[int, ...], default: int) -> int:
    """An integer enum property within ``allowed``."""
    value = _int(data, key, default)
    if value not in allowed:
        raise PayloadError(f"{key} value {value} is not defined")
    return value


def queue_info_json(name: str, opts: QueueOptions, message_count: int, subscriber_count: int,
                    created_at: float, dlq_name: str | None) -> bytes:
    """The QueueInfo reply payload, with the original's field names and integer enums."""
    data: dict[str, Any] = {
        "name": name, "messageCount": message_count, "subscriberCount": subscriber_count,
        "deliveryMode": opts.mode, "maxSize": opts.max_queue_size,
        "createdAt": format_datetime(created_at),
    }
    if opts.message_ttl is not None:
        data["messageTtl"] = format_timespan(opts.message_ttl)
    data["enableDeadLetterQueue"] = opts.enable_dead_letter_queue
    if dlq_name is not None:
        data["deadLetterQueueName"] = dlq_name
    data["overflowStrategy"] = opts.overflow_strategy
    data["maxRetryAttempts"] = opts.max_retry_attempts
    return json.dumps(data, separators=(",", ":")).encode()
