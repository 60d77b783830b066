"""LameDuck's schedule on a Clock: stop accepting, tell the protocols, grace, rounds, stop."""

from __future__ import annotations

from typing import Any

from twisted.application.service import MultiService
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock

from mqhub.lameduck import LameDuck
from mqhub.listener import ListenerService


class Conn:
    """A client connection that records how it was closed."""

    def __init__(self, log: list[str], name: str) -> None:
        """Open."""
        self.log = log
        self.name = name
        self.open = True

    def lame_duck_close(self) -> None:
        """Close (the protocol's own graceful path)."""
        self.open = False
        self.log.append(f"close {self.name}")


class Listener(ListenerService):
    """A listener with given connections and no socket."""

    def __init__(self, name: str, conns: list[Conn], log: list[str],
                 observer: bool = False) -> None:
        """Serve ``conns``."""
        super().__init__("tcp:0", None, observer=observer)
        self.setName(name)
        self.conns = conns
        self.log = log

    @property
    def connections(self) -> list[Any]:
        """The connections still open."""
        return [c for c in self.conns if c.open]

    def stop_accepting(self) -> Deferred[Any]:
        """Record it."""
        self.log.append(f"stop accepting {self.name}")
        return succeed(None)


class Protocol(MultiService):
    """A protocol service with a lame_duck hook."""

    def __init__(self, name: str, log: list[str], *listeners: Listener) -> None:
        """Own ``listeners``."""
        super().__init__()
        self.setName(name)
        self.log = log
        for listener in listeners:
            listener.setServiceParent(self)

    def lame_duck(self) -> None:
        """Record that the clients were told."""
        self.log.append(f"tell {self.name}")


def test_lame_duck_schedule() -> None:
    """Grace first, then closes spread so the last one is at the end of the duration; admin
    keeps serving; a second start changes nothing; the hub stops once everyone is gone."""
    log: list[str] = []
    clock = Clock()
    root = MultiService()
    nats = [Conn(log, f"n{i}") for i in range(4)]
    Protocol("mq9", log, Listener("mq9-tcp", nats, log),
             Listener("mq9-monitor", [], log, observer=True)).setServiceParent(root)
    admin = Listener("admin", [Conn(log, "browser")], log, observer=True)
    admin.setServiceParent(root)
    lame = LameDuck(root, clock, lambda: log.append("stop"), duration=10, grace=2)
    status = lame.start()
    assert status["lame_duck"] and status["connections"] == 4
    assert log == ["stop accepting mq9-tcp", "tell mq9"]
    assert lame.start(duration=99)["duration"] == 10
    clock.advance(1.5)
    assert len(log) == 2
    clock.advance(0.5)              # grace over: 4 rounds of 2 s over the remaining 8 s
    assert log[2:] == ["close n0"]
    clock.advance(2)
    assert log[3:] == ["close n1"]
    clock.advance(2)
    clock.advance(2)
    assert log[4:] == ["close n2", "close n3"]
    assert "stop" not in log
    clock.advance(2)
    assert log[-1] == "stop" and admin.conns[0].open
    assert lame.status()["closed"] == 4
