"""The Hub (shared context every protocol plugin receives) and HubService (ordered start/stop).

A Hub holds the store, the broker core, the scheduler, the clock and the configuration;
plugins get it in ``make_service`` and keep a reference (like twisted.words' realm).

Strategy: twistd ignores the Deferred ``startService`` returns, and ``MultiService`` stops its
children all at once. HubService therefore sequences both by hand:

- start: ``store.open()`` (synchronous recovery) → ``broker.start()`` (a Deferred: queues
  rebuilt) → scheduler (its due entries now find their queues) → listener children. No port is
  bound before the broker has recovered (``privilegedStartService`` does not start children).
  "mqhub ready" is logged once every listener under the children is bound. A listener that
  cannot bind (or a child that raises, or a store that cannot open) fails the start instead:
  the owner (the tap) stops the process with status 1, as nsqd and nats-server exit, so a
  supervisor sees it (docs/operations.md "Starting and stopping").
- stop: listeners (stop accepting, close connections) → scheduler → broker → ``store.close()``,
  each step bounded so that SIGTERM ends the process within seconds even if a step hangs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from twisted.application.service import IService, MultiService, Service
from twisted.internet.defer import Deferred, DeferredList, maybeDeferred, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqhub.core.broker import Broker
from mqhub.errors import StoreError
from mqhub.identity import Directory
from mqhub.listener import walk_listeners
from mqhub.scheduler.service import SchedulerService
from mqhub.store.journal import DEFAULT_RETENTION_BYTES, DEFAULT_RETENTION_SECONDS, Journal
from mqhub.store.journal_recorder import JournalRecorder
from mqhub.store.lmdb import DEFAULT_MAP_SIZE, LmdbStore
from mqhub.store.memory import MemoryStore

log = Logger(namespace="mqhub.hub")

#: Options of the core's paging (``twistd mqhub --window ...``) -> their Broker keyword.
PAGING_KEYWORDS = {"window": "window", "window-bytes": "window_bytes",
                   "tails-bytes": "tails_bytes", "windows-bytes": "windows_bytes"}


class StartFailed(Exception):
    """The hub cannot start; the message says why in one line (no traceback is logged)."""


@dataclass
class Hub:
    """Shared context handed to protocol plugins.

    :ivar clock: the IReactorTime everything reads time from (a task.Clock in tests).
    :ivar store: the opened IMessageStore provider.
    :ivar broker: the protocol-neutral core (:class:`mqhub.core.broker.Broker`).
    :ivar scheduler: the SchedulerService (durable timers, cron, sweeps).
    :ivar config: parsed options (plugin-specific keys included).
    :ivar data_dir: where durable data lives, or None for a memory hub.
    :ivar reactor: the reactor listeners bind with (None in unit tests: nothing listens).
    :ivar journal: the flow journal's files (:class:`mqhub.store.journal.Journal`), or None.
    :ivar identity: the :class:`mqhub.identity.Directory` (users, rights, denials), or None.
    """

    clock: Any
    store: Any
    broker: Any = None
    scheduler: Any = None
    config: dict[str, Any] = field(default_factory=dict)
    data_dir: str | None = None
    reactor: Any = None
    journal: Any = None
    identity: Any = None


def standalone_core(store: Any, clock: Any) -> Broker:
    """A core of its own over an opened ``store``, for a hub built without one (the NATS
    server's unit tests build mq9 on such a hub); the caller starts and stops it."""
    return Broker(store, clock)


def build_hub(options: Mapping[str, Any], clock: Any, reactor: Any = None) -> Hub:
    """Create the store, scheduler and broker core for ``options`` (nothing is opened or started).

    Reads ``data-dir`` (None: a memory hub), ``durability`` (sync | batch | none) and
    ``journal`` (on | off; the flow journal needs a data directory), ``journal-days`` and
    ``journal-max-bytes`` (its retention; unset: the defaults of :mod:`mqhub.store.journal`).
    ``store-map-size`` (initial LMDB map in MiB; None: the store's default) and
    ``store-reserve`` (MiB held back for acks on a full disk; 0 or None: none).
    ``window``, ``window-bytes``, ``tails-bytes`` and ``windows-bytes`` (the core's paging:
    ``Broker(window=..., window_bytes=..., tails_bytes=..., windows_bytes=...)``; unset or None:
    the Broker's defaults).
    The store is ``LmdbStore(DATA_DIR/store)``, or a MemoryStore for a memory hub.
    ``users`` (a users file, read now; None: every client may do everything) makes
    ``hub.identity``.
    """
    data_dir = options.get("data-dir", options.get("data_dir"))
    durability = options.get("durability") or "sync"
    store: Any
    if data_dir is not None:
        os.makedirs(data_dir, exist_ok=True)
        path = os.path.join(data_dir, "store")
        map_mib = options.get("store-map-size")
        store = LmdbStore(path, clock=clock, durability=durability,
                          map_size=int(map_mib) << 20 if map_mib else DEFAULT_MAP_SIZE,
                          reserve=int(options.get("store-reserve") or 0) << 20)
    else:
        store = MemoryStore(clock=clock)
    scheduler = SchedulerService(store, clock)
    paging = {kw: int(options[key]) for key, kw in PAGING_KEYWORDS.items()
              if options.get(key) is not None}
    broker: Any
    if options.get("cluster"):   # cluster mode: a gateway node over JetStream (docs/cluster.md)
        from mqhub.cluster.broker import ClusterBroker
        broker = ClusterBroker.from_options(options, reactor or clock, clock, store, scheduler)
        scheduler = broker.scheduler   # schedules run once per cluster (mqhub.cluster.cron)
    else:
        broker = Broker(store, clock, scheduler=scheduler, **paging)
    journal = None
    if data_dir is not None and (options.get("journal") or "on") != "off":
        broker.journal = JournalRecorder(clock)
        days = options.get("journal-days")
        max_bytes = options.get("journal-max-bytes")
        journal = Journal(
            store.path, broker.journal,
            retention_seconds=float(days) * 86400.0 if days else DEFAULT_RETENTION_SECONDS,
            retention_bytes=int(max_bytes) if max_bytes else DEFAULT_RETENTION_BYTES)
    identity = Directory(clock, options.get("users") or None)
    identity.load()
    return Hub(
        clock=clock,
        store=store,
        broker=broker,
        scheduler=scheduler,
        config=dict(options),
        data_dir=data_dir,
        reactor=reactor,
        journal=journal,
        identity=identity,
    )


class HubService(MultiService):
    """The root service: owns the hub's lifecycle; its children are the protocol listeners.

    :ivar started: fires once every listener was started (or fails if recovery failed).
    :ivar stop_budget: seconds allowed for each stop step (listeners, scheduler, broker, store).
    """

    def __init__(
        self,
        hub: Hub,
        on_start_failure: Callable[[Failure], None] | None = None,
        stop_budget: dict[str, float] | None = None,
    ) -> None:
        """:param on_start_failure: called when recovery fails (the tap stops the reactor)."""
        super().__init__()
        self.setName("mqhub")
        self.hub = hub
        self.started: Deferred[None] = Deferred()
        #: the hub's lame-duck controller (:class:`mqhub.lameduck.LameDuck`; set by the tap)
        self.lame_duck: Any = None
        self._on_start_failure = on_start_failure
        self.stop_budget = {"listeners": 2.5, "scheduler": 0.5, "broker": 0.5, "store": 1.0}
        if stop_budget:
            self.stop_budget.update(stop_budget)

    def add_listener(self, name: str, service: IService) -> None:
        """Add a protocol's service; it starts after recovery and stops first."""
        if getattr(service, "name", None) is None:
            service.setName(name)
        self.addService(service)

    def privilegedStartService(self) -> None:
        """Do not bind listeners yet: they start once the broker has recovered."""
        Service.privilegedStartService(self)

    def startService(self) -> None:
        """Open the store, start the scheduler, recover the broker, then start the listeners."""
        Service.startService(self)
        d: Deferred[None] = maybeDeferred(self._start_core)
        d.addCallback(self._reactor_running)
        d.addCallback(lambda _: self._start_listeners())
        d.addCallbacks(self._ready, self._start_failed)

    def _reactor_running(self, _: object) -> Deferred[None]:
        """Fire once the hub's reactor runs (at once without a reactor, as in unit tests).

        twistd starts the application before it runs the reactor; waiting lets the reactor's
        (and the tap's) signal handlers be in place before any port accepts a client.
        """
        reactor = self.hub.reactor
        waiting: Deferred[None] = Deferred()
        if reactor is None or reactor.running:
            waiting.callback(None)
        else:
            reactor.callWhenRunning(waiting.callback, None)
        return waiting

    def _start_core(self) -> Deferred[None]:
        """store.open() → broker.start() (recovery) → scheduler.startService().

        The scheduler starts after the broker has recovered so that a due entry (a delayed
        message, a queue expiry) always finds the queue it belongs to.
        """
        hub = self.hub
        try:
            hub.store.open()
        except (StoreError, OSError) as exc:
            where = getattr(hub.store, "path", type(hub.store).__name__)
            raise StartFailed(f"store {where} cannot open: {exc}") from exc
        log.info("store open ({store})", store=type(hub.store).__name__)
        if hub.journal is not None:
            hub.journal.open()
            hub.store.journal = hub.journal
            hub.journal.recorder.start(hub.store)
        recovered: Deferred[Any] = succeed(None)
        if hub.broker is not None:
            recovered = maybeDeferred(hub.broker.start)

        def start_scheduler(_: object) -> None:
            """Start the scheduler unless the hub was stopped during recovery."""
            if hub.scheduler is not None and self.running:
                hub.scheduler.startService()

        return recovered.addCallback(start_scheduler)

    def _start_listeners(self) -> Deferred[None]:
        """Start every child, then fire once every listener under them is bound.

        A listener that cannot bind has logged its own line (name, endpoint, reason); a child
        that raises is logged here in one line. Either fails the Deferred with StartFailed
        naming them (after every bind has reported, so each failure is logged).
        """
        if not self.running:
            return succeed(None)
        raised: list[str] = []
        for child in list(self):
            try:
                child.privilegedStartService()
                child.startService()
            except Exception as exc:  # noqa: BLE001 - any refusal fails the start, in one line
                log.error("{name} cannot start: {error}", name=child.name, error=exc)
                raised.append(child.name)
        binds = [ls.listening for top, ls in walk_listeners(self) if top not in raised]
        waiting: Deferred[Any] = DeferredList(binds, consumeErrors=True)

        def check(_: object) -> None:
            """Fail the start when anything did not come up."""
            failed = raised + [ls.name or top for top, ls in walk_listeners(self)
                               if ls.failure is not None]
            if failed:
                raise StartFailed(f"{', '.join(failed)} could not start")

        return waiting.addCallback(check)

    def _ready(self, _: object) -> None:
        """Every listener is bound: say so and fire :attr:`started`."""
        if self.running:  # not when stopped during recovery
            log.info("mqhub ready: {names}", names=", ".join(c.name for c in self) or "no listeners")
        self.started.callback(None)

    def _start_failed(self, failure: Failure) -> None:
        """Report a failed start (one line for a known cause) and let the owner stop the
        process."""
        if failure.check(StartFailed):
            log.error("mqhub could not start: {reason}", reason=failure.getErrorMessage())
        else:
            log.failure("mqhub could not start", failure)
        self.started.errback(failure)
        self.started.addErrback(lambda _: None)
        if self._on_start_failure is not None:
            self._on_start_failure(failure)

    def _bounded(self, step: str, action: Callable[[], Any]) -> Deferred[None]:
        """Run one stop step; log and move on if it fails or overruns its budget."""
        d: Deferred[Any] = maybeDeferred(action)
        d.addTimeout(self.stop_budget[step], self.hub.clock)

        def report(result: Any) -> None:
            """Log how the step ended; never pass a failure on to the next step."""
            if isinstance(result, Failure):
                log.failure("stopping {step} failed", result, step=step)
            else:
                log.info("{step} stopped", step=step)

        d.addBoth(report)
        return d

    def _stop_listeners(self) -> Deferred[Any]:
        """Stop every running child at once (each stops accepting, then closes connections)."""
        children = [c for c in reversed(list(self)) if c.running]
        return DeferredList([maybeDeferred(c.stopService) for c in children], consumeErrors=True)

    def stopService(self) -> Deferred[None]:
        """Listeners → scheduler → broker → store close, each bounded; fires when done."""
        Service.stopService(self)
        hub = self.hub
        d = self._bounded("listeners", self._stop_listeners)
        if hub.scheduler is not None and hub.scheduler.running:
            d.addCallback(lambda _: self._bounded("scheduler", hub.scheduler.stopService))
        stop_broker = getattr(hub.broker, "stop", None)
        if stop_broker is not None:
            d.addCallback(lambda _: self._bounded("broker", stop_broker))
        if hub.journal is not None:
            # the last journal records ride with one more group commit (bounded like the store)
            d.addCallback(lambda _: self._bounded("store", hub.journal.recorder.stop))
        d.addCallback(lambda _: self._bounded("store", hub.store.close))
        if hub.journal is not None:
            d.addCallback(lambda _: hub.journal.close())
        d.addCallback(lambda _: log.info("store closed"))
        return d
