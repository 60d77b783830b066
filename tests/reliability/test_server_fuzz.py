"""Server-level fuzz: mutated frames of every protocol into one live broker, while a bystander
client of another protocol keeps publishing and receiving.

Inputs come from the codec fuzz targets' seeds, mutated (tests/reliability/fuzz/mutate.py);
each goes on a fresh connection (ZeroMQ multipart messages for eMQP). After every batch the
bystander does a round trip; at the end the broker is alive, its RSS bounded, and its log
holds no unhandled error. ``MQHUB_SERVER_FUZZ_INPUTS`` sets the inputs per protocol (300).
"""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Callable

import psutil
import pytest
import zmq

from tests.interop.broker import HOST, BrokerProcess
from tests.plugins import EXAMPLE_PLUGINS
from tests.reliability.fuzz.mutate import mutate
from tests.reliability.fuzz.targets import all_targets, pieces
from tests.reliability.targets.natsock import NatsSocket
from tests.reliability.test_limits import RSS_BOUND_MIB, Bystander

pytestmark = pytest.mark.interop

INPUTS = int(os.environ.get("MQHUB_SERVER_FUZZ_INPUTS", 300))
#: fuzz target -> (protocol, role) of the live listener it is sent to.
LISTENERS = {"nsq": ("nsq", "tcp"), "nats": ("mq9", "tcp"), "resp": ("redis", "tcp"),
             "emqp": ("emqp", "frontend"), "mqks": ("mqks", "tcp"), "vibemq": ("vibemq", "tcp")}


def send_tcp(port: int, data: bytes) -> None:
    """Send ``data`` in its fuzz pieces on a fresh connection, read what comes, close."""
    with socket.create_connection((HOST, port), timeout=2) as sock:
        try:
            for piece in pieces(data):
                sock.sendall(piece)
            sock.settimeout(0.01)
            sock.recv(65536)
        except (OSError, TimeoutError):
            pass  # closed by the broker after its error, or nothing to say: both are fine


@pytest.mark.parametrize("name", sorted(LISTENERS))
def test_fuzzed_frames_never_hurt_the_broker_or_a_bystander(
        name: str, make_broker: Callable[..., BrokerProcess],
        record_figures: Callable[[str, dict[str, object]], None]) -> None:
    """INPUTS mutated inputs of one protocol; the bystander (NSQ, or NATS for NSQ) keeps working."""
    broker = make_broker(["nsq", "mq9", "emqp", "redis", "mqks", "vibemq"], plugin_paths=[EXAMPLE_PLUGINS],
                         extra_args=["--durability", "none"])
    target = all_targets()[name]
    rng = random.Random(name)
    pool = [bytes([k]) + seed for seed in target.seeds for k in range(7)]
    if name == "nsq":
        bystander_nats = NatsSocket(broker.port("mq9"))
        bystander_nats.send(b"SUB by 1\r\nPING\r\n")

        def check() -> None:
            """A NATS round trip."""
            bystander_nats.send(b"PUB by 2\r\nok\r\nPING\r\n")
            bystander_nats.until(lambda e: e[0] == 11 and bytes(e[-1]) == b"ok")
    else:
        check = Bystander(broker).check
    protocol, role = LISTENERS[name]
    dealer = None
    if name == "emqp":
        dealer = zmq.Context.instance().socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(broker.url(protocol, role))
    for i in range(INPUTS):
        data = mutate(rng, rng.choice(pool), pool)
        if dealer is not None:
            for message in data[1:].split(b"\n"):
                dealer.send_multipart(message.split(b"|")[1:] or [b""])  # the ROUTER adds our id
        else:
            send_tcp(broker.port(protocol, role), data)
        if i % 50 == 49:
            check()
    check()
    if dealer is not None:
        dealer.close(linger=0)
    assert broker.running
    assert broker.process is not None
    rss = psutil.Process(broker.process.pid).memory_info().rss >> 20
    assert rss < RSS_BOUND_MIB
    log = broker.output()
    assert "Unhandled Error" not in log and "Traceback" not in log, log[-3000:]
    record_figures("server-fuzz", {"protocol": name, "inputs": INPUTS, "rss_mib": rss})
