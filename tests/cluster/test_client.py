"""The Twisted NATS client against real nats-servers: pipelined PubAcks, API requests,
refusals, and reconnection when its server is killed."""

from __future__ import annotations

import pytest

from mqhub.cluster.client import NatsConnection
from mqhub.cluster.local import LocalCluster, free_port
from mqhub.errors import ClusterUnavailable
from tests.cluster.conftest import Driver


def _stream(driver: Driver, conn: NatsConnection, name: str, subjects: list[str]) -> dict:
    reply = driver.result(conn.request(f"$JS.API.STREAM.CREATE.{name}", {
        "name": name, "subjects": subjects, "num_replicas": 3, "storage": "file"}))
    assert isinstance(reply, dict) and "error" not in reply, reply
    return reply


def _pubs(subject: str, bodies: list[bytes]):
    def build(reply: str) -> list[bytes]:
        return [b"PUB %s %s %d\r\n%s\r\n" % (subject.encode(), reply.encode(), len(b), b)
                for b in bodies]
    return build


def test_pipelined_batches_are_acked_with_their_sequences(
        cluster: LocalCluster, driver: Driver, uid: str) -> None:
    conn = NatsConnection(driver.reactor, driver.reactor, cluster.urls)
    driver.result(conn.start())
    _stream(driver, conn, uid, [f"{uid}.>"])
    batches = [conn.publish_acked(_pubs(f"{uid}.a", [b"m%d" % i] * 50), 50) for i in range(20)]
    seqs = [driver.result(d) for d in batches]
    assert seqs == [50 * (i + 1) for i in range(20)]
    info = driver.result(conn.request(f"$JS.API.STREAM.INFO.{uid}", b""))
    assert info["state"]["messages"] == 1000
    conn.stop()


def test_a_publish_no_stream_takes_is_refused(
        cluster: LocalCluster, driver: Driver, uid: str) -> None:
    conn = NatsConnection(driver.reactor, driver.reactor, cluster.urls)
    driver.result(conn.start())
    with pytest.raises(ClusterUnavailable, match="no stream"):
        driver.result(conn.publish_acked(_pubs(f"{uid}.nowhere", [b"x"]), 1))
    conn.stop()


def test_a_dead_url_is_skipped_and_a_killed_server_is_left_for_another(
        cluster: LocalCluster, driver: Driver, uid: str) -> None:
    dead = f"nats://127.0.0.1:{free_port()}"
    conn = NatsConnection(driver.reactor, driver.reactor, [dead] + cluster.urls)
    states: list[bool] = []
    conn.on_state.append(states.append)
    driver.result(conn.start())
    _stream(driver, conn, uid, [f"{uid}.>"])
    got: list[bytes] = []
    conn.subscribe(f"{uid}.live", lambda events: got.extend(e[-1] for e in events))
    port = conn.wire.transport.getPeer().port  # type: ignore[union-attr]
    index = [s.port for s in cluster.servers].index(port)
    cluster.kill(index)
    driver.until(lambda: states[-1:] == [False], "the drop to be noticed")
    with pytest.raises(ClusterUnavailable):
        driver.result(conn.publish_acked(_pubs(f"{uid}.a", [b"x"]), 1))
    driver.until(lambda: conn.connected, "a reconnect to another server")
    assert states[-1] is True and conn.connects == 2
    # the subscription was renewed on the new server
    def published() -> bool:
        conn.publish([b"PUB %s.live 2\r\nhi\r\n" % uid.encode()])
        driver.reactor.iterate(0.05)
        return bool(got)
    driver.until(published, "the renewed subscription to receive")
    conn.stop()
