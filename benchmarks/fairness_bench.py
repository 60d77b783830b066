"""Fairness under sustained publishing: does a durable consumer keep receiving while a producer MPUBs?

The scenario of issue 10: one NSQ producer publishes MPUB x200 (16 B bodies) for ``--duration``
seconds to a topic whose one channel has one consumer at RDY 100 that FINs every message. The
backlog soon outgrows the queue's in-memory window, so the consumer is fed by paging while the
producer's batches are being committed. Before that runs, the same producer publishes alone (to
a topic without a consumer) for the same time: that is its rate "with no consumer".

Figures (``<figure> <value> <unit>``):

- ``producer_alone``: MPUB messages confirmed per second with no consumer;
- ``producer_with_consumer``: the same while the consumer runs;
- ``consumer_while_publishing``: messages the consumer received per second while the producer ran;
- ``consumer_after``: its rate once the producer stopped (draining the backlog);
- ``longest_gap_while_publishing``: the longest stretch without a delivery while the producer ran
  (and how many stretches reached 0.25 s, and the 99th percentile of the stretches between reads);
- ``target_*``: the issue's targets (gap < 0.25 s, consumer while publishing >= 50% of after,
  producer with the consumer >= 90% of alone), ``1`` when met.

    mqhub bench fairness [--duration 8] [--durability sync]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import tempfile
import uuid

try:
    from benchmarks import _common, nsq_bench
except ImportError:  # run as a script: benchmarks/ is on sys.path
    import _common  # type: ignore[no-redef]
    import nsq_bench  # type: ignore[no-redef]

HOST = _common.HOST


def publish_alone(host: str, port: int, duration: float) -> float:
    """The producer's MPUB rate on a topic nobody consumes (its messages are kept for a channel)."""
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    ready.set()
    total = ctx.Value("q", 0)
    p_recv, p_send = ctx.Pipe(False)
    topic = f"fair_alone_{uuid.uuid4().hex[:8]}"
    prod = ctx.Process(target=nsq_bench.producer,
                       args=(host, port, topic, "mpub", 16, duration, ready, total, p_send))
    prod.start()
    sent, start, end, _ = p_recv.recv()
    prod.join(10)
    return sent / (end - start)


def run(host: str, port: int, duration: float) -> dict[str, float]:
    """Producer and consumer on one topic; the figures of the module docstring."""
    topic = f"fair_{uuid.uuid4().hex[:8]}"
    (sent, start, end, _), arrivals = nsq_bench.run_pair(host, port, topic, "mpub", 16, duration,
                                                         rdy=100, arrivals=True)
    got = sum(n for _, n in arrivals)
    during = sum(n for t, n in arrivals if t <= end)
    after = got - during
    last = arrivals[-1][0] if arrivals else end
    gaps = []
    prev = start
    for t, _ in arrivals:
        if t > end:
            break
        gaps.append(t - prev)
        prev = t
    if prev < end:
        gaps.append(end - prev)
    gaps.sort()
    if got < sent:
        print(f"# the consumer got {got} of {sent} messages")
    return {"sent": sent, "producer_with_consumer": sent / (end - start),
            "consumer_while_publishing": during / (end - start),
            "consumer_after": after / (last - end) if last > end and after else 0.0,
            "longest_gap_while_publishing": gaps[-1] if gaps else duration,
            "gaps_over_0.25s": sum(1 for g in gaps if g >= 0.25),
            "gap_p99": gaps[int(len(gaps) * 0.99)] if gaps else duration}


def main(argv: list[str] | None = None) -> int:
    """Run both phases and print the figures and targets."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--duration", type=float, default=8.0, help="seconds of publishing")
    parser.add_argument("--durability", default="sync", choices=["sync", "batch", "none"])
    parser.add_argument("--address", help="HOST:PORT of a running nsqd-compatible server")
    args = _common.parse_args(parser, argv, {"duration": 0.5})
    proc = None
    tmp = None
    if args.address:
        host, _, port_text = args.address.rpartition(":")
        host, port = host or HOST, int(port_text)
    else:
        tmp = tempfile.mkdtemp(prefix="fairness-bench-")
        data_dir = os.path.join(tmp, "data")
        os.makedirs(data_dir)
        proc, port = nsq_bench.start_mqhub(data_dir, args.durability)
        host = HOST
    print(f"# fairness bench at {host}:{port}: MPUB x200 16 B for {args.duration:g} s, "
          f"one consumer at RDY 100, durability={args.durability}")
    try:
        alone = publish_alone(host, port, args.duration)
        fig = run(host, port, args.duration)
    finally:
        if proc is not None:
            _common.stop(proc)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"producer_alone {alone:.0f} msg/s")
    print(f"producer_with_consumer {fig['producer_with_consumer']:.0f} msg/s")
    print(f"consumer_while_publishing {fig['consumer_while_publishing']:.0f} msg/s")
    print(f"consumer_after {fig['consumer_after']:.0f} msg/s")
    print(f"longest_gap_while_publishing {fig['longest_gap_while_publishing']:.3f} s")
    print(f"gaps_over_0.25s_while_publishing {fig['gaps_over_0.25s']:.0f}")
    print(f"gap_p99_while_publishing {fig['gap_p99'] * 1000:.1f} ms")
    share = fig["consumer_while_publishing"] / max(1.0, fig["consumer_after"])
    print(f"target_gap_under_0.25s {int(fig['longest_gap_while_publishing'] < 0.25)}")
    print(f"target_consumer_share_50pct {int(share >= 0.5)} ({share:.2f})")
    ratio = fig["producer_with_consumer"] / max(1.0, alone)
    print(f"target_producer_90pct_of_alone {int(ratio >= 0.9)} ({ratio:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
