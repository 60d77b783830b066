"""Lame-duck mode end to end: `mqhub lameduck` and SIGUSR2 against a real broker."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from pathlib import Path

import nats
from click.testing import CliRunner

from mqhub.cli import main
from mqhub.protocols.nsq import codec as wire
from tests.interop.admin_client import admin_url
from tests.interop.broker import BrokerProcess, port_accepts, wait_until
from tests.interop.nsq_client import NsqSocket
from tests.interop.test_nats_py import run

N = 200


def published(port: int, topic: str, count: int) -> set[bytes]:
    """PUB ``count`` bodies and wait for every OK: the confirmed messages."""
    s = NsqSocket(port)
    bodies = {b"m%04d" % i for i in range(count)}
    s.send(b"".join(wire.encode_pub(topic, b) for b in sorted(bodies)))
    oks = s.read_until(lambda fs: sum(f == wire.Response(b"OK") for f in fs) >= count,
                       "every PUB confirmed")
    assert all(isinstance(f, wire.Response) for f in oks)
    s.close()
    return bodies


def wait_exit(broker: BrokerProcess, timeout: float = 20.0) -> int:
    """Wait for the broker to stop by itself; its exit status."""
    assert broker.process is not None
    return broker.process.wait(timeout)


def test_lameduck_command_closes_gracefully_without_losing_confirmed_messages(
        make_broker: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    """`mqhub lameduck`: ports stop accepting, nats.py's lame-duck callback fires, an NSQ
    consumer gets no new messages and its unfinished in-flight ones are requeued; the broker
    then stops by itself (status 0) and after a restart every confirmed message is either
    finished or still there."""
    broker = make_broker(["nats", "nsq"], extra_args=["--lame-duck-duration", "2",
                                                      "--lame-duck-grace", "0.5"])
    nsq_port, nats_port = broker.port("nsq", "tcp"), broker.port("mq9")
    bodies = published(nsq_port, "ld", N)
    consumer = NsqSocket(nsq_port)
    consumer.send(wire.encode_sub("ld", "c") + wire.encode_rdy(50))
    first = consumer.messages_until(50, "the first 50 messages")
    finished = {m.body for m in first[:20]}
    consumer.send(b"".join(wire.encode_fin(m.msg_id) for m in first[:20]))
    first += consumer.messages_until(20, "20 more once 20 were finished")   # 50 in flight

    async def lame_duck() -> tuple[bool, float]:
        """Connect with a lame-duck callback, start lame duck, wait for the callback."""
        seen = asyncio.Event()

        async def on_lame_duck() -> None:
            seen.set()

        nc = await nats.connect(f"nats://127.0.0.1:{nats_port}", lame_duck_mode_cb=on_lame_duck,
                                allow_reconnect=False)
        started = time.monotonic()
        result = await asyncio.get_running_loop().run_in_executor(None, lambda: CliRunner().invoke(
            main, ["lameduck", "--url", admin_url(broker), "--json"]))
        assert result.exit_code == 0, result.output
        assert '"lame_duck": true' in result.output
        await asyncio.wait_for(seen.wait(), 5)
        await nc.close()
        return True, started

    fired, started = run(lame_duck())
    assert fired
    assert not port_accepts(nats_port) and not port_accepts(nsq_port)
    # while lame: the consumer may still FIN what it holds but gets nothing new
    frames = consumer.read(0.3)
    assert not [f for f in frames if isinstance(f, wire.Message)]
    consumer.send(b"".join(wire.encode_fin(m.msg_id) for m in first[20:30]))
    finished |= {m.body for m in first[20:30]}
    assert wait_exit(broker) == 0
    assert time.monotonic() - started >= 0.5        # not before the grace period
    assert "lame duck over" in broker.output()
    broker.start()
    rest = NsqSocket(nsq_port).consume("ld", "c", lambda got: len(got) >= N - len(finished))
    left = {m.body for m in rest}
    assert left | finished == bodies and not left & finished


def test_sigusr2_enters_lame_duck(make_broker: Callable[..., BrokerProcess]) -> None:
    """SIGUSR2 is lame duck, not death: INFO ldm reaches the client, the broker exits 0."""
    broker = make_broker(["nats"], extra_args=["--lame-duck-duration", "1",
                                               "--lame-duck-grace", "0"])

    async def main_() -> None:
        seen = asyncio.Event()

        async def on_lame_duck() -> None:
            seen.set()

        nc = await nats.connect(f"nats://127.0.0.1:{broker.port('mq9')}",
                                lame_duck_mode_cb=on_lame_duck, allow_reconnect=False)
        assert broker.process is not None
        broker.process.send_signal(signal.SIGUSR2)
        await asyncio.wait_for(seen.wait(), 5)
        await nc.close()

    run(main_())
    assert wait_exit(broker) == 0
    wait_until(lambda: "received SIGUSR2" in broker.output(), "the SIGUSR2 log line")
