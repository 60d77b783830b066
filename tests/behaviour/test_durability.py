"""Cross-protocol at-least-once across ``kill -9`` (DESIGN.md §8), for every publisher that confirms.

NSQ ``PUB``/``MPUB`` and HTTP ``/pub`` answer ``OK`` and Redis ``PUBLISH`` answers its receiver count (MQKS ``publish --confirm``: ``ok ``) only after
the store committed the batch, so a message they confirmed into a durable queue (an NSQ
channel) must survive SIGKILL of the broker. This module has its own broker (the module-scoped
fixture), because the test kills it.
"""

from __future__ import annotations

from tests.behaviour.bodies import BINARY_BODIES, MQKS_BODIES
from tests.behaviour.clients import NsqConsumer
from tests.behaviour.conftest import Drivers
from tests.interop.broker import BrokerProcess

CONFIRMING_PUBLISHERS = ["nsq", "nsq-mpub", "nsq-http", "redis", "mqks"]
#: what each publisher can carry (MQKS: one text line per message)
BODIES = {"mqks": MQKS_BODIES}


def test_confirmed_messages_of_every_protocol_survive_sigkill(
    broker: BrokerProcess, drivers: Drivers
) -> None:
    """Messages NSQ PUB/MPUB/HTTP and Redis PUBLISH confirmed into an NSQ channel are there after kill -9."""
    port = broker.port("nsq", "tcp")
    for protocol in CONFIRMING_PUBLISHERS:
        NsqConsumer(port, f"durable.{protocol}", channel="keep").close()  # creates the channel
    for protocol in CONFIRMING_PUBLISHERS:
        drivers.publisher(protocol).publish(f"durable.{protocol}", BODIES.get(protocol, BINARY_BODIES))
    broker.kill()
    broker.start()
    for protocol in CONFIRMING_PUBLISHERS:
        consumer = drivers.consumer_on_channel(f"durable.{protocol}", "keep")
        bodies = BODIES.get(protocol, BINARY_BODIES)
        assert consumer.take(len(bodies)) == bodies, protocol
