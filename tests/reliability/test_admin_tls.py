"""TLS on the admin listener: ``--listen admin.http=ssl:...`` with a certificate generated here.

The admin API answers over TLS (verified against the generated certificate), the admin token
still guards changes there, and the port does not answer plain HTTP.
"""

from __future__ import annotations

import json
import socket
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.interop.broker import HOST, BrokerProcess
from tests.interop.nsq_client import ok
from tests.interop.test_nats_auth_tls import self_signed

pytestmark = pytest.mark.interop


def https(port: int, path: str, ctx: ssl.SSLContext, method: str = "GET",
          body: object = None, token: str | None = None) -> tuple[int, object]:
    """``(status, parsed JSON)`` of one HTTPS request to the admin listener."""
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(f"https://localhost:{port}{path}", method=method,
                                     headers=headers,
                                     data=None if body is None else json.dumps(body).encode())
    try:
        with urllib.request.urlopen(request, timeout=10, context=ctx) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, None


def test_admin_listener_over_tls(make_broker: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    """healthz and the queue list over TLS; a change needs the token; plain HTTP gets nothing."""
    cert, key = self_signed(tmp_path)
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    broker = make_broker(["nsq"], start=False,
                         extra_args=["--durability", "none", "--admin-token", str(token)])
    port = broker.port("admin", "http")
    broker.endpoints[("admin", "http")] = (
        f"ssl:{port}:interface={HOST}:privateKey={key}:certKey={cert}")
    broker.start()
    ctx = ssl.create_default_context(cafile=str(cert))
    status, health = https(port, "/healthz", ctx)
    assert status == 200 and health["status"] == "ok"  # type: ignore[index]
    ok(broker, "/topic/create?topic=t")
    ok(broker, "/channel/create?topic=t&channel=c")
    status, queues = https(port, "/api/queues", ctx)
    assert status == 200 and queues["total"] == 1  # type: ignore[index]
    path = "/api/queues/nsq%2Ft%2Fc"
    assert https(port, path, ctx, "PATCH", {"max_attempts": 2}, token="wrong")[0] == 401
    status, detail = https(port, path, ctx, "PATCH", {"max_attempts": 2}, token="s3cret")
    assert status == 200 and detail["max_attempts"] == 2  # type: ignore[index]
    # an unverified certificate is refused by a verifying client (nothing served in clear)
    with pytest.raises(urllib.error.URLError):
        https(port, "/healthz", ssl.create_default_context())
    with socket.create_connection((HOST, port), timeout=5) as plain:
        plain.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        plain.settimeout(5)
        try:
            answer = plain.recv(4096)
        except (ConnectionResetError, TimeoutError):
            answer = b""
    assert not answer.startswith(b"HTTP/"), answer
