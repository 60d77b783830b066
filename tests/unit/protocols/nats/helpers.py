"""Test helpers: a NatsServer on a memory hub and clients on StringTransports."""

from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock

from mqhub.hub import Hub
from mqhub.protocols.nats import codec
from mqhub.protocols.nats.codec import NEED_DATA, NatsParser
from mqhub.protocols.nats.server import NatsServer, NatsSettings
from mqhub.store.memory import MemoryStore
from mqhub.testing import connect as connect_transport
from mqhub.testing import take_output


def make_hub() -> Hub:
    """A hub with a Clock and an open MemoryStore."""
    store = MemoryStore()
    store.open()
    return Hub(clock=Clock(), store=store)


def make_server(hub: Hub | None = None, **settings: Any) -> NatsServer:
    """A NatsServer over ``hub`` (or a fresh memory hub)."""
    return NatsServer(hub or make_hub(), NatsSettings(**settings))


class Client:
    """A NATS connection driven through a StringTransport; ``events()`` parses what it got."""

    def __init__(self, server: NatsServer, connect: dict[str, Any] | None = None,
                 handshake: bool = True) -> None:
        """Connect, read INFO, and (by default) send CONNECT + PING and read the PONG."""
        self.server = server
        self.proto, self.transport = connect_transport(server)
        self.parser = NatsParser(server=False, max_payload=1 << 30)
        first = self.events()
        assert first[0][0] == codec.OP_INFO
        self.info = first[0][1]
        if handshake:
            opts = {"verbose": False, "pedantic": False, "headers": True, "no_responders": True,
                    "protocol": 1}
            opts.update(connect or {})
            self.send(codec.encode_connect(opts) + codec.PING)
            assert self.events() == [(codec.OP_PONG,)]

    def send(self, data: bytes) -> None:
        """Deliver ``data`` to the server as one read."""
        self.proto.dataReceived(data)

    def raw(self) -> bytes:
        """Take everything written to this client so far."""
        return take_output(self.transport)

    def events(self) -> list[tuple]:
        """Parse everything written so far into client-side events."""
        self.parser.receive_data(self.raw())
        out: list[tuple] = []
        while (ev := self.parser.next_event()) is not NEED_DATA:
            assert isinstance(ev, tuple)
            out.append(ev)
        return out

    @property
    def closed(self) -> bool:
        """True once the server closed (or aborted) this connection."""
        return not self.transport.connected or not self.proto.connected


def make_mq9_server(hub: Hub | None = None, **plugin_options: Any) -> NatsServer:
    """A NatsServer with its mq9 layer (as the plugin builds it), recovered and sweeping."""
    from mqhub.protocols.nats.service import build_server

    if hub is None:
        hub = make_hub()
        hub.clock.advance(1_800_000_000)
    srv = build_server(hub, plugin_options)
    d = srv.mq9.start()
    assert d.called
    return srv


def request(client: Client, subject: str, payload: bytes, inbox: str = "_INBOX.t.1") -> Any:
    """Send a request with a reply inbox (subscribed once per client) and return the JSON reply."""
    import json

    if not getattr(client, "_inbox_sub", False):
        client.send(b"SUB _INBOX.t.* 99\r\n")
        client._inbox_sub = True  # type: ignore[attr-defined]
    client.send(codec.encode_pub(subject, payload, inbox))
    replies = [e for e in client.events() if e[0] == codec.OP_MSG and e[1] == inbox]
    assert len(replies) == 1, replies
    return json.loads(replies[0][4])
