"""DeadLetterView: a failed read of the dead letters is logged, and the view reads again later."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.defer import fail
from twisted.internet.task import Clock

from mqhub.protocols.vibemq import dlq


class _Queue:
    """A core queue stand-in with one dead letter."""

    dead_letter_count = 1


class _Broker:
    """A broker whose dead-letter read always fails."""

    def __init__(self) -> None:
        """Count the reads."""
        self.reads = 0

    def queue(self, name: str) -> _Queue:
        """Every source queue exists."""
        return _Queue()

    def dead_letters(self, name: str, limit: int) -> Any:
        """A read that fails."""
        self.reads += 1
        return fail(RuntimeError("store gone"))


class _Sub:
    """A subscriber that must not be handed anything."""

    def deliver_dead(self, view: Any, dead: list[Any]) -> None:
        """Fail the test: nothing was read."""
        raise AssertionError("nothing to deliver")


def test_failed_read_is_logged_and_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    """The failure reaches the log (not swallowed) and the next subscribe reads again."""
    logged: list[Any] = []
    monkeypatch.setattr(dlq.log, "failure", lambda fmt, failure, **kw: logged.append(failure))
    broker, clock = _Broker(), Clock()
    view = dlq.DeadLetterView(broker, clock, "orders", "orders.dlq")
    view.subscribe(_Sub())
    assert broker.reads == 1
    assert len(logged) == 1 and logged[0].check(RuntimeError)
    view.subscribe(_Sub())
    assert broker.reads == 2 and len(logged) == 2
    view.unsubscribe(view.subscribers[0])
    view.unsubscribe(view.subscribers[0])
    assert not clock.getDelayedCalls()
