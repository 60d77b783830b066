"""NATS over WebSocket (``--listen nats.ws=ENDPOINT``), as nats-server's ``websocket {}`` block.

autobahn does the WebSocket handshake and framing; this module only carries the NATS byte
stream across it. Each WebSocket connection owns one ordinary
:class:`mqhub.protocols.nats.connection.NatsConnection` of the same
:class:`~mqhub.protocols.nats.server.NatsServer` (same subjects, same auth, same counters),
whose transport is a :class:`WebSocketStream`: every write of the connection (one per read
turn) is one binary message, every message from the client (binary or text) is stream input.
No subprotocol is needed (browsers' ``nats.ws`` and nats.py send none).

The listener itself (options, TLS, the no_tls rule) is built by
:func:`mqhub.protocols.nats.service.websocket_listener`, which imports this module (and
autobahn) only when the first WebSocket client connects or shortly after the port is bound.
"""

from __future__ import annotations

from typing import Any

from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from autobahn.websocket.compress import PerMessageDeflateOffer, PerMessageDeflateOfferAccept
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqhub.protocols.nats.connection import NatsConnection
from mqhub.protocols.nats.server import NatsServer

__all__ = ["WebSocketStream", "NatsWebSocket", "NatsWebSocketFactory", "MAX_MESSAGE"]

log = Logger()

#: the largest WebSocket message a client may send (the NATS connection's own limits apply
#: inside it; this bounds what autobahn buffers while reassembling one message)
MAX_MESSAGE = 64 * 1024 * 1024


class WebSocketStream:
    """The transport a NatsConnection sees: a byte stream over one WebSocket connection.

    Producer calls go to the TCP transport underneath, so the connection's slow-consumer
    accounting and publisher stalls work as on a plain socket.
    """

    def __init__(self, ws: NatsWebSocket) -> None:
        """Carry the stream over ``ws``."""
        self.ws = ws
        #: the TCP (or TLS) transport under the WebSocket
        self.tcp: Any = ws.transport
        self.connected = True
        self.disconnecting = False

    def write(self, data: bytes) -> None:
        """Send ``data`` as one binary WebSocket message."""
        if self.connected and data:
            self.ws.sendMessage(data, isBinary=True)

    def writeSequence(self, chunks: list[bytes]) -> None:
        """Send ``chunks`` as one binary message."""
        self.write(b"".join(chunks))

    def loseConnection(self) -> None:
        """Close with the WebSocket closing handshake (pending messages go first)."""
        if self.connected and not self.disconnecting:
            self.disconnecting = True
            self.ws.sendClose(1000)

    def abortConnection(self) -> None:
        """Drop the TCP connection at once (a slow consumer)."""
        self.disconnecting = True
        self.ws.dropConnection(abort=True)

    def getPeer(self) -> Any:
        """The client's TCP address."""
        return self.tcp.getPeer()

    def getHost(self) -> Any:
        """The listener's TCP address."""
        return self.tcp.getHost()

    def getPeerCertificate(self) -> Any:
        """The client's TLS certificate on a wss:// connection with verification, or None."""
        get = getattr(self.tcp, "getPeerCertificate", None)
        return get() if get is not None else None

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        """Let the TCP transport pause the NATS connection when its buffer fills."""
        self.tcp.registerProducer(producer, streaming)

    def unregisterProducer(self) -> None:
        """Undo :meth:`registerProducer`."""
        if getattr(self.tcp, "producer", None) is not None:
            self.tcp.unregisterProducer()

    def pauseProducing(self) -> None:
        """Stop reading from this client (a publisher stalled by a backed-up subscriber)."""
        self.tcp.pauseProducing()

    def resumeProducing(self) -> None:
        """Read from this client again."""
        self.tcp.resumeProducing()


class NatsWebSocket(WebSocketServerProtocol):
    """One WebSocket connection carrying one NATS connection (built once the handshake is done).
    """

    factory: NatsWebSocketFactory
    nats: NatsConnection | None = None

    def onConnect(self, request: Any) -> None:
        """Accept the handshake without a subprotocol (nats-server picks none)."""
        return None

    def onOpen(self) -> None:
        """Handshake done: start the NATS connection (INFO goes out as the first message)."""
        stream = WebSocketStream(self)
        conn = self.factory.nats.buildProtocol(stream.getPeer())
        conn.websocket = True
        self.nats = conn
        conn.makeConnection(stream)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        """A message from the client is the next piece of its NATS byte stream."""
        if self.nats is not None:
            self.nats.dataReceived(payload)

    def lame_duck_close(self) -> None:
        """Closed by the hub's lame-duck mode: the NATS connection closes, then the WebSocket."""
        if self.nats is not None:
            self.nats.close(None)
        else:
            self.sendClose(1001)

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        """The WebSocket closed: the NATS connection is gone."""
        conn, self.nats = self.nats, None
        if conn is not None:
            transport = conn.transport
            if isinstance(transport, WebSocketStream):
                transport.connected = False
            conn.connectionLost(Failure(ConnectionError(f"websocket closed ({code})")))


class NatsWebSocketFactory(WebSocketServerFactory):
    """Builds :class:`NatsWebSocket` protocols for one NATS server."""

    def __init__(self, nats: NatsServer, compression: bool) -> None:
        """Serve ``nats``'s clients; ``compression`` accepts permessage-deflate offers."""
        super().__init__()
        self.nats = nats
        options: dict[str, Any] = {
            "failByDrop": False, "maxMessagePayloadSize": MAX_MESSAGE,
            "maxFramePayloadSize": MAX_MESSAGE, "openHandshakeTimeout": 10,
        }
        if compression:
            def accept(offers: list[Any]) -> Any:
                """Take the client's first permessage-deflate offer."""
                for offer in offers:
                    if isinstance(offer, PerMessageDeflateOffer):
                        return PerMessageDeflateOfferAccept(offer)
                return None

            options["perMessageCompressionAccept"] = accept
        self.setProtocolOptions(**options)
        self.noisy = False

    def buildProtocol(self, addr: Any) -> Any:
        """A WebSocket protocol of this factory."""
        proto = NatsWebSocket()
        proto.factory = self
        return proto
