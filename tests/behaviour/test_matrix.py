"""Cross-protocol matrix (DESIGN.md §3): every publisher protocol reaches every consumer protocol.

Publishers: NSQ ``PUB``, NATS (nats-py), the Redis example (redis-py) and eMQP ``PUBLISH``.
Consumers: an NSQ channel, a NATS subscriber, a Redis subscriber. Body bytes must arrive
unchanged and in publish order. NSQ, NATS and Redis carry arbitrary bytes, so their documented
rule is "byte for byte" (docs/protocols/nsq.md, nats.md). eMQP can only carry UTF-8 frames
(docs/protocols/emqp.md, ``E_NOT_UTF8``): such a PUBLISH is dropped with a logged warning and
never reaches anyone, which is checked too.
"""

from __future__ import annotations

import pytest

from tests.behaviour.conftest import Drivers
from tests.interop.broker import BrokerProcess

PUBLISHERS = ["nsq", "nats", "redis", "emqp"]
CONSUMERS = ["nsq", "nats", "redis"]

#: Plain text, a newline (MQKS-style line protocols cannot carry it raw), CRLF inside the body
#: (the NATS and Redis framing terminator), non-UTF-8 bytes with NUL, and 64 KiB of every byte.
BINARY_BODIES = [
    b"plain text",
    b"two\nlines\r\nand CRLF\r\n",
    b"\x00\xff\xfe\x80 not utf-8 \xc3(",
    bytes(range(256)) * 256,
]
#: What eMQP can carry: UTF-8 only (newlines and CRLF included).
UTF8_BODIES = [b"plain text", b"two\nlines\r\nand CRLF\r\n", "caf\u00e9 \u2713 \U0001f680".encode()]


@pytest.mark.parametrize("consumer_protocol", CONSUMERS)
@pytest.mark.parametrize("publisher_protocol", PUBLISHERS)
def test_message_reaches_every_protocol_intact(
    drivers: Drivers, publisher_protocol: str, consumer_protocol: str
) -> None:
    """A message published by one protocol reaches another protocol's consumer, bytes and order intact."""
    address = f"matrix.{publisher_protocol}.{consumer_protocol}"
    bodies = UTF8_BODIES if publisher_protocol == "emqp" else BINARY_BODIES
    consumer = drivers.consumer(consumer_protocol, address)
    publisher = drivers.publisher(publisher_protocol)
    publisher.publish(address, bodies)
    assert consumer.take(len(bodies)) == bodies


@pytest.mark.parametrize("consumer_protocol", CONSUMERS)
def test_emqp_non_utf8_publish_is_dropped_not_delivered(
    broker: BrokerProcess, drivers: Drivers, consumer_protocol: str
) -> None:
    """eMQP cannot carry non-UTF-8 frames: such a PUBLISH is dropped (E_NOT_UTF8 logged), later ones arrive."""
    address = f"utf8.{consumer_protocol}"
    consumer = drivers.consumer(consumer_protocol, address)
    publisher = drivers.publisher("emqp")
    publisher.publish(address, [b"\xff\xfe not utf-8", b"after"])
    # The frames of one DEALER arrive in order: once "after" is delivered, the bad one was handled.
    assert consumer.take(1) == [b"after"]
    broker.wait_for_log("E_NOT_UTF8")
    publisher.publish(address, [b"marker"])
    assert consumer.take(1) == [b"marker"]


def test_one_publish_fans_out_to_all_protocols_at_once(drivers: Drivers) -> None:
    """One publish on an address reaches an NSQ channel, a NATS and a Redis subscriber together."""
    address = "fanout.all"
    consumers = [drivers.consumer(protocol, address) for protocol in CONSUMERS]
    drivers.publisher("nats").publish(address, BINARY_BODIES[:3])
    for consumer in consumers:
        assert consumer.take(3) == BINARY_BODIES[:3]
