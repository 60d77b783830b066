"""NSQ durability against a real broker: every OK'd message survives SIGKILL; DPUB/REQ delays too."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from mqhub.protocols.nsq import codec as wire
from tests.interop.broker import BrokerProcess
from tests.interop.nsq_client import NsqSocket, channel_stats, ok

pytestmark = pytest.mark.interop


def test_every_ok_survives_sigkill_during_pub_load(make_broker: Callable[..., BrokerProcess]) -> None:
    """SIGKILL during a pipelined PUB load: after restart every message that got OK is delivered."""
    broker = make_broker(["nsq"])
    ok(broker, "/topic/create?topic=crash")
    ok(broker, "/channel/create?topic=crash&channel=c")
    confirmed = [0]
    stop = threading.Event()

    def produce() -> None:
        """Pipelined PUB load counting OKs until the broker dies."""
        client = NsqSocket(broker.port("nsq", "tcp"))
        seq = 0
        try:
            while not stop.is_set():
                client.send(b"".join(wire.encode_pub("crash", b"msg-%d" % (seq + i)) for i in range(200)))
                seq += 200
                while confirmed[0] < seq - 600:  # keep about three batches in flight
                    confirmed[0] += sum(1 for f in client.read(2.0) if f == wire.Response(b"OK"))
        except (ConnectionError, OSError):
            pass
        finally:
            client.close()

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while confirmed[0] < 5000 and time.monotonic() < deadline:
        time.sleep(0.01)
    broker.kill()
    stop.set()
    thread.join(10)
    ok_count = confirmed[0]
    assert ok_count >= 5000, "the producer never got going"
    broker.start()
    expected = {b"msg-%d" % i for i in range(ok_count)}
    consumer = NsqSocket(broker.port("nsq", "tcp"))
    got = consumer.consume("crash", "c", lambda bodies: expected <= set(bodies), timeout=30)
    consumer.close()
    assert expected <= {m.body for m in got}


def test_deferred_and_requeued_messages_survive_restart(make_broker: Callable[..., BrokerProcess]) -> None:
    """A DPUB and a REQ with delay, both pending at SIGKILL, are delivered after the restart."""
    broker = make_broker(["nsq"])
    port = broker.port("nsq", "tcp")
    consumer = NsqSocket(port)
    consumer.send(wire.encode_sub("later", "c") + wire.encode_rdy(10))
    consumer.read_until(lambda fs: wire.Response(b"OK") in fs, "the SUB's OK")
    producer = NsqSocket(port)
    producer.send(wire.encode_pub("later", b"requeue-me") + wire.encode_dpub("later", 1500, b"deferred"))
    frames = producer.read_until(lambda fs: fs.count(wire.Response(b"OK")) >= 2, "two OKs", 5)
    assert frames.count(wire.Response(b"OK")) == 2
    msgs = consumer.messages_until(1, "the undeferred message", 5)
    assert [m.body for m in msgs] == [b"requeue-me"]
    consumer.send(wire.encode_req(msgs[0].msg_id, 1500))
    deadline = time.monotonic() + 5
    while channel_stats(broker, "later", "c")["requeue_count"] < 1:  # the REQ reached the broker
        assert time.monotonic() < deadline, "REQ not seen by the broker"
        time.sleep(0.02)
    broker.kill()
    broker.start()
    after = NsqSocket(broker.port("nsq", "tcp"))
    got = after.consume("later", "c", lambda b: {b"requeue-me", b"deferred"} <= set(b), timeout=15)
    after.close()
    # at least once: both come back (the REQ's own commit may or may not have landed before the
    # SIGKILL, so the attempts count is not asserted here; the unit tests check it on restart)
    assert {m.body for m in got} >= {b"requeue-me", b"deferred"}
