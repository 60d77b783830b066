"""The admin page's history charts end to end in Debian's headless Chromium.

Known NSQ traffic goes in; /api/history accounts for every message; each chart is drawn (its
canvas holds pixels of its series' colour) and plots exactly /api/history's values at the same
timestamps; the charts move on while traffic flows; a queue's detail chart shows its depth rise
as messages arrive and fall as a consumer FINs them. Screenshots are saved (docs/images/ with
MQHUB_UPDATE_SCREENSHOT=1).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.interop.admin_client import admin_url, get, wait_for
from tests.interop.nsq_client import NsqSocket, ok
from tests.interop.test_admin_page import (  # noqa: F401 - browser is a fixture
    browser,
    click_row,
    orders_and_payments,
)

pytestmark = pytest.mark.interop

IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
QUEUE = "nsq/orders/archive"
CHARTS = ("rates", "depth", "in_flight", "dead", "connections", "system")


def charts(driver: Any) -> dict[str, Any]:
    """Every drawn chart as {name: {t, keys, values}} read from the page in one step."""
    return dict(driver.execute_script("""
        const out = {};
        for (const [name, c] of Object.entries(window.mqhubCharts || {}))
          out[name] = {t: Array.from(c.plot.data[0]), keys: c.keys,
                       values: c.plot.data.slice(1).map((v) => Array.from(v))};
        return out;"""))


def raised_pixels(driver: Any, name: str, key: list[str]) -> int:
    """Pixels of chart ``name``'s canvas in the colour of series ``key`` that lie above its
    zero line (so only a non-zero stretch of that series can have drawn them)."""
    return int(driver.execute_script("""
        const c = window.mqhubCharts[arguments[0]];
        const i = c.keys.findIndex((k) => JSON.stringify(k) === JSON.stringify(arguments[1]));
        const hex = c.colours[i];
        const [r, g, b] = [1, 3, 5].map((j) => parseInt(hex.slice(j, j + 2), 16));
        const scale = c.plot.series[i + 1].scale;
        const zero = Math.floor(c.plot.valToPos(0, scale, true)) - 3;
        const canvas = c.plot.ctx.canvas;
        const px = canvas.getContext('2d').getImageData(0, 0, canvas.width, zero).data;
        let n = 0;
        for (let p = 0; p < px.length; p += 4)
          if (px[p + 3] > 200 && Math.abs(px[p] - r) + Math.abs(px[p + 1] - g) + Math.abs(px[p + 2] - b) < 40) n++;
        return n;""", name, key))


def plotted_matches_api(chart: dict[str, Any], doc: dict[str, Any]) -> None:
    """Assert the chart plots every point /api/history has for its series (the page read the
    history after ``doc`` was read, so it holds each of ``doc``'s times) with the same value."""
    plotted_at = {t: i for i, t in enumerate(chart["t"])}
    assert all(t in plotted_at for t in doc["t"]), (chart["t"], doc["t"])
    compared = 0
    for key, values in zip(chart["keys"], chart["values"], strict=True):
        family, label = key
        api = doc["series"].get(family, {}).get(label)
        if api is not None:  # else a series that appeared after ``doc`` was read
            assert [values[plotted_at[t]] for t in doc["t"]] == api, (family, label)
            compared += 1
    assert compared, chart["keys"]


def published_since(doc: dict[str, Any], protocol: str, since: float) -> float:
    """Messages the rate series of ``protocol`` accounts for after time ``since``."""
    t, rates = doc["t"], doc["series"]["published"].get(protocol, [])
    return sum((rates[i] or 0) * (t[i] - t[i - 1]) for i in range(1, len(t)) if t[i - 1] >= since)


def newest_sample(broker: Any) -> float:
    """The time of the history's newest sample."""
    return float(get(broker, "/api/history?series=process")["t"][-1])


def test_history_charts_match_the_api_update_and_follow_a_queue(make_broker: Any, browser: Any,  # noqa: F811
                                                                tmp_path: Path) -> None:
    """Issue 25's Done-when scenario in Chromium."""
    broker = orders_and_payments(make_broker)
    browser.get(admin_url(broker) + "/")
    wait_for(lambda: set(CHARTS) <= set(charts(browser)), "every chart drawn")
    paint = browser.execute_script(
        "return performance.getEntriesByName('mqhub-charts-drawn').map((e) => e.startTime);")
    assert len(paint) == 1  # the page marks its first drawing of the charts

    # known traffic: 20 MPUBs of 25 messages (and 5 of 2), spread over 5 samples
    since = newest_sample(broker)
    for i in range(20):
        ok(broker, "/mpub?topic=orders", b"\n".join(b"order-%d" % (i * 25 + j) for j in range(25)))
        if i % 4 == 3:
            ok(broker, "/mpub?topic=payments", b"p1\np2")
            seen = newest_sample(broker)
            wait_for(lambda seen=seen: newest_sample(broker) > seen, "the next sample")
    wait_for(lambda: abs(published_since(get(broker, "/api/history?series=published"), "nsq",
                                         since) - 510) < 1,
             "the history to account for every published message", timeout=15)
    doc = get(broker, "/api/history")
    wait_for(lambda: charts(browser)["rates"]["t"][-1] >= doc["t"][-1],
             "the page to show the API's newest sample")
    drawn = charts(browser)
    for name in CHARTS:
        plotted_matches_api(drawn[name], doc)
    rates = drawn["rates"]
    nsq_in = rates["values"][rates["keys"].index(["published", "nsq"])]
    assert max(v or 0 for v in nsq_in) > 0
    depth = drawn["depth"]
    assert ["queue_depth", QUEUE] in depth["keys"]
    assert depth["values"][depth["keys"].index(["queue_depth", QUEUE])][-1] == 500
    assert raised_pixels(browser, "rates", ["published", "nsq"]) > 30  # NSQ's line is drawn
    assert raised_pixels(browser, "depth", ["queue_depth", QUEUE]) > 30
    assert raised_pixels(browser, "system", ["process", "rss_bytes"]) > 30

    # the charts move on while traffic flows
    last = drawn["rates"]["t"][-1]
    for _ in range(3):
        ok(broker, "/mpub?topic=payments", b"p\np\np")
    wait_for(lambda: charts(browser)["rates"]["t"][-1] >= last + 2, "the charts to update")

    # a queue's detail chart: depth rising, then falling as a consumer FINs everything
    wait_for(lambda: click_row(browser, QUEUE), "a click on the queue row")
    wait_for(lambda: "queue" in charts(browser), "the queue's chart")
    for _ in range(3):
        ok(broker, "/mpub?topic=orders", b"\n".join(b"more-%d" % j for j in range(100)))
        first = charts(browser)["queue"]["t"][-1]
        wait_for(lambda first=first: charts(browser)["queue"]["t"][-1] > first,
                 "a new point of the queue")
    consumer = NsqSocket(broker.port("nsq", "tcp"))
    consumer.consume("orders", "archive", lambda bodies: len(bodies) >= 800)

    def fell() -> Any:
        """The queue chart's depth once it has come back to 0 after its peak."""
        chart = charts(browser)["queue"]
        d = [v for v in chart["values"][chart["keys"].index(["depth"])] if v is not None]
        return d if d and d[-1] == 0 else None

    depth_seen = wait_for(fell, "the queue's depth back to 0 on its chart")
    peak = depth_seen.index(max(depth_seen))
    assert max(depth_seen) == 800 and depth_seen[0] < 800
    assert depth_seen[:peak + 1] == sorted(depth_seen[:peak + 1])  # rose
    assert depth_seen[peak:] == sorted(depth_seen[peak:], reverse=True)  # fell
    detail = get(broker, "/api/queues/nsq%2Forders%2Farchive")["history"]
    chart = charts(browser)["queue"]
    plotted = dict(zip(chart["t"], chart["values"][chart["keys"].index(["depth"])], strict=True))
    assert all(plotted[t] == v for t, v in zip(detail["t"], detail["depth"], strict=True)
               if t in plotted)
    assert raised_pixels(browser, "queue", ["depth"]) > 30
    consumer.close()

    browser.execute_script("window.scrollTo(0, 0)")
    overview = tmp_path / "admin-history.png"
    assert browser.save_screenshot(str(overview)) and overview.stat().st_size > 20_000
    browser.execute_script("document.getElementById('queue-detail').scrollIntoView();"
                           "window.scrollBy(0, -60)")
    queue_view = tmp_path / "admin-queue-history.png"
    assert browser.save_screenshot(str(queue_view)) and queue_view.stat().st_size > 20_000
    if os.environ.get("MQHUB_UPDATE_SCREENSHOT"):
        shutil.copyfile(overview, IMAGES / "admin-history.png")
        shutil.copyfile(queue_view, IMAGES / "admin-queue-history.png")
