"""Inspector views, /metrics collection and manhole configuration checks (no network)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from twisted.application.service import MultiService

from mqhub.introspect import SAFE_SETTINGS, Inspector
from mqhub.listener import ListenerService
from mqhub.manhole import ManholeError, check_config, endpoint_is_loopback
from mqhub.testing import memory_hub, property_examples, settle
from mqhub.web.metrics import build_registry


def filled_hub(n: int = 30) -> tuple[object, Inspector]:
    """A memory hub with queues q00..q{n-1}; queue i holds i % 7 messages."""
    hub = memory_hub()
    for i in range(n):
        name = f"q{i:02d}"
        hub.broker.declare_queue(name, tier="memory")
        hub.broker.bind_queue(name, name)
        if i % 7:
            hub.broker.publish_batch(name, [b"m"] * (i % 7), origin="nsq")
    settle(hub)
    return hub, Inspector(hub)


def test_queue_page_sorts_filters_and_paginates_like_a_full_sort() -> None:
    """Every sort key, both directions, pages that tile the whole list."""
    hub, ins = filled_hub()
    for sort in ("name", "depth", "-depth", "-name", "dead", "-messages"):
        seen = []
        for offset in range(0, 30, 8):
            page = ins.queue_page(offset, 8, sort)
            assert page["total"] == 30
            seen += page["queues"]
        key = sort.lstrip("-")
        field = {"messages": "messages", "dead": "dead"}.get(key, key)
        values = [r[field] for r in seen]
        assert values == sorted(values, reverse=sort.startswith("-"))
        assert sorted(r["name"] for r in seen) == [f"q{i:02d}" for i in range(30)]
    page = ins.queue_page(0, 50, "-depth", "q1")
    assert [r["name"] for r in page["queues"]][:2] == ["q13", "q12"]
    assert page["total"] == 10
    with pytest.raises(ValueError):
        ins.queue_page(0, 10, "colour")


def test_queue_detail_and_unknown_queue() -> None:
    """Detail has settings and bindings; an unknown queue is None."""
    _, ins = filled_hub(3)
    detail = ins.queue_detail("q02")
    assert detail is not None
    assert detail["depth"] == 2 and detail["bindings"] == ["q02"]
    assert detail["settings"]["max_attempts"] == 0
    assert ins.queue_detail("nope") is None


@pytest.mark.parametrize("body, error", [
    ({}, "JSON object"), ([], "JSON object"), ({"tier": "memory"}, "cannot be changed"),
    ({"max_attempts": "3"}, "number"), ({"max_attempts": -1}, "from 0"),
    ({"max_attempts": float("inf")}, "finite"), ({"ttl": float("nan")}, "finite"),
    ({"max_attempts": True}, "number"), ({"expire_to_dead_letters": 1}, "true or false"),
])
def test_settings_patch_is_validated(body: object, error: str) -> None:
    """Only safe settings of the right type pass."""
    with pytest.raises(ValueError, match=error):
        Inspector.check_settings(body)


def test_settings_patch_converts_types() -> None:
    """Numbers become the setting's type."""
    assert Inspector.check_settings({"max_attempts": 3.0, "ttl": 5}) == {"max_attempts": 3, "ttl": 5.0}


def test_health_reports_a_listener_that_is_not_listening() -> None:
    """A protocol listener that is not up makes the hub unhealthy, naming it."""
    hub, _ = filled_hub(1)
    root = MultiService()
    proto = MultiService()
    proto.setName("nsq")
    proto.setServiceParent(root)
    listener = ListenerService("tcp:0", object())
    listener.setName("nsq-tcp")
    listener.setServiceParent(proto)
    ok, details = Inspector(hub, root).health()
    assert not ok
    assert details["problems"] == ["listener nsq-tcp is not listening"]
    hub.store.close()
    ok, details = Inspector(hub, None).health()
    assert not ok and details["store_open"] is False


def test_metrics_parse_and_cap_queue_series() -> None:
    """The exposition parses; queue depth has the cap's series plus one summed "_other"."""
    hub, ins = filled_hub(30)
    text = generate_latest(build_registry(ins, queue_cap=5)).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    published = {s.labels["protocol"]: s.value for s in families["mqhub_messages_published"].samples
                 if s.name.endswith("_total")}
    assert published == {"nsq": sum(i % 7 for i in range(30))}
    depth = {s.labels["queue"]: s.value for s in families["mqhub_queue_depth"].samples}
    assert len(depth) == 6
    assert sum(depth.values()) == sum(i % 7 for i in range(30))
    assert sorted(v for k, v in depth.items() if k != "_other") == [5, 6, 6, 6, 6]
    assert "process_cpu_seconds" in families or "process_virtual_memory_bytes" in families


@pytest.mark.parametrize("endpoint, loopback", [
    ("tcp:8722:interface=127.0.0.1", True), ("tcp6:8722:interface=\\:\\:1", True),
    ("tcp6:8722:interface=\\:\\:", False), ("unix:/tmp/m.sock", True), ("tcp:8722", False),
    ("tcp:8722:interface=0.0.0.0", False), ("tcp:8722:interface=localhost", True),
])
def test_endpoint_is_loopback(endpoint: str, loopback: bool) -> None:
    """Only loopback interfaces and unix sockets count as local."""
    assert endpoint_is_loopback(endpoint) is loopback


def test_manhole_needs_keys_and_says_why(tmp_path: object) -> None:
    """No key file: refused, with the exposure named for a non-loopback endpoint."""
    with pytest.raises(ManholeError, match="not a loopback endpoint"):
        check_config("tcp:8722", None)
    with pytest.raises(ManholeError, match="key authentication only"):
        check_config("tcp:8722:interface=127.0.0.1", None)
    with pytest.raises(ManholeError, match="cannot read"):
        check_config("tcp:8722:interface=127.0.0.1", "/nonexistent/keys")


@settings(max_examples=property_examples(200), deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda kids: st.lists(kids, max_size=4)
                    | st.dictionaries(st.sampled_from(sorted(SAFE_SETTINGS) + ["x"]), kids, max_size=4),
                    max_leaves=10))
def test_untrusted_bodies_only_ever_raise_value_error(body: object) -> None:
    """Whatever JSON a client sends, settings and id parsing answer or raise ValueError (400)."""
    for parse in (Inspector.check_settings, Inspector.parse_ids):
        try:
            parse(body)
        except ValueError:
            pass


def test_emqp_peers_are_connections_and_workers_of_schedules() -> None:
    """An eMQP service's router peers appear in connections (and counts); its workers in
    /api/schedules' ``workers``."""
    from mqhub.protocols.emqp.service import EmqpService

    hub, _ = filled_hub(1)
    root = MultiService()
    emqp = EmqpService(hub, {}, {})  # not started: no sockets, the router is driven directly
    emqp.setServiceParent(root)
    v = b"eMQP/1.0"
    emqp.router.backend_received([[b"jm-1", b"", v, b"INFORM", b"i", b'[[10, "default"], '
                                   b'[0, "slow"]]', b"worker"],
                                  [b"jm-1", b"", v, b"READY", b"r1"]])
    emqp.router.frontend_received([[b"\x00\x01", b"", v, b"HEARTBEAT", b"h", b"0"]])
    ins = Inspector(hub, root)
    rows = ins.connections()
    assert [(r["protocol"], r["kind"], r["peer"], r["listener"]) for r in rows] == [
        ("emqp", "worker", "jm-1", "emqp-backend"), ("emqp", "client", "0x0001", "emqp-frontend")]
    assert rows[0]["queues"] == ["default", "slow"] and rows[0]["slots"] == 1
    assert ins.connection_counts() == {"emqp": 2}
    assert ins.schedules()["workers"] == [{"protocol": "emqp", "peer": "jm-1",
                                           "queues": ["default", "slow"], "slots": 1,
                                           "in_flight": 0, "last_seen": rows[0]["last_seen"]}]


class BrokenCounters(MultiService):
    """A protocol service whose ``counters()`` fails (a bug): only it is left out."""

    def counters(self) -> dict[str, int]:
        """Fail."""
        raise RuntimeError("counters bug")


def test_protocol_counters_in_stats_and_metrics() -> None:
    """A protocol service's ``counters()`` (eMQP: messages its router dropped, jobs the core
    refused) join its /api/stats row and /metrics as ``mqhub_protocol_<name>_total``; the
    core's own fields win over a counter of the same name; a failing service is left out."""
    from mqhub.protocols.emqp.service import EmqpService

    hub, _ = filled_hub(1)
    root = MultiService()
    emqp = EmqpService(hub, {}, {})  # not started: no sockets, the router is driven directly
    emqp.setServiceParent(root)
    broken = BrokenCounters()
    broken.setName("broken")
    broken.setServiceParent(root)
    v = b"eMQP/1.0"
    emqp.router.frontend_received([[b"\x00\x01", b"", v, b"BOGUS", b"m1"],
                                   [b"\x00\x01", b"", v, b"REQUEST", b"m2", b"default", b"",
                                    b"not a job"]])
    emqp.router.backend_received([[b"jm-9", b"", v, b"READY", b"r1"]])  # an unknown worker
    ins = Inspector(hub, root)
    counters = ins.protocol_counters()
    assert set(counters) == {"emqp"}
    assert counters["emqp"]["dropped"] == 3 and counters["emqp"]["refused"] == 0
    row = ins.stats()["protocols"]["emqp"]
    assert row["dropped"] == 3 and row["published"] == 0 and row["relayed"] == 0
    text = generate_latest(build_registry(ins)).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    dropped = families["mqhub_protocol_dropped"]
    assert dropped.type == "counter"
    assert [(s.name, s.labels, s.value) for s in dropped.samples
            if s.name.endswith("_total")] == [("mqhub_protocol_dropped_total",
                                                {"protocol": "emqp"}, 3.0)]


def test_several_commit_observers_share_the_store_hook(tmp_path) -> None:
    """/metrics' histogram and other observers all see each LMDB group commit; a failing
    observer neither stops the others nor fails the commit; removal stops the calls."""
    from mqhub.hub import Hub
    from mqhub.introspect import add_commit_observer, remove_commit_observer
    from tests.unit.store.test_journal import Rig

    rig = Rig(str(tmp_path / "s"))
    seen: dict[str, list[float]] = {"first": [], "second": []}
    rig.store.on_commit = seen["first"].append  # a hook set directly before is kept
    hub = Hub(clock=rig.clock, store=rig.store, broker=rig.broker)
    registry = build_registry(Inspector(hub))

    def broken(seconds: float) -> None:
        raise RuntimeError("observer bug")

    assert add_commit_observer(rig.store, broken)
    assert add_commit_observer(rig.store, seen["second"].append)
    rig.broker.declare_queue("q")
    rig.broker.bind_queue("a", "q")
    for _ in range(3):
        rig.broker.publish_batch("a", [b"m"], origin="nsq")
        rig.settle()
    assert rig.store.commits >= 3
    assert len(seen["first"]) == len(seen["second"]) == rig.store.commits
    count = registry.get_sample_value("mqhub_store_commit_seconds_count")
    assert count == rig.store.commits
    remove_commit_observer(rig.store, seen["second"].append)
    before = len(seen["second"])
    rig.broker.publish_batch("a", [b"m"], origin="nsq")
    rig.settle()
    assert len(seen["first"]) == rig.store.commits and len(seen["second"]) == before
    rig.close()
    assert not add_commit_observer(memory_hub().store, seen["first"].append)  # no commit hook


def test_cli_stats_shows_protocol_counters() -> None:
    """``mqhub stats`` adds a table of the protocols' own counters, a row per protocol that
    reports any; with none there is no such table."""
    from rich.console import Console

    from mqhub.cli_admin import stats_tables

    row = {"connections": 1, "published": 5, "published_rate": 0.0, "delivered": 5,
           "delivered_rate": 0.0, "acked": 0, "acked_rate": 0.0}
    stats = {"uptime": 3.0, "queues": 0, "depth": 0, "in_flight": 0, "dead_letters": 0,
             "store": {"kind": "memory"},
             "protocols": {"nsq": dict(row),
                           "mq9": {**row, "slow_consumers": 2, "bridge_refused": 1200}}}
    console = Console(record=True, width=200)
    for table in stats_tables(stats):
        console.print(table)
    text = console.export_text()
    assert "protocol counters" in text
    assert "slow_consumers 2 · bridge_refused 1,200" in text
    assert not any("nsq" in line and "·" in line for line in text.splitlines())
    stats["protocols"] = {"nsq": row}
    assert len(stats_tables(stats)) == 2
