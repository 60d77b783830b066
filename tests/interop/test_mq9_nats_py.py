"""mq9 mailboxes with nats-py against a real broker, including a SIGKILL crash."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import nats
import pytest

from tests.interop.broker import BrokerProcess
from tests.interop.test_nats_py import barrier, collector, run, until, url


@pytest.fixture
def broker(make_broker: Callable[..., BrokerProcess]) -> BrokerProcess:
    """A durable broker serving mq9 with a fast TTL sweep."""
    return make_broker(["mq9"], extra_args=["--option", "mq9.sweep_interval=0.1"])


async def create(nc: Any, **req: Any) -> dict[str, Any]:
    """MAILBOX.CREATE through nats-py's request()."""
    msg = await nc.request("$mq9.AI.MAILBOX.CREATE", json.dumps(req).encode(), timeout=5)
    return json.loads(msg.data)


async def query(nc: Any, mail_id: str, token: str) -> dict[str, Any]:
    """MAILBOX.QUERY through nats-py's request()."""
    msg = await nc.request(f"$mq9.AI.MAILBOX.QUERY.{mail_id}",
                           json.dumps({"token": token}).encode(), timeout=5)
    return json.loads(msg.data)


def test_create_backlog_priority_order_query_and_latest(broker: BrokerProcess) -> None:
    """nats-py: create, backlog in priority order, live push, QUERY tokens, latest."""
    async def main() -> None:
        nc = await nats.connect(url(broker))
        box = await create(nc, type="standard", ttl=3600)
        latest = await create(nc, type="latest")
        assert box["inbox"] == "$mq9.AI.INBOX." + box["mail_id"] and latest["type"] == "latest"
        mid = box["mail_id"]
        for prio, body in [("normal", b"n1"), ("notify", b"x1"), ("urgent", b"u1"),
                           ("normal", b"n2"), ("urgent", b"u2")]:
            await nc.publish(f"$mq9.AI.INBOX.{mid}.{prio}", body)
        for i in range(3):
            await nc.publish(f"$mq9.AI.INBOX.{latest['mail_id']}.normal", b"status %d" % i)
        await barrier(nc)
        agent = await nats.connect(url(broker))
        got: list[Any] = []
        await agent.subscribe(f"$mq9.AI.INBOX.{mid}.*", cb=collector(got))
        await until(lambda: len(got) == 5)
        assert [m.data for m in got] == [b"u1", b"u2", b"n1", b"n2", b"x1"]
        assert got[0].subject == f"$mq9.AI.INBOX.{mid}.urgent"
        await nc.publish(f"$mq9.AI.INBOX.{mid}.normal", b"live")
        await until(lambda: len(got) == 6)
        assert got[-1].data == b"live"
        assert await query(nc, latest["mail_id"], "wrong") == {"error": "invalid token"}
        q = await query(nc, latest["mail_id"], latest["token"])
        assert q["unread"] == 1 and [m["payload"] for m in q["messages"]] == ["status 2"]
        q = await query(nc, mid, box["token"])
        assert q == {"mail_id": mid, "unread": 0, "messages": []}
        assert nc.is_connected and agent.is_connected
        await agent.close()
        await nc.close()
    run(main())


def test_ttl_expiry_of_message_and_mailbox(broker: BrokerProcess) -> None:
    """nats-py: a message TTL and a mailbox TTL expire on a real broker."""
    async def main() -> None:
        nc = await nats.connect(url(broker))
        box = await create(nc, ttl=3)
        mid = box["mail_id"]
        await nc.publish(f"$mq9.AI.INBOX.{mid}.normal", b"short", headers={"mq9-ttl": "0.3"})
        await nc.publish(f"$mq9.AI.INBOX.{mid}.urgent", b"stays")
        await barrier(nc)
        await asyncio.sleep(0.6)      # waiting past a TTL is the behaviour under test
        q = await query(nc, mid, box["token"])
        assert [m["payload"] for m in q["messages"]] == ["stays"]
        await nc.publish(f"$mq9.AI.INBOX.{mid}.urgent", b"doomed")
        await barrier(nc)
        await asyncio.sleep(2.6)      # past the mailbox TTL (3 s from CREATE)
        q = await query(nc, mid, box["token"])
        assert q == {"error": f"mailbox {mid} does not exist"}
        got: list[Any] = []
        await nc.subscribe(f"$mq9.AI.INBOX.{mid}.*", cb=collector(got))
        await barrier(nc)
        assert got == []              # "doomed" went with its mailbox
        await nc.close()
    run(main())


def test_broadcast_wildcards_hash_queue_groups_and_persist(broker: BrokerProcess) -> None:
    """nats-py: broadcasts with *, #, queue groups and mq9-persist replay."""
    async def main() -> None:
        nc = await nats.connect(url(broker))
        dom: list[Any] = []
        evt: list[Any] = []
        every: list[Any] = []
        w1: list[Any] = []
        w2: list[Any] = []
        await nc.subscribe("$mq9.AI.BROADCAST.system.*", cb=collector(dom))
        await nc.subscribe("$mq9.AI.BROADCAST.*.anomaly", cb=collector(evt))
        await nc.subscribe("$mq9.AI.BROADCAST.#", cb=collector(every))
        await nc.subscribe("$mq9.AI.BROADCAST.task.available", queue="task.workers",
                           cb=collector(w1))
        await nc.subscribe("$mq9.AI.BROADCAST.task.available", queue="task.workers",
                           cb=collector(w2))
        await barrier(nc)
        pub = await nats.connect(url(broker))
        await pub.publish("$mq9.AI.BROADCAST.system.anomaly", b"a")
        for i in range(20):
            await pub.publish("$mq9.AI.BROADCAST.task.available", b"t%d" % i)
        await pub.flush()
        await until(lambda: len(every) == 21 and len(w1) + len(w2) == 20)
        assert [m.data for m in dom] == [b"a"] and [m.data for m in evt] == [b"a"]
        assert sorted(m.data for m in w1 + w2) == sorted(b"t%d" % i for i in range(20))
        # persisted broadcast: a late queue group and a late subject get it once
        await pub.publish("$mq9.AI.BROADCAST.audit.login", b"kept",
                          headers={"mq9-persist": "true"})
        await pub.publish("$mq9.AI.BROADCAST.audit.logout", b"lost")
        await barrier(pub)
        late: list[Any] = []
        late2: list[Any] = []
        late_sub = await nats.connect(url(broker))
        await late_sub.subscribe("$mq9.AI.BROADCAST.audit.*", queue="auditors",
                                 cb=collector(late))
        await barrier(late_sub)
        await until(lambda: len(late) == 1)
        await late_sub.subscribe("$mq9.AI.BROADCAST.audit.*", queue="auditors",
                                 cb=collector(late2))
        await barrier(late_sub)
        assert [m.data for m in late] == [b"kept"] and late2 == []
        await late_sub.close()
        await pub.close()
        await nc.close()
    run(main())


def test_durable_inbox_survives_sigkill(broker: BrokerProcess) -> None:
    """Durable INBOX messages survive SIGKILL and arrive in priority order after restart."""
    async def before() -> dict[str, Any]:
        nc = await nats.connect(url(broker))
        box = await create(nc)
        for i in range(100):
            await nc.publish(f"$mq9.AI.INBOX.{box['mail_id']}.{'urgent' if i % 2 else 'normal'}",
                             b"m%d" % i)
        await nc.publish(f"$mq9.AI.INBOX.{box['mail_id']}.notify", b"memory only")
        await barrier(nc)     # the PONG follows the commit of everything before it
        await nc.close()
        return box

    async def after(box: dict[str, Any]) -> None:
        nc = await nats.connect(url(broker))
        got: list[Any] = []
        await nc.subscribe(f"$mq9.AI.INBOX.{box['mail_id']}.*", cb=collector(got))
        await until(lambda: len(got) == 100)
        await barrier(nc)
        data = [m.data for m in got]
        assert data == [b"m%d" % i for i in range(1, 100, 2)] + [b"m%d" % i for i in range(0, 100, 2)]
        await nc.close()

    box = run(before())
    broker.kill()
    broker.start()
    run(after(box))
