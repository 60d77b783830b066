"""MQKS events are hub addresses: NSQ → MQKS and MQKS → NATS (and NSQ) through one broker."""

from __future__ import annotations

import base64
import json
import socket
import time
from collections.abc import Callable

import pytest

from mqhub.protocols.nsq import codec as nsq_wire
from tests.interop.broker import BrokerProcess
from tests.interop.mqks_client import MqksSocket
from tests.interop.nsq_client import NsqSocket

pytestmark = pytest.mark.interop


def test_nsq_to_mqks_renders_every_body(make_broker: Callable[..., BrokerProcess]) -> None:
    """NSQ PUBs reach an MQKS queue; bodies MQKS cannot carry are rendered, never dropped."""
    broker = make_broker(["mqks", "nsq"])
    c = MqksSocket(broker.port("mqks", "tcp"))
    c.confirm(b"c", b"consume", b"fromnsq user.updated --manual-ack")
    nsq = NsqSocket(broker.port("nsq", "tcp"))
    bodies = [b"plain text", b"two\nlines\tand tab", b"\xff\xfebinary"]
    nsq.send(b"".join(nsq_wire.encode_pub("user.updated", b) for b in bodies))
    nsq.read_until(lambda fs: fs.count(nsq_wire.Response(b"OK")) >= 3, "three OKs")
    msgs = c.wait_messages(b"c", 3)
    assert all(m["event"] == b"user.updated" and len(m["id"]) == 16 for m in msgs)
    assert (msgs[0]["data"], msgs[0].get("enc")) == (b"plain text", None)
    assert msgs[1]["enc"] == b"json" and json.loads(msgs[1]["data"]) == "two\nlines\tand tab"
    assert msgs[2]["enc"] == b"base64" and base64.b64decode(msgs[2]["data"]) == bodies[2]
    c.confirm(b"a", b"ack", b"c " + msgs[0]["id"])
    nsq.close()
    c.close()


def test_mqks_to_nats_and_nsq(make_broker: Callable[..., BrokerProcess]) -> None:
    """An MQKS publish reaches a NATS subscriber and an NSQ channel of that address."""
    broker = make_broker(["mqks", "nsq", "nats"])
    nats_sock = socket.create_connection(("127.0.0.1", broker.port("mq9", "tcp")), timeout=10)
    nats_sock.sendall(b"CONNECT {\"verbose\":false}\r\nSUB user.created 1\r\nPING\r\n")
    buf = b""
    deadline = time.monotonic() + 10
    while b"PONG" not in buf:
        assert time.monotonic() < deadline, buf
        buf += nats_sock.recv(4096)
    nsq = NsqSocket(broker.port("nsq", "tcp"))
    nsq.send(nsq_wire.encode_sub("user.created", "c") + nsq_wire.encode_rdy(10))
    nsq.read_until(lambda fs: nsq_wire.Response(b"OK") in fs, "SUB OK")
    p = MqksSocket(broker.port("mqks", "tcp"))
    p.confirm(b"m1", b"publish", b"user.created {\"id\": 7}")
    want = b"MSG user.created 1 9\r\n{\"id\": 7}\r\n"
    while want not in buf:
        assert time.monotonic() < deadline, buf
        buf += nats_sock.recv(4096)
    assert [m.body for m in nsq.messages_until(1, "the NSQ copy")] == [b"{\"id\": 7}"]
    nats_sock.close()
    nsq.close()
    p.close()
