"""ListenerService: one Twisted endpoint + factory, stopped as "stop accepting, then close".

Protocol plugins that serve a stream endpoint return this from ``make_service`` (or put several
in a MultiService). Unlike ``strports.service`` it binds in ``startService`` only (HubService
starts listeners once the broker has recovered), and its ``stopService`` closes every open
connection and fires when they are gone, aborting the stragglers after ``drain_timeout``.

Connections are tracked without wrapping them: the factory handed to the endpoint only records
each protocol it builds (in a WeakSet), so protocols see their real transport (TLS handshake
callbacks, producer registration) and the hot path pays nothing.

Every TCP listener has TCP_NODELAY set on its listening socket, which accepted sockets inherit
(Linux, the BSDs): no client connection of any protocol waits for Nagle's algorithm (a reply
followed by a PONG would otherwise wait for the peer's delayed ACK, ~40 ms).
"""

from __future__ import annotations

import re
import socket
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred, maybeDeferred, succeed
from twisted.internet.interfaces import IListeningPort
from twisted.internet.protocol import Factory
from twisted.logger import Logger
from twisted.python.failure import Failure

#: How often stopService checks whether the closed connections are gone.
POLL_INTERVAL = 0.02

#: a plain TCP endpoint (``tcp:PORT`` or ``tcp:port=PORT``, optional ``interface=``/``backlog=``,
#: nothing escaped): :func:`listen` binds it with ``listenTCP`` itself
PLAIN_TCP = re.compile(r"tcp:(?:port=)?(\d+)((?::(?:interface=[^:\\=]+|backlog=\d+))*)")


def listen(reactor: Any, endpoint: str, factory: Any) -> Deferred[Any]:
    """Listen on the server endpoint string ``endpoint``: what ``serverFromString(reactor,
    endpoint).listen(factory)`` does.

    A plain ``tcp:`` string (every default endpoint) goes to ``reactor.listenTCP`` directly,
    as Twisted's TCP endpoint would (backlog 50, all interfaces unless ``interface=``); any
    other string (``ssl:``, ``unix:``, escapes, other keywords) to Twisted's parser. Importing
    ``twisted.internet.endpoints`` costs a start about 30 ms (its TLS endpoints pull in
    ``twisted.internet.ssl`` and service_identity), a tenth of the time to the first client
    answer (issue 28, fast start), for a string a regular expression reads exactly.
    """
    plain = PLAIN_TCP.fullmatch(endpoint)
    if plain is None:
        from twisted.internet.endpoints import serverFromString

        return serverFromString(reactor, endpoint).listen(factory)
    args = dict(item.split("=", 1) for item in plain.group(2).split(":")[1:])
    return maybeDeferred(reactor.listenTCP, int(plain.group(1)), factory,
                         backlog=int(args.get("backlog", 50)), interface=args.get("interface", ""))


class _TrackingFactory(Factory):
    """Delegates to the protocol's own factory and remembers every protocol it builds."""

    noisy = False  # ListenerService logs its own one-line "listening on" message

    def __init__(self, wrapped: Any, clock: Any = None) -> None:
        """Track the protocols ``wrapped`` builds (and when, read from ``clock`` if given)."""
        self.wrapped = wrapped
        self.clock = clock
        self.built: weakref.WeakSet[Any] = weakref.WeakSet()
        #: protocol -> POSIX time it was built (the admin API's "since")
        self.since: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()

    def logPrefix(self) -> str:
        """Log as the wrapped factory ("NsqFactory starting on 4150")."""
        prefix = getattr(self.wrapped, "logPrefix", None)
        return prefix() if prefix is not None else type(self.wrapped).__name__

    def doStart(self) -> None:
        """Start the wrapped factory."""
        self.wrapped.doStart()

    def doStop(self) -> None:
        """Stop the wrapped factory."""
        self.wrapped.doStop()

    def buildProtocol(self, addr: Any) -> Any:
        """Build with the wrapped factory and remember the protocol."""
        protocol = self.wrapped.buildProtocol(addr)
        if protocol is not None:
            self.built.add(protocol)
            if self.clock is not None:
                self.since[protocol] = self.clock.seconds()
        return protocol

    def open_connections(self) -> list[Any]:
        """Protocols whose transport is still connected."""
        return [
            p for p in list(self.built)
            if getattr(p, "transport", None) is not None and getattr(p.transport, "connected", False)
        ]


class ListenerService(Service):
    """Listen on ``endpoint`` with ``factory`` while running.

    :ivar port: the IListeningPort once listening (``port.getHost().port`` is the bound port).
    :ivar listening: a Deferred that fires with the port, or fails when binding failed.
    :ivar failure: why binding failed (one line), or None.
    """

    log = Logger()

    def __init__(
        self,
        endpoint: str,
        factory: Any,
        reactor: Any = None,
        drain_timeout: float = 2.0,
        observer: bool = False,
    ) -> None:
        """:param endpoint: a Twisted server endpoint string, e.g. ``tcp:4150:interface=127.0.0.1``.
        :param reactor: the reactor to listen with (``hub.reactor``). The global reactor is
            never used: a hub without a reactor (unit tests) builds listeners but cannot start them.
        :param drain_timeout: seconds to wait for connections to close before aborting them.
        :param observer: an operator's surface (admin, manhole, NATS monitoring), not a
            protocol's clients: it keeps serving in lame-duck mode and its connections are not
            counted as the protocol's.
        """
        self.endpoint = endpoint
        self.observer = observer
        self.factory = factory
        self._reactor = reactor
        self.drain_timeout = drain_timeout
        self._tracking = _TrackingFactory(factory, reactor)
        self.port: IListeningPort | None = None
        self.listening: Deferred[Any] = Deferred()
        self.failure: str | None = None
        #: no longer accepting but keeping its connections (:meth:`stop_accepting`)
        self.draining = False

    @property
    def state(self) -> str:
        """``listening``, ``failed`` (binding failed), ``starting`` (bind under way),
        ``draining`` (no longer accepting, its connections still open: lame-duck mode) or
        ``stopped`` (not started yet, or stopped)."""
        if self.failure is not None:
            return "failed"
        if not self.running:
            return "stopped"
        if self.draining:
            return "draining"
        return "listening" if self.port is not None else "starting"

    def _get_reactor(self) -> Any:
        """The reactor given to the constructor.

        :raises RuntimeError: when there is none (a reactor-less hub must not bind ports).
        """
        if self._reactor is None:
            raise RuntimeError(f"{self.name or self.endpoint}: no reactor to listen with")
        return self._reactor

    def startService(self) -> None:
        """Start listening; failures (a bad endpoint string too) are logged in one line and
        reported through ``listening``.

        :raises RuntimeError: when the service was built without a reactor.
        """
        reactor = self._get_reactor()
        Service.startService(self)
        try:
            d = listen(reactor, self.endpoint, self._tracking)
        except Exception:  # noqa: BLE001 - a malformed endpoint string is a failed bind
            self._listen_failed(Failure())
            return
        d.addCallbacks(self._listened, self._listen_failed)

    def _listened(self, port: IListeningPort) -> None:
        """Remember the port; stop it at once if we were stopped meanwhile."""
        self.port = port
        no_delay_listening(port)
        self.log.info("{name} listening on {endpoint}", name=self.name, endpoint=self.endpoint)
        if not self.running:
            port.stopListening()
        self.listening.callback(port)

    def _listen_failed(self, failure: Failure) -> None:
        """Log a bind failure in one line."""
        self.failure = failure.getErrorMessage()
        self.log.error(
            "{name} cannot listen on {endpoint}: {error}",
            name=self.name,
            endpoint=self.endpoint,
            error=self.failure,
        )
        self.listening.errback(failure)
        self.listening.addErrback(lambda _: None)

    def stop_accepting(self) -> Deferred[Any]:
        """Stop listening but keep the open connections (lame-duck mode); stopService later
        still closes them."""
        port, self.port = self.port, None
        if port is None:
            return succeed(None)
        self.draining = True
        self.log.info("{name} stopped accepting on {endpoint}", name=self.name,
                      endpoint=self.endpoint)
        return maybeDeferred(port.stopListening)

    @property
    def connections(self) -> list[Any]:
        """The protocols of the open connections."""
        return self._tracking.open_connections()

    def connected_since(self, protocol: Any) -> float | None:
        """POSIX time the connection of ``protocol`` was accepted (None if unknown)."""
        return self._tracking.since.get(protocol)

    def stopService(self) -> Deferred[None]:
        """Stop accepting, close every connection, and fire when all are closed (bounded)."""
        Service.stopService(self)
        port, self.port = self.port, None
        stopped: Deferred[Any] = succeed(None) if port is None else maybeDeferred(port.stopListening)
        stopped.addBoth(self._close_all)
        return stopped

    def _close_all(self, _: object) -> Deferred[None]:
        """Ask every connection to close; fire once none is left or after aborting the rest."""
        open_now = self._tracking.open_connections()
        if not open_now:
            return succeed(None)
        for protocol in open_now:
            protocol.transport.loseConnection()
        clock = self._get_reactor()
        deadline = clock.seconds() + self.drain_timeout
        done: Deferred[None] = Deferred()

        def check() -> None:
            """Fire when every connection is gone; abort the rest at the deadline."""
            remaining = self._tracking.open_connections()
            if not remaining:
                done.callback(None)
            elif clock.seconds() >= deadline:
                self._abort(remaining)
                done.callback(None)
            else:
                clock.callLater(POLL_INTERVAL, check)

        check()
        return done

    def _abort(self, remaining: list[Any]) -> None:
        """Abort connections that did not close in time."""
        self.log.warn("{name}: aborting {n} connection(s) that did not close", name=self.name,
                      n=len(remaining))
        for protocol in remaining:
            abort = getattr(protocol.transport, "abortConnection", None)
            if abort is not None:
                abort()


def walk_listeners(service: Any, top: str | None = None) -> Iterator[tuple[str, ListenerService]]:
    """Every ListenerService under ``service`` with the name of its top-level service."""
    for child in list(service) if hasattr(service, "__iter__") else []:
        name = top or getattr(child, "name", None) or "?"
        if isinstance(child, ListenerService):
            yield name, child
        else:
            yield from walk_listeners(child, name)


#: seconds after its port is bound that a :class:`DeferredFactory` is built
BUILD_DELAY = 0.05


class DeferredFactory(Factory):
    """A listener's factory built on first use, or :data:`BUILD_DELAY` seconds after its port
    is bound (:func:`build_soon`), so the modules it needs (twisted.web, autobahn, ...) are not
    imported before the protocol ports answer their first clients (issue 28, fast start)."""

    noisy = False

    def __init__(self, build: Callable[[], Any]) -> None:
        """Build the real factory with ``build()`` when first needed."""
        self.build = build
        self.built: Any = None
        self.started = False

    def ensure(self) -> Any:
        """The real factory, built now if it was not yet (and started if the port is)."""
        if self.built is None:
            self.built = self.build()
            if self.started:
                self.built.doStart()
        return self.built

    def doStart(self) -> None:
        """The port is listening."""
        self.started = True
        if self.built is not None:
            self.built.doStart()

    def doStop(self) -> None:
        """The port stopped."""
        self.started = False
        if self.built is not None:
            self.built.doStop()

    def buildProtocol(self, addr: Any) -> Any:
        """A protocol of the (built) factory."""
        return self.ensure().buildProtocol(addr)


def build_soon(listener: ListenerService, factory: DeferredFactory, clock: Any,
               delay: float = BUILD_DELAY) -> None:
    """Build ``factory`` ``delay`` seconds after ``listener`` is bound (a later reactor turn)."""

    def bound(port: Any) -> Any:
        """Schedule the build."""
        clock.callLater(delay, factory.ensure)
        return port

    listener.listening.addCallback(bound)


def peer_text(transport: Any) -> str:
    """``host:port`` of a connection's peer for logs and stats (``?`` when it has none)."""
    try:
        peer = transport.getPeer()
        return f"{peer.host}:{peer.port}"
    except Exception:
        return "?"


def no_delay_listening(port: Any) -> None:
    """Set TCP_NODELAY on a TCP listening port's socket (accepted sockets inherit it)."""
    sock = getattr(port, "socket", None)
    if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass


def set_no_delay(transport: Any) -> None:
    """Turn Nagle's algorithm off where the transport allows it (small replies go out at once)."""
    no_delay = getattr(transport, "setTcpNoDelay", None)
    if no_delay is not None:
        try:
            no_delay(True)
        except OSError:
            pass


def set_read_size(transport: Any, size: int) -> None:
    """Read up to ``size`` bytes per turn (and buffer as much output before pausing).

    Looks through a ProtocolWrapper (TLS, the listener's tracking) to the socket transport;
    transports without a ``bufferSize`` are left alone.
    """
    inner = getattr(transport, "transport", None)
    real = inner if inner is not None and hasattr(inner, "bufferSize") else transport
    if hasattr(real, "bufferSize"):
        real.bufferSize = size
