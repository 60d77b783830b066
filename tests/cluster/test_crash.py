"""Crash tests with real nats-servers and real mqhub nodes: kill -9 of the node a producer
pipelines into, kill -9 of the stream leader, every node restarted, the whole cluster gone
and back. In each, every message that got its OK is delivered (at least once)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest

from mqhub.cluster.local import LocalCluster
from tests.cluster.conftest import queues_made
from tests.cluster.crash import Collector, Producer
from tests.interop.broker import BrokerProcess

pytestmark = pytest.mark.interop


def health(node: BrokerProcess) -> tuple[int, dict]:
    """The node's /healthz status and document."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{node.port('admin', 'http')}/healthz",
                                    timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def started(node: BrokerProcess, cluster: LocalCluster, uid: str,
            windows: int) -> tuple[Collector, Producer]:
    """A channel consumed on ``node`` and a producer that got ``windows`` windows OK'd."""
    collector = Collector(node.port("nsq", "tcp"), uid, "ch")
    queues_made(cluster, f"nsq/{uid}/ch")
    producer = Producer(lambda: node.port("nsq", "tcp"), uid)
    for _ in range(windows):
        assert producer.step()
    return collector, producer


def test_kill_9_of_the_node_a_producer_pipelines_into(
        make_node: Callable[..., BrokerProcess], cluster: LocalCluster, uid: str) -> None:
    a = make_node(["nsq"])
    b = make_node(["nsq"])
    collector = Collector(b.port("nsq", "tcp"), uid, "ch")
    queues_made(cluster, f"nsq/{uid}/ch")
    producer = Producer(lambda: a.port("nsq", "tcp"), uid)
    # a window refused while the stream settles after an earlier test's server kill is an
    # honest refusal (never delivered, never counted): publish until 1000 are confirmed
    deadline = time.monotonic() + 30
    while len(producer.confirmed) < 1000 and time.monotonic() < deadline:
        producer.step()
    a.kill()                                   # mid-stream: the next window meets a dead node
    producer.step()
    assert len(producer.confirmed) >= 1000
    producer.port = lambda: b.port("nsq", "tcp")   # the client goes to another node
    for _ in range(5):
        producer.step()
    collector.until_has(producer.confirmed)
    producer.close()


def test_kill_9_of_the_stream_leader_loses_nothing_confirmed_and_publishing_resumes(
        make_node: Callable[..., BrokerProcess], cluster: LocalCluster, uid: str) -> None:
    a = make_node(["nsq"])
    collector, producer = started(a, cluster, uid, 10)
    name = cluster.stream_leader()
    assert name is not None
    leader = cluster.index_of(name)
    cluster.kill(leader)
    killed = time.monotonic()
    while not producer.step():
        assert time.monotonic() - killed < 60, "publishing never resumed"
    for _ in range(10):
        producer.step()
    cluster.restart(leader)
    collector.until_has(producer.confirmed)
    producer.close()


def test_every_node_restarted_keeps_queues_and_messages(
        make_node: Callable[..., BrokerProcess], cluster: LocalCluster, uid: str) -> None:
    a = make_node(["nsq"])
    b = make_node(["nsq"])
    first = Collector(b.port("nsq", "tcp"), uid, "ch")
    queues_made(cluster, f"nsq/{uid}/ch")
    first.sock.close()                          # the channel stays; nobody consumes now
    producer = Producer(lambda: a.port("nsq", "tcp"), uid)
    for _ in range(4):
        assert producer.step()
    producer.close()
    a.kill()
    b.kill()
    a.restart()
    b.restart()
    collector = Collector(a.port("nsq", "tcp"), uid, "ch")
    collector.until_has(producer.confirmed)


def test_the_whole_cluster_unreachable_refuses_publishes_then_resumes(
        make_node: Callable[..., BrokerProcess], cluster: LocalCluster, uid: str) -> None:
    a = make_node(["nsq"])
    collector, producer = started(a, cluster, uid, 4)
    assert health(a)[0] == 200
    cluster.stop()
    refused_before = producer.refused
    for _ in range(3):
        assert not producer.step()               # E_PUB_FAILED, never an OK
    assert producer.refused == refused_before + 3
    code, body = health(a)
    assert code == 503 and body["cluster"]["connected"] is False and body["problems"]
    cluster.start()
    stop = time.monotonic() + 60
    while not producer.step():
        assert time.monotonic() < stop, "publishing never resumed"
    collector.until_has(producer.confirmed)
    assert health(a)[0] == 200
    producer.close()
