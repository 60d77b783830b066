"""What per-address rights cost the hot paths: the broker's own CPU per message, rights off
against rights on, in one process (``mqhub bench security``).

Each scenario runs the real server code over StringTransports on a task.Clock and a MemoryStore
(no sockets, no disk, no client processes), so the figure is the server's own CPU per message
and the A/B is not blurred by load generators or by whatever else shares the cores:

- ``nats_16b``: 16 B PUBs on one subject, one subscriber, pipelined in 64 KiB reads (after one
  read that is not timed: a new subject's first read takes the slow way either way);
- ``nsq_pub_16b`` / ``nsq_mpub_16b``: NSQ PUBs (500 per read) and MPUBs (200 bodies), each read
  answered with its OKs, to a topic with one channel whose consumer FINs every message.

"off" has no users file (``hub.identity`` not enforcing: nothing is checked); "on" has one and
the clients act as a user whose grants are patterns (``bench.>``, ``*`` — never the plain ``>``
that would skip the checks). Rounds alternate off/on; each figure is the median of the rounds,
with ``<scenario>_rights_cost`` the difference in percent.

    python benchmarks/security_bench.py [--rounds 7] [--messages 200000]
    mqhub bench security
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from mqhub.identity import Directory
from mqhub.protocols.nats.server import NatsServer, NatsSettings
from mqhub.protocols.nsq import codec as wire
from mqhub.protocols.nsq.config import NsqConfig
from mqhub.protocols.nsq.service import NsqService
from mqhub.store.memory import MemoryStore
from mqhub.testing import connect, memory_hub, start_clock

try:
    from benchmarks import _common
except ImportError:  # run as a script: benchmarks/ is on sys.path
    import _common  # type: ignore[no-redef]

CHUNK = 64 * 1024


def _hub(rights: bool, tmp: str) -> Any:
    """A memory hub (grouped commits on its Clock), with the bench users file when ``rights``."""
    clock = start_clock()
    store = MemoryStore(clock=clock)
    store.open()
    hub = memory_hub(clock, store=store)
    path = _common.users_file(tmp) if rights else None
    hub.identity = Directory(clock, path)
    hub.identity.load()
    return hub


def nats_16b(rights: bool, n: int, tmp: str) -> float:
    """Server CPU µs per 16 B message, publisher → one subscriber."""
    hub = _hub(rights, tmp)
    srv = NatsServer(hub, NatsSettings())
    auth = f',"auth_token":"{_common.BENCH_TOKEN}"' if rights else ""
    connect_line = ('CONNECT {"verbose":false,"pedantic":false,"protocol":1' + auth
                    + '}\r\n').encode()
    sub, sub_t = connect(srv, port=40001)
    pub, pub_t = connect(srv, port=40002)
    sub.dataReceived(connect_line + b"SUB bench.a 1\r\nPING\r\n")
    pub.dataReceived(connect_line + b"PING\r\n")
    frame = b"PUB bench.a 16\r\n" + b"x" * 16 + b"\r\n"
    per = CHUNK // len(frame)
    chunk = frame * per
    reads = max(1, n // per)
    pub.dataReceived(chunk)            # warm-up: the first read of a subject goes the slow way
    sub_t.clear()
    want = len(b"MSG bench.a 1 16\r\n" + b"x" * 16 + b"\r\n") * per
    start = time.process_time()
    for _ in range(reads):
        pub.dataReceived(chunk)
        got = len(sub_t.value())
        sub_t.clear()
        if got != want:
            raise RuntimeError(f"the subscriber got {got} bytes of {want}")
    return (time.process_time() - start) * 1e6 / (reads * per)


def _nsq(rights: bool, tmp: str) -> tuple[Any, Any, Any, Any, Any]:
    """An NSQ service, a consumer (SUB, RDY 2500) and a producer, both AUTHed when ``rights``."""
    hub = _hub(rights, tmp)
    service = NsqService(hub, {"tcp": "tcp:0", "http": ""}, NsqConfig(hostname="bench"), None)
    service.registry.load()
    hub.clock.advance(0)
    auth = wire.encode_auth(_common.BENCH_TOKEN.encode()) if rights else b""
    cons, cons_t = connect(service.factory, port=40001)
    cons.dataReceived(wire.MAGIC_V2 + auth + wire.encode_sub("bench", "ch")
                      + wire.encode_rdy(2500))
    prod, prod_t = connect(service.factory, port=40002)
    prod.dataReceived(wire.MAGIC_V2 + auth)
    hub.clock.advance(0)
    cons_t.clear()
    prod_t.clear()
    return hub, cons, cons_t, prod, prod_t


def _nsq_run(rights: bool, n: int, tmp: str, command: bytes, per_read: int,
             per_command: int) -> float:
    """Server CPU µs per message: ``per_read`` commands a read, OKs and FINs as they come."""
    hub, cons, cons_t, prod, prod_t = _nsq(rights, tmp)
    chunk = command * per_read
    reads = max(1, n // (per_read * per_command))
    decoder = wire.ClientCodec()
    spent = 0.0                        # the server's calls only (not the bench's decoding)
    delivered = 0
    oks = 0
    for _ in range(reads):
        start = time.process_time()
        prod.dataReceived(chunk)
        hub.clock.advance(0)           # the group commit: OKs go out, messages are delivered
        spent += time.process_time() - start
        oks += prod_t.value().count(wire.OK_FRAME)
        prod_t.clear()
        decoder.receive_data(cons_t.value())
        cons_t.clear()
        fins = [wire.encode_fin(f.msg_id) for f in decoder.frames()
                if isinstance(f, wire.Message)]
        delivered += len(fins)
        if fins:
            start = time.process_time()
            cons.dataReceived(b"".join(fins))
            spent += time.process_time() - start
    total = reads * per_read * per_command
    if oks != reads * per_read or delivered < total - 2500:
        raise RuntimeError(f"{oks} OKs, {delivered} of {total} messages delivered")
    return spent * 1e6 / total


def nsq_pub_16b(rights: bool, n: int, tmp: str) -> float:
    """Server CPU µs per 16 B PUB."""
    return _nsq_run(rights, n, tmp, wire.encode_pub("bench", b"x" * 16), 500, 1)


def nsq_mpub_16b(rights: bool, n: int, tmp: str) -> float:
    """Server CPU µs per message of 16 B MPUBs of 200."""
    return _nsq_run(rights, n, tmp, wire.encode_mpub("bench", [b"x" * 16] * 200), 5, 200)


SCENARIOS: dict[str, Callable[[bool, int, str], float]] = {
    "nats_16b": nats_16b, "nsq_pub_16b": nsq_pub_16b, "nsq_mpub_16b": nsq_mpub_16b}


def main(argv: list[str] | None = None) -> int:
    """Alternate off/on rounds per scenario; print medians and the cost of rights."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7, help="off/on pairs per scenario")
    ap.add_argument("--messages", type=int, default=200_000, help="messages per run")
    ap.add_argument("--only", default="", help="run only scenarios whose name contains this")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="security-bench-") as tmp:
        for name, run in SCENARIOS.items():
            if args.only not in name:
                continue
            got: dict[bool, list[float]] = {False: [], True: []}
            for rnd in range(args.rounds):
                for rights in ((False, True) if rnd % 2 == 0 else (True, False)):
                    where = os.path.join(tmp, f"{name}{rnd}{int(rights)}")
                    os.makedirs(where)
                    got[rights].append(run(rights, args.messages, where))
            off, on = statistics.median(got[False]), statistics.median(got[True])
            print(f"{name}_off {off:.3f} us/msg (server CPU, median of {args.rounds})")
            print(f"{name}_on {on:.3f} us/msg")
            print(f"{name}_rights_cost {100 * (on / off - 1):+.1f} %", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
