"""The Grafana dashboard in docs/grafana/ asks only for series a running broker exports.

A real broker (NSQ and mq9) gets traffic and a dead letter, then its /metrics is read; every
PromQL expression of the dashboard (panels and variables) must name only metrics that have
samples there, and group or select only by labels those metrics carry (or that Prometheus adds
to every scraped series: ``instance``, ``job``).
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mqhub.protocols.nsq import codec as wire
from tests.interop.admin_client import admin_url, call, wait_for
from tests.interop.nsq_client import NsqSocket, ok

pytestmark = pytest.mark.interop

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "mqhub-dashboard.json"
#: Metric names in the dashboard's PromQL (mqhub's own and prometheus_client's process ones).
METRIC = re.compile(r"\b((?:mqhub|process)_[a-zA-Z0-9_]+)")
#: Label names in ``by (...)`` clauses and in ``{name=...}`` selectors.
BY = re.compile(r"\bby\s*\(([^)]*)\)")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
#: Labels Prometheus adds to every series it scrapes.
TARGET_LABELS = {"instance", "job"}


def expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and query variable."""
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out.append((f"panel {panel['title']!r}", target["expr"]))
    for var in dashboard["templating"]["list"]:
        query = var.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        if var.get("type") == "query":
            out.append((f"variable {var['name']!r}", str(query)))
    return out


def scraped(text: str) -> dict[str, set[str]]:
    """Sample name -> label names seen on its samples, from a /metrics text."""
    samples: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, set()).update(sample.labels)
    return samples


def test_every_dashboard_query_uses_exported_metrics_and_labels(make_broker: Any) -> None:
    """Each metric name the dashboard's PromQL uses has samples on a live broker's /metrics."""
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["__inputs"][0]["pluginId"] == "prometheus"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))

    broker = make_broker(["nsq", "mq9"], extra_args=["--durability", "none"])
    ok(broker, "/topic/create?topic=orders")
    ok(broker, "/channel/create?topic=orders&channel=archive")
    ok(broker, "/mpub?topic=orders", b"a\nb")
    status, _ = call(broker, "/api/queues/nsq%2Forders%2Farchive", "PATCH", {"max_attempts": 1})
    assert status == 200
    consumer = NsqSocket(broker.port("nsq", "tcp"))
    consumer.send(wire.encode_sub("orders", "archive") + wire.encode_rdy(1))
    (msg,) = consumer.messages_until(1, "one order")
    consumer.send(wire.encode_rdy(0) + b"REQ " + msg.msg_id + b" 0\n")

    def metrics() -> dict[str, set[str]] | None:
        """The scraped samples once the dead letter shows."""
        with urllib.request.urlopen(admin_url(broker) + "/metrics", timeout=10) as resp:
            samples = scraped(resp.read().decode())
        return samples if "mqhub_messages_dead_lettered_total" in samples else None

    samples = wait_for(metrics, "the dead letter in /metrics")
    consumer.close()

    checked: set[str] = set()
    for where, expr in expressions(dashboard):
        names = set(METRIC.findall(expr))
        assert names, f"{where}: no mqhub_/process_ metric in {expr!r}"
        missing = sorted(n for n in names if n not in samples)
        assert not missing, f"{where}: {missing} not exported by the broker ({expr!r})"
        labels = set().union(*(samples[n] for n in names)) | TARGET_LABELS
        used = {x.strip() for m in BY.findall(expr) for x in m.split(",") if x.strip()}
        used |= set(MATCHER.findall(expr))
        assert used <= labels, f"{where}: labels {sorted(used - labels)} not on {sorted(names)}"
        checked |= names
    # the dashboard covers what the issue asks: rates, depths, dead letters, connections, commits
    for needed in ("mqhub_messages_published_total", "mqhub_messages_delivered_total",
                   "mqhub_queue_depth", "mqhub_dead_letters", "mqhub_messages_dead_lettered_total",
                   "mqhub_connections", "mqhub_store_commit_seconds_bucket"):
        assert needed in checked, needed
