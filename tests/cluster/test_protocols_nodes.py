"""mq9, VibeMQ, MQKS and eMQP across two mqhub nodes of one cluster, each with its real client
(or the protocol's own test client): a record one node's adapter writes (a mailbox, a queue's
options, a consumer's binding) is known to the other node's adapter, and messages published
on one node reach consumers on the other."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats
import pytest

from mqhub.cluster.local import LocalCluster
from mqhub.protocols.vibemq.options import QueueOptions
from tests.cluster.conftest import queues_made
from tests.cluster.test_nats_nodes import until
from tests.cluster.test_nats_nodes import url as nats_url
from tests.interop.broker import BrokerProcess
from tests.interop.broker import wait_until as wait
from tests.interop.mqks_client import MqksSocket
from tests.interop.vibemq_client import SocketClient

pytestmark = pytest.mark.interop

Make = Callable[..., BrokerProcess]


def test_mq9_mailbox_made_on_a_is_written_on_b_and_read_on_a(make_node: Make) -> None:
    a = make_node(["mq9"])
    b = make_node(["mq9"])

    async def scenario() -> None:
        on_a = await nats.connect(nats_url(a))
        on_b = await nats.connect(nats_url(b))
        reply = await on_a.request("$mq9.AI.MAILBOX.CREATE",
                                   json.dumps({"type": "standard", "ttl": 3600}).encode(),
                                   timeout=5)
        box = json.loads(reply.data)
        mid = box["mail_id"]
        # node B knows the mailbox from the cluster's records and takes writes for it
        for prio, body in [("normal", b"q1"), ("urgent", b"v1"), ("normal", b"q2")]:
            await on_b.publish(f"$mq9.AI.INBOX.{mid}.{prio}", body)
        await on_b.flush()
        # nobody subscribes: QUERY on A takes them from the stream (seen by A's next
        # directory read), each once, urgent first within an answer
        queried: list[dict[str, Any]] = []
        answers: list[list[str]] = []

        async def query_a() -> None:
            reply = await on_a.request(f"$mq9.AI.MAILBOX.QUERY.{mid}",
                                       json.dumps({"token": box["token"]}).encode(), timeout=5)
            items = json.loads(reply.data)["messages"]
            queried.extend(items)
            answers.append([m["payload"] for m in items])
        deadline = asyncio.get_running_loop().time() + 15
        while len(queried) < 3 and asyncio.get_running_loop().time() < deadline:
            await query_a()
            await asyncio.sleep(0.2)
        assert sorted(m["payload"] for m in queried) == ["q1", "q2", "v1"], answers
        assert all(a[:1] == ["v1"] for a in answers if "v1" in a), answers
        await query_a()
        assert len(queried) == 3                               # taken: gone from the mailbox
        for prio, body in [("normal", b"n1"), ("urgent", b"u1"), ("normal", b"n2")]:
            await on_b.publish(f"$mq9.AI.INBOX.{mid}.{prio}", body)
        await on_b.flush()
        got: list[Any] = []

        async def collect(msg: Any) -> None:
            got.append(msg)
        await on_a.subscribe(f"$mq9.AI.INBOX.{mid}.*", cb=collect)
        await until(lambda: len(got) == 3, f"the three messages on A: {[m.data for m in got]}")
        assert sorted(m.data for m in got) == [b"n1", b"n2", b"u1"]
        query = await on_b.request(f"$mq9.AI.MAILBOX.QUERY.{mid}",
                                   json.dumps({"token": box["token"]}).encode(), timeout=5)
        assert json.loads(query.data)["mail_id"] == mid     # B answers for A's mailbox
        await on_a.close()
        await on_b.close()
    asyncio.run(asyncio.wait_for(scenario(), 60))


def vibe(node: BrokerProcess) -> SocketClient:
    """A connected VibeMQ test client."""
    client = SocketClient(node.port("vibemq", "tcp"))
    client.connect(compression=None)  # type: ignore[arg-type]
    return client


def test_vibemq_consumer_on_b_gets_publishes_on_a(make_node: Make, cluster: LocalCluster,
                                                  uid: str) -> None:
    a = make_node(["vibemq"])
    b = make_node(["vibemq"])
    pub, sub = vibe(a), vibe(b)
    queue = f"jobs-{uid}"
    pub.create_queue(queue, QueueOptions(max_retry_attempts=5))
    queues_made(cluster, queue)
    sub.subscribe(queue)                      # B knows the queue A declared
    ids = [pub.publish(queue, {"n": i}).id for i in range(20)]
    assert len(ids) == 20
    got = sub.receive(20, timeout=20, ack=True)
    assert sorted(json.loads(d.payload)["n"] for d in got) == list(range(20))
    # and the other way round: a queue B declared takes A's publishes (A's adapter knows it
    # from the cluster's records)
    other = f"back-{uid}"
    sub.create_queue(other, QueueOptions(max_retry_attempts=5))
    sub.subscribe(other)
    pub.publish(other, {"n": "back"})
    (back,) = sub.receive(1, timeout=20, ack=True)
    assert json.loads(back.payload) == {"n": "back"}
    pub.close()
    sub.close()


def test_mqks_consumer_on_b_gets_publishes_on_a(make_node: Make, cluster: LocalCluster,
                                               uid: str) -> None:
    a = make_node(["mqks"])
    b = make_node(["mqks"])
    pub, sub = MqksSocket(a.port("mqks", "tcp")), MqksSocket(b.port("mqks", "tcp"))
    try:
        queue, event = f"q{uid}", f"e{uid}"
        sub.confirm(b"c1", b"consume", f"{queue} {event}".encode())
        for i in range(5):
            pub.confirm(b"m%d" % i, b"publish", f"{event} d{i}".encode())
        msgs = sub.wait_messages(b"c1", 5)
        assert sorted(m["data"] for m in msgs) == [b"d%d" % i for i in range(5)]
        assert all(m["event"] == event.encode() for m in msgs)
    finally:
        pub.close()
        sub.close()


def test_emqp_job_sent_to_a_runs_on_a_worker_of_b_and_its_reply_returns(
        make_node: Make, tmp_path: Path) -> None:
    from eventmq.client.messages import send_request

    from tests.unit.protocols.emqp.interop_support import Client, JobEnv, job_body

    a = make_node(["emqp"])
    b = make_node(["emqp"])
    jobs = JobEnv(tmp_path / "emq")
    client = Client(a.url("emqp", "frontend"))
    try:
        jobs.jobmanager(b.url("emqp", "backend"))
        ids = [send_request(client.sender, json.loads(job_body("emqjobs.work", n)),
                            reply_requested=True, queue="default") for n in (1, 2, 3)]
        assert [client.result_for(m) for m in ids] == [{"i": n, "double": 2 * n}
                                                       for n in (1, 2, 3)]
        assert sorted(jobs.results()) == [1, 2, 3]
    finally:
        client.close()
        jobs.close()


def test_nats_info_and_nsq_lookup_name_every_node(make_node: Make) -> None:
    """NATS INFO's ``connect_urls`` lists the other nodes' NATS listeners; NSQ ``/lookup``
    lists every node as a producer (pynsq's lookupd polling finds them all)."""
    import socket
    import urllib.request

    a = make_node(["nsq", "mq9"])
    b = make_node(["nsq", "mq9"])

    def info(node: BrokerProcess) -> dict[str, Any]:
        with socket.create_connection(("127.0.0.1", node.port("mq9", "tcp")), 5) as sock:
            line = sock.makefile("rb").readline()
        assert line.startswith(b"INFO ")
        return json.loads(line[5:])

    # each node learns the other from its announcement, in its own time
    wait(lambda: info(a).get("connect_urls") == [f"127.0.0.1:{b.port('mq9', 'tcp')}"],
         "A's INFO naming B")
    wait(lambda: info(b).get("connect_urls") == [f"127.0.0.1:{a.port('mq9', 'tcp')}"],
         "B's INFO naming A")

    def lookup(node: BrokerProcess) -> set[int]:
        url = f"http://127.0.0.1:{node.port('nsq', 'http')}/lookup?topic=anything"
        with urllib.request.urlopen(url, timeout=5) as reply:
            body = json.loads(reply.read())
        return {p["tcp_port"] for p in body["producers"]}
    every = {a.port("nsq", "tcp"), b.port("nsq", "tcp")}
    wait(lambda: lookup(a) == every and lookup(b) == every, "/lookup naming both nodes")


def test_an_emqp_schedule_runs_once_per_cluster_and_moves_when_its_node_dies(
        make_node: Make, tmp_path: Path) -> None:
    """An interval schedule taken by node B runs on the one node holding the cluster's lease
    (not once per node); after ``kill -9`` of that node another takes the lease and runs it."""
    import urllib.request

    from eventmq.client.messages import schedule

    from tests.unit.protocols.emqp.interop_support import Client, JobEnv

    a = make_node(["emqp"])
    b = make_node(["emqp"])
    jobs = JobEnv(tmp_path / "emq")
    client = Client(b.url("emqp", "frontend"))

    def holds(node: BrokerProcess) -> bool:
        url = f"http://127.0.0.1:{node.port('admin', 'http')}/api/stats"
        with urllib.request.urlopen(url, timeout=5) as reply:
            return bool(json.loads(reply.read())["core"]["cluster"]["runs_schedules"])
    try:
        jobs.jobmanager(a.url("emqp", "backend"), name="jma")
        jobs.jobmanager(b.url("emqp", "backend"), name="jmb")
        holder = wait(lambda: next((n for n in (a, b) if holds(n)), None), "a lease holder")
        assert sum(holds(n) for n in (a, b)) == 1
        schedule(client.sender, "emqjobs.work", interval_secs=1, args=[9])
        wait(lambda: jobs.results().count(9) >= 2, "two scheduled runs")
        start, t0 = jobs.results().count(9), time.monotonic()
        time.sleep(4.0)
        runs = jobs.results().count(9) - start
        assert 2 <= runs <= int(time.monotonic() - t0) + 2, runs    # once per interval, not twice
        holder.kill()
        other = b if holder is a else a
        wait(lambda: holds(other), "the other node taking the lease", timeout=30)
        before = jobs.results().count(9)
        wait(lambda: jobs.results().count(9) >= before + 2, "runs after the takeover")
    finally:
        client.close()
        jobs.close()


def test_vibemq_fanout_subscribers_on_two_nodes_each_get_every_message(
        make_node: Make, uid: str) -> None:
    """A fan-out queue: one subscriber on each node, each gets its own copy of every message
    (a JetStream consumer per subscriber)."""
    from mqhub.protocols.vibemq.options import MODE_FANOUT_ACK

    a = make_node(["vibemq"])
    b = make_node(["vibemq"])
    pub, on_a, on_b = vibe(a), vibe(a), vibe(b)
    queue = f"fan-{uid}"
    pub.create_queue(queue, QueueOptions(mode=MODE_FANOUT_ACK))
    on_a.subscribe(queue)
    on_b.subscribe(queue)
    for i in range(5):
        pub.publish(queue, {"n": i})
    for sub in (on_a, on_b):
        got = sub.receive(5, timeout=20, ack=True)
        assert sorted(json.loads(d.payload)["n"] for d in got) == list(range(5))
    for client in (pub, on_a, on_b):
        client.close()
