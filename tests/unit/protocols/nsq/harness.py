"""Test harness for the NSQ server: a memory hub on a Clock and StringTransport clients."""

from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransportWithDisconnection

from mqhub.protocols.nsq import codec as wire
from mqhub.protocols.nsq.auth import SecretsFile
from mqhub.protocols.nsq.config import NsqConfig
from mqhub.protocols.nsq.server import NsqFactory, NsqProtocol
from mqhub.protocols.nsq.service import NsqService
from mqhub.store.memory import MemoryStore
from mqhub.testing import connect, memory_hub, take_output


class Client:
    """One fake connection: send bytes, read decoded frames, see whether it was closed."""

    def __init__(self, service: NsqService, port: int) -> None:
        """Connect to ``service``'s factory (port only names the peer)."""
        self.proto: NsqProtocol
        self.transport: StringTransportWithDisconnection
        self.proto, self.transport = connect(service.factory, port=port)
        self.codec = wire.ClientCodec()

    def send(self, *chunks: bytes) -> None:
        """Deliver each chunk as one read."""
        for chunk in chunks:
            self.proto.dataReceived(chunk)

    def frames(self) -> list[Any]:
        """Every frame written since the last call, decoded."""
        self.codec.receive_data(take_output(self.transport))
        return self.codec.frames()

    @property
    def closed(self) -> bool:
        """True once the server closed (or aborted) this connection."""
        return bool(self.transport.disconnecting or not self.transport.connected
                    or getattr(self.transport, "disconnected", False))

    def lose(self) -> None:
        """The client goes away."""
        self.transport.loseConnection()


class Harness:
    """A memory hub with the NSQ service built (not listening) and helpers to make clients."""

    def __init__(self, config: NsqConfig | None = None, secrets: SecretsFile | None = None) -> None:
        """Build the hub and service; recover topics (memory store: nothing to recover)."""
        self.clock = Clock()
        self.clock.advance(1_700_000_000)
        store = MemoryStore(clock=self.clock)  # grouped commits: OK waits for the turn's commit
        store.open()
        self.hub = memory_hub(clock=self.clock, store=store)
        self.config = config or NsqConfig(hostname="test-host")
        self.service = NsqService(self.hub, {"tcp": "tcp:0", "http": ""}, self.config, secrets)
        self.service.ports["tcp"] = 4150
        self.service.registry.load()
        self.clock.advance(0)
        self._ports = 40000

    @property
    def factory(self) -> NsqFactory:
        """The TCP factory."""
        return self.service.factory

    def client(self, magic: bool = True) -> Client:
        """A new connected client (magic already sent unless ``magic`` is False)."""
        self._ports += 1
        c = Client(self.service, self._ports)
        if magic:
            c.send(wire.MAGIC_V2)
        return c

    def settle(self) -> None:
        """Let grouped store commits (callLater(0)) and due timers run."""
        self.clock.advance(0)
        self.clock.advance(0)

    def consumer(self, topic: str, channel: str, rdy: int = 0, identify: dict | None = None) -> Client:
        """A client subscribed to topic/channel (and RDY when rdy > 0), frames cleared."""
        c = self.client()
        if identify is not None:
            c.send(wire.encode_identify(identify))
        c.send(wire.encode_sub(topic, channel))
        self.settle()
        frames = c.frames()
        assert frames[-1] == wire.Response(b"OK"), frames
        if rdy:
            c.send(wire.encode_rdy(rdy))
        return c
