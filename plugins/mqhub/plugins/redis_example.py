"""Example drop-in protocol plugin: a Redis RESP pub/sub subset on TCP 6380.

mqhub never imports this file: it is found when ``plugins/`` is given with ``--plugin-path``
(or ``MQHUB_PLUGIN_PATH``). It is the template for third-party protocols: a tiny descriptor
here, the real code imported inside ``make_service``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zope.interface import implementer

from mqhub.interfaces import IProtocolPlugin


@dataclass
class RedisSettings:
    """The plugin's options: ``--option redis.KEY=VALUE``, or ``[redis]`` in a config file."""

    #: output bytes a subscriber may have pending before it is disconnected (slow subscriber)
    max_pubsub_buffer: int = 32 * 1024 * 1024


@implementer(IProtocolPlugin)
class RedisExample:
    """Descriptor of the ``redis`` protocol (PING, PUBLISH, (P)SUBSCRIBE, (P)UNSUBSCRIBE)."""

    name = "redis"
    aliases = ("resp",)
    description = "Redis RESP pub/sub subset (example drop-in plugin), channels are hub addresses"
    default_endpoints = {"tcp": "tcp:6380:interface=127.0.0.1"}
    settings = "mqhub.plugins.redis_example:RedisSettings"

    def make_service(self, hub: Any, endpoints: dict[str, str], options: dict[str, Any]) -> Any:
        """Build a listener serving RESP on ``endpoints['tcp']`` (settings: RedisSettings)."""
        from mqhub.plugins._redis_example.server import RespFactory

        from mqhub.listener import ListenerService
        from mqhub.plugin_settings import apply_settings

        raw = options.get("plugin_options", {}).get("redis", {})
        settings = apply_settings(RedisSettings(), raw, "redis")
        return ListenerService(endpoints["tcp"], RespFactory(hub, settings.max_pubsub_buffer),
                               reactor=hub.reactor)


redis = RedisExample()
