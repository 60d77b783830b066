"""The flow journal across ``kill -9``: a real broker is killed mid-traffic, a torn record is
left at the journal's tail, and the restarted broker truncates it, keeps journaling, and every
journal record reads back (no crash, no corrupt record)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mqhub.protocols.nsq import codec as wire
from mqhub.store.journal import journal_files
from mqhub.store.segments import scan
from tests.interop.broker import BrokerProcess
from tests.interop.nsq_client import NsqSocket

pytestmark = pytest.mark.interop
pa = pytest.importorskip("pyarrow")
from mqhub.analytics.arrow import journal_file_batches  # noqa: E402


def _published_ids(journal: Path) -> list[int]:
    """msg ids of every ``published`` event in the journal files (all records must decode)."""
    ids: list[int] = []
    for path, length in journal_files(str(journal)):
        assert all(payload is not None for _, _, payload in scan(path)), f"bad record in {path}"
        for name, batch in journal_file_batches(path, length):
            if name == "events":
                ids += [r["msg_id"] for r in batch.to_pylist() if r["event"] == "published"]
    return ids


def _publish(broker: BrokerProcess, n: int) -> None:
    """MPUB ``n`` messages (in batches of 50) to topic t, each confirmed with OK."""
    p = NsqSocket(broker.port("nsq", "tcp"))
    try:
        for _ in range(n // 50):
            p.send(wire.encode_mpub("t", [b"x" * 30] * 50))
            p.read_until(lambda fs: wire.Response(b"OK") in fs, "MPUB OK", 10)
    finally:
        p.close()


def test_kill_9_and_torn_journal_tail(make_broker: Callable[..., BrokerProcess]) -> None:
    """Journal records confirmed before the kill survive it; a torn tail is cut on restart."""
    broker = make_broker(["nsq"])
    consumer = NsqSocket(broker.port("nsq", "tcp"))
    consumer.send(wire.encode_sub("t", "c") + wire.encode_rdy(1000))
    consumer.read_until(lambda fs: wire.Response(b"OK") in fs, "SUB OK", 10)
    _publish(broker, 500)
    consumer.close()
    journal = Path(broker.data_dir) / "store" / "journal"
    deadline = time.monotonic() + 10
    while len(_published_ids(journal)) < 500:  # chunks ride with a commit within ~1 s
        assert time.monotonic() < deadline, "the journal did not catch up"
        time.sleep(0.05)
    broker.kill()
    before = _published_ids(journal)
    assert len(before) == 500
    active = journal_files(str(journal))[-1][0]
    good = Path(active).stat().st_size
    with open(active, "ab") as f:
        f.write(b"\x00\x00\x10\x00\x12\x34\x56\x78\x00partial")  # a record cut mid-write
    broker.start()
    _publish(broker, 100)
    broker.stop()
    assert broker.returncode == 0
    after = _published_ids(journal)
    assert after[:500] == before and len(after) == 600
    assert Path(active).stat().st_size >= good
    assert b"partial" not in Path(active).read_bytes()


def test_every_confirmed_publish_is_journaled_across_kill_9(
        make_broker: Callable[..., BrokerProcess]) -> None:
    """A pipelined NSQ publisher (PUBs sent without waiting for their OKs) is cut by kill -9
    in mid-burst: every publish it saw confirmed has its ``published`` event in the journal the
    restarted broker keeps (the record is written with the commit that stores the message)."""
    broker = make_broker(["nsq"])
    port = broker.port("nsq", "tcp")
    channel = NsqSocket(port)
    channel.send(wire.encode_sub("t", "c"))  # the channel's queue holds what is published
    channel.read_until(lambda fs: wire.Response(b"OK") in fs, "SUB OK", 10)
    channel.close()
    publisher = NsqSocket(port)
    confirmed = 0
    chunk = wire.encode_pub("t", b"x" * 30) * 100
    codec = wire.ClientCodec()
    publisher.sock.settimeout(5)
    in_flight = 0
    while confirmed < 3000:  # keep up to 2,000 PUBs unconfirmed: commits carry many
        while in_flight < 2000:
            publisher.send(chunk)
            in_flight += 100
        codec.receive_data(publisher.sock.recv(1 << 16))
        oks = sum(f == wire.Response(b"OK") for f in codec.frames())
        confirmed += oks
        in_flight -= oks
    for _ in range(10):
        publisher.send(chunk)
    broker.kill()
    publisher.sock.settimeout(2)
    try:
        while data := publisher.sock.recv(1 << 16):
            codec.receive_data(data)
            confirmed += sum(f == wire.Response(b"OK") for f in codec.frames())
    except OSError:
        pass
    publisher.sock.close()
    broker.start()
    assert broker.stop() == 0
    journaled = _published_ids(Path(broker.data_dir) / "store" / "journal")
    assert len(set(journaled)) >= confirmed
