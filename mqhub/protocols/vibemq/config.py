"""VibeMQConfig: the VibeMQ plugin's limits and switches, read from twistd options."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mqhub.errors import PluginError
from mqhub.plugin_settings import apply_settings


@dataclass
class VibeMQConfig:
    """Settings (``--option vibemq.KEY=VALUE``; the users file also as ``--vibemq-users``).

    Rate limits are off (0) by default; the original enforced 20 connections per IP per minute
    and 1000 frames per second per connection.
    """

    users: str | None = None
    max_frame_size: int = 1 << 20
    max_decompressed: int = 64 << 20
    compression_threshold: int = 1024
    #: server-side preference among the client's list (comma-separated, client order wins)
    compressions: str = "brotli,gzip"
    max_connections: int = 0
    connection_rate: int = 0
    frame_rate: int = 0
    ack_timeout: float = 30.0
    #: Deliver frames in flight per subscription before the broker waits for acks
    prefetch: int = 5000
    #: ready messages a durable queue keeps in memory before the rest is paged from the store
    #: (core ``window``; the broker's default is 10,000, NSQ channels use 50,000 for the same
    #: reason: a consumer briefly further behind falls into paging, which waits for a pause in
    #: the publishing)
    window: int = 50_000
    auto_create: bool = True
    tier: str = "durable"
    #: JSON validation of every publish payload (INVALID_MESSAGE on bad JSON, as the original)
    validate_json: bool = True
    #: publishes a connection may have withheld by BlockPublisher before its reads pause
    max_blocked: int = 10_000
    dlq_poll: float = 0.5

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> VibeMQConfig:
        """Build from ``plugin_options['vibemq']`` plus ``--vibemq-users``.

        :raises PluginError: on an unknown key or a value of the wrong type.
        """
        raw: dict[str, Any] = dict((options.get("plugin_options") or {}).get("vibemq", {}))
        if options.get("vibemq-users"):
            raw["users"] = options["vibemq-users"]
        config = apply_settings(cls(), raw, "vibemq")
        if config.tier not in ("durable", "memory"):
            raise PluginError("vibemq: tier must be durable or memory")
        return config
