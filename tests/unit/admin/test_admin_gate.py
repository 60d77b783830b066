"""The admin listener under a users file: who may read, who may change, what is counted, and
the failed-login slowdown (DummyRequest through the real resource tree, Clock only)."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

from twisted.web.resource import getChildForRequest
from twisted.web.test.requesthelper import DummyRequest

from mqhub.introspect import Inspector
from mqhub.testing import memory_hub, settle
from mqhub.web.service import build_site
from tests.unit.identity.helpers import directory


def rig(tmp_path: Path, token: str | None = None) -> tuple[Any, Any]:
    """A memory hub with a users file and the admin Site (its gate at the root)."""
    hub = memory_hub()
    hub.identity = directory(tmp_path, hub.clock)
    return hub, build_site(Inspector(hub), token)


def call(site: Any, hub: Any, method: str, path: str, auth: str | None = None,
         body: Any = None, peer: str = "10.1.1.1", wait: float = 0.0) -> tuple[int, Any]:
    """(status, JSON or raw body) of one request through the whole tree."""
    req = DummyRequest([p.encode() for p in path.strip("/").split("/")])
    req.method = method.encode()
    req.path = path.encode()
    req.client = type("Addr", (), {"host": peer, "port": 1234})()
    req.getClientAddress = lambda: req.client  # type: ignore[method-assign]
    req.content = io.BytesIO(json.dumps(body or {}).encode())
    req.requestHeaders.setRawHeaders("content-type", ["application/json"])
    if auth:
        req.requestHeaders.setRawHeaders("authorization", [auth])
    req.render(getChildForRequest(site.resource, req))
    if wait:
        hub.clock.advance(wait)
    settle(hub, 3)
    data = b"".join(req.written)
    try:
        return req.responseCode or 200, json.loads(data)
    except ValueError:
        return req.responseCode or 200, data


def basic(user: str, password: str) -> str:
    """A Basic Authorization header."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_users_admins_and_strangers(tmp_path: Path) -> None:
    """healthz is open; reads need a user; changes and dead-letter bodies need an admin."""
    hub, site = rig(tmp_path)
    hub.broker.declare_queue("jobs")
    assert call(site, hub, "GET", "/healthz")[0] == 200
    status, _ = call(site, hub, "GET", "/api/stats")
    assert status == 401
    assert call(site, hub, "GET", "/metrics")[0] == 401
    status, stats = call(site, hub, "GET", "/api/stats", "Bearer alice-token")
    assert status == 200 and stats["auth"]["users"] == 2
    assert call(site, hub, "GET", "/api/dlq/jobs", "Bearer alice-token")[0] == 403
    assert call(site, hub, "POST", "/api/queues/jobs/pause", "Bearer alice-token")[0] == 403
    assert call(site, hub, "POST", "/api/queues/jobs/pause", basic("bob", "builder")) == (
        200, {"queue": "jobs", "paused": True})
    assert call(site, hub, "GET", "/api/dlq/jobs", basic("bob", "builder"))[0] == 200
    assert hub.identity.counters == {("admin", "admin"): 2}
    assert call(site, hub, "GET", "/api/stats", basic("bob", "wrong"))[0] == 401
    assert hub.identity.counters[("admin", "login")] == 1


def test_admin_token_is_an_admin_and_reload(tmp_path: Path) -> None:
    """--admin-token acts as an admin under a users file; POST /api/users/reload re-reads it."""
    hub, site = rig(tmp_path, token="tok")
    status, answer = call(site, hub, "POST", "/api/users/reload", "Bearer tok")
    assert status == 200 and answer["reloaded"] is True and answer["users"] == 2
    (tmp_path / "users.toml").write_text("not toml [")
    status, answer = call(site, hub, "POST", "/api/users/reload", "Bearer tok")
    assert status == 400 and "not reloaded" in answer["error"]
    assert hub.identity.by_token("alice-token") is not None


def test_a_guessing_peer_waits_for_its_turn(tmp_path: Path) -> None:
    """After the free failures a peer's request is answered only at its turn (even with the
    right password); another peer is answered at once."""
    hub, site = rig(tmp_path)
    for _ in range(3):
        assert call(site, hub, "GET", "/api/stats", basic("bob", "guess"))[0] == 401
    status, body = call(site, hub, "GET", "/api/stats", basic("bob", "builder"))
    assert (status, body) == (200, b"")           # nothing written yet: its turn has not come
    assert call(site, hub, "GET", "/api/stats", "Bearer alice-token", peer="10.9.9.9")[0] == 200
    status, stats = call(site, hub, "GET", "/api/stats", basic("bob", "builder"), wait=5.0)
    assert status == 200 and stats["auth"]["denied"] == {"admin": {"login": 3}}


def test_without_users_file_nothing_changes(tmp_path: Path) -> None:
    """No --users: the page and API are open as before; the token guards changes."""
    hub = memory_hub()
    site = build_site(Inspector(hub), "tok")
    hub.broker.declare_queue("jobs")
    assert call(site, hub, "GET", "/api/stats")[0] == 200
    assert call(site, hub, "POST", "/api/queues/jobs/pause")[0] == 401
    assert call(site, hub, "POST", "/api/queues/jobs/pause", "Bearer tok")[0] == 200
    assert call(site, hub, "POST", "/api/users/reload", "Bearer tok")[0] == 409


def test_manhole_keys_only_for_admins(tmp_path: Path) -> None:
    """With a users file the manhole's keys log in only as a user with admin = true."""
    from cryptography.hazmat.primitives.asymmetric import ec
    from twisted.conch.ssh import keys

    from mqhub.manhole import KeyList

    hub, _ = rig(tmp_path)
    key = keys.Key(ec.generate_private_key(ec.SECP256R1())).public()
    anyone = KeyList([key])
    admins = KeyList([key], hub.identity)
    assert anyone.getAuthorizedKeys(b"whoever") == [key]
    assert admins.getAuthorizedKeys(b"bob") == [key]            # admin = true
    assert admins.getAuthorizedKeys(b"alice") == []             # a user, not an admin
    assert admins.getAuthorizedKeys(b"whoever") == []
    assert hub.identity.counters[("manhole", "login")] == 2

