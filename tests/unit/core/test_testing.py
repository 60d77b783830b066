"""The public test harness itself: memory hub, result_of, connect/take_output."""

from __future__ import annotations

import pytest
from twisted.internet.defer import Deferred, fail
from twisted.internet.protocol import Factory, Protocol

from mqhub.testing import connect, memory_hub, restart_hub, result_of, take_output


class Echo(Protocol):
    """Writes back what it receives."""

    def dataReceived(self, data: bytes) -> None:
        """Echo."""
        assert self.transport is not None
        self.transport.write(data)


def test_memory_hub_parts_are_wired() -> None:
    """The hub's broker and scheduler share its store and clock and are started."""
    hub = memory_hub()
    assert hub.broker.store is hub.store and hub.scheduler.store is hub.store
    assert hub.broker.clock is hub.clock and hub.scheduler.running
    hub.broker.declare_queue("q")
    again = restart_hub(hub)
    assert again.broker.queue("q") is not None and again.store is hub.store


def test_result_of() -> None:
    """result_of returns, raises the failure, or complains about an unfired Deferred."""
    d: Deferred[int] = Deferred()
    d.callback(3)
    assert result_of(d) == 3
    with pytest.raises(ValueError):
        result_of(fail(ValueError("x")))
    with pytest.raises(AssertionError):
        result_of(Deferred())


def test_connect_and_take_output() -> None:
    """connect builds a protocol on a StringTransport; take_output drains what it wrote."""
    proto, transport = connect(Factory.forProtocol(Echo))
    proto.dataReceived(b"ping")
    assert take_output(transport) == b"ping"
    assert take_output(transport) == b""
    assert transport.getPeer().host == "127.0.0.1"
