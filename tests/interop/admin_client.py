"""Helpers for the admin interop tests: JSON API calls against a running broker's admin.http."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from tests.interop.broker import BrokerProcess, wait_until


def admin_url(broker: BrokerProcess) -> str:
    """http://127.0.0.1:PORT of the broker's admin listener."""
    return f"http://127.0.0.1:{broker.port('admin', 'http')}"


def call(broker: BrokerProcess, path: str, method: str = "GET", body: Any = None,
         headers: dict[str, str] | None = None, raw: bytes | None = None) -> tuple[int, Any]:
    """(status, decoded JSON or text) of one admin request; a body is sent as JSON."""
    data = raw
    hdrs = dict(headers or {})
    if body is not None:
        data = json.dumps(body).encode()
        hdrs.setdefault("Content-Type", "application/json")
    req = urllib.request.Request(admin_url(broker) + path, data=data, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            status, text = resp.status, resp.read()
    except urllib.error.HTTPError as err:
        status, text = err.code, err.read()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text.decode("utf-8", "replace")


def get(broker: BrokerProcess, path: str) -> Any:
    """GET ``path`` and require 200; the decoded answer."""
    status, data = call(broker, path)
    assert status == 200, (path, status, data)
    return data


def wait_for(check: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    """Poll ``check()`` until it returns something truthy; fail naming ``what`` at the deadline."""
    return wait_until(check, what, timeout)


def queue_row(broker: BrokerProcess, name: str) -> dict[str, Any] | None:
    """The /api/queues row of ``name`` (None when absent)."""
    page = get(broker, "/api/queues?limit=1000&q=" + urllib.request.quote(name, safe=""))
    return next((r for r in page["queues"] if r["name"] == name), None)
