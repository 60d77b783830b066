"""The test engine itself: three real nats-servers, kill -9 of the stream leader, restart,
a start that meets a taken port."""

from __future__ import annotations

import socket
from pathlib import Path

from mqhub.cluster.client import NatsConnection
from mqhub.cluster.local import LocalCluster
from mqhub.errors import ClusterUnavailable
from tests.cluster.conftest import Driver


def test_an_r3_stream_survives_its_leader_and_the_leader_comes_back(
        cluster: LocalCluster, driver: Driver, uid: str) -> None:
    conn = NatsConnection(driver.reactor, driver.reactor, cluster.urls, timeout=2.0)
    driver.result(conn.start())
    reply = driver.result(conn.request(f"$JS.API.STREAM.CREATE.{uid}", {
        "name": uid, "subjects": [f"{uid}.>"], "num_replicas": 3, "storage": "file"}))
    assert "error" not in reply, reply

    def publish(n: int):
        def build(reply: str) -> list[bytes]:
            return [b"PUB %s.a %s 1\r\nx\r\n" % (uid.encode(), reply.encode())] * n
        return conn.publish_acked(build, n)

    driver.result(publish(100))
    info = driver.result(conn.request(f"$JS.API.STREAM.INFO.{uid}", b""))
    leader = cluster.index_of(info["cluster"]["leader"])
    cluster.kill(leader)
    confirmed = 100

    def try_publish() -> bool:
        nonlocal confirmed
        try:
            driver.result(publish(10), timeout=5)
        except ClusterUnavailable:
            return False
        confirmed += 10
        return True

    driver.until(try_publish, "publishing to resume after the leader's death", timeout=30)
    cluster.restart(leader)
    info = driver.result(conn.request(f"$JS.API.STREAM.INFO.{uid}", b""))
    assert info["state"]["messages"] >= confirmed
    conn.stop()


def test_a_port_taken_before_the_first_start_moves_the_cluster_to_new_ports(
        tmp_path: Path) -> None:
    """A port chosen free but taken by another process before nats-server binds it (another
    test run's broker, say) does not fail the start: the cluster starts again on new ports."""
    cluster = LocalCluster(tmp_path)
    taken = cluster.servers[0].cluster_port
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        with cluster:
            assert cluster.servers[0].cluster_port != taken
            assert cluster.leader() is not None
