"""Public test harness: a memory hub on a task.Clock, Deferred helpers and a collecting target.

Protocol tests build a hub with :func:`memory_hub`, drive time with ``hub.clock.advance``, read
what the core delivered through :class:`CollectingTarget`, and talk to a protocol factory over a
StringTransport with :func:`connect` / :func:`take_output`. Nothing here touches the global reactor.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransportWithDisconnection
from twisted.python.failure import Failure
from zope.interface import implementer

from mqhub.core.broker import Broker
from mqhub.errors import StoreError
from mqhub.hub import Hub
from mqhub.interfaces import IDeliveryTarget
from mqhub.records import get_body, get_msg_id
from mqhub.scheduler.service import SchedulerService
from mqhub.store.batch import WriteBatch
from mqhub.store.memory import MemoryStore

#: Where a memory hub's clock starts (2026-01-01T00:00:00Z), so ids and cron look realistic.
START_TIME = 1767225600.0


class RefusingStore(MemoryStore):
    """A MemoryStore that, while :attr:`refuse_puts` is set, fails every commit that stores
    messages (as a full disk does: the whole batch fails with a StoreError, on the clock's next
    turn when it has a clock); other commits (acks, settings) still succeed."""

    def __init__(self, clock: Any = None, durability: str = "none") -> None:
        """As MemoryStore; starts accepting everything."""
        super().__init__(clock, durability)
        self.clock = clock
        #: set to refuse commits that store messages
        self.refuse_puts = False
        #: batches refused so far
        self.refused = 0
        #: when set, refuse only this many more batches, then accept again
        self.refuse_left: int | None = None

    def commit(self, batch: WriteBatch) -> Deferred[None]:
        """Fail ``batch`` when it holds puts and puts are refused; else commit it."""
        if not (self.refuse_puts and batch.puts):
            return super().commit(batch)
        self.refused += 1
        if self.refuse_left is not None:
            self.refuse_left -= 1
            self.refuse_puts = self.refuse_left > 0
        d: Deferred[None] = Deferred()
        failure = Failure(StoreError("no space left on device (RefusingStore)"))
        if self.clock is None:
            d.errback(failure)
        else:
            self.clock.callLater(0, d.errback, failure)
        return d


def property_examples(default: int) -> int:
    """Hypothesis ``max_examples`` for a property test: ``$MQHUB_PROPERTY_EXAMPLES`` or ``default``."""
    return int(os.environ.get("MQHUB_PROPERTY_EXAMPLES", default))


def start_clock() -> Clock:
    """A task.Clock already advanced to :data:`START_TIME`."""
    clock = Clock()
    clock.advance(START_TIME)
    return clock


def memory_hub(clock: Clock | None = None, *, store: Any = None, start: bool = True,
               **broker_kw: Any) -> Hub:
    """A Hub with a Clock, an opened MemoryStore (or ``store``), a started Broker and scheduler.

    The broker starts before the scheduler (the same order HubService uses), so due rows always
    find their queues. Pass ``start=False`` to get the parts unstarted.
    """
    if clock is None:
        clock = start_clock()
    if store is None:
        store = MemoryStore()
        store.open()
    scheduler = SchedulerService(store, clock)
    broker = Broker(store, clock, scheduler=scheduler, **broker_kw)
    hub = Hub(clock=clock, store=store, broker=broker, scheduler=scheduler)
    if start:
        result_of(broker.start())
        scheduler.startService()
    return hub


def refusing_hub(**broker_kw: Any) -> tuple[Hub, RefusingStore]:
    """A memory hub whose store commits once per clock turn and can refuse puts (a
    :class:`RefusingStore`), with ``broker_kw`` passed to the Broker."""
    clock = start_clock()
    store = RefusingStore(clock)
    store.open()
    return memory_hub(clock, store=store, **broker_kw), store


def restart_hub(hub: Hub, **broker_kw: Any) -> Hub:
    """Stop ``hub``'s broker and scheduler and start fresh ones over the same store and clock."""
    hub.scheduler.stopService()
    hub.broker.stop()
    return memory_hub(hub.clock, store=hub.store, **broker_kw)


def settle(hub: Hub, turns: int = 2) -> None:
    """Run ``hub``'s commits grouped on this clock turn and the ones they cause (``turns`` turns)."""
    for _ in range(turns):
        hub.clock.advance(0)


def result_of(d: Any) -> Any:
    """Return the result of an already-fired Deferred (raise its failure; fail if not fired)."""
    if not isinstance(d, Deferred):
        return d
    box: list[Any] = []
    d.addBoth(box.append)
    if not box:
        raise AssertionError("Deferred has not fired")
    result = box[0]
    if isinstance(result, Failure):
        result.raiseException()
    return result


def advance(clock: Clock, seconds: float, step: float = 0.1) -> None:
    """Advance ``clock`` by ``seconds`` in ``step`` increments so chained timers run."""
    end = clock.seconds() + seconds
    while clock.seconds() + step < end:
        clock.advance(step)
    clock.advance(max(0.0, end - clock.seconds()))


def connect(factory: Any, *, port: int = 40000) -> tuple[Any, StringTransportWithDisconnection]:
    """Connect a protocol built by ``factory`` to a StringTransport (a loopback "client").

    Returns ``(protocol, transport)``; feed bytes with ``protocol.dataReceived`` and read what the
    server wrote with :func:`take_output`. ``transport.loseConnection()`` disconnects it.
    """
    peer = IPv4Address("TCP", "127.0.0.1", port)
    proto = factory.buildProtocol(peer)
    transport = StringTransportWithDisconnection(
        hostAddress=IPv4Address("TCP", "127.0.0.1", 1), peerAddress=peer)
    transport.protocol = proto
    proto.makeConnection(transport)
    return proto, transport


def take_output(transport: Any) -> bytes:
    """Return and clear what was written to a StringTransport."""
    data: bytes = transport.value()
    transport.clear()
    return data


@implementer(IDeliveryTarget)
class CollectingTarget:
    """An IDeliveryTarget that records what it receives.

    :ivar batches: every ``(binding, address, messages)`` call, in order.
    :ivar entries: every delivered entry, in order.
    """

    def __init__(self, protocol_name: str = "test") -> None:
        """Start with nothing received."""
        self.protocol_name = protocol_name
        self.batches: list[tuple[Any, str, list[tuple]]] = []
        self.entries: list[tuple] = []

    def deliver_batch(self, binding: Any, address: str, messages: list[tuple]) -> None:
        """Record one delivery."""
        self.batches.append((binding, address, list(messages)))
        self.entries.extend(messages)

    @property
    def bodies(self) -> list[bytes]:
        """The bodies received, in order."""
        return list(map(get_body, self.entries))

    def ids(self) -> list[int]:
        """The msg ids received, in order."""
        return list(map(get_msg_id, self.entries))

    def clear(self) -> None:
        """Forget what was received."""
        self.batches.clear()
        self.entries.clear()
