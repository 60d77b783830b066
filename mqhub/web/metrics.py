"""Prometheus ``/metrics`` through prometheus_client: a collector over the hub's figures.

The hub's totals are kept incrementally by the core (``broker.counters``) and read only at
scrape time; per-queue depth is capped to the deepest queues (the rest summed into
``queue="_other"``) so a hub with 100,000 queues does not make a 100,000-series scrape.
A protocol's own totals (its service's ``counters()``: NATS ``slow_consumers``...) are
``mqhub_protocol_<name>_total{protocol=...}``.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterator
from operator import attrgetter
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from twisted.web.resource import Resource

from mqhub.introspect import Inspector, add_commit_observer

#: Default number of queues exported one by one in ``mqhub_queue_depth``.
DEFAULT_QUEUE_CAP = 500
#: Characters a metric name may not hold (a counter's name is mapped into one).
_UNSAFE = re.compile(r"[^a-zA-Z0-9_]")
#: Buckets (seconds) of the store commit histogram.
COMMIT_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                  0.25, 0.5, 1.0)


class HubCollector:
    """Collects mqhub's metrics from an :class:`Inspector` at scrape time."""

    def __init__(self, inspector: Inspector, queue_cap: int = DEFAULT_QUEUE_CAP) -> None:
        """:param queue_cap: queues exported one by one (the deepest)."""
        self.inspector = inspector
        self.queue_cap = queue_cap

    def collect(self) -> Iterator[Any]:
        """Yield every metric family."""
        ins = self.inspector
        totals = ins.totals()
        for field, doc in (("published", "Messages published, by protocol."),
                           ("delivered", "Messages delivered to consumers, by protocol."),
                           ("acked", "Messages acknowledged, by protocol.")):
            fam = CounterMetricFamily(f"mqhub_messages_{field}", doc, labels=["protocol"])
            for protocol, row in sorted(totals.items()):
                fam.add_metric([protocol], row[field])
            yield fam
        dead = CounterMetricFamily("mqhub_messages_dead_lettered",
                                   "Messages moved to dead letters, by reason.", labels=["reason"])
        for reason, n in sorted(ins.broker.counters.dead.items()):
            dead.add_metric([reason], n)
        yield dead
        yield from protocol_families(ins.protocol_counters())
        conns = GaugeMetricFamily("mqhub_connections", "Open client connections, by protocol.",
                                  labels=["protocol"])
        for protocol, n in sorted(ins.connection_counts().items()):
            conns.add_metric([protocol], n)
        yield conns
        queues = ins.broker.queues()
        yield GaugeMetricFamily("mqhub_queues", "Queues in the hub.", value=len(queues))
        depth = GaugeMetricFamily(
            "mqhub_queue_depth",
            f"Ready messages per queue (the {self.queue_cap} deepest; the rest as queue=\"_other\").",
            labels=["queue"])
        top = heapq.nlargest(self.queue_cap, queues, key=attrgetter("depth"))
        for q in top:
            depth.add_metric([q.name], q.depth)
        if len(queues) > len(top):
            shown = {id(q) for q in top}
            depth.add_metric(["_other"], sum(q.depth for q in queues if id(q) not in shown))
        yield depth
        yield GaugeMetricFamily("mqhub_messages_in_flight", "Messages delivered and not acked.",
                                value=sum(q.in_flight for q in queues))
        yield GaugeMetricFamily("mqhub_dead_letters", "Dead letters held, over every queue.",
                                value=sum(q.dead_letter_count for q in queues))
        identity = getattr(ins.hub, "identity", None)
        if identity is not None:
            denied = CounterMetricFamily(
                "mqhub_auth_denied", "Refused logins, publishes, subscriptions and admin "
                "requests, by protocol and action.", labels=["protocol", "action"])
            for (protocol, action), n in sorted(identity.counters.items()):
                denied.add_metric([protocol, action], n)
            yield denied
        yield GaugeMetricFamily("mqhub_uptime_seconds", "Seconds since the admin surface started.",
                                value=ins.now() - ins.started_at)
        store = ins.store_stats()
        if "used_bytes" in store:
            yield GaugeMetricFamily("mqhub_store_bytes", "Bytes used in the LMDB file.",
                                    value=store["used_bytes"])
        if "commits" in store:
            yield CounterMetricFamily("mqhub_store_commits", "Store group commits.",
                                      value=store["commits"])


def protocol_families(counters: dict[str, dict[str, int]]) -> Iterator[CounterMetricFamily]:
    """One ``mqhub_protocol_<name>_total`` counter family per name a protocol reports
    (``counters()`` of its service, e.g. ``mqhub_protocol_slow_consumers_total``), labelled by
    protocol."""
    families: dict[str, CounterMetricFamily] = {}
    for protocol, row in sorted(counters.items()):
        for name, n in sorted(row.items()):
            metric = "mqhub_protocol_" + _UNSAFE.sub("_", name)
            fam = families.get(metric)
            if fam is None:
                fam = families[metric] = CounterMetricFamily(
                    metric, f"The protocol's own {name} total (its service's counters()).",
                    labels=["protocol"])
            fam.add_metric([protocol], n)
    yield from families.values()


def build_registry(inspector: Inspector, queue_cap: int = DEFAULT_QUEUE_CAP) -> CollectorRegistry:
    """A registry (not the global one) with the hub's collector, the commit histogram and
    the process metrics; the store reports each commit's duration to the histogram (as one
    of its commit observers: :func:`mqhub.introspect.add_commit_observer`)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HubCollector(inspector, queue_cap))
    ProcessCollector(registry=registry)
    commit = Histogram("mqhub_store_commit_seconds", "Duration of store group commits.",
                       buckets=COMMIT_BUCKETS, registry=registry)
    add_commit_observer(inspector.hub.store, commit.observe)
    return registry


class MetricsResource(Resource):
    """``GET /metrics`` in the Prometheus text format."""

    isLeaf = True

    def __init__(self, registry: CollectorRegistry) -> None:
        """Serve ``registry``."""
        super().__init__()
        self.registry = registry

    def render_GET(self, request: Any) -> bytes:
        """The text exposition of every metric."""
        request.setHeader(b"content-type", CONTENT_TYPE_LATEST.encode())
        return generate_latest(self.registry)
