"""Segment files on their own: framing, CRC, brotli, scanning, rollover and rollback."""

from __future__ import annotations

import os
from typing import Any

import pytest

from mqhub.store.segments import (
    HEAD_SIZE,
    CorruptRecord,
    SegmentLog,
    frame,
    list_segments,
    scan,
    unframe,
)


def test_frame_round_trip_and_crc() -> None:
    """A framed record unframes to its payload; any flipped byte or cut is detected."""
    payload = os.urandom(300)
    rec = frame(payload)
    assert len(rec) == HEAD_SIZE + 300 and unframe(rec) == payload
    for i in (0, 4, 8, HEAD_SIZE, len(rec) - 1):
        bad = bytearray(rec)
        bad[i] ^= 0x01
        with pytest.raises(CorruptRecord):
            unframe(bytes(bad))
    with pytest.raises(CorruptRecord):
        unframe(rec[:-1])


def test_brotli_only_when_it_helps() -> None:
    """Compressible payloads are stored brotli-compressed; random ones stay raw."""
    text = b"the same words again and again " * 100
    packed = frame(text, compress=True)
    assert len(packed) < len(text) // 4 and unframe(packed) == text
    noise = os.urandom(500)
    assert len(frame(noise, compress=True)) == HEAD_SIZE + 500


def test_append_read_rollover_and_rollback(tmp_path: Any) -> None:
    """Appends roll over at max_size; rollback removes appends (and files) after a mark."""
    log = SegmentLog(str(tmp_path), max_size=1000, compress=True)
    assert log.open() is None
    payloads = [os.urandom(400) for _ in range(4)]
    refs = [log.append(p) for p in payloads]
    assert [r[0] for r in refs] == [1, 1, 2, 2]
    assert [log.read(*r) for r in refs] == payloads
    assert log.read(*log.append(b"z" * 400)) == b"z" * 400  # compressed record
    mark = log.mark()
    log.append(os.urandom(900))
    log.append(os.urandom(900))
    assert log.active > mark[0]
    log.rollback(mark)
    assert log.mark() == mark and list_segments(str(tmp_path))[-1] == mark[0]
    assert os.path.getsize(log.path(mark[0])) == mark[1]
    log.close()


def test_scan_stops_at_a_torn_record(tmp_path: Any) -> None:
    """scan yields whole records and marks the first torn one."""
    path = str(tmp_path / "seg-0000000001.seg")
    with open(path, "wb") as f:
        f.write(frame(b"a" * 10) + frame(b"b" * 10) + frame(b"c" * 10)[:-3])
    got = list(scan(path))
    assert [p for _, _, p in got] == [b"a" * 10, b"b" * 10, None]
    assert got[2][0] == 2 * (HEAD_SIZE + 10)


def test_open_cuts_an_uncommitted_tail(tmp_path: Any) -> None:
    """Bytes past the committed length are cut on open; a short file reports damage."""
    d = str(tmp_path)
    log = SegmentLog(d)
    log.open()
    a = log.append(b"a" * 50)
    log.append(b"b" * 50)
    log.close()
    log = SegmentLog(d)
    assert log.open(committed_end=a[2]) is None
    assert os.path.getsize(log.path(1)) == a[2] and log.truncated_bytes == HEAD_SIZE + 50
    log.close()
    log = SegmentLog(d)
    assert log.open(committed_end=a[2] + 10) == a[2]  # committed bytes are missing
    log.close()
