"""MQKS durability on a real broker: confirmed publishes, bindings and settings survive kill -9."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.interop.broker import BrokerProcess, wait_until
from tests.interop.mqks_client import MqksClient, MqksSocket

pytestmark = pytest.mark.interop


def test_confirmed_publishes_survive_sigkill(make_broker: Callable[..., BrokerProcess]) -> None:
    """200 ``publish --confirm`` to a bound queue with no consumer, kill -9, restart: all 200."""
    broker = make_broker(["mqks"])
    p = MqksSocket(broker.port("mqks", "tcp"))
    p.confirm(b"rb", b"rebind", b"crashq crash.e")
    p.send(*[b"m%03d publish --confirm crash.e body-%03d" % (i, i) for i in range(200)])
    p.until(lambda ls: sum(1 for x in ls if x.endswith(b" ok ")) >= 201, "200 confirms")
    assert [x for x in p.lines if x.startswith(b"m")] == [b"m%03d ok " % i for i in range(200)]
    p.close()
    broker.kill()
    broker.start()
    c = MqksSocket(broker.port("mqks", "tcp"))
    c.confirm(b"c", b"consume", b"crashq")
    msgs = c.wait_messages(b"c", 200)
    assert [(m["id"], m["event"], m["data"]) for m in msgs] == [
        (b"m%03d" % i, b"crash.e", b"body-%03d" % i) for i in range(200)]
    c.close()


def test_bindings_and_delete_when_unused_survive_restart(
        make_broker: Callable[..., BrokerProcess]) -> None:
    """A queue's events and its --delete-queue-when-unused value are durable; unacked come back."""
    broker = make_broker(["mqks"])
    a = MqksSocket(broker.port("mqks", "tcp"))
    a.confirm(b"c1", b"consume", b"keepq k.1 k.2 --delete-queue-when-unused=60 --manual-ack")
    a.confirm(b"m1", b"publish", b"k.2 unacked")
    a.wait_messages(b"c1", 1)
    broker.kill()
    broker.start()
    b = MqksSocket(broker.port("mqks", "tcp"))
    b.confirm(b"c2", b"consume", b"keepq --add k.3 --delete-queue-when-unused=60")
    b.wait_line(b"c2 ok --update keepq k.1 k.2 k.3 --delete-queue-when-unused=60.0")
    msgs = b.wait_messages(b"c2", 1)
    assert (msgs[0]["id"], msgs[0]["event"], msgs[0]["data"]) == (b"m1", b"k.2", b"unacked")
    b.confirm(b"m2", b"publish", b"k.1 after")
    assert b.wait_messages(b"c2", 2)[1]["data"] == b"after"
    a.close()
    b.close()


def test_original_client_consumer_survives_a_broker_restart(
        make_broker: Callable[..., BrokerProcess]) -> None:
    """client/mqks.py behaviour across kill -9 + restart: reconnect, re-consume under a new id
    (on_reconnect), and a message published afterwards reaches the new consumer."""
    broker = make_broker(["mqks"])
    port = broker.port("mqks", "tcp")
    client = MqksClient(port)
    got: list[dict[str, str]] = []
    swaps: list[tuple[str, str]] = []
    try:
        cid = client.consume("rq", ["r.e"], got.append, confirm=True,
                             on_reconnect=lambda old, new: swaps.append((old, new)))
        broker.kill()
        broker.start()
        wait_until(lambda: len(swaps) == 1, "on_reconnect after the restart", timeout=20)
        assert swaps[0][0] == cid
        publisher = MqksSocket(port)
        # the queue and its binding are durable: the message waits there for the new consumer
        publisher.confirm(b"p1", b"publish", b"r.e after-restart")
        wait_until(lambda: bool(got), "the message after the restart")
        assert got[0]["consumer"] == swaps[0][1] and got[0]["data"] == "after-restart"
        publisher.close()
    finally:
        client.close()
