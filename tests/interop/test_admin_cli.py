"""``mqhub stats``, ``mqhub queues`` and ``mqhub dlq`` against a running broker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from mqhub.cli import main
from mqhub.protocols.nsq import codec as wire
from tests.interop.admin_client import admin_url, call, queue_row, wait_for
from tests.interop.nsq_client import NsqSocket, ok

pytestmark = pytest.mark.interop

QUEUE = "nsq/jobs/work"


def run(*args: str) -> str:
    """Run ``mqhub ARGS``; require success; its output."""
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def dead_letter_one(broker: Any) -> None:
    """Publish one job, REQ it past max_attempts=1 from a raw NSQ consumer."""
    ok(broker, "/topic/create?topic=jobs")
    ok(broker, "/channel/create?topic=jobs&channel=work")
    ok(broker, "/mpub?topic=jobs", b"job-1\njob-2")
    assert call(broker, "/api/queues/nsq%2Fjobs%2Fwork", "PATCH", {"max_attempts": 1},
                headers={"Authorization": "Bearer t0ken"})[0] == 200
    consumer = NsqSocket(broker.port("nsq", "tcp"))
    consumer.send(wire.encode_sub("jobs", "work") + wire.encode_rdy(1))
    (msg,) = consumer.messages_until(1, "a job")
    consumer.send(wire.encode_rdy(0) + b"REQ " + msg.msg_id + b" 0\n")
    wait_for(lambda: (r := queue_row(broker, QUEUE)) and r["dead"] == 1, "a dead letter")
    consumer.close()


def test_stats_queues_and_dlq_replay(make_broker: Any, tmp_path: Path) -> None:
    """Tables, JSON, and a replay that puts the dead letter back."""
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    broker = make_broker(["nsq"], extra_args=["--durability", "none", "--admin-token", str(token)])
    url = admin_url(broker)
    dead_letter_one(broker)

    table = run("stats", "--url", url)
    assert "nsq" in table and "dead letters" in table
    figures = json.loads(run("stats", "--url", url, "--json"))
    assert figures["protocols"]["nsq"]["published"] == 2
    assert figures["dead_letters"] == 1

    listing = run("queues", "--url", url, "--sort", "-depth")
    assert QUEUE in listing
    page = json.loads(run("queues", "--url", url, "--json", "--filter", "jobs"))
    assert [(q["name"], q["depth"], q["dead"]) for q in page["queues"]] == [(QUEUE, 1, 1)]

    assert "max_attempts: 1" in run("dlq", "list", "--url", url)
    shown = json.loads(run("dlq", "show", QUEUE, "--url", url, "--json"))
    assert [d["preview"] for d in shown["dead_letters"]] == ["job-1"]

    refused = CliRunner().invoke(main, ["dlq", "replay", QUEUE, "--url", url])
    assert refused.exit_code != 0 and "401" in refused.output
    out = run("dlq", "replay", QUEUE, "--url", url, "--token-file", str(token))
    assert "1 dead letter(s)" in out
    row = wait_for(lambda: (r := queue_row(broker, QUEUE)) and r["depth"] == 2 and r, "replayed")
    assert row["dead"] == 0


def test_unreachable_broker_is_a_clear_error() -> None:
    """No broker: a one-line error, exit status 1."""
    result = CliRunner().invoke(main, ["stats", "--url", "http://127.0.0.1:9"])
    assert result.exit_code == 1
    assert "cannot reach http://127.0.0.1:9" in result.output
