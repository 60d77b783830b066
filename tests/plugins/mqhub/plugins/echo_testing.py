"""Test-only protocol plugin ``echotest``: a line echo server on one TCP role.

It exercises the drop-in path end to end (discovery, --listen, ListenerService, ordered stop)
without depending on any built-in protocol.
"""

from __future__ import annotations

from typing import Any

from zope.interface import implementer

from mqhub.interfaces import IProtocolPlugin


@implementer(IProtocolPlugin)
class EchoTesting:
    """Descriptor of the echo test protocol."""

    name = "echotest"
    aliases = ("echo",)
    description = "Test-only line echo server"
    default_endpoints = {"tcp": "tcp:7907:interface=127.0.0.1"}

    def make_service(self, hub: Any, endpoints: dict[str, str], options: dict[str, Any]) -> Any:
        """Build a ListenerService echoing lines, prefixed by ``--option echotest.prefix=``."""
        from twisted.internet.protocol import Factory
        from twisted.protocols.basic import LineReceiver

        from mqhub.listener import ListenerService

        prefix = options["plugin_options"].get("echotest", {}).get("prefix", "").encode()

        class Echo(LineReceiver):
            """Write every line back, prefixed."""

            delimiter = b"\n"

            def lineReceived(self, line: bytes) -> None:
                """Echo ``line``."""
                self.sendLine(prefix + line)

        return ListenerService(endpoints["tcp"], Factory.forProtocol(Echo), reactor=hub.reactor)


echotest = EchoTesting()
