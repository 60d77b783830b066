"""Cross-protocol on a real broker: a NATS publish on address ``orders`` reaches NSQ topic orders."""

from __future__ import annotations

import socket
import time
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
    deadline = time.monotonic() + 5
    frames: list[object] = []
    while wire.Response(b"OK") not in frames:
        assert time.monotonic() < deadline, "SUB not answered"
        frames += consumer.read()
    nats = socket.create_connection(("127.0.0.1", broker.port("mq9", "tcp")), timeout=5)
    nats.recv(4096)  # INFO
    nats.sendall(b'CONNECT {"verbose":false}\r\nPUB orders 8\r\nfrom-nat\r\nPUB orders 2\r\n\x00\xff\r\nPING\r\n')
    got: list[wire.Message] = []
    deadline = time.monotonic() + 10
    while len(got) < 2:
        assert time.monotonic() < deadline, f"only {got} arrived"
        got += [f for f in consumer.read() if isinstance(f, wire.Message)]
    consumer.send(b"".join(wire.encode_fin(m.msg_id) for m in got))
    assert [m.body for m in got] == [b"from-nat", b"\x00\xff"]
    assert all(m.attempts == 1 and len(m.msg_id) == 16 for m in got)
    nats.close()
    consumer.close()
