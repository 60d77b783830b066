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

    #: JSON users file; clients must send authUsername/authPassword (also --vibemq-users)
    users: str | None = None
    #: largest frame (bytes)
    max_frame_size: int = 1 << 20
    #: largest payload after decompression (bytes)
    max_decompressed: int = 64 << 20
    #: payloads at least this large are compressed for clients that accept it (bytes)
    compression_threshold: int = 1024
    #: server-side preference among the client's list (comma-separated, client order wins)
    compressions: str = "brotli,gzip"
    #: connections at once (0 = no limit)
    max_connections: int = 0
    #: new connections per IP per minute (0 = no limit; the original: 20)
    connection_rate: int = 0
    #: frames per second per connection (0 = no limit; the original: 1000)
    frame_rate: int = 0
    #: seconds a delivered message may stay unacknowledged before it is redelivered
    ack_timeout: float = 30.0
    #: Deliver frames in flight per subscription before the broker waits for acks
    prefetch: int = 5000
    #: ready messages a durable queue keeps in memory before the rest is paged from the store
    #: (core ``window``; the broker's default is 10,000, NSQ channels use 50,000 for the same
    #: reason: a consumer briefly further behind falls into paging, which waits for a pause in
    #: the publishing)
    window: int = 50_000
    #: a publish to a missing queue creates it (the original's EnableAutoCreate)
    auto_create: bool = True
    #: durable (stored, survives restarts) or memory queues
    tier: str = "durable"
    #: JSON validation of every publish payload (INVALID_MESSAGE on bad JSON, as the original)
    validate_json: bool = True
    #: publishes a connection may have withheld by BlockPublisher before its reads pause
    max_blocked: int = 10_000
    #: seconds between checks for new dead letters while a dead-letter queue has subscribers
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
