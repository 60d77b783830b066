"""eMQP peers in the admin API: a real emq-jobmanager, eventmq's client and a publisher on
pub-in are listed by ``/api/connections`` (protocol ``emqp``) and counted per protocol."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.interop.admin_client import get, wait_for
from tests.protocols.emqp.interop_support import Client, JobEnv, job_body, raw_dealer

pytestmark = pytest.mark.interop

V = b"eMQP/1.0"


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[JobEnv]:
    """The job module and the eventmq processes the test starts."""
    env = JobEnv(tmp_path / "emq")
    yield env
    env.close()


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
