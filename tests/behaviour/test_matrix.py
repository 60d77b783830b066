"""Cross-protocol matrix (DESIGN.md §3): every publisher protocol reaches every consumer protocol.

Publishers: NSQ ``PUB``, ``MPUB`` and HTTP ``/pub``, NATS (nats-py), the Redis example (redis-py), eMQP
``PUBLISH`` and MQKS ``publish --confirm``. Consumers: an NSQ channel, a NATS subscriber, a Redis
subscriber, an MQKS queue (bodies MQKS cannot carry arrive by its documented rule, ``enc=json`` /
``enc=base64``, decoded by the driver; an MQKS publisher sends only bodies a line can carry, and
NATS subscribers see its message id as the header ``mqks-id``). Body bytes must
arrive unchanged and in publish order, rendered as the receiving protocol's own messages (NSQ:
attempts 1, a 16-hex-digit id, a publish timestamp in ns; NATS: a plain ``MSG`` without headers
for protocols that have none). NSQ, NATS and Redis carry arbitrary bytes, so their documented
rule is "byte for byte" (docs/protocols/nsq.md, nats.md). eMQP can only carry UTF-8 frames
(docs/protocols/emqp.md, ``E_NOT_UTF8``): such a PUBLISH is dropped with a logged warning and
never reaches anyone, which is checked too.
"""

from __future__ import annotations

import re
import time

import pytest

from tests.behaviour.bodies import BINARY_BODIES, MQKS_BODIES, UTF8_BODIES
from tests.behaviour.clients import (
    Mq9PushConsumer,
    Mq9QueryConsumer,
    NatsConsumer,
    NatsPublisher,
    NsqConsumer,
    wait_until,
)
from tests.behaviour.conftest import Drivers
from tests.interop.broker import BrokerProcess

PUBLISHERS = ["nsq", "nsq-mpub", "nsq-http", "nats", "redis", "emqp", "mqks"]
CONSUMERS = ["nsq", "nats", "redis", "mqks"]


@pytest.mark.parametrize("consumer_protocol", CONSUMERS)
@pytest.mark.parametrize("publisher_protocol", PUBLISHERS)
def test_message_reaches_every_protocol_intact(
    drivers: Drivers, publisher_protocol: str, consumer_protocol: str
) -> None:
    """A message published by one protocol reaches another protocol's consumer, bytes and order intact."""
    address = f"matrix.{publisher_protocol}.{consumer_protocol}"
    bodies = {"emqp": UTF8_BODIES, "mqks": MQKS_BODIES}.get(publisher_protocol, BINARY_BODIES)
    consumer = drivers.consumer(consumer_protocol, address)
    publisher = drivers.publisher(publisher_protocol)
    published_ns = time.time_ns()
    publisher.publish(address, bodies)
    assert consumer.take(len(bodies)) == bodies
    if isinstance(consumer, NsqConsumer):
        for timestamp, attempts, msg_id in consumer.meta:
            assert attempts == 1
            assert re.fullmatch(rb"[0-9a-f]{16}", msg_id), msg_id
            assert abs(timestamp - published_ns) < 60 * 10**9, (timestamp, published_ns)
        assert len({msg_id for _, _, msg_id in consumer.meta}) == len(bodies)
    if isinstance(consumer, NatsConsumer) and publisher_protocol == "mqks":
        # the MQKS message id (the publisher's request id) travels as the header mqks-id
        assert all(set(h) == {"mqks-id"} for h in consumer.headers), consumer.headers
    elif isinstance(consumer, NatsConsumer) and publisher_protocol != "nats":
        assert consumer.headers == [None] * len(bodies)


@pytest.mark.parametrize("consumer_protocol", ["nsq", "redis"])
def test_nats_headers_stay_out_of_bodies_of_headerless_protocols(
    drivers: Drivers, consumer_protocol: str
) -> None:
    """NATS HPUB headers are dropped for NSQ and Redis (no headers there); the body is unchanged."""
    address = f"headers.{consumer_protocol}"
    consumer = drivers.consumer(consumer_protocol, address)
    publisher = drivers.publisher("nats")
    assert isinstance(publisher, NatsPublisher)
    publisher.headers = {"X-Trace": "abc", "Content-Type": "application/octet-stream"}
    publisher.publish(address, BINARY_BODIES[:3])
    assert consumer.take(3) == BINARY_BODIES[:3]


def test_wildcard_subscribers_of_other_protocols_see_a_publish(drivers: Drivers) -> None:
    """An NSQ publish reaches NATS ``*``/``>`` wildcard subscribers (patterns are hub patterns)."""
    star = drivers.consumer("nats", "wild.*.leaf")
    tail = drivers.consumer("nats", "wild.>")
    drivers.publisher("nsq").publish("wild.mid.leaf", [b"\x00wild\n"])
    assert star.take(1) == [b"\x00wild\n"]
    assert tail.take(1) == [b"\x00wild\n"]


@pytest.mark.parametrize("consumer_protocol", CONSUMERS)
def test_emqp_non_utf8_publish_is_dropped_not_delivered(
    broker: BrokerProcess, drivers: Drivers, consumer_protocol: str
) -> None:
    """eMQP cannot carry non-UTF-8 frames: such a PUBLISH is dropped (E_NOT_UTF8 logged), later ones arrive."""
    address = f"utf8.{consumer_protocol}"
    consumer = drivers.consumer(consumer_protocol, address)
    publisher = drivers.publisher("emqp")
    warnings = broker.output().count("E_NOT_UTF8")
    publisher.publish(address, [b"\xff\xfe not utf-8", b"after"])
    # The frames of one DEALER arrive in order: once "after" is delivered, the bad one was handled.
    assert consumer.take(1) == [b"after"]
    wait_until(lambda: broker.output().count("E_NOT_UTF8") > warnings, "the E_NOT_UTF8 warning")
    publisher.publish(address, [b"marker"])
    assert consumer.take(1) == [b"marker"]


def test_one_publish_fans_out_to_all_protocols_at_once(drivers: Drivers) -> None:
    """One publish on an address reaches an NSQ channel, a NATS and a Redis subscriber together."""
    address = "fanout.all"
    consumers = [drivers.consumer(protocol, address) for protocol in CONSUMERS]
    drivers.publisher("nats").publish(address, BINARY_BODIES[:3])
    for consumer in consumers:
        assert consumer.take(3) == BINARY_BODIES[:3]


def is_utf8(body: bytes) -> bool:
    """Whether ``body`` is valid UTF-8."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@pytest.mark.parametrize("consumer_protocol", ["mq9-push", "mq9-query"])
@pytest.mark.parametrize("publisher_protocol", ["nats", "redis", "emqp", "mqks"])
def test_message_reaches_mq9_mailbox(
    drivers: Drivers, publisher_protocol: str, consumer_protocol: str
) -> None:
    """A publish to a mailbox's INBOX subject lands in the mailbox; QUERY renders non-UTF-8 as base64.

    NSQ is not a publisher here: NSQ names cannot contain ``$``, so no NSQ topic maps to a
    ``$mq9.AI.INBOX...`` address (docs/protocols/nsq.md, names).
    """
    consumer = drivers.consumer(consumer_protocol, "")
    assert isinstance(consumer, Mq9PushConsumer | Mq9QueryConsumer)
    address = consumer.address
    bodies = {"emqp": UTF8_BODIES, "mqks": MQKS_BODIES}.get(publisher_protocol, BINARY_BODIES)
    drivers.publisher(publisher_protocol).publish(address, bodies)
    assert consumer.take(len(bodies)) == bodies
    if consumer_protocol == "mq9-query":
        expected = ["utf-8" if is_utf8(body) else "base64" for body in bodies]
        assert isinstance(consumer, Mq9QueryConsumer)
        assert consumer.encodings == expected
