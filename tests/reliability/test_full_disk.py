"""A full disk: the broker's store on a small tmpfs the test mounts.

Publishers get their protocol's error for every message not stored and an ``OK`` for none of
them; reads and acknowledgements keep working (the store gives back its reserve file when a
write fails, so acks and deletes find room: without it every ack failed too, and space could
never come back without a restart); once space is back (messages consumed, topic deleted)
publishing resumes without a restart. Needs ``mount`` (root or CAP_SYS_ADMIN); where it
is not permitted the test is skipped with that reason and the store-level proof is
``tests/unit/store/test_lmdb.py`` (a real EFBIG from RLIMIT_FSIZE).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mqhub.protocols.nsq import codec as wire
from tests.interop.broker import BrokerProcess
from tests.interop.nsq_client import NsqSocket, channel_stats, ok, request

pytestmark = pytest.mark.interop

DISK_MIB = 12


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A DISK_MIB tmpfs mounted at tmp_path/disk (skipped where mounting is not permitted)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MIB}m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}); the store's disk-full "
                    "handling is proven by tests/unit/store/test_lmdb.py instead")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def publish_until_full(port: int, body: bytes, limit: int) -> tuple[list[bytes], int]:
    """PUB numbered bodies one at a time; return (bodies answered OK, errors) once 50 errors came.

    Every answer is OK or nsqd's fatal E_PUB_FAILED (then a new connection goes on).
    """
    client = NsqSocket(port)
    oks: list[bytes] = []
    errors = 0
    for i in range(limit):
        payload = b"%08d|" % i + body
        client.send(wire.encode_pub("disk", payload))
        (frame,) = client.read_until(lambda fs: bool(fs), "the PUB's answer")
        if frame == wire.Response(b"OK"):  # (a page LMDB freed may still take a small write)
            oks.append(payload)
        else:
            assert isinstance(frame, wire.ErrorFrame) and frame.code == "E_PUB_FAILED", frame
            errors += 1
            if errors >= 50:
                break
            client.close()  # E_PUB_FAILED is fatal in nsqd: the broker closes this connection
            client = NsqSocket(port)
    client.close()
    return oks, errors


def fill_read_and_recover(disk: Path, make_broker: Callable[..., BrokerProcess]) -> tuple[set[bytes], set[bytes]]:
    """Fill the store's disk through NSQ PUB, read everything back, free space, publish again.

    Returns (bodies answered OK, bodies delivered).
    """
    broker = make_broker(["nsq"], data_dir=disk / "data",
                         extra_args=["--store-map-size", "1", "--store-reserve", "1"])
    ok(broker, "/topic/create?topic=disk")
    ok(broker, "/channel/create?topic=disk&channel=c")
    port = broker.port("nsq", "tcp")
    oks, errors = publish_until_full(port, b"d" * 8000, limit=DISK_MIB * 1024 // 4)
    assert errors == 50 and len(oks) > 100, (len(oks), errors)
    http_body = b"http|" + b"h" * 8000
    status, _, data = request(broker, "/pub?topic=disk", http_body)
    assert (status, data) in ((200, b"OK"), (500, b'{"message": "INTERNAL_ERROR"}')), (status, data)
    if status == 200:
        oks.append(http_body)
    consumer = NsqSocket(port)  # reads and FINs keep working on the full disk
    got = consumer.consume("disk", "c", lambda bodies: set(oks) <= set(bodies), timeout=60)
    deadline = time.monotonic() + 20
    while (stats := channel_stats(broker, "disk", "c"))["depth"] or stats["in_flight_count"]:
        assert time.monotonic() < deadline, f"FINs not taken on the full disk: {stats}"
        late = [f for f in consumer.read(0.1) if isinstance(f, wire.Message)]
        consumer.send(b"".join(wire.encode_fin(m.msg_id) for m in late))
        got += late
    consumer.close()
    ok(broker, "/topic/delete?topic=disk")
    # space is back: publishing resumes without a restart (after the store's short refusal
    # window that follows a failed write)
    deadline = time.monotonic() + 20
    while True:
        producer = NsqSocket(port)
        producer.send(wire.encode_pub("after", b"resumed"))
        (frame,) = producer.read_until(lambda fs: bool(fs), "the PUB's answer")
        producer.close()
        if frame == wire.Response(b"OK"):
            break
        assert time.monotonic() < deadline, f"publishing did not resume: {frame}"
        time.sleep(0.1)
    assert "store commit failed" not in broker.output(), "an ack or delete failed on the full disk"
    assert broker.running
    return set(oks), {m.body for m in got}


def test_full_disk_refuses_keeps_reading_and_recovers(
        small_disk: Path, make_broker: Callable[..., BrokerProcess]) -> None:
    """Every OK'd message is delivered byte-identical after the disk filled; publishing resumes."""
    oks, delivered = fill_read_and_recover(small_disk, make_broker)
    assert oks <= delivered
    assert all(body.startswith((b"http|", b"0")) for body in delivered)  # nothing invented


def test_refused_messages_are_not_delivered(
        small_disk: Path, make_broker: Callable[..., BrokerProcess]) -> None:
    """A message answered E_PUB_FAILED never reaches consumers (the publisher will retry it):
    durable queues deliver a put only after its commit (docs/guarantees.md, defect 6)."""
    oks, delivered = fill_read_and_recover(small_disk, make_broker)
    assert delivered == oks
