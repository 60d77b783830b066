"""The Redis RESP example drop-in, end to end: redis-py against ``twistd -n mqhub --plugin-path plugins``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from tests.interop.broker import BrokerProcess
from tests.plugins import EXAMPLE_PLUGINS

pytestmark = pytest.mark.interop

MakeBroker = Callable[..., BrokerProcess]


@pytest.fixture
def broker(make_broker: MakeBroker) -> BrokerProcess:
    """A broker serving only the example ``redis`` protocol."""
    return make_broker(["redis"], plugin_paths=[EXAMPLE_PLUGINS], extra_args=["--durability", "none"])


def client(broker: BrokerProcess, protocol: int = 3) -> redis.Redis:
    """A redis-py client (RESP3 by default, as redis-py 8 opens with HELLO 3)."""
    return redis.Redis(host="127.0.0.1", port=broker.port("redis"), protocol=protocol,
                       socket_timeout=5)


def next_message(pubsub: Any, timeout: float = 5.0) -> dict[str, Any]:
    """The next pub/sub message (not a subscribe confirmation), within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2)
        if message is not None:
            return message
    raise AssertionError("no message arrived")


def wait_subscribed(pubsub: Any, count: int) -> None:
    """Consume ``count`` subscribe confirmations, so later publishes are routed to us."""
    seen = 0
    deadline = time.monotonic() + 5.0
    while seen < count:
        assert time.monotonic() < deadline, "subscription not confirmed"
        message = pubsub.get_message(timeout=0.2)
        if message is not None and message["type"] in ("subscribe", "psubscribe"):
            seen += 1


@pytest.mark.parametrize("protocol", [2, 3])
def test_ping(broker: BrokerProcess, protocol: int) -> None:
    """PING answers PONG over RESP2 and RESP3 (redis-py 8's HELLO 3 handshake included)."""
    conn = client(broker, protocol)
    assert conn.ping() is True
    assert conn.echo("hi") == b"hi"
    conn.close()


@pytest.mark.parametrize("protocol", [2, 3])
def test_publish_reaches_subscriber_and_pattern_subscriber(broker: BrokerProcess, protocol: int) -> None:
    """A PUBLISH from one client reaches another client's SUBSCRIBE and PSUBSCRIBE."""
    subscriber = client(broker, protocol).pubsub()
    subscriber.subscribe("news.sport")
    watcher = client(broker, protocol).pubsub()
    watcher.psubscribe("news.*")
    wait_subscribed(subscriber, 1)
    wait_subscribed(watcher, 1)
    publisher = client(broker, protocol)
    assert publisher.publish("news.sport", b"goal") == 2
    message = next_message(subscriber)
    assert message["type"] == "message"
    assert message["channel"] == b"news.sport" and message["data"] == b"goal"
    pmessage = next_message(watcher)
    assert pmessage["type"] == "pmessage"
    assert pmessage["pattern"] == b"news.*"
    assert pmessage["channel"] == b"news.sport" and pmessage["data"] == b"goal"
    # a deeper address still matches the trailing '*' (Redis globs cross dots)
    assert publisher.publish("news.sport.late", b"extra time") == 1
    assert next_message(watcher)["channel"] == b"news.sport.late"
    # nobody listens here
    assert publisher.publish("weather", b"rain") == 0
    for conn in (subscriber, watcher):
        conn.close()
    publisher.close()


def test_unsubscribe_stops_delivery(broker: BrokerProcess) -> None:
    """After UNSUBSCRIBE and PUNSUBSCRIBE are confirmed, nothing is routed to the client any more."""
    sub = client(broker).pubsub()
    sub.subscribe("a.b")
    sub.psubscribe("a.*")
    wait_subscribed(sub, 2)
    publisher = client(broker)
    assert publisher.publish("a.b", b"1") == 2
    sub.unsubscribe("a.b")
    sub.punsubscribe("a.*")
    received, confirmations = [], []
    deadline = time.monotonic() + 5.0
    while len(confirmations) < 2:
        assert time.monotonic() < deadline, "unsubscribe not confirmed"
        message = sub.get_message(timeout=0.2)
        if message is None:
            continue
        if message["type"] in ("unsubscribe", "punsubscribe"):
            confirmations.append((message["type"], message["data"]))
        else:
            received.append((message["type"], message["data"]))
    assert sorted(received) == [("message", b"1"), ("pmessage", b"1")]
    assert confirmations == [("unsubscribe", 1), ("punsubscribe", 0)]
    assert publisher.publish("a.b", b"2") == 0
    assert sub.get_message(timeout=0.3) is None
    sub.close()
    publisher.close()


def test_pipelined_publishes_arrive_in_order(broker: BrokerProcess) -> None:
    """A pipeline of PUBLISHes (one batch in the core) is delivered whole and in order."""
    sub = client(broker).pubsub()
    sub.subscribe("bulk")
    wait_subscribed(sub, 1)
    publisher = client(broker)
    pipe = publisher.pipeline(transaction=False)
    for n in range(200):
        pipe.publish("bulk", b"m%d" % n)
    assert pipe.execute() == [1] * 200
    assert [next_message(sub)["data"] for _ in range(200)] == [b"m%d" % n for n in range(200)]
    sub.close()
    publisher.close()


def test_errors_keep_the_connection_usable(broker: BrokerProcess) -> None:
    """Unknown commands and bad channels get redis errors; the connection keeps working."""
    conn = client(broker, 2)
    with pytest.raises(redis.ResponseError, match="unknown command 'GET'"):
        conn.get("key")
    with pytest.raises(redis.ResponseError, match="invalid address"):
        conn.publish("bad..name", b"x")
    assert conn.ping() is True
    conn.close()


def test_redis_and_nats_share_the_address_space(make_broker: MakeBroker) -> None:
    """A Redis PUBLISH reaches a nats-py subscriber, and a NATS publish reaches a Redis SUBSCRIBEr."""
    import asyncio

    import nats

    broker = make_broker(["redis", "nats"], plugin_paths=[EXAMPLE_PLUGINS],
                         extra_args=["--durability", "none"])
    redis_conn = client(broker)
    redis_sub = client(broker).pubsub()
    redis_sub.subscribe("chat.room")
    wait_subscribed(redis_sub, 1)

    async def exchange() -> list[bytes]:
        """Publish from redis-py and nats-py; return what a nats-py subscriber received."""
        nc = await nats.connect(f"nats://127.0.0.1:{broker.port('mq9')}")
        received: list[bytes] = []
        done = asyncio.Event()

        async def on_message(msg: Any) -> None:
            """Collect one message."""
            received.append(msg.data)
            done.set()

        await nc.subscribe("chat.room", cb=on_message)
        await nc.flush()
        assert redis_conn.publish("chat.room", b"from redis") == 2
        await asyncio.wait_for(done.wait(), 5.0)
        done.clear()
        await nc.publish("chat.room", b"from nats")
        await asyncio.wait_for(done.wait(), 5.0)  # NATS echoes to its own subscription
        await nc.close()
        return received

    assert asyncio.run(exchange()) == [b"from redis", b"from nats"]
    assert next_message(redis_sub)["data"] == b"from redis"
    message = next_message(redis_sub)
    assert (message["channel"], message["data"]) == (b"chat.room", b"from nats")
    redis_sub.close()
    redis_conn.close()


def test_sigterm_with_subscribed_clients_exits_zero(broker: BrokerProcess) -> None:
    """SIGTERM while redis-py clients are subscribed: exit 0 within 5 s, clients see the close."""
    subscribers = []
    for n in range(4):
        pubsub = client(broker, 2 + n % 2).pubsub()
        pubsub.subscribe(f"room.{n}")
        wait_subscribed(pubsub, 1)
        subscribers.append(pubsub)
    started = time.monotonic()
    assert broker.stop(timeout=10.0) == 0
    assert time.monotonic() - started < 5.0
    for pubsub in subscribers:
        with pytest.raises(redis.ConnectionError):
            pubsub.connection.read_response()
        pubsub.reset()
    assert "store closed" in broker.output()
