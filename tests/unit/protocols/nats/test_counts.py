"""Monitoring counts as nats-server keeps them: messages and payload bytes in per publisher,
out per receiver, and in total, whichever path (runs, line and head routes, the frame
scanner, the general path, headers, queue groups) delivered the messages."""

from __future__ import annotations

import random

import pytest

from mqhub.protocols.nats import codec, scan
from tests.unit.protocols.nats.helpers import Client, make_server

#: every test here runs with the scanner's C loop and with its fallback (conftest.py)
pytestmark = pytest.mark.usefixtures("scan_impl")


def _pubs(rnd: random.Random, n: int) -> tuple[bytes, int]:
    """``n`` PUB frames over a few subjects and sizes, runs of repeats among them; and their
    payload bytes."""
    frames = []
    total = 0
    while len(frames) < n:
        subject = rnd.choice([b"a.x", b"a.y", b"b", b"q.z"])
        size = rnd.choice([0, 3, 16, 700, 1500, rnd.randrange(4000)])
        repeat = rnd.choice([1, 1, 1, 12])
        for _ in range(repeat):
            frames.append(b"PUB %s %d\r\n%s\r\n" % (subject, size, b"p" * size))
            total += size
    return b"".join(frames), total


def test_counts_are_messages_and_payload_bytes_per_connection_and_in_total() -> None:
    """Every delivery path counts exactly what the receivers got; HPUB counts headers and
    payload; nothing is counted per wire byte."""
    saved, scan.SCAN_BYTES = scan.SCAN_BYTES, 0     # the scanner on every buffer
    try:
        srv = make_server()
        wild, plain, group = Client(srv), Client(srv), Client(srv)
        wild.send(b"SUB a.* 1\r\nSUB q.> 2\r\n")
        plain.send(b"SUB b 1\r\nSUB a.x 2\r\n")
        group.send(b"SUB q.z g 1\r\n")
        pub = Client(srv)
        rnd = random.Random(5)
        sent_msgs = sent_bytes = 0
        for _ in range(6):
            data, nbytes = _pubs(rnd, 300)
            pub.send(data)
            sent_msgs += data.count(b"PUB ")
            sent_bytes += nbytes
        hdr = b"NATS/1.0\r\nk: v\r\n\r\n"
        pub.send(b"HPUB a.y %d %d\r\n%shi\r\n" % (len(hdr), len(hdr) + 2, hdr))
        sent_msgs += 1
        sent_bytes += len(hdr) + 2
        srv.fold_counts()
        assert (pub.proto.in_msgs, pub.proto.in_bytes) == (sent_msgs, sent_bytes)
        total_msgs = total_bytes = 0
        for client in (wild, plain, group):
            got = [ev for ev in client.events() if ev[0] in (codec.OP_MSG, codec.OP_HMSG)]
            size = sum(len(ev[-1]) + (len(ev[4]) if ev[0] == codec.OP_HMSG else 0)
                       for ev in got)
            assert (client.proto.out_msgs, client.proto.out_bytes) == (len(got), size)
            total_msgs += len(got)
            total_bytes += size
        assert total_msgs > sent_msgs      # a.x went to two receivers
        stats = srv.stats
        assert (stats["in_msgs"], stats["in_bytes"]) == (sent_msgs, sent_bytes)
        assert (stats["out_msgs"], stats["out_bytes"]) == (total_msgs, total_bytes)
        # a SUB drops the route caches: what they counted is kept
        plain.send(b"SUB c 3\r\n")
        srv.fold_counts()
        assert (stats["out_msgs"], stats["out_bytes"]) == (total_msgs, total_bytes)
    finally:
        scan.SCAN_BYTES = saved
