"""`mqhub bench counters`: CPU cost per message of the hot paths the admin counters touch.

Two in-process loops, each timed with ``time.process_time`` (CPU of this process only, so other
load on the machine matters less) and reported as the best of ``--reps`` runs:

- ``nats_route_pubs``: the NATS router's fast path delivering 20,000 ``PUB foo 16`` lines
  to one subscriber (counted per read through ``last_sent``);
- ``core_publish_deliver_ack``: ``publish_batch`` of 300 memory-tier messages, their delivery
  to one consumer and one ``ack`` of all 300 ids, 300 times (counters bumped once per batch).

Compare two checkouts by running it under each (``PYTHONPATH=/path/to/other/checkout``),
alternating; benchmarks/results/README.md has the A/B against the tree before the counters.

    python benchmarks/counters_bench.py [--reps 15]
    mqhub bench counters
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

try:
    from benchmarks import _common
except ImportError:  # run as a script: benchmarks/ is on sys.path
    import _common  # type: ignore[no-redef]


def nats_route_pubs(reps: int) -> float:
    """Best ns per PUB of ``PubRouter.route_pubs`` over 20,000 one-target PUBs."""
    from mqhub.protocols.nats.codec import NatsParser
    from mqhub.protocols.nats.router import PubRouter

    line = b"PUB foo 16\r\n"
    buf = (line + b"x" * 16 + b"\r\n") * 20_000
    best = float("inf")
    for _ in range(reps):
        parser = NatsParser()
        out: list[bytes] = []
        # a line route as NatsServer builds it: (targets, special, size, [MSG copies counted])
        routes = {line[:-1]: ([(object(), out, b"MSG foo 1 16\r\n")], None, 16, [0])}
        parser.receive_data(buf)
        started = time.process_time()
        n = PubRouter(parser).route_pubs(routes, [])
        elapsed = time.process_time() - started
        assert n == 20_000, n
        best = min(best, elapsed / n)
    return best * 1e9


def core_publish_deliver_ack(reps: int) -> float:
    """Best ns per message of publish_batch(300) + delivery + ack on a memory queue."""
    from mqhub.testing import memory_hub

    class Target:
        """Keeps the last delivered batch."""

        protocol_name = "nsq"
        got: list[Any] = []

        def deliver_batch(self, consumer: Any, name: str, entries: list[Any]) -> None:
            """Remember the batch."""
            self.got = entries

    best = float("inf")
    for _ in range(reps):
        hub = memory_hub()
        broker = hub.broker
        queue = broker.declare_queue("q", tier="memory")
        broker.bind_queue("q", "q")
        target = Target()
        consumer = queue.attach(target, ready=300)
        bodies = [b"x" * 16] * 300
        started = time.process_time()
        for _ in range(300):
            broker.publish_batch("q", bodies, origin="nsq")
            queue.ack(consumer, [e[0] for e in target.got])
        elapsed = time.process_time() - started
        best = min(best, elapsed / 90_000)
    return best * 1e9


def main(argv: Sequence[str] | None = None) -> int:
    """Print ``<figure> <value> ns/msg`` lines."""
    p = argparse.ArgumentParser(prog="mqhub bench counters", description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=15, help="runs per figure (the best is kept)")
    args = _common.parse_args(p, argv, {"reps": 1})
    print(f"nats_route_pubs {nats_route_pubs(args.reps):.1f} ns/msg", flush=True)
    print(f"core_publish_deliver_ack {core_publish_deliver_ack(args.reps):.1f} ns/msg", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
