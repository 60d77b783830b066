"""`mqhub bench admin`: admin API latency over a hub with many queues (target: /api/queues < 100 ms).

Builds a hub in this process (MemoryStore, the real reactor), declares ``--queues`` queues
(default 100,000), each bound to its own address, and publishes one batch to every seventh so
depths differ; then serves the admin listener on a free 127.0.0.1 port and times real HTTP
requests from a client thread: the default page, sorted by depth descending, a substring filter,
a deep page, one queue's detail, /api/stats and /metrics (500-series cap). Each figure is the
median (and max) of ``--requests`` requests, printed as ``<figure> <value> <unit>`` lines.

    python benchmarks/admin_bench.py [--queues 100000] [--requests 20]
    mqhub bench admin
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import urllib.request
from collections.abc import Sequence
from typing import Any

try:
    from benchmarks import _common
except ImportError:  # run as a script: benchmarks/ is on sys.path
    import _common  # type: ignore[no-redef]


def queries(n: int) -> list[tuple[str, str]]:
    """The timed requests over a hub of ``n`` queues (a deep page near the end, the detail of a
    queue that holds messages)."""
    deep = max(0, n - 1000)
    detail = (n // 2) // 7 * 7
    return [
        ("queues_default", "/api/queues"),
        ("queues_sort_depth", "/api/queues?sort=-depth&limit=50"),
        ("queues_filter", "/api/queues?q=q0042&limit=50"),
        ("queues_deep_page", f"/api/queues?offset={deep}&limit=50&sort=name"),
        ("queue_detail", f"/api/queues/q{detail:07d}"),
        ("stats", "/api/stats"),
        ("metrics", "/metrics"),
    ]


def build(n: int, reactor: Any) -> Any:
    """A started memory hub with ``n`` queues (every 7th holding 3 messages)."""
    from mqhub.hub import build_hub

    hub = build_hub({"data-dir": None, "durability": "none"}, reactor, reactor=reactor)
    hub.store.open()
    hub.broker.start()
    broker = hub.broker
    for i in range(n):
        name = f"q{i:07d}"
        broker.declare_queue(name)
        broker.bind_queue(name, name)
        if i % 7 == 0:
            broker.publish_batch(name, [b"x", b"y", b"z"], origin="bench")
    return hub


def client(base: str, requests: int, paths: list[tuple[str, str]],
           results: dict[str, list[float]], done: threading.Event) -> None:
    """Time each of ``paths`` ``requests`` times (one warm-up request first)."""
    try:
        for name, path in paths:
            urllib.request.urlopen(base + path, timeout=30).read()
            times = []
            for _ in range(requests):
                start = time.perf_counter()
                body = urllib.request.urlopen(base + path, timeout=30).read()
                times.append(time.perf_counter() - start)
                assert body
            results[name] = times
    finally:
        done.set()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print one line per figure."""
    p = argparse.ArgumentParser(prog="mqhub bench admin", description=__doc__.split("\n")[0])
    p.add_argument("--queues", type=int, default=100_000, help="queues in the hub")
    p.add_argument("--requests", type=int, default=20, help="timed requests per query")
    args = _common.parse_args(p, argv, {"queues": 2000, "requests": 3})
    paths = queries(args.queues)

    from twisted.internet import reactor

    from mqhub.web.service import make_admin_service

    started = time.perf_counter()
    hub = build(args.queues, reactor)
    print(f"admin_setup_{args.queues}_queues {time.perf_counter() - started:.1f} s", flush=True)
    service = make_admin_service(hub, None, "tcp:0:interface=127.0.0.1")
    results: dict[str, list[float]] = {}
    done = threading.Event()

    def go(port: Any) -> None:
        """Listening: run the client in a thread, stop the reactor when it is done."""
        base = f"http://127.0.0.1:{port.getHost().port}"
        worker = threading.Thread(target=client, args=(base, args.requests, paths, results, done),
                                  daemon=True)
        worker.start()

        def check() -> None:
            """Stop once the client has finished."""
            if done.is_set():
                reactor.stop()
            else:
                reactor.callLater(0.05, check)

        check()

    reactor.callWhenRunning(service.startService)
    service.listening.addCallback(go)
    reactor.run()
    failed = False
    for name, _ in paths:
        times = results.get(name)
        if not times:
            print(f"admin_{name} missing", flush=True)
            failed = True
            continue
        median = statistics.median(times) * 1000
        print(f"admin_{name}_median {median:.1f} ms")
        print(f"admin_{name}_max {max(times) * 1000:.1f} ms")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
