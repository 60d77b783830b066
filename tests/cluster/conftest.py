"""Cluster-mode fixtures: one three-server JetStream cluster shared by the whole session.

Forming a cluster costs 1-9 s (the meta leader's first election), so every test shares one
and keeps to names of its own (streams, queues, subjects carry the test's ``uid``). A test
that kills a server gets it back from :func:`cluster`'s check before the next test runs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.epollreactor import EPollReactor

from mqhub.cluster.local import LocalCluster
from tests.interop.broker import BrokerProcess

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
    shared_cluster.wait_settled()   # an earlier test's server kill has been caught up
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


@pytest.fixture
def make_node(cluster: LocalCluster, tmp_path: Path,
              uid: str) -> Iterator[Callable[..., BrokerProcess]]:
    """``make_node(["nsq"])``: a started mqhub node of the cluster (stopped after the test)."""
    made: list[BrokerProcess] = []

    def make(protocols: list[str], *extra: str, start: bool = True) -> BrokerProcess:
        n = len(made)
        node = BrokerProcess(protocols, tmp_path / f"node{n}", log_dir=tmp_path / f"log{n}",
                             extra_args=["--durability", "none", "--cluster",
                                         cluster.url_list, "--cluster-name",
                                         f"{tmp_path.name[-12:]}-{n}", *extra])
        made.append(node)
        return node.start() if start else node

    yield make
    for node in made:
        node.close()
        print(f"--- {node.log_path} ---\n{node.output()[-6000:]}")
    drop_consumers(cluster, uid)




def queues_made(cluster: LocalCluster, *names: str, bound: str = "",
                timeout: float = WAIT) -> None:
    """Wait until the consumers of queues ``names`` exist in the cluster (a queue declared on
    a node exists cluster-wide once JetStream made its consumer), and with ``bound`` until
    they filter that address (a binding made after the declaration is a later update)."""
    from mqhub.cluster.jetstream import consumer_name

    wanted = {consumer_name(n) for n in names}

    def made() -> bool:
        infos = cluster.consumers()
        if not wanted <= set(infos):
            return False
        return not bound or all(
            f"mq.{bound}" in (infos[w]["config"].get("filter_subjects") or []) for w in wanted)
    deadline = time.monotonic() + timeout
    while not made():
        if time.monotonic() > deadline:
            raise AssertionError(f"queues {names} not made in the cluster")
        time.sleep(0.05)


def drop_consumers(cluster: LocalCluster, marker: str) -> None:
    """Delete the consumers whose name holds ``marker`` (a test's uid): every R3 consumer is
    a Raft group, and a shared cluster full of them slows every later test; and the adapter
    records the test's nodes wrote."""
    import asyncio

    import nats

    names = [n for n in cluster.consumers() if marker in n]

    async def drop() -> None:
        nc = await nats.connect(cluster.urls)
        for name in names:
            await nc.request(f"$JS.API.CONSUMER.DELETE.MQHUB.{name}", b"", timeout=10)
        # adapter records (topics, mailboxes, queue options) are cluster-wide: start clean
        await nc.request("$JS.API.STREAM.PURGE.KV_MQHUB",
                         b'{"filter": "$KV.MQHUB.st.>"}', timeout=10)
        await nc.close()
    try:
        asyncio.run(drop())
    except Exception as exc:  # cleanup only: a failure here must not hide the test's result
        print(f"dropping consumers {names}: {exc}")
