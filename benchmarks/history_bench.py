"""`mqhub bench history`: what the admin history costs with many queues (issue 25's targets).

1. **Memory**: a hub with ``--queues`` (100,000) queues, every one holding a message and having
   taken a million (so every queue has a count in the scan, each its own int object: the worst
   case), ``--watched`` queues watched from the admin
   page and a moving set of busy queues (so the top queues churn). The History samples on a
   Clock for ``--minutes`` (≥ 2, so the 24h ring has series too); tracemalloc counts what lines
   of ``mqhub/history.py`` allocated and still hold.
2. **Cost of a sample**: the time of each sample in that hub (median, mean, max) and in a hub of 3
   queues (what ``mqhub bench nsq`` and ``nats`` run): the mean over the step is the share of
   one core the sampler takes.
3. **First paint with charts**: the same hub behind the admin listener on the real reactor, its
   10m ring filled with 600 real samples (time-shifted), then ``--loads`` page loads in headless
   Chromium: the page's ``mqhub-charts-drawn`` performance mark and first-contentful-paint, in
   ms after the navigation started.

    python benchmarks/history_bench.py [--queues 100000] [--loads 10] [--no-browser] [--quick]
    mqhub bench history
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
import urllib.request
from collections.abc import Sequence
from typing import Any

from twisted.internet.task import Clock

#: What a page load measured (ms after navigation start), once the charts are drawn.
PAGE_TIMINGS = """
const d = performance.getEntriesByName('mqhub-charts-drawn');
const f = performance.getEntriesByName('first-contentful-paint');
const h = performance.getEntriesByType('resource').filter((e) => e.name.includes('/api/history'));
const n = performance.getEntriesByType('navigation');
if (!d.length || !f.length || !h.length || !n.length) return null;
return {drawn: d[0].startTime, fcp: f[0].startTime, dcl: n[0].domContentLoadedEventEnd,
        history_start: h[0].startTime, history_end: h[0].responseEnd,
        bytes: h[0].encodedBodySize, points: window.mqhubCharts.depth.plot.data[0].length};
"""
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def build(n: int, clock: Any) -> Any:
    """``mqhub bench admin``'s hub of ``n`` queues (the real reactor, or a Clock), with a message
    in every queue (the worst case for the scan's per-queue counts)."""
    try:
        from benchmarks.admin_bench import build as admin_hub
    except ImportError:  # run as a script: benchmarks/ is on sys.path
        from admin_bench import build as admin_hub  # type: ignore[no-redef]

    hub = admin_hub(n, clock)
    for i in range(n):
        if i % 7:
            hub.broker.publish_batch(f"q{i:07d}", [b"x"], origin="bench")
    if isinstance(clock, Clock):
        clock.advance(0)
    return hub


def churn(hub: Any, n: int, second: int) -> None:
    """Publish to a moving set of 40 queues (so the busiest change every few seconds)."""
    for j in range(40):
        name = f"q{(second * 7 + j * 2503) % n:07d}"
        hub.broker.publish_batch(name, [b"y"] * (1 + j % 5), origin="nsq")


def memory_and_cost(args: argparse.Namespace) -> None:
    """Parts 1 and 2: history memory with many queues; the time of a sample."""
    from mqhub.history import History
    from mqhub.introspect import Inspector

    clock = Clock()
    clock.advance(1_800_000_000)
    started = time.perf_counter()
    hub = build(args.queues, clock)
    for i, q in enumerate(hub.broker.queues()):  # long-lived queues: counts past the small ints
        q.message_count += 1_000_000 + i
    print(f"history_setup_{args.queues}_queues {time.perf_counter() - started:.1f} s", flush=True)
    tracemalloc.start(1)
    history = History(Inspector(hub))
    for i in range(args.watched):
        history.watch(f"q{i * 997 % args.queues:07d}")
    samples = int(args.minutes * 60)
    timed_samples(hub, history, clock, args.queues, range(samples))
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(True, "*" + os.sep + "mqhub" + os.sep + "history.py")])
    held = sum(stat.size for stat in snapshot.statistics("filename"))
    tracemalloc.stop()
    print(f"history_memory_{args.queues}_queues {held / 1048576:.2f} MiB "
          f"(rings {history.nbytes() / 1048576:.2f} MiB, {len(history.fine.series)} fine and "
          f"{len(history.coarse.series)} coarse series, {len(history.tracked)} queues tracked)")
    # the sample's time without tracemalloc
    times = timed_samples(hub, history, clock, args.queues, range(samples, samples + 120))
    report_times(f"history_sample_{args.queues}_queues", times)
    small = build(3, clock)
    times = timed_samples(small, History(Inspector(small)), clock, 3, range(300))
    report_times("history_sample_3_queues", times)


def timed_samples(hub: Any, history: Any, clock: Clock, n: int, seconds: range) -> list[float]:
    """One sample a (Clock) second after some publishing (:func:`churn`); each one's time."""
    times = []
    for second in seconds:
        churn(hub, n, second)
        clock.advance(0)
        t = time.perf_counter()
        history.sample()
        times.append(time.perf_counter() - t)
        clock.advance(1)
    return times


def report_times(figure: str, times: list[float]) -> None:
    """Median, mean and max of a sample's time, and the share of a core at one sample a second."""
    print(f"{figure}_median {statistics.median(times) * 1e3:.3f} ms")
    print(f"{figure}_max {max(times) * 1e3:.3f} ms")
    print(f"{figure}_cpu_share {statistics.fmean(times) * 100:.3f} %", flush=True)


def first_paint(args: argparse.Namespace) -> int:
    """Part 3: page loads in headless Chromium against a hub with many queues."""
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        print("history_first_paint skipped: no chromium/chromedriver (make browser)")
        return 1
    from twisted.internet import reactor, threads

    from mqhub.gc_tuning import tune_gc
    from mqhub.web.service import make_admin_service

    hub = build(args.queues, reactor)
    service = make_admin_service(hub, None, "tcp:0:interface=127.0.0.1")
    history = service.history
    fake = Clock()
    fake.advance(time.time() - 600)
    history.clock = fake
    for second in range(600):
        churn(hub, args.queues, second)
        history.sample()
        fake.advance(1)
    history.clock = reactor
    # a settled broker: twistd's collector settings, and the hub built so far moved out of the
    # collector's sight (else the first full collection of ~10 M fresh objects lands in a load)
    tune_gc()
    gc.collect()
    gc.freeze()
    results: dict[str, list[float]] = {}

    def browse(base: str) -> None:
        """Load the page ``--loads`` times; record the marks."""
        # the hub's setup commits are pending until the reactor runs: wait for them (a
        # broker that recovered is past this) before the first, cold-cache, page load
        urllib.request.urlopen(base + "/healthz", timeout=300).read()
        os.environ.setdefault("SE_OFFLINE", "true")
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                     "--window-size=1280,1200", "--disable-background-networking"):
            options.add_argument(flag)
        profile = tempfile.mkdtemp(prefix="mqhub-bench-chromium-")
        options.add_argument(f"--user-data-dir={profile}")
        driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
        try:
            for _ in range(args.loads):
                # start from a quiet broker: the previous page's table requests (/api/stats,
                # /api/addresses... over every queue) must not be served during this load
                driver.get("about:blank")
                time.sleep(1.0)
                driver.get(base + "/")
                deadline = time.monotonic() + 30
                marks: dict[str, float] | None = None
                while time.monotonic() < deadline and not marks:
                    marks = driver.execute_script(PAGE_TIMINGS)
                    time.sleep(0.05)
                if marks:
                    for key, value in marks.items():
                        results.setdefault(key, []).append(value)
        finally:
            driver.quit()

    def go(port: Any) -> Any:
        """Listening: browse in a thread, then stop the reactor."""
        d = threads.deferToThread(browse, f"http://127.0.0.1:{port.getHost().port}")
        return d.addBoth(lambda _: reactor.stop())

    reactor.callWhenRunning(service.startService)
    service.listening.addCallback(go)
    reactor.run()
    if not results.get("drawn"):
        print("history_first_paint missing")
        return 1
    drawn = results["drawn"]
    print("history_first_load " + ", ".join(f"{k} {v[0]:.0f}" for k, v in results.items()))
    print(f"history_charts_drawn_median {statistics.median(drawn):.0f} ms (max {max(drawn):.0f}, "
          f"{len(drawn)} loads, {results['points'][-1]:.0f} points per series, "
          f"/api/history {results['bytes'][-1] / 1024:.0f} KiB)")
    for key in ("fcp", "dcl", "history_start", "history_end"):
        print(f"history_page_{key}_median {statistics.median(results[key]):.0f} ms")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print one line per figure."""
    p = argparse.ArgumentParser(prog="mqhub bench history", description=__doc__.split("\n")[0])
    p.add_argument("--queues", type=int, default=100_000, help="queues in the hub")
    p.add_argument("--watched", type=int, default=10, help="queues watched from the page")
    p.add_argument("--minutes", type=float, default=2.5, help="minutes sampled (memory part)")
    p.add_argument("--loads", type=int, default=10, help="page loads in Chromium")
    p.add_argument("--no-browser", action="store_true", help="skip the first-paint part")
    p.add_argument("--only-browser", action="store_true", help="only the first-paint part")
    p.add_argument("--quick", action="store_true",
                   help="2,000 queues, one page load: shows the benchmark works; figures mean nothing")
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.quick:
        args.queues, args.minutes, args.loads = min(args.queues, 2000), 2.05, 1
    if not args.only_browser:
        memory_and_cost(args)
    if args.no_browser:
        return 0
    return first_paint(args)


if __name__ == "__main__":
    raise SystemExit(main())
