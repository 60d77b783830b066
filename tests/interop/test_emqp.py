"""eMQP interop: eventmq 0.3.13's own client, emq-jobmanager and emq-scheduler against a real
``twistd -n mqhub`` broker subprocess (and the eMQP peers the admin API lists)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from tests.interop.admin_client import get, wait_for
from tests.unit.protocols.emqp.interop_support import (
    Client,
    JobEnv,
    job_body,
    raw_dealer,
    wait_until,
)

V = b"eMQP/1.0"


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[JobEnv]:
    """The job module, output file and every eventmq process started by the test."""
    env = JobEnv(tmp_path / "emq")
    yield env
    env.close()


@pytest.fixture
def emqp(make_broker):
    """A started mqhub broker serving eMQP (sync durability, the default)."""
    return make_broker(["emqp"])


def addr(broker, role: str) -> str:
    """ZeroMQ address of one of the broker's eMQP roles."""
    return broker.url("emqp", role)


@pytest.fixture
def client(emqp) -> Iterator[Client]:
    """eventmq's Sender connected to the frontend."""
    c = Client(addr(emqp, "frontend"))
    yield c
    c.close()


def test_send_request_reaches_jobmanager_and_result_comes_back(emqp, jobs, client):
    """send_request reaches a real emq-jobmanager; with reply-requested the client gets the result."""
    from eventmq.client.messages import send_request

    jobs.jobmanager(addr(emqp, "backend"))
    ids = [send_request(client.sender, json.loads(job_body("emqjobs.work", n)),
                        reply_requested=True, queue="default") for n in (1, 2, 3)]
    assert [client.result_for(m) for m in ids] == [{"i": n, "double": 2 * n} for n in (1, 2, 3)]
    assert sorted(jobs.results()) == [1, 2, 3]
    acks = [m for m in client.received if m[2] == "REPLY" and len(m) == 5]
    assert sorted(m[4] for m in acks) == sorted(ids)


def test_defer_job_without_reply_runs_once(emqp, jobs, client):
    """defer_job without reply-requested runs every job exactly once and forwards no result."""
    from eventmq.client.messages import defer_job

    jobs.jobmanager(addr(emqp, "backend"))
    for n in range(20):
        defer_job(client.sender, "emqjobs.work", args=[n])
    wait_until(lambda: len(jobs.results()) >= 20, what="20 jobs")
    client.pump(0.3)
    assert sorted(jobs.results()) == list(range(20))
    assert not [m for m in client.received if len(m) == 6]


def test_schedule_interval_runs_repeatedly_until_unscheduled(emqp, jobs, client):
    """schedule() with an interval runs the job repeatedly in the hub's scheduler; unschedule()
    stops it."""
    from eventmq.client.messages import schedule

    jobs.jobmanager(addr(emqp, "backend"))
    schedule(client.sender, "emqjobs.work", interval_secs=1, args=[7])
    wait_until(lambda: jobs.results().count(7) >= 3, what="three scheduled runs")
    schedule(client.sender, "emqjobs.work", args=[7], unschedule=True)
    time.sleep(0.5)  # a run already dispatched may still finish
    settled = jobs.results().count(7)
    time.sleep(3.0)  # three intervals with no run prove the schedule is gone
    assert jobs.results().count(7) == settled


def test_schedule_survives_broker_restart(emqp, jobs, client):
    """A schedule is durable: after a broker restart it keeps running without a new SCHEDULE."""
    from eventmq.client.messages import schedule

    jm = jobs.jobmanager(addr(emqp, "backend"))
    schedule(client.sender, "emqjobs.work", interval_secs=1, args=[8])
    wait_until(lambda: jobs.results().count(8) >= 1, what="a scheduled run")
    jobs.kill(jm)
    assert emqp.stop() == 0
    emqp.start()
    before = jobs.results().count(8)
    jobs.jobmanager(addr(emqp, "backend"))
    wait_until(lambda: jobs.results().count(8) >= before + 2, what="runs after the restart")


def test_guarantee_job_survives_sigkill_and_finished_job_is_not_repeated(emqp, jobs, client):
    """A guarantee job waiting at a SIGKILL runs after the restart; a finished one does not rerun."""
    from eventmq.client.messages import send_request

    jm = jobs.jobmanager(addr(emqp, "backend"), queues='[[10, "default"], [10, "fast"]]')
    done = send_request(client.sender, json.loads(job_body("emqjobs.work", 41)),
                        reply_requested=True, guarantee=True, queue="default")
    assert client.result_for(done)["i"] == 41
    jobs.kill(jm)
    jm2 = jobs.jobmanager(addr(emqp, "backend"), queues='[[10, "fast"]]')
    # until a worker INFORMs "fast" the broker would send its jobs to "default" (eventmq's rule)
    emqp.wait_for_log("serves [(10, 'fast')]", timeout=20)
    send_request(client.sender, json.loads(job_body("emqjobs.work", 42)), guarantee=True,
                 queue="default")
    # a later job through the same socket proves the broker read (and stored) the one before
    probe = send_request(client.sender, json.loads(job_body("emqjobs.work", 0)),
                         reply_requested=True, queue="fast")
    assert client.result_for(probe)["i"] == 0
    assert 42 not in jobs.results()
    jobs.kill(jm2)
    emqp.kill()
    emqp.start()
    jobs.jobmanager(addr(emqp, "backend"))
    wait_until(lambda: 42 in jobs.results(), what="the guaranteed job after the crash")
    assert jobs.results().count(41) == 1  # finished before the crash: never dispatched again
    assert jobs.results().count(42) == 1


def test_binary_identity_garbage_and_disconnect_leave_broker_serving(emqp, jobs, client):
    """A binary-identity peer is served, garbage is dropped, a client DISCONNECT ends only it."""
    from eventmq.client.messages import send_request

    jobs.jobmanager(addr(emqp, "backend"))
    binary = raw_dealer(addr(emqp, "frontend"))  # libzmq's auto-generated binary identity
    binary.send_multipart([b"", V, b"REQUEST", b"bin-1", b"default", b"reply-requested",
                           job_body("emqjobs.work", "binary")])
    assert binary.poll(20000)
    garbage = raw_dealer(addr(emqp, "frontend"), b"garbage")
    for frames in ([b"\xff\xfe"], [b"", V, b"REQUEST", b"x"], [b"", b"eMQP/9", b"READY", b"x"],
                   [b"", V, b"REQUEST", b"g", b"default", b"", b"\xff not json"]):
        garbage.send_multipart(frames)
    worker_garbage = raw_dealer(addr(emqp, "backend"), b"fake-worker")
    worker_garbage.send_multipart([b"", V, b"READY", b"\xff"])
    quitter = raw_dealer(addr(emqp, "frontend"), b"quitter")
    quitter.send_multipart([b"", V, b"DISCONNECT", b"bye"])
    assert quitter.poll(10000)
    assert quitter.recv_multipart()[2] == b"KBYE"
    msgid = send_request(client.sender, json.loads(job_body("emqjobs.work", "after")),
                         reply_requested=True)
    assert client.result_for(msgid)["i"] == "after"
    results: list[list[bytes]] = []

    def binary_result() -> bool:
        while binary.poll(100):
            results.append(binary.recv_multipart())
        return any(len(r) == 6 for r in results)

    wait_until(binary_result, what="the binary peer's result")
    [result] = [r for r in results if len(r) == 6]
    assert result[4:] == [b'{"value": {"i": "binary", "double": "binarybinary"}}', b"bin-1"]
    assert emqp.running
    for sock in (binary, garbage, worker_garbage, quitter):
        sock.close()


def test_publish_reaches_sub_socket_and_nats_subscriber(make_broker):
    """PUBLISH to the pub/sub ROUTER goes out on PUB as [topic, message] and to NATS subscribers;
    with pub_bridge, a NATS publish reaches the ZeroMQ SUB socket."""
    import asyncio

    import nats
    from eventmq.client.messages import send_publish_request
    from eventmq.sender import Sender

    broker = make_broker(["emqp", "mq9"], extra_args=["--option", "emqp.pub_bridge=news.>"])
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"news")
    sub.connect(addr(broker, "pub-out"))
    publisher = Sender()
    publisher.connect(addr(broker, "pub-in"))

    async def scenario() -> list[bytes]:
        nc = await nats.connect(f"nats://127.0.0.1:{broker.port('mq9', 'tcp')}")
        got: list[bytes] = []

        async def on_message(msg: Any) -> None:
            got.append(msg.data)

        await nc.subscribe("news.>", cb=on_message)
        await nc.flush()
        await nc.flush()
        end = time.monotonic() + 20
        zmq_got = None
        while time.monotonic() < end and (zmq_got is None or not got):
            send_publish_request(publisher, "news.sport", {"score": 3})
            if zmq_got is None and sub.poll(100):
                zmq_got = sub.recv_multipart()
            await asyncio.sleep(0.05)
        assert zmq_got == [b"news.sport", b'{"score": 3}']
        bridged = None
        while time.monotonic() < end and bridged is None:
            await nc.publish("news.tech", b"from nats")
            await nc.flush()
            while sub.poll(100):
                frames = sub.recv_multipart()
                if frames[0] == b"news.tech":
                    bridged = frames
        await nc.close()
        assert bridged == [b"news.tech", b"from nats"]
        return got

    got = asyncio.run(scenario())
    assert b'{"score": 3}' in got
    sub.close()
    publisher.zsocket.close(linger=0)


def test_real_emq_scheduler_still_works_in_forward_mode(make_broker, jobs):
    """With emqp.schedules=forward a real emq-scheduler gets the SCHEDULE and its REQUESTs run."""
    from eventmq.client.messages import schedule

    broker = make_broker(["emqp"], extra_args=["--option", "emqp.schedules=forward"])
    jobs.scheduler(addr(broker, "frontend"))
    jobs.jobmanager(addr(broker, "backend"))
    client = Client(addr(broker, "frontend"))
    try:
        # the scheduler must have INFORMed before a SCHEDULE can be forwarded: resend until a run
        def first_run() -> bool:
            if 5 in jobs.results():
                return True
            schedule(client.sender, "emqjobs.work", interval_secs=1, args=[5])
            return False

        wait_until(first_run, timeout=30, interval=0.3, what="a run from emq-scheduler")
        runs = jobs.results().count(5)
        wait_until(lambda: jobs.results().count(5) >= runs + 2, timeout=15,
                   what="interval runs from emq-scheduler")
    finally:
        client.close()


def test_retry_count_reruns_a_timed_out_job_on_a_real_jobmanager(emqp, jobs, client):
    """timeout:1 with retry-count:1: the real jobmanager times the job out twice; the client gets
    only the final TimeoutError result."""
    from eventmq.client.messages import send_request

    jobs.jobmanager(addr(emqp, "backend"), jobs=2)
    msgid = send_request(client.sender, json.loads(job_body("emqjobs.slow", 5)),
                         reply_requested=True, retry_count=1, timeout=1)
    assert client.result_for(msgid, timeout=30) == "TimeoutError"
    assert jobs.results().count("slow-start") == 2
    results = [m for m in client.received if m[2] == "REPLY" and len(m) == 6]
    assert len(results) == 1


def test_guarantee_job_of_a_killed_jobmanager_runs_on_another(make_broker, jobs):
    """A jobmanager SIGKILLed mid-job is detected (a send fails or it goes silent) and its
    guaranteed job runs again on another jobmanager."""
    from eventmq.client.messages import send_request

    broker = make_broker(["emqp"], extra_args=["--option", "emqp.heartbeat_interval=1",
                                               "--option", "emqp.heartbeat_timeout=4"])
    client = Client(addr(broker, "frontend"))
    try:
        jm1 = jobs.jobmanager(addr(broker, "backend"), jobs=2)
        send_request(client.sender, json.loads(job_body("emqjobs.slow", 60)), guarantee=True)
        send_request(client.sender, json.loads(job_body("emqjobs.slow", 61)))
        wait_until(lambda: jobs.results().count("slow-start") == 2, what="both jobs started")
        jobs.kill(jm1)
        jobs.jobmanager(addr(broker, "backend"), jobs=2)
        wait_until(lambda: jobs.results().count("slow-start") == 3, timeout=20,
                   what="the guaranteed job on the second jobmanager")
        broker.wait_for_log("removed", timeout=10)
    finally:
        client.close()


def emqp_rows(broker: Any) -> dict[str, list[dict[str, Any]]]:
    """The eMQP rows of /api/connections by kind."""
    out: dict[str, list[dict[str, Any]]] = {}
    for row in get(broker, "/api/connections")["connections"]:
        if row["protocol"] == "emqp":
            out.setdefault(row["kind"], []).append(row)
    return out


def test_emqp_peers_are_listed_as_connections(make_broker: Any, jobs: JobEnv) -> None:
    """Worker (queues, slots), client (identity, messages) and publisher rows; a client's
    DISCONNECT removes its row; by_protocol counts them."""
    from eventmq.client.messages import send_request

    broker = make_broker(["emqp", "nsq"], extra_args=["--durability", "none"])
    jobs.jobmanager(broker.url("emqp", "backend"), jobs=2)
    client = Client(broker.url("emqp", "frontend"))
    try:
        msgid = send_request(client.sender, json.loads(job_body("emqjobs.work", 5)),
                             reply_requested=True, queue="default")
        assert client.result_for(msgid)["i"] == 5
        named = raw_dealer(broker.url("emqp", "frontend"), b"tidy-client")
        named.send_multipart([b"", V, b"REQUEST", b"n-1", b"default", b"",
                              job_body("emqjobs.work", 6)])
        publisher = raw_dealer(broker.url("emqp", "pub-in"), b"tidy-pub")
        publisher.send_multipart([b"", V, b"PUBLISH", b"p-1", b"news.a", b"hello"])
        rows = wait_for(lambda: (r := emqp_rows(broker)) and len(r.get("client", [])) == 2
                        and r.get("publisher") and r.get("worker") and r, "eMQP peers listed")
        [worker] = rows["worker"]
        assert worker["listener"] == "emqp-backend" and worker["queues"] == ["default"]
        assert worker["slots"] >= 0 and worker["since"] <= worker["last_seen"]
        mine = [r for r in rows["client"] if r["peer"] == "tidy-client"]
        assert mine and mine[0]["listener"] == "emqp-frontend" and mine[0]["messages"] == 1
        assert rows["publisher"][0]["peer"] == "tidy-pub"
        assert rows["publisher"][0]["listener"] == "emqp-pub-in"
        counts = get(broker, "/api/connections")["by_protocol"]
        assert counts["emqp"] == 4 and counts["nsq"] == 0
        assert get(broker, "/api/stats")["protocols"]["emqp"]["connections"] == 4
        named.send_multipart([b"", V, b"DISCONNECT", b"bye"])
        assert named.poll(10000) and named.recv_multipart()[2] in (b"REPLY", b"KBYE")
        wait_for(lambda: not [r for r in emqp_rows(broker).get("client", [])
                              if r["peer"] == "tidy-client"], "the DISCONNECTed client gone")
        named.close()
        publisher.close()
    finally:
        client.close()
