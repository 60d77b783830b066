"""Behaviour-suite fixtures: one broker per module with every implemented protocol, and drivers.

The broker runs NSQ (TCP and HTTP), NATS/mq9, eMQP, MQKS and the Redis example drop-in
(``--plugin-path plugins``) on free 127.0.0.1 ports. ``drivers`` opens publishers and
consumers by protocol name and closes them after the test.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.behaviour.clients import (
    AsyncLoop,
    Consumer,
    EmqpPublisher,
    Mq9PushConsumer,
    Mq9QueryConsumer,
    MqksConsumer,
    MqksPublisher,
    NatsConsumer,
    NatsPublisher,
    NsqConsumer,
    NsqHttpPublisher,
    NsqMpubPublisher,
    NsqPublisher,
    Publisher,
    RedisConsumer,
    RedisPublisher,
)
from tests.interop.broker import BrokerProcess
from tests.plugins import EXAMPLE_PLUGINS

#: Protocols served by the module broker (names as BrokerProcess resolves them).
PROTOCOLS = ["nsq", "mq9", "emqp", "mqks", "redis"]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One started broker for the whole module, every protocol on a free loopback port."""
    base = tmp_path_factory.mktemp("behaviour")
    proc = BrokerProcess(PROTOCOLS, base / "data", log_dir=base, plugin_paths=[EXAMPLE_PLUGINS])
    proc.start()
    yield proc
    proc.close()
    print(f"--- {proc.log_path} ---\n{proc.output()[-20000:]}")


@pytest.fixture(scope="module")
def nats_loop() -> Iterator[AsyncLoop]:
    """A background asyncio loop for nats-py, shared by the module."""
    loop = AsyncLoop()
    yield loop
    loop.close()


class Drivers:
    """Opens protocol drivers against the module broker and closes them all at the end."""

    def __init__(self, broker: BrokerProcess, loop: AsyncLoop) -> None:
        """:param broker: the running module broker. :param loop: the nats-py loop."""
        self.broker = broker
        self.loop = loop
        self.opened: list[Any] = []

    @property
    def nats_url(self) -> str:
        """nats:// URL of the broker's NATS port."""
        return self.broker.url("mq9", "tcp", scheme="nats")

    def publisher(self, protocol: str) -> Publisher:
        """A connected publisher of ``protocol`` (nsq, nsq-mpub, nsq-http, nats, redis or emqp)."""
        made: Publisher
        if protocol == "nsq":
            made = NsqPublisher(self.broker.port("nsq", "tcp"))
        elif protocol == "nsq-mpub":
            made = NsqMpubPublisher(self.broker.port("nsq", "tcp"))
        elif protocol == "nsq-http":
            made = NsqHttpPublisher(self.broker.port("nsq", "http"))
        elif protocol == "nats":
            made = NatsPublisher(self.loop, self.nats_url)
        elif protocol == "redis":
            made = RedisPublisher(self.broker.port("redis", "tcp"))
        elif protocol == "emqp":
            made = EmqpPublisher(self.broker.url("emqp", "pub-in"))
        elif protocol == "mqks":
            made = MqksPublisher(self.broker.port("mqks", "tcp"))
        else:
            raise ValueError(protocol)
        self.opened.append(made)
        return made

    def consumer(self, protocol: str, address: str) -> Consumer:
        """A live subscription of ``protocol`` (nsq channel, nats or redis subscriber).

        ``mq9-push`` and ``mq9-query`` create a new mailbox and ignore ``address``: publish to
        the consumer's own ``address`` (its INBOX subject) instead.
        """
        made: Consumer
        if protocol == "mq9-push":
            made = Mq9PushConsumer(self.loop, self.nats_url)
        elif protocol == "mq9-query":
            made = Mq9QueryConsumer(self.loop, self.nats_url)
        elif protocol == "nsq":
            made = NsqConsumer(self.broker.port("nsq", "tcp"), address)
        elif protocol == "nats":
            made = NatsConsumer(self.loop, self.nats_url, address)
        elif protocol == "redis":
            made = RedisConsumer(self.broker.port("redis", "tcp"), address)
        elif protocol == "mqks":
            made = MqksConsumer(self.broker.port("mqks", "tcp"), address)
        else:
            raise ValueError(protocol)
        self.opened.append(made)
        return made

    def consumer_on_channel(self, address: str, channel: str) -> NsqConsumer:
        """An NSQ consumer of a named channel (closed after the test)."""
        made = NsqConsumer(self.broker.port("nsq", "tcp"), address, channel)
        self.opened.append(made)
        return made

    def close(self) -> None:
        """Close every driver opened (ignoring ones the broker already closed)."""
        for driver in reversed(self.opened):
            try:
                driver.close()
            except Exception:  # noqa: BLE001 - best-effort cleanup after the assertions ran
                pass


@pytest.fixture
def drivers(broker: BrokerProcess, nats_loop: AsyncLoop) -> Iterator[Drivers]:
    """Per-test driver factory; asserts afterwards that the broker is still running."""
    made = Drivers(broker, nats_loop)
    yield made
    made.close()
    assert broker.running, f"broker died:\n{broker.output()[-5000:]}"
