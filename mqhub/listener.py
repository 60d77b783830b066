"""ListenerService: one Twisted endpoint + factory, stopped as "stop accepting, then close".

Protocol plugins that serve a stream endpoint return this from ``make_service`` (or put several
in a MultiService). Unlike ``strports.service`` it binds in ``startService`` only (HubService
starts listeners once the broker has recovered), and its ``stopService`` closes every open
connection and fires when they are gone, aborting the stragglers after ``drain_timeout``.
"""

from __future__ import annotations

from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred, maybeDeferred, succeed
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IListeningPort
from twisted.logger import Logger
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from twisted.python.failure import Failure


class _TrackingFactory(WrappingFactory):
    """WrappingFactory that can tell when its last connection has gone."""

    noisy = False  # ListenerService logs its own one-line "listening on" message

    def __init__(self, wrapped: Any) -> None:
        """Wrap ``wrapped`` (a server factory)."""
        super().__init__(wrapped)
        self._idle_waiters: list[Deferred[None]] = []

    def unregisterProtocol(self, p: ProtocolWrapper) -> None:
        """Forget ``p`` and wake the waiters when none are left."""
        super().unregisterProtocol(p)
        if not self.protocols:
            waiters, self._idle_waiters = self._idle_waiters, []
            for d in waiters:
                d.callback(None)

    def release_waiters(self) -> None:
        """Fire every waiter now (connections were aborted and will not be waited for)."""
        waiters, self._idle_waiters = self._idle_waiters, []
        for d in waiters:
            d.callback(None)

    def wait_idle(self) -> Deferred[None]:
        """Fire once no connection is open."""
        if not self.protocols:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._idle_waiters.append(d)
        return d


class ListenerService(Service):
    """Listen on ``endpoint`` with ``factory`` while running.

    :ivar port: the IListeningPort once listening (``port.getHost().port`` is the bound port).
    :ivar listening: a Deferred that fires with the port, or fails when binding failed.
    """

    log = Logger()

    def __init__(
        self,
        endpoint: str,
        factory: Any,
        reactor: Any = None,
        drain_timeout: float = 2.0,
    ) -> None:
        """:param endpoint: a Twisted server endpoint string, e.g. ``tcp:4150:interface=127.0.0.1``.
        :param reactor: the reactor to listen with (the global one when None).
        :param drain_timeout: seconds to wait for connections to close before aborting them.
        """
        self.endpoint = endpoint
        self.factory = factory
        self._reactor = reactor
        self.drain_timeout = drain_timeout
        self._tracking = _TrackingFactory(factory)
        self.port: IListeningPort | None = None
        self.listening: Deferred[Any] = Deferred()

    def _get_reactor(self) -> Any:
        """The reactor given, or the global one."""
        if self._reactor is None:
            from twisted.internet import reactor

            self._reactor = reactor
        return self._reactor

    def startService(self) -> None:
        """Start listening; failures are logged and reported through ``listening``."""
        Service.startService(self)
        d = serverFromString(self._get_reactor(), self.endpoint).listen(self._tracking)
        d.addCallbacks(self._listened, self._listen_failed)

    def _listened(self, port: IListeningPort) -> None:
        """Remember the port; stop it at once if we were stopped meanwhile."""
        self.port = port
        self.log.info("{name} listening on {endpoint}", name=self.name, endpoint=self.endpoint)
        if not self.running:
            port.stopListening()
        self.listening.callback(port)

    def _listen_failed(self, failure: Failure) -> None:
        """Log a bind failure in one line."""
        self.log.error(
            "{name} cannot listen on {endpoint}: {error}",
            name=self.name,
            endpoint=self.endpoint,
            error=failure.getErrorMessage(),
        )
        self.listening.errback(failure)
        self.listening.addErrback(lambda _: None)

    @property
    def connections(self) -> list[Any]:
        """The protocols of the open connections."""
        return [w.wrappedProtocol for w in self._tracking.protocols]

    def stopService(self) -> Deferred[None]:
        """Stop accepting, close every connection, and fire when all are closed (bounded)."""
        Service.stopService(self)
        port, self.port = self.port, None
        stopped: Deferred[Any] = succeed(None) if port is None else maybeDeferred(port.stopListening)

        def close_all(_: object) -> Deferred[None]:
            for wrapper in list(self._tracking.protocols):
                wrapper.transport.loseConnection()
            idle = self._tracking.wait_idle()
            if not idle.called:
                timer = self._get_reactor().callLater(self.drain_timeout, self._abort_all)

                def cancel_timer(result: object) -> object:
                    if timer.active():
                        timer.cancel()
                    return result

                idle.addBoth(cancel_timer)
            return idle

        stopped.addBoth(close_all)
        return stopped

    def _abort_all(self) -> None:
        """Abort connections that did not close in time, and stop waiting for them."""
        for wrapper in list(self._tracking.protocols):
            self.log.warn("{name}: aborting a connection that did not close", name=self.name)
            abort = getattr(wrapper.transport, "abortConnection", None)
            if abort is not None:
                abort()
        self._tracking.release_waiters()
