"""The admin history's rings and sampler on Twisted's Clock (memory hub, no network)."""

from __future__ import annotations

import math
from typing import Any

from mqhub.history import FAMILIES, OTHER, History, Timeline
from mqhub.introspect import Inspector
from mqhub.testing import CollectingTarget, memory_hub, settle
from mqhub.web.api import ApiResource
from tests.unit.admin.test_api_resource import request


def hub_with_queues(n: int) -> Any:
    """A memory hub with memory-tier queues q000..q{n-1}, each bound to its own address."""
    hub = memory_hub()
    for i in range(n):
        name = f"q{i:03d}"
        hub.broker.declare_queue(name, tier="memory")
        hub.broker.bind_queue(name, name)
    return hub


def tick(hub: Any, history: History, seconds: float = 1.0) -> None:
    """Let the hub's commits land, then move the clock one step (the sampler runs)."""
    settle(hub)
    hub.clock.advance(seconds)


def take(hub: Any, q: Any, ready: int) -> tuple[Any, list[int]]:
    """Attach an NSQ consumer with ``ready`` credit to ``q``: (consumer, ids delivered)."""
    target = CollectingTarget(protocol_name="nsq")
    consumer = q.attach(target, ready=ready)
    settle(hub)
    return consumer, [e[0] for e in target.entries]


def series(history: History, family: str, label: str, window: str = "10m") -> list[Any]:
    """One series of the history's API document."""
    return history.read(window, [family])["series"][family].get(label, [])


def test_timeline_rolls_over_oldest_first_and_forgets_stale_series() -> None:
    """A ring of 4 keeps the newest 4 points in time order; a late series is None before its
    first point; a series unwritten for a whole ring is dropped."""
    line = Timeline(4)
    for i in range(6):
        sample = {("a", "x"): float(i)}
        if i >= 4:
            sample[("b", "y")] = 10.0 * i
        line.append(100.0 + i, sample)
    times, values = line.read([("a", "x"), ("b", "y")])
    assert times == [102.0, 103.0, 104.0, 105.0]
    assert values[("a", "x")] == [2.0, 3.0, 4.0, 5.0]
    assert values[("b", "y")] == [None, None, 40.0, 50.0]
    assert line.mean_of_last(2) == {("a", "x"): 4.5, ("b", "y"): 45.0}
    for i in range(6, 10):
        line.append(100.0 + i, {("b", "y"): 1.0})
    line.forget_stale()
    assert ("a", "x") not in line.series and ("b", "y") in line.series
    assert line.nbytes() == 2 * 4 * 8  # one series and the time axis, 4 points each


def test_rates_roll_over_from_seconds_to_minutes_on_the_clock() -> None:
    """10 NSQ messages a second: the 10m ring shows 10 msg/s per step, the 24h ring one point a
    minute holding that minute's mean; the fine ring keeps only its newest points."""
    hub = hub_with_queues(1)
    start = hub.clock.seconds()
    assert start % 60 == 0
    history = History(Inspector(hub), fine_points=90)
    history.start()
    for second in range(150):
        hub.broker.publish_batch("q000", [b"m"] * (20 if second >= 120 else 10), origin="nsq")
        tick(hub, history)
    fine = history.read("10m", ["published"])
    assert len(fine["t"]) == 90 and fine["step"] == 1.0
    assert fine["t"] == sorted(fine["t"]) and fine["t"][-1] == hub.clock.seconds()
    rates = fine["series"]["published"]["nsq"]
    assert rates[:58] == [10.0] * 58 and rates[-30:] == [20.0] * 30
    coarse = history.read("24h", ["published"])
    assert coarse["step"] == 60.0
    # two minutes are complete (the first sample, before any publish, has no NSQ series)
    assert coarse["t"] == [start, start + 60.0]
    assert coarse["series"]["published"]["nsq"] == [10.0, 10.0]
    history.stop()
    assert not [c for c in hub.clock.getDelayedCalls() if "History" in repr(c)]


def test_top_queues_keep_their_own_series_and_the_rest_are_summed() -> None:
    """With top=4: the two busiest and the two deepest queues have series; ``_other`` holds the
    sum of every other queue, and the totals add up to every queue."""
    hub = hub_with_queues(30)
    history = History(Inspector(hub), top=4)
    history.start()
    broker = hub.broker
    for _ in range(3):
        for i in range(30):
            broker.publish_batch(f"q{i:03d}", [b"m"] * (1 + (i == 7) * 50 + (i == 8) * 40),
                                 origin="nsq")
        broker.publish_batch("q020", [b"d"] * 300, origin="nsq")
        broker.publish_batch("q021", [b"d"] * 200, origin="nsq")
        tick(hub, history)
    doc = history.read("10m", ["queue_depth", "queue_rate", "totals"])["series"]
    assert set(doc["queue_depth"]) == {"q007", "q008", "q020", "q021", OTHER}
    total_depth = sum(q.depth for q in broker.queues())
    assert doc["totals"]["depth"][-1] == total_depth
    assert doc["queue_depth"][OTHER][-1] == total_depth - sum(
        broker.queue(n).depth for n in ("q007", "q008", "q020", "q021"))
    assert doc["queue_rate"]["q020"][-1] == 301.0
    assert doc["queue_rate"][OTHER][-1] == 26.0  # 26 untracked queues, 1 msg/s each
    assert doc["totals"]["queues"][-1] == 30.0


def test_memory_is_bounded_whatever_the_number_of_queues() -> None:
    """The rings hold the same number of series with 40 or 400 busy queues, and a queue that
    drops out of the top loses its series (its figures join ``_other``)."""
    sizes = []
    for n in (40, 400):
        hub = hub_with_queues(n)
        history = History(Inspector(hub), top=6, scan_slice=50)
        history.start()
        for second in range(30):
            for i in range(n):
                busy = (i + second) % n < 10  # the busiest ten move along every second
                hub.broker.publish_batch(f"q{i:03d}", [b"m"] * (5 if busy else 1), origin="nsq")
            tick(hub, history)
        queue_series = [k for k in history.fine.series if k[0].startswith("queue_")]
        assert len(queue_series) <= 4 * (6 + 1)
        assert len(history.tracked) <= 6
        sizes.append(history.nbytes())
    assert sizes[0] == sizes[1]


def test_scan_is_spread_over_steps_and_tracked_queues_are_read_every_step() -> None:
    """With 35 queues read 10 a step, ``_other`` first appears after the fourth step; the
    tracked queue's depth is current at every step."""
    hub = hub_with_queues(35)
    history = History(Inspector(hub), top=2, scan_slice=10)
    history.start()
    for _ in range(3):
        assert ("queue_depth", OTHER) not in history.fine.series
        hub.broker.publish_batch("q034", [b"m"] * 5, origin="nsq")
        tick(hub, history)
    assert history.fine.series[("queue_depth", OTHER)][3] == 0.0
    assert history.tracked == {"q034"}
    hub.broker.publish_batch("q034", [b"m"] * 5, origin="nsq")
    tick(hub, history)
    assert series(history, "queue_depth", "q034")[-1] == 20.0


def test_a_watched_queue_shows_its_depth_rise_and_fall() -> None:
    """An idle queue among busy ones is tracked once its detail is read (``watch``): its own
    series shows the depth rising as messages arrive and falling as a consumer acks them."""
    hub = hub_with_queues(12)
    history = History(Inspector(hub), top=2)
    history.start()
    for i in range(4):
        hub.broker.publish_batch(f"q{i:03d}", [b"m"] * 100, origin="nsq")
    tick(hub, history)
    assert "q011" not in history.tracked
    history.watch("q011")
    q = hub.broker.queue("q011")
    for _ in range(3):
        hub.broker.publish_batch("q011", [b"w"] * 4, origin="nsq")
        tick(hub, history)
    consumer, ids = take(hub, q, 100)
    q.ack(consumer, ids)
    tick(hub, history)
    tick(hub, history)
    doc = history.queue_history("q011")
    assert doc["tracked"] is True
    depth = [d for d in doc["depth"] if d is not None]
    assert depth == [4.0, 8.0, 12.0, 0.0, 0.0]
    assert len(doc["t"]) == len(doc["depth"]) == len(doc["in_flight"]) == len(doc["rate"])
    assert max(r for r in doc["rate"] if r is not None) == 4.0


def test_process_memory_commit_latency_and_dead_letters() -> None:
    """Memory from the injected reader; commit mean and max per step from the store's commit
    observer; dead letters per second by reason."""
    hub = hub_with_queues(1)
    history = History(Inspector(hub), memory=lambda: 123456.0)
    history.start()
    history.observe_commit(0.002)
    history.observe_commit(0.004)
    q = hub.broker.declare_queue("jobs", tier="memory", max_attempts=1)
    hub.broker.bind_queue("jobs", "jobs")
    hub.broker.publish_batch("jobs", [b"a", b"b"], origin="nsq")
    tick(hub, history)
    consumer, ids = take(hub, q, 2)
    q.requeue(consumer, ids)
    tick(hub, history)
    doc = history.read("10m", ["process", "store", "dead_lettered", "totals"])["series"]
    assert doc["process"]["rss_bytes"] == [123456.0] * 3
    assert doc["store"]["commit_ms_mean"][1] == 3.0 and doc["store"]["commit_ms_max"][1] == 4.0
    assert doc["dead_lettered"]["max_attempts"][-1] == 2.0
    assert doc["totals"]["dead_letters"][-1] == 2.0


def test_history_api_and_queue_detail() -> None:
    """GET /api/history answers the asked families for a window; bad windows and families
    are 400; a queue's detail carries its own series."""
    hub = hub_with_queues(3)
    history = History(Inspector(hub))
    api = ApiResource(Inspector(hub))
    api.history = history
    history.start()
    for _ in range(3):
        hub.broker.publish_batch("q001", [b"m"] * 3, origin="nsq")
        tick(hub, history)
    status, doc = request(api, hub, "GET", "/api/history?series=published,queue_depth:q001")
    assert status == 200
    assert set(doc["series"]) == {"published", "queue_depth"}
    assert doc["series"]["queue_depth"] == {"q001": [None, 3.0, 6.0, 9.0]}
    assert doc["series"]["published"]["nsq"] == [None, 3.0, 3.0, 3.0]
    assert len(doc["t"]) == 4
    status, doc = request(api, hub, "GET", "/api/history")
    assert set(doc["series"]) == set(FAMILIES)
    assert request(api, hub, "GET", "/api/history?window=1y")[0] == 400
    assert request(api, hub, "GET", "/api/history?series=colour")[0] == 400
    status, detail = request(api, hub, "GET", "/api/queues/q001")
    assert detail["history"]["depth"][-1] == 9.0 and detail["history"]["tracked"] is True
    assert not any(math.isnan(v) for v in detail["history"]["t"])
