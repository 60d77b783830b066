"""NATS over WebSocket: nats.py's WebSocket transport and, in headless Chromium, nats.ws."""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
import trustme
from nats.errors import Error as NatsError

from tests.interop.broker import BrokerProcess, free_port, port_accepts, wait_until
from tests.interop.conftest import NODE_DIR
from tests.interop.test_admin_page import browser  # noqa: F401  (the Chromium fixture)
from tests.interop.test_nats_auth_tls import echo_roundtrip
from tests.interop.test_nats_monitor import get
from tests.interop.test_nats_py import run

PAGE = Path(__file__).with_name("nats_ws_page.html")


def ws_broker(make_broker: Callable[..., BrokerProcess], *options: str,
              scheme_port: int | None = None) -> tuple[BrokerProcess, int, int]:
    """A NATS broker with a WebSocket listener and monitoring: (broker, ws port, http port)."""
    ws, http = scheme_port or free_port(), free_port()
    args = ["--listen", f"nats.ws=tcp:{ws}:interface=127.0.0.1",
            "--listen", f"nats.monitor=tcp:{http}:interface=127.0.0.1"]
    for option in options:
        args += ["--option", option]
    broker = make_broker(["nats"], extra_args=args)
    wait_until(lambda: port_accepts(ws) and port_accepts(http), "the ws and monitor ports")
    return broker, ws, http


def test_nats_py_over_websocket_with_token(make_broker: Callable[..., BrokerProcess]) -> None:
    """nats.py's ws:// transport: same auth as TCP, messages cross between TCP and ws clients,
    /connz shows the connection as type websocket."""
    broker, ws, http = ws_broker(make_broker, "nats.token=s3cret")

    async def main() -> None:
        nc = await nats.connect(f"ws://127.0.0.1:{ws}", token="s3cret")
        assert await echo_roundtrip(nc) == b"hello"
        tcp = await nats.connect(f"nats://127.0.0.1:{broker.port('mq9')}", token="s3cret")
        sub = await nc.subscribe("cross")
        await nc.flush()
        await tcp.publish("cross", b"from tcp")
        assert (await sub.next_msg(timeout=5)).data == b"from tcp"
        types = sorted(c["type"] for c in get(http, "/connz")[1]["connections"])
        assert types == ["nats", "websocket"]
        assert get(http, "/varz")[1]["websocket"]["port"] == ws
        await tcp.close()
        await nc.close()
        with pytest.raises(NatsError, match="Authorization Violation"):
            await nats.connect(f"ws://127.0.0.1:{ws}", token="wrong", allow_reconnect=False,
                               max_reconnect_attempts=0)
    run(main())


def test_nats_py_over_secure_websocket(make_broker: Callable[..., BrokerProcess],
                                       tmp_path: Path) -> None:
    """wss:// with the ws_tls_cert/ws_tls_key options."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    _, ws, _ = ws_broker(make_broker, f"nats.ws_tls_cert={cert_file}",
                         f"nats.ws_tls_key={key_file}")

    async def main() -> None:
        ctx = ssl.create_default_context()
        ca.configure_trust(ctx)
        nc = await nats.connect(f"wss://127.0.0.1:{ws}", tls=ctx)
        assert await echo_roundtrip(nc) == b"hello"
        await nc.close()
    run(main())


@pytest.fixture
def page_server(tmp_path: Path) -> Iterator[int]:
    """An HTTP server for the test page and the nats.ws bundle (ES modules need http://)."""
    root = tmp_path / "page"
    root.mkdir()
    shutil.copy(PAGE, root / "index.html")
    bundle = NODE_DIR / "node_modules" / "nats.ws" / "esm" / "nats.js"
    assert bundle.exists(), "npm nats.ws missing: `make node` installs tests/interop/node"
    shutil.copy(bundle, root / "nats.js")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(httpd.server_address[1])
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_nats_ws_in_headless_chromium(make_broker: Callable[..., BrokerProcess],
                                      browser: Any, page_server: int) -> None:  # noqa: F811
    """The npm nats.ws client in a page: headers, wildcard, request/reply, token auth."""
    _, ws, _ = ws_broker(make_broker, "nats.token=s3cret")
    browser.get(f"http://127.0.0.1:{page_server}/index.html?port={ws}&token=s3cret")

    def result() -> Any:
        text = browser.execute_script("return document.getElementById('result').textContent")
        return None if text == "running" else json.loads(text)

    found = wait_until(result, "the page's result", timeout=30)
    assert found == {"pubsub": [{"subject": "browser.a", "data": "one", "h": "42"},
                                {"subject": "browser.b", "data": "two", "h": None}],
                     "reply": "re:hi", "server": "mqhub"}, found
