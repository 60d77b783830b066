"""VibeMQ end-to-end throughput: RoundRobin publish → deliver → ack, 127.0.0.1 only.

Target (issue 13): ≥ 50,000 msg/s with 1 KiB JSON payloads, uncompressed and
brotli-negotiated, durable (the default store mode, ``--durability sync``), one publisher and
one subscriber. Both clients are raw-socket processes on the project's codec that behave like
the .NET client (Connect then next frame, Ack by Deliver id). The publisher pre-encodes its
frames (compressed ones included, so its own CPU does not limit the figure) and keeps a window
of unacknowledged publishes; the subscriber acks every delivery, all acks of a read in one write.

Figures (``<figure> <value> <unit>``):

- ``<scenario>_publish``: PublishAcks per second at the publisher;
- ``<scenario>_e2e``: messages acked per second, from the publisher's first byte to the
  subscriber's last delivery.

    python benchmarks/vibemq_bench.py [--count 100000] [--scenarios plain,brotli]
    mqhub bench vibemq
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import socket
import struct
import sys
import tempfile
import time
import uuid
from typing import Any

from mqhub.protocols.vibemq import codec as c
from mqhub.protocols.vibemq.options import QueueOptions

try:
    from benchmarks import _common
except ImportError:  # run as a script: benchmarks/ is on sys.path
    import _common  # type: ignore[no-redef]

HOST = _common.HOST
_PREFIX = struct.Struct(">IB")
#: publishes in one write, and writes the publisher keeps unacknowledged
CHUNK = 500
WINDOW = 8


def _connect(port: int, compression: str | None) -> tuple[socket.socket, c.FrameDecoder, int]:
    """Connect, send Connect, read the next frame; return the socket, decoder and frame flag."""
    sock = _common.connect(port)
    headers = {"supported-compression": compression} if compression else None
    sock.sendall(c.encode(c.Frame(c.CONNECT, uuid.uuid4().hex, headers=headers)))
    dec = c.FrameDecoder()
    while True:
        frames = dec.feed(sock.recv(65536))
        if frames:
            ack = frames[0]
            assert isinstance(ack, c.Frame) and ack.type == c.CONNECT_ACK, ack
            chosen = (ack.headers or {}).get("negotiated-compression", "")
            return sock, dec, c.COMPRESSIONS.get(chosen, 0)


def payload(i: int) -> bytes:
    """A 1 KiB JSON document (varied text, so compression does some real work)."""
    doc = {"orderId": i, "customer": f"customer-{i % 977}", "items": [
        {"sku": f"SKU-{(i * 7 + k) % 10007}", "qty": k + 1, "price": 9.99 + k} for k in range(12)]}
    raw = json.dumps(doc, separators=(",", ":"))
    return json.dumps({**doc, "note": "x" * max(0, 1024 - len(raw) - 10)},
                      separators=(",", ":")).encode()


_ACK_HEAD = struct.pack(">IB", 2 + 2 + 16 + 2 + 4 + 2, 0) + bytes((1, c.ACK)) + b"\x00\x10"
_ACK_TAIL = b"\x00\x00\x00\x00\x00\x00\x00\x00"


def scan_deliveries(buf: bytes) -> tuple[bytes, list[bytes]]:
    """Ack frames for the complete Deliver frames in ``buf``, and the unread rest.

    A light scanner (like the NSQ benchmark's): it reads the 16-character Deliver id in place
    and only decompresses compressed frames, so the load generator's CPU stays small.
    """
    acks = []
    pos = 0
    n = len(buf)
    unpack = _PREFIX.unpack_from
    while n - pos >= 5:
        length, flags = unpack(buf, pos)
        end = pos + 5 + length
        if end > n:
            break
        body = buf[pos + 5:end] if not flags else c.FrameDecoder().decompress(
            buf[pos + 5:end], flags)
        if body[1] == c.DELIVER:
            acks.append(_ACK_HEAD + body[4:20] + _ACK_TAIL)
        elif body[1] == c.ERROR:
            raise RuntimeError(f"server error: {c.decode_body(body)}")
        pos = end
    return buf[pos:], acks


def subscriber(port: int, queue: str, compression: str | None, count: int, ready: Any,
               out: Any) -> None:
    """Subscribe, ack every delivery (one write per read) until ``count`` arrived."""
    sock, dec, flag = _connect(port, compression)
    # maxQueueSize 0 = unbounded: the default (10,000, DropOldest) would drop the oldest
    # messages whenever the publisher runs more than 10,000 ahead of the subscriber
    options = QueueOptions(max_queue_size=0).to_json()
    sock.sendall(c.encode(c.Frame(c.CREATE_QUEUE, uuid.uuid4().hex, queue, options))
                 + c.encode(c.Frame(c.SUBSCRIBE, uuid.uuid4().hex, queue)))
    got = 0
    acked = False
    while not acked:
        for f in dec.feed(sock.recv(65536)):
            acked = acked or (isinstance(f, c.Frame) and f.type == c.SUBSCRIBE_ACK)
    ready.set()
    last = time.perf_counter()
    sock.settimeout(30)
    buf = b""
    while got < count:
        try:
            data = sock.recv(1 << 20)
        except TimeoutError:
            break
        if not data:
            break
        buf, acks = scan_deliveries(buf + data if buf else data)
        if acks:
            got += len(acks)
            last = time.perf_counter()
            sock.sendall(b"".join(acks))
    out.send((got, last, time.process_time()))
    sock.close()


def publisher(port: int, queue: str, compression: str | None, count: int, ready: Any,
              out: Any) -> None:
    """Publish ``count`` pre-encoded messages with a window of unacknowledged chunks."""
    sock, dec, flag = _connect(port, compression)
    body = [payload(i) for i in range(1000)]
    chunks = []
    for start in range(0, count, CHUNK):
        chunks.append(b"".join(
            c.encode(c.Frame(c.PUBLISH, f"{i:032x}", queue, body[i % 1000]), flag)
            for i in range(start, min(count, start + CHUNK))))
    ready.wait(30)
    sent = acks = 0
    t0 = time.perf_counter()
    k = 0
    buf = b""
    unpack = _PREFIX.unpack_from
    while acks < count:
        if k < len(chunks) and sent - acks < WINDOW * CHUNK:
            sock.sendall(chunks[k])
            sent += min(CHUNK, count - k * CHUNK)
            k += 1
            continue
        data = sock.recv(1 << 20)
        if not data:
            raise RuntimeError("server closed the publisher connection")
        buf = buf + data if buf else data
        pos, n = 0, len(buf)
        while n - pos >= 7:  # PublishAcks are never compressed: read the type in place
            length, _ = unpack(buf, pos)
            end = pos + 5 + length
            if end > n:
                break
            if buf[pos + 6] == c.PUBLISH_ACK:
                acks += 1
            elif buf[pos + 6] == c.ERROR:
                raise RuntimeError(f"server error: {c.decode_body(buf[pos + 5:end])}")
            pos = end
        buf = buf[pos:]
    out.send((acks, t0, time.perf_counter(), time.process_time()))
    sock.close()


def run_scenario(port: int, compression: str | None, count: int,
                 server_pid: int | None) -> tuple[float, float]:
    """One publisher/subscriber pair; returns (publish rate, end-to-end rate) in msg/s."""
    ctx = mp.get_context("fork")
    queue = f"bench.{compression or 'plain'}.{uuid.uuid4().hex[:8]}"
    ready = ctx.Event()
    s_recv, s_send = ctx.Pipe(False)
    p_recv, p_send = ctx.Pipe(False)
    sub = ctx.Process(target=subscriber, args=(port, queue, compression, count, ready, s_send))
    pub = ctx.Process(target=publisher, args=(port, queue, compression, count, ready, p_send))
    cpu0 = _common.server_cpu(server_pid)
    sub.start()
    pub.start()
    acks, t0, t1, pub_cpu = p_recv.recv()
    got, last, sub_cpu = s_recv.recv()
    pub.join()
    sub.join()
    cpu = _common.server_cpu(server_pid) - cpu0
    if got < count:
        raise RuntimeError(f"only {got} of {count} delivered")
    print(f"# {compression or 'plain'}: server {cpu / count * 1e6:.1f} us/msg, publisher "
          f"{pub_cpu / count * 1e6:.1f}, subscriber {sub_cpu / count * 1e6:.1f} (CPU)",
          flush=True)
    return acks / (t1 - t0), got / (last - t0)


def main(argv: list[str] | None = None) -> int:
    """Start a durable mqhub, run the scenarios, print the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=100_000, help="messages per scenario")
    ap.add_argument("--scenarios", default="plain,brotli", help="plain, brotli, gzip")
    ap.add_argument("--durability", default="sync", help="sync (default), batch or none")
    ap.add_argument("--address", default="", help="HOST:PORT of a running server instead")
    args = _common.parse_args(ap, argv, {"count": 1000, "scenarios": "plain,brotli"})
    tmp = tempfile.mkdtemp(prefix="vibemq-bench-")
    proc = None
    try:
        if args.address:
            port = int(args.address.rpartition(":")[2])
        else:
            port = _common.free_port()
            proc = _common.start_mqhub(
                "vibemq", [f"vibemq.tcp=tcp:{port}:interface={HOST}"], os.path.join(tmp, "data"),
                args.durability, os.path.join(tmp, "mqhub.log"), wait_for=port)
            print(f"# durability {args.durability}; fsync {_common.fsync_ms(tmp):.2f} ms median; "
                  f"{os.cpu_count()} CPUs (shared)", flush=True)
        for name in args.scenarios.split(","):
            comp = None if name == "plain" else name
            pub_rate, e2e = run_scenario(port, comp, args.count, proc.pid if proc else None)
            print(f"roundrobin_1k_{name}_publish {pub_rate:.0f} msg/s", flush=True)
            print(f"roundrobin_1k_{name}_e2e {e2e:.0f} msg/s", flush=True)
    finally:
        if proc is not None:
            _common.stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
