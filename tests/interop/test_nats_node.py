"""The npm `nats` client (run by node) against a real mqhub broker."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

from tests.interop.broker import BrokerProcess
from tests.interop.conftest import NODE_DIR


def test_npm_nats_client(make_broker: Callable[..., BrokerProcess]) -> None:
    """The npm nats client: headers, wildcards, queue request/reply, 503 and mq9."""
    broker = make_broker(["nats"])
    proc = subprocess.run(["node", str(NODE_DIR / "nats_client.js"), str(broker.port("mq9"))],
                          cwd=NODE_DIR, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["headers"] is True and out["server_version"].count(".") == 2
    assert out["pubsub"] == [{"subject": "js.a", "data": "one", "h": "42"},
                             {"subject": "js.b", "data": "two", "h": None}]
    assert out["reply"] == "re:hi"
    assert out["no_responders"] == "503"
    assert out["mailbox"] == ["u", "n"]
    assert out["query_unread"] == 0
