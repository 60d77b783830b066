"""The operations surfaces in cluster mode: the admin API, ``mqhub stats/queues/dlq`` and
``/metrics`` of one node show the cluster's view — a channel another node declared, its depth
from the cluster's consumer info, dead letters another node made (max attempts reached across
nodes), and a replay from this node; a queue TTL set on one node expires messages another
node delivers (TTL as on one node)."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from mqhub.cli import main
from mqhub.protocols.nsq import codec as wire
from tests.interop.admin_client import admin_url, call, queue_row, wait_for
from tests.interop.broker import BrokerProcess
from tests.interop.nsq_client import NsqSocket, ok

pytestmark = pytest.mark.interop

Make = Callable[..., BrokerProcess]


def run(*args: str) -> str:
    """Run ``mqhub ARGS``; require success; its output."""
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_admin_views_show_the_cluster_and_dead_letters_cross_nodes(make_node: Make,
                                                                   tmp_path: Path,
                                                                   uid: str) -> None:
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    auth = ["--admin-token", str(token)]
    a = make_node(["nsq"], *auth)
    b = make_node(["nsq"], *auth)
    topic, queue = uid, f"nsq/{uid}/work"
    ok(b, f"/topic/create?topic={topic}")
    ok(b, f"/channel/create?topic={topic}&channel=work")   # declared on B
    wait_for(lambda: queue_row(a, queue), "A listing B's channel", timeout=20)
    ok(a, f"/mpub?topic={topic}", b"\n".join(b"job-%d" % i for i in range(5)))
    # the depth A shows is the cluster's (read from the channel's consumer), not A's own
    row = wait_for(lambda: (r := queue_row(a, queue)) and r["depth"] == 5 and r,
                   "depth 5 on A", timeout=20)
    assert row["depth"] == 5
    # max attempts set through A's admin API holds on B, where the message is REQ'd
    status, _ = call(a, f"/api/queues/{urllib.request.quote(queue, safe='')}", "PATCH",
                     {"max_attempts": 1}, headers={"Authorization": "Bearer t0ken"})
    assert status == 200
    wait_for(lambda: queue_row(b, queue)["max_attempts"] == 1, "the setting on B", timeout=20)
    consumer = NsqSocket(b.port("nsq", "tcp"))
    try:
        consumer.send(wire.encode_sub(topic, "work") + wire.encode_rdy(1))
        (msg,) = consumer.messages_until(1, "a job")
        consumer.send(wire.encode_rdy(0) + b"REQ " + msg.msg_id + b" 0\n")
        url = admin_url(a)
        shown = wait_for(lambda: (s := json.loads(run("dlq", "show", queue, "--url", url,
                                                         "--json")))["dead_letters"] and s,
                         "the dead letter listed on A", timeout=20)
        assert [d["preview"] for d in shown["dead_letters"]] == [msg.body.decode()]
        wait_for(lambda: queue_row(a, queue)["dead"] == 1, "A's dead count", timeout=20)
        figures = json.loads(run("stats", "--url", url, "--json"))
        assert figures["dead_letters"] == 1
        assert queue in run("queues", "--url", url)
        metrics = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
        assert queue in metrics
        out = run("dlq", "replay", queue, "--url", url, "--token-file", str(token))
        assert "1 dead letter(s)" in out
        wait_for(lambda: queue_row(a, queue)["dead"] == 0, "replayed", timeout=20)
    finally:
        consumer.close()


def test_queue_ttl_set_on_a_expires_what_b_would_deliver(make_node: Make, uid: str) -> None:
    """A VibeMQ queue with messageTtl made on A: a message older than it is not delivered to
    a consumer on B; a fresh one is."""
    from mqhub.protocols.vibemq.options import QueueOptions
    from tests.interop.vibemq_client import SocketClient

    a = make_node(["vibemq"])
    b = make_node(["vibemq"])
    pub, sub = SocketClient(a.port("vibemq", "tcp")), SocketClient(b.port("vibemq", "tcp"))
    pub.connect(compression=None)  # type: ignore[arg-type]
    sub.connect(compression=None)  # type: ignore[arg-type]
    queue = f"ttl-{uid}"
    pub.create_queue(queue, QueueOptions(message_ttl=1.0))
    pub.publish(queue, {"n": "old"})
    time.sleep(2.5)
    pub.publish(queue, {"n": "fresh"})
    sub.subscribe(queue)
    got: list[Any] = sub.receive(1, timeout=20, ack=True)
    assert [json.loads(d.payload) for d in got] == [{"n": "fresh"}]
    assert not sub.pump(1.0)            # the expired one never comes
    pub.close()
    sub.close()


def test_snapshot_of_a_node_says_what_it_covers(make_node: Make, tmp_path: Path) -> None:
    """``mqhub snapshot`` of a cluster node's data directory works and says it holds the
    node's journal and local records only (the messages are the cluster's)."""
    node = make_node(["nsq"])
    ok(node, "/pub?topic=snap", b"x")
    result = CliRunner().invoke(
        main, ["snapshot", "--data-dir", str(node.data_dir), "--out", str(tmp_path / "snap")])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert "cluster mode" in out["covers"] and "flow journal" in out["covers"]
    assert "JetStream cluster" in result.stderr


def test_rights_hold_at_the_seam_of_a_cluster_node(make_node: Make, tmp_path: Path,
                                                   uid: str) -> None:
    """With a users file, each node's sessions are the principal's guarded handles of the
    cluster backend: alice publishes on A and reads on B within her rights, and a publish
    outside them is refused with NSQ's own error."""
    import asyncio

    from tests.interop.security_support import (
        RecordingReader,
        nsq_call,
        nsq_close,
        nsq_writer,
        until,
    )

    users = tmp_path / "users.toml"
    users.write_text('[[user]]\nname = "alice"\npassword = "alice-pw"\ntoken = "alice-token"\n'
                     'publish = ["orders.>"]\nsubscribe = ["orders.>"]\n')
    a = make_node(["nsq"], "--users", str(users))
    b = make_node(["nsq"], "--users", str(users))
    topic = f"orders.{uid}"

    async def scenario() -> None:
        writer = await nsq_writer(a, "alice-token")
        reader = RecordingReader(b, topic, "alice-token")
        await until(lambda: reader.conns, "alice's reader on B")
        assert await nsq_call(writer.pub, topic, b"mine") == b"OK"
        refused = await nsq_call(writer.pub, f"secret{uid}", b"no")
        assert "E_UNAUTHORIZED" in str(refused)
        await until(lambda: reader.bodies == [b"mine"], "alice's message on B", timeout=20)
        reader.close()
        nsq_close(writer)
    asyncio.run(asyncio.wait_for(scenario(), 60))
