"""Fast start: building a NATS-only hub imports nothing that protocol set does not use."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

#: modules a `twistd -n mqhub --protocols nats` start must not import (issue 28, fast start):
#: other protocols' and analytics' libraries, the admin web stack (built after the ports are
#: up), the manhole's SSH stack, cron parsing, and the NATS features that are off by default
NOT_AT_START = ("zmq", "txzmq", "pyspark", "pyarrow", "matplotlib", "numpy",
                "prometheus_client", "croniter", "twisted.conch", "twisted.web.server",
                "twisted.application.internet", "autobahn", "nkeys", "nacl", "mqhub.introspect",
                "mqhub.protocols.nats.monitor", "mqhub.protocols.nats.websocket")

SCRIPT = """
import json, sys
from twisted.internet import reactor
from mqhub.tap import Options, build_service
options = Options()
options.parseOptions(["--protocols", "nats", "--data-dir", sys.argv[1], *sys.argv[2:]])
build_service(options, reactor)
print(json.dumps(sorted(sys.modules)))
"""


@pytest.mark.parametrize("roles", [[], ["--listen", "nats.monitor=tcp:0:interface=127.0.0.1",
                                          "--listen", "nats.ws=tcp:0:interface=127.0.0.1"]],
                         ids=["defaults", "monitor_and_ws"])
def test_nats_only_start_imports_only_what_it_uses(tmp_path: Path, roles: list[str]) -> None:
    """Options + build_service for --protocols nats leave the heavy modules unimported, also
    with the monitoring and WebSocket listeners configured (they load once bound)."""
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "data"), *roles],
                         capture_output=True, text=True, timeout=60, check=True)
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert "mqhub.protocols.nats.server" in loaded          # the check can see imports
    found = sorted(m for m in loaded for bad in NOT_AT_START
                   if m == bad or m.startswith(bad + "."))
    assert not found, f"imported at start: {found}"
