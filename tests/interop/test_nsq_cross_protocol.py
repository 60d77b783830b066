"""Cross-protocol on a real broker: a NATS publish on address ``orders`` reaches NSQ topic orders."""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest

from mqhub.protocols.nsq import codec as wire
from tests.interop.broker import BrokerProcess
from tests.interop.nsq_client import NsqSocket

pytestmark = pytest.mark.interop


def test_nats_publish_reaches_nsq_channel(make_broker: Callable[..., BrokerProcess]) -> None:
    """Bodies published by a NATS client on subject 'orders' arrive on NSQ channel orders/billing."""
    broker = make_broker(["nsq", "mq9"])
    consumer = NsqSocket(broker.port("nsq", "tcp"))
    consumer.send(wire.encode_sub("orders", "billing") + wire.encode_rdy(10))
    consumer.read_until(lambda fs: wire.Response(b"OK") in fs, "the SUB's OK", 5)
    nats = socket.create_connection(("127.0.0.1", broker.port("mq9", "tcp")), timeout=5)
    nats.recv(4096)  # INFO
    nats.sendall(b'CONNECT {"verbose":false}\r\nPUB orders 8\r\nfrom-nat\r\nPUB orders 2\r\n\x00\xff\r\nPING\r\n')
    got = consumer.messages_until(2, "both NATS messages")
    consumer.send(b"".join(wire.encode_fin(m.msg_id) for m in got))
    assert [m.body for m in got] == [b"from-nat", b"\x00\xff"]
    assert all(m.attempts == 1 and len(m.msg_id) == 16 for m in got)
    nats.close()
    consumer.close()
