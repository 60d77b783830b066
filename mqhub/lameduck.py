"""Lame-duck mode for the whole hub (SIGUSR2, ``POST /api/lameduck``, ``mqhub lameduck``).

As nats-server's: the hub stops accepting clients on every protocol port, tells the clients
that can be told (NATS: ``INFO {"ldm": true}``; NSQ consumers: nsqd's CLOSE_WAIT state, no new
deliveries while their in-flight messages may still be finished), waits a grace period, then
closes the open client connections a few at a time so that the last one closes at the end of
the lame-duck duration, and finally stops the hub the ordinary way (listeners, scheduler,
broker, store: nothing is killed). Each connection closes through its protocol's own path, so
unfinished deliveries are requeued as on any disconnect.

Protocol services take part through two optional methods:

- ``lame_duck()`` on a protocol service: tell its clients (called once, at the start);
- ``lame_duck_close()`` on a connection protocol: close it gracefully (default:
  ``transport.loseConnection()``).

Observer listeners (``ListenerService(observer=True)``: the admin listener, the manhole, NATS
monitoring) keep serving until the final stop, so the operator can watch the clients leave.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Callable
from typing import Any

from twisted.logger import Logger

from mqhub.listener import ListenerService

__all__ = ["LameDuck", "DEFAULT_DURATION", "DEFAULT_GRACE", "install_signal"]

log = Logger(namespace="mqhub.lameduck")

#: nats-server's defaults: lame_duck_duration 2m, lame_duck_grace_period 10s
DEFAULT_DURATION = 120.0
DEFAULT_GRACE = 10.0
#: at most this many closing rounds over the closing window
MAX_ROUNDS = 100


class LameDuck:
    """Drives one lame-duck run over the services under ``root`` (a HubService).

    :param clock: IReactorTime for the timers.
    :param stop: called once every client is gone (twistd: ``reactor.stop``).
    """

    def __init__(self, root: Any, clock: Any, stop: Callable[[], Any],
                 duration: float = DEFAULT_DURATION, grace: float = DEFAULT_GRACE) -> None:
        """Remember where to act; nothing happens until :meth:`start`."""
        self.root = root
        self.clock = clock
        self.stop = stop
        self.duration = duration
        self.grace = grace
        self.started_at: float | None = None
        self.closed = 0
        self._calls: list[Any] = []
        self._stopped = False

    @property
    def active(self) -> bool:
        """Whether lame-duck mode was entered."""
        return self.started_at is not None

    def _client_listeners(self) -> list[ListenerService]:
        """Every protocol listener that accepts clients (observers left out)."""
        from mqhub.introspect import walk_listeners  # the admin stack's module: load late

        return [ls for _, ls in walk_listeners(self.root) if not ls.observer]

    def _open_connections(self) -> list[Any]:
        """The open client connections of every client listener."""
        return [conn for ls in self._client_listeners() for conn in ls.connections]

    def status(self) -> dict[str, Any]:
        """What the admin API shows: active, timing, clients left and closed."""
        out: dict[str, Any] = {"lame_duck": self.active, "duration": self.duration,
                               "grace": self.grace}
        if self.started_at is not None:
            out.update(since=self.started_at, connections=len(self._open_connections()),
                       closed=self.closed,
                       stops_by=self.started_at + max(self.duration, self.grace))
        return out

    def start(self, duration: float | None = None, grace: float | None = None) -> dict[str, Any]:
        """Enter lame-duck mode (a second call changes nothing) and return :meth:`status`."""
        if self.active:
            return self.status()
        if duration is not None:
            self.duration = float(duration)
        if grace is not None:
            self.grace = float(grace)
        if self.duration < 0 or self.grace < 0:
            raise ValueError("lame-duck duration and grace must not be negative")
        self.started_at = self.clock.seconds()
        listeners = self._client_listeners()
        for ls in listeners:
            ls.stop_accepting()
        for child in list(self.root):
            hook = getattr(child, "lame_duck", None)
            if callable(hook):
                try:
                    hook()
                except Exception:  # noqa: BLE001 - one protocol must not stop the others
                    log.failure("lame duck: {name} could not tell its clients", name=child.name)
        n = len(self._open_connections())
        log.info("entering lame-duck mode: {n} client(s), closing over {d:g}s after a {g:g}s "
                 "grace period", n=n, d=max(0.0, self.duration - self.grace), g=self.grace)
        self._calls.append(self.clock.callLater(self.grace, self._begin_closing))
        return self.status()

    def _begin_closing(self) -> None:
        """Grace period over: close the clients in rounds spread over the rest of the duration."""
        window = max(0.0, self.duration - self.grace)
        total = len(self._open_connections())
        rounds = max(1, min(MAX_ROUNDS, total))
        interval = window / rounds
        per_round = max(1, math.ceil(total / rounds))
        self._close_round(per_round, interval, rounds)

    def _close_round(self, per_round: int, interval: float, left: int) -> None:
        """Close up to ``per_round`` clients; schedule the next round, or finish."""
        conns = self._open_connections()
        batch = conns if left <= 1 else conns[:per_round]
        for conn in batch:
            self._close(conn)
        if left <= 1 or len(conns) <= len(batch):
            self._calls.append(self.clock.callLater(interval, self._finish))
            return
        self._calls.append(self.clock.callLater(
            interval, self._close_round, per_round, interval, left - 1))

    def _close(self, conn: Any) -> None:
        """Close one client gracefully through its protocol."""
        self.closed += 1
        hook = getattr(conn, "lame_duck_close", None)
        try:
            if callable(hook):
                hook()
            else:
                conn.transport.loseConnection()
        except Exception:  # noqa: BLE001 - keep closing the others
            log.failure("lame duck: closing a connection failed")

    def _finish(self) -> None:
        """Every client had its turn: stop the hub the ordinary way."""
        if self._stopped:
            return
        self._stopped = True
        log.info("lame duck over ({n} client(s) closed): stopping", n=self.closed)
        self.stop()

    def cancel(self) -> None:
        """Forget pending timers (the hub is stopping for another reason)."""
        for call in self._calls:
            if call.active():
                call.cancel()
        self._calls.clear()


def install_signal(reactor: Any, lame: LameDuck) -> None:
    """Make SIGUSR2 enter lame-duck mode (nats-server's ``--signal ldm``)."""

    def on_signal(signum: int, frame: Any) -> None:
        """Start lame duck from the reactor thread (safe from a signal handler)."""
        log.info("received SIGUSR2: lame-duck mode")
        reactor.callFromThread(lame.start)

    signal.signal(signal.SIGUSR2, on_signal)
