"""The JetStream layer against real nats-servers: the cluster-mode streams, a queue's
consumer bound to a pattern, pulling with credit, ack / nak with delay / redelivery counts,
and interest retention removing a message once every queue acked it."""

from __future__ import annotations

import time

from mqhub.cluster.client import NatsConnection
from mqhub.cluster.jetstream import (
    JetStream,
    JetStreamError,
    Puller,
    ack_frames,
    address_subject,
    consumer_name,
    nak_frames,
    parse_ack_reply,
    pattern_filter,
    queue_subject,
)
from mqhub.cluster.local import LocalCluster
from tests.cluster.conftest import Driver


def test_names_and_subjects() -> None:
    assert address_subject("orders.eu") == "mq.orders.eu"
    assert pattern_filter("orders.*") == ("mq.orders.*", False)
    assert pattern_filter("$mq9.AI.BROADCAST.#") == ("mq.$mq9.AI.BROADCAST.>", False)
    assert pattern_filter("log.ab*c.x") == ("mq.log.*.x", True)
    assert consumer_name("topic:ch.1") == "qtopic_3ach_2e1"
    assert consumer_name("a_b") != consumer_name("a.b")
    long = consumer_name("x" * 255)
    assert len(long) <= 201 and long != consumer_name("x" * 254)
    assert queue_subject("a b").startswith("mqq.a_20b")
    assert parse_ack_reply("$JS.ACK.S.q.3.17.9.1795920274000596174.0") == (3, 17, 1795920274000596174)
    assert parse_ack_reply("$JS.ACK.dom.acc.S.q.2.5.4.123.0.tok") == (2, 5, 123)


def _setup(driver: Driver, cluster: LocalCluster, uid: str) -> tuple[NatsConnection, JetStream, str]:
    conn = NatsConnection(driver.reactor, driver.reactor, cluster.urls)
    driver.result(conn.start())
    js = JetStream(conn)
    stream = uid.upper()
    driver.result(js.ensure_stream({
        "name": stream, "subjects": [f"{uid}.>"], "retention": "interest",
        "storage": "file", "num_replicas": 3, "allow_msg_ttl": True}))
    return conn, js, stream


def _publish(conn: NatsConnection, subject: str, bodies: list[bytes]):
    def build(reply: str) -> list[bytes]:
        return [b"PUB %s %s %d\r\n%s\r\n" % (subject.encode(), reply.encode(), len(b), b)
                for b in bodies]
    return conn.publish_acked(build, len(bodies))


def test_two_queues_each_get_a_copy_and_acks_remove_the_message(
        cluster: LocalCluster, driver: Driver, uid: str) -> None:
    conn, js, stream = _setup(driver, cluster, uid)
    for queue in ("q1", "q2"):
        driver.result(js.ensure_consumer(stream, {
            "durable_name": queue, "ack_policy": "explicit", "ack_wait": 30_000_000_000,
            "filter_subjects": [f"{uid}.a.*", f"{uid}.direct.{queue}"],
            "max_deliver": -1}))
    driver.result(_publish(conn, f"{uid}.a.b", [b"m%d" % i for i in range(50)]))
    got: dict[str, list] = {"q1": [], "q2": []}
    pullers = []
    for queue in ("q1", "q2"):
        p = Puller(conn, stream, queue, want=lambda q=queue: 30 - len(got[q]),
                   handler=lambda evs, q=queue: got[q].extend(evs), max_batch=10)
        p.start()
        pullers.append(p)
    driver.until(lambda: len(got["q1"]) == 30 and len(got["q2"]) == 30, "30 each (credit)")
    # credit respected: nothing more arrives until more is wanted
    driver.until(lambda: True, "a pause")
    end = time.monotonic() + 0.3
    while time.monotonic() < end:
        driver.reactor.iterate(0.02)
    assert len(got["q1"]) == 30
    for q, p in zip(("q1", "q2"), pullers, strict=True):
        p.want = lambda q=q: 50 - len(got[q])
        p.refill()
    driver.until(lambda: len(got["q1"]) == 50 and len(got["q2"]) == 50, "the rest")
    assert [e[-1] for e in got["q1"]] == [b"m%d" % i for i in range(50)]
    conn.publish(ack_frames([e[3] for e in got["q1"]]))
    info = driver.result(js.stream_info(stream))
    assert info["state"]["messages"] == 50          # q2 has not acked
    conn.publish(ack_frames([e[3] for e in got["q2"]]))
    driver.until(lambda: driver.result(js.stream_info(stream))["state"]["messages"] == 0,
                 "interest retention to remove acked messages")
    for p in pullers:
        p.stop()
    conn.stop()


def test_nak_with_delay_redelivers_later_with_the_count(
        cluster: LocalCluster, driver: Driver, uid: str) -> None:
    conn, js, stream = _setup(driver, cluster, uid)
    driver.result(js.ensure_consumer(stream, {
        "durable_name": "q", "ack_policy": "explicit", "filter_subject": f"{uid}.>"}))
    driver.result(_publish(conn, f"{uid}.x", [b"one"]))
    got: list = []
    p = Puller(conn, stream, "q", want=lambda: 10, handler=got.extend)
    p.start()
    driver.until(lambda: got, "the first delivery")
    first = parse_ack_reply(got[0][3])
    assert first[0] == 1
    t0 = time.monotonic()
    conn.publish(nak_frames([got[0][3]], 0.5))
    driver.until(lambda: len(got) == 2, "the redelivery")
    assert time.monotonic() - t0 >= 0.45
    again = parse_ack_reply(got[1][3])
    assert again[0] == 2 and again[1] == first[1]
    p.stop()
    try:
        driver.result(js.consumer_info(stream, "nope"))
    except JetStreamError as exc:
        assert exc.not_found
    else:
        raise AssertionError("a missing consumer must be an error")
    conn.stop()
