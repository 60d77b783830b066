"""Example drop-in protocol plugin: a Redis RESP pub/sub subset on TCP 6380.

mqhub never imports this file: it is found when ``plugins/`` is given with ``--plugin-path``
(or ``MQHUB_PLUGIN_PATH``). It is the template for third-party protocols: a tiny descriptor
here, the real code imported inside ``make_service``.
"""

from __future__ import annotations

from typing import Any

from zope.interface import implementer

from mqhub.interfaces import IProtocolPlugin


@implementer(IProtocolPlugin)
class RedisExample:
    """Descriptor of the ``redis`` protocol (PING, PUBLISH, (P)SUBSCRIBE, (P)UNSUBSCRIBE)."""

    name = "redis"
    aliases = ("resp",)
    description = "Redis RESP pub/sub subset (example drop-in plugin), channels are hub addresses"
    default_endpoints = {"tcp": "tcp:6380:interface=127.0.0.1"}

    def make_service(self, hub: Any, endpoints: dict[str, str], options: dict[str, Any]) -> Any:
        """Build a listener serving RESP on ``endpoints['tcp']``.

        ``--option redis.max_pubsub_buffer=BYTES`` sets the slow-subscriber limit (32 MiB).
        """
        from mqhub.plugins._redis_example.server import MAX_PUBSUB_BUFFER, RespFactory

        from mqhub.errors import PluginError
        from mqhub.listener import ListenerService

        settings = options.get("plugin_options", {}).get("redis", {})
        try:
            limit = int(settings.get("max_pubsub_buffer", MAX_PUBSUB_BUFFER))
        except ValueError:
            raise PluginError("redis: max_pubsub_buffer must be a number of bytes") from None
        return ListenerService(endpoints["tcp"], RespFactory(hub, limit), reactor=hub.reactor)


redis = RedisExample()
