"""Cluster-mode fixtures: one three-server JetStream cluster shared by the whole session.

Forming a cluster costs 1-9 s (the meta leader's first election), so every test shares one
and keeps to names of its own (streams, queues, subjects carry the test's ``uid``). A test
that kills a server gets it back from :func:`cluster`'s check before the next test runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.epollreactor import EPollReactor

from mqhub.cluster.local import LocalCluster, wait_for

#: seconds a test waits for a cluster-side condition
WAIT = 20.0


@pytest.fixture(scope="session")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three nats-servers (-js, routed) on loopback for the session."""
    cluster = LocalCluster(tmp_path_factory.mktemp("nats-cluster"))
    try:
        cluster.start()
    except Exception:
        print(cluster.logs())
        cluster.stop()
        raise
    yield cluster
    cluster.stop()


@pytest.fixture
def cluster(shared_cluster: LocalCluster) -> Iterator[LocalCluster]:
    """The shared cluster, every server running and a meta leader elected."""
    if not all(s.running for s in shared_cluster.servers):
        shared_cluster.start()
    shared_cluster.wait_formed()
    yield shared_cluster
    if not all(s.running for s in shared_cluster.servers):
        shared_cluster.start()


@pytest.fixture
def uid(request: pytest.FixtureRequest) -> str:
    """A short name unique to this test (for streams, queues and subjects)."""
    return "t" + os.urandom(4).hex()


class Driver:
    """A private (never installed) epoll reactor that tests drive by hand until a Deferred
    fires or a condition holds; the global reactor is never touched."""

    def __init__(self) -> None:
        self.reactor = EPollReactor()

    def result(self, d: Deferred, timeout: float = WAIT) -> object:
        """Run until ``d`` fires and return its result (raise its failure)."""
        box: list = []
        d.addBoth(box.append)
        self.until(lambda: box, f"{d!r} to fire", timeout)
        value = box[0]
        if hasattr(value, "raiseException"):
            value.raiseException()
        return value

    def until(self, cond: object, what: str, timeout: float = WAIT) -> object:
        """Run until ``cond()`` is truthy and return it."""
        import time
        deadline = time.monotonic() + timeout
        while True:
            value = cond()  # type: ignore[operator]
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            self.reactor.iterate(0.01)

    def close(self) -> None:
        """Run pending calls briefly so connections close, then drop the reactor."""
        for _ in range(20):
            self.reactor.iterate(0)
        for call in self.reactor.getDelayedCalls():
            call.cancel()
        self.reactor.disconnectAll()


@pytest.fixture
def driver() -> Iterator[Driver]:
    """A hand-driven reactor for in-process cluster clients."""
    d = Driver()
    yield d
    d.close()


__all__ = ["Driver", "WAIT", "wait_for", "Path"]
