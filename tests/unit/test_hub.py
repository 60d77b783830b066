"""HubService start and stop order, bounded stop, build_hub, and ListenerService (Clock only)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from twisted.application.service import Service
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.internet.testing import (
    MemoryReactorClock,
    StringTransport,
    StringTransportWithDisconnection,
)
from twisted.logger import Logger

from mqhub.core.broker import Broker
from mqhub.hub import Hub, HubService, StartFailed, build_hub
from mqhub.listener import ListenerService
from mqhub.logs import json_observer
from mqhub.scheduler.service import SchedulerService
from mqhub.store.lmdb import LmdbStore
from mqhub.store.memory import MemoryStore


class RecordingStore(MemoryStore):
    """A real MemoryStore that records open and close in a shared event list."""

    def __init__(self, events: list[str]) -> None:
        """Record into ``events``."""
        super().__init__()
        self.events = events

    def open(self) -> None:
        """Open and record."""
        self.events.append("store.open")
        super().open()

    def close(self) -> Deferred[None]:
        """Close and record."""
        self.events.append("store.close")
        return super().close()


class RecordingService(Service):
    """A service recording its lifecycle; stop may return a Deferred the test controls."""

    def __init__(self, label: str, events: list[str], stop_result: Any = None) -> None:
        """:param stop_result: what stopService returns (None or a Deferred)."""
        self.label = label
        self.events = events
        self.stop_result = stop_result

    def privilegedStartService(self) -> None:
        """Record the privileged start (where ports would be bound)."""
        self.events.append(f"{self.label}.privileged")
        Service.privilegedStartService(self)

    def startService(self) -> None:
        """Record the start."""
        self.events.append(f"{self.label}.start")
        Service.startService(self)

    def stopService(self) -> Any:
        """Record the stop and return the configured result."""
        self.events.append(f"{self.label}.stop")
        Service.stopService(self)
        return self.stop_result


class RecordingBroker:
    """Broker core stand-in whose start() Deferred the test fires (recovery in progress)."""

    def __init__(self, events: list[str], start_result: Deferred[None] | None = None) -> None:
        """:param start_result: returned by start(); an unfired Deferred means 'recovering'."""
        self.events = events
        self.start_result = start_result if start_result is not None else succeed(None)

    def start(self) -> Deferred[None]:
        """Record and return the configured Deferred."""
        self.events.append("broker.start")
        return self.start_result

    def stop(self) -> Deferred[None]:
        """Record the stop."""
        self.events.append("broker.stop")
        return succeed(None)


def make_root(
    events: list[str], broker_start: Deferred[None] | None = None, listener_stop: Any = None
) -> tuple[HubService, Clock]:
    """A HubService with a recording store, scheduler, broker and two listeners."""
    clock = Clock()
    hub = Hub(
        clock=clock,
        store=RecordingStore(events),
        broker=RecordingBroker(events, broker_start),
        scheduler=RecordingService("scheduler", events),
    )
    root = HubService(hub)
    root.add_listener("nsq", RecordingService("nsq", events, listener_stop))
    root.add_listener("mq9", RecordingService("mq9", events))
    return root, clock


def test_start_order_store_broker_scheduler_then_listeners() -> None:
    """Start runs store.open, broker.start (recovery), scheduler, and only then the listeners."""
    events: list[str] = []
    root, _ = make_root(events)
    root.privilegedStartService()
    assert events == []  # no port is bound in the privileged phase
    root.startService()
    assert events == [
        "store.open",
        "broker.start",
        "scheduler.start",
        "nsq.privileged",
        "nsq.start",
        "mq9.privileged",
        "mq9.start",
    ]
    assert root.started.called


def test_listeners_wait_for_broker_recovery() -> None:
    """While broker.start() has not fired, neither the scheduler nor any listener starts."""
    events: list[str] = []
    recovery: Deferred[None] = Deferred()
    root, _ = make_root(events, broker_start=recovery)
    root.startService()
    assert events == ["store.open", "broker.start"]
    recovery.callback(None)
    assert events[-2:] == ["mq9.privileged", "mq9.start"]


def test_listeners_wait_for_the_reactor_to_run() -> None:
    """Under twistd (start before reactor.run) listeners start only once the reactor runs."""
    events: list[str] = []
    root, _ = make_root(events)
    reactor = MemoryReactorClock()
    root.hub.reactor = reactor
    root.startService()
    assert events == ["store.open", "broker.start", "scheduler.start"]
    reactor.run()
    assert events[-2:] == ["mq9.privileged", "mq9.start"]
    assert root.started.called


def test_failed_recovery_starts_no_listener_and_reports() -> None:
    """If the broker cannot recover, the owner is told and nothing listens."""
    events: list[str] = []
    clock = Clock()
    failures: list[Any] = []
    hub = Hub(clock=clock, store=RecordingStore(events),
              broker=RecordingBroker(events, fail(RuntimeError("corrupt"))))
    root = HubService(hub, on_start_failure=failures.append)
    root.add_listener("nsq", RecordingService("nsq", events))
    root.startService()
    assert events == ["store.open", "broker.start"]
    assert failures[0].check(RuntimeError)


class TakenPortReactor(MemoryReactorClock):
    """A MemoryReactorClock on which every port is already taken."""

    def listenTCP(self, port: int, factory: Any, backlog: int = 50, interface: str = "") -> Any:
        """Refuse like a port held by another process."""
        from twisted.internet.error import CannotListenError

        raise CannotListenError(interface, port, OSError(98, "Address already in use"))


def test_a_listener_that_cannot_bind_fails_the_start_without_ready() -> None:
    """A bind failure: one line naming listener, endpoint and reason; no "ready"; the owner is
    told (the tap then exits 1); the listener's state says ``failed``."""
    events: list[str] = []
    reactor = TakenPortReactor()
    failures: list[Any] = []
    hub = Hub(clock=reactor, store=RecordingStore(events), reactor=reactor)
    root = HubService(hub, on_start_failure=failures.append)
    bad = ListenerService("tcp:4150:interface=127.0.0.1", Factory.forProtocol(Protocol),
                          reactor=reactor)
    bad.setName("nsq-tcp")
    root.add_listener("nsq", bad)
    lines: list[dict[str, Any]] = []
    from twisted.logger import globalLogPublisher

    globalLogPublisher.addObserver(lines.append)
    try:
        root.startService()
        reactor.run()
    finally:
        globalLogPublisher.removeObserver(lines.append)
    assert failures and failures[0].check(StartFailed)
    assert "nsq-tcp could not start" in failures[0].getErrorMessage()
    assert root.started.called and bad.state == "failed"
    texts = [e.get("log_format", "") for e in lines]
    assert not any("ready" in t for t in texts)
    bind = [e for e in lines if e.get("log_format", "").startswith("{name} cannot listen")]
    assert len(bind) == 1 and bind[0]["endpoint"] == "tcp:4150:interface=127.0.0.1"
    assert "Address already in use" in bind[0]["error"]


def test_ready_waits_until_every_listener_is_bound() -> None:
    """A listener bound later (NATS binds after mq9 recovery) holds "ready" back until then."""
    events: list[str] = []
    reactor = MemoryReactorClock()
    hub = Hub(clock=reactor, store=RecordingStore(events), reactor=reactor)
    root = HubService(hub)
    later = ListenerService("tcp:0:interface=127.0.0.1", Factory.forProtocol(Protocol),
                            reactor=reactor)

    class Recovering(Service):
        """Starts its listener only when told (recovery done)."""

        def __iter__(self) -> Any:
            return iter([later])

    root.add_listener("mq9", Recovering())
    root.startService()
    reactor.run()
    assert not root.started.called and later.state == "stopped"
    later.startService()
    assert root.started.called and later.state == "listening"


def test_one_listener_failing_to_start_fails_the_start_after_the_others() -> None:
    """A listener raising in startService is logged; the next one still starts (and is
    stopped with the rest when the owner stops the process), and the start fails."""
    events: list[str] = []

    class Exploding(RecordingService):
        """A listener whose port cannot be bound."""

        def startService(self) -> None:
            """Fail like a bind error."""
            raise OSError("address in use")

    hub = Hub(clock=Clock(), store=RecordingStore(events))
    failures: list[Any] = []
    root = HubService(hub, on_start_failure=failures.append)
    root.add_listener("bad", Exploding("bad", events))
    root.add_listener("good", RecordingService("good", events))
    root.startService()
    assert "good.start" in events
    assert failures[0].check(StartFailed) and failures[0].getErrorMessage() == \
        "bad could not start"


def test_stop_order_listeners_scheduler_broker_store() -> None:
    """Stop: listeners first (reverse order), then scheduler, broker, and store close last."""
    events: list[str] = []
    root, _ = make_root(events)
    root.startService()
    del events[:]
    fired: list[object] = []
    root.stopService().addBoth(fired.append)
    assert fired == [None]
    assert events == ["mq9.stop", "nsq.stop", "scheduler.stop", "broker.stop", "store.close"]


def test_store_closes_only_after_connections_are_closed() -> None:
    """While a listener is still closing its connections, the scheduler and store wait."""
    events: list[str] = []
    draining: Deferred[None] = Deferred()
    root, _ = make_root(events, listener_stop=draining)
    root.startService()
    del events[:]
    fired: list[object] = []
    root.stopService().addBoth(fired.append)
    assert events == ["mq9.stop", "nsq.stop"]
    assert fired == []
    draining.callback(None)
    assert events[-3:] == ["scheduler.stop", "broker.stop", "store.close"]
    assert fired == [None]


def test_stop_is_bounded_when_a_listener_hangs() -> None:
    """A listener that never finishes stopping is abandoned after its budget; the store closes."""
    events: list[str] = []
    root, clock = make_root(events, listener_stop=Deferred())
    root.startService()
    fired: list[object] = []
    root.stopService().addBoth(fired.append)
    assert fired == []
    clock.advance(root.stop_budget["listeners"])
    assert fired == [None]
    assert events[-1] == "store.close"
    assert root.hub.store._open is False


def test_stop_before_recovery_finished_starts_no_listener() -> None:
    """SIGTERM during recovery: listeners are never started, the store still closes."""
    events: list[str] = []
    recovery: Deferred[None] = Deferred()
    root, _ = make_root(events, broker_start=recovery)
    root.startService()
    root.stopService()
    recovery.callback(None)
    assert not any(e.endswith(".start") and e.split(".")[0] in ("nsq", "mq9") for e in events)
    assert "store.close" in events


def test_build_hub_memory_when_no_data_dir() -> None:
    """Without a data dir the hub keeps everything in a MemoryStore, on the given clock."""
    clock = Clock()
    hub = build_hub({"data-dir": None}, clock)
    assert isinstance(hub.store, MemoryStore)
    assert hub.clock is clock
    assert hub.data_dir is None
    assert isinstance(hub.broker, Broker) and isinstance(hub.scheduler, SchedulerService)
    assert hub.broker.scheduler is hub.scheduler


def test_build_hub_uses_lmdb_under_data_dir(tmp_path: Path) -> None:
    """With a data dir the store is an LmdbStore in DATA_DIR/store with the chosen durability."""
    hub = build_hub({"data-dir": str(tmp_path / "d"), "durability": "none"}, Clock())
    assert hub.data_dir == str(tmp_path / "d")
    assert hub.config["durability"] == "none"
    assert isinstance(hub.store, LmdbStore)
    assert hub.store.path == str(tmp_path / "d" / "store")
    assert hub.store.durability == "none"  # --durability reaches the store
    assert hub.journal is not None and hub.broker.journal.enabled  # the journal is on by default
    assert hub.journal.retention_seconds == 7 * 86400.0
    assert isinstance(hub.broker, Broker) and hub.broker.store is hub.store


def test_build_hub_journal_options(tmp_path: Path) -> None:
    """--journal off leaves the core's no-op recorder; retention options reach the journal."""
    off = build_hub({"data-dir": str(tmp_path / "a"), "journal": "off"}, Clock())
    assert off.journal is None and not off.broker.journal.enabled
    on = build_hub({"data-dir": str(tmp_path / "b"), "journal-days": "0.5",
                    "journal-max-bytes": "1000"}, Clock())
    assert on.journal.retention_seconds == 43200.0 and on.journal.retention_bytes == 1000


class Quiet(Protocol):
    """A protocol that does nothing (connections under test)."""


def _listening(drain_timeout: float = 2.0) -> tuple[ListenerService, MemoryReactorClock, Any]:
    """A started ListenerService on a MemoryReactorClock and its tracking factory."""
    reactor = MemoryReactorClock()
    service = ListenerService("tcp:0:interface=127.0.0.1", Factory.forProtocol(Quiet),
                              reactor=reactor, drain_timeout=drain_timeout)
    service.setName("quiet")
    service.startService()
    assert service.listening.called
    port, factory, _backlog, interface = reactor.tcpServers[0]
    assert interface == "127.0.0.1"
    return service, reactor, factory


def test_listener_closes_connections_on_stop() -> None:
    """Stop stops accepting, closes every open connection and fires once they are gone."""
    service, _reactor, factory = _listening()
    transports = []
    for n in range(3):
        proto = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40000 + n))
        transport = StringTransportWithDisconnection()
        transport.protocol = proto
        proto.makeConnection(transport)
        assert proto.transport is transport  # not wrapped: TLS callbacks and producers work
        transports.append(transport)
    assert len(service.connections) == 3
    done = service.stopService()
    assert done.called
    assert service.connections == []
    assert all(not t.connected for t in transports)


def test_listener_aborts_connections_that_do_not_close() -> None:
    """A connection that ignores loseConnection is aborted after drain_timeout."""
    service, reactor, factory = _listening(drain_timeout=1.5)
    proto = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40001))
    transport = StringTransport()
    proto.makeConnection(transport)
    fired: list[object] = []
    service.stopService().addBoth(fired.append)
    assert fired == []
    reactor.advance(1.4)
    assert fired == []
    reactor.advance(0.2)
    assert fired == [None]
    assert transport.disconnecting


def test_listener_without_a_reactor_never_reaches_the_global_one() -> None:
    """Built on a reactor-less hub (hub.reactor None) a listener refuses to start instead of
    binding through the global reactor; stopping it still completes."""
    service = ListenerService("tcp:0:interface=127.0.0.1", Factory.forProtocol(Quiet), reactor=None)
    service.setName("quiet")
    with pytest.raises(RuntimeError, match="quiet: no reactor"):
        service.startService()
    assert not service.running and service.port is None
    assert service.stopService().called


def test_json_observer_writes_one_object_per_line() -> None:
    """--log-format json: every event is one JSON object on its own line."""
    out = io.StringIO()
    log = Logger(namespace="mqhub.test", observer=json_observer(out))
    log.info("hello {who}", who="world")
    log.error("second {n}", n=2)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert first["who"] == "world" and first["log_namespace"] == "mqhub.test"
    assert json.loads(lines[1])["log_level"]["name"] == "error"
