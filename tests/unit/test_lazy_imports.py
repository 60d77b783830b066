"""Fast start: building and starting a NATS-only hub imports nothing that protocol set does not
use, up to the moment its ports listen."""

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
#: ... nor, until its ports listen, Twisted's endpoint parser (plain tcp: endpoints are bound
#: directly: mqhub.listener.listen; ~7 ms of a start. The TLS stack it would also pull in,
#: twisted.internet.ssl, pyOpenSSL and service_identity, comes with the reactor itself)
NOT_UNTIL_LISTENING = ("twisted.internet.endpoints", "twisted.protocols._sni")

#: ... nor, without a TLS option, pyOpenSSL and the X.509 stack (the reactor is imported
#: without them: mqhub.startup; 45-80 ms of a start)
NOT_WITHOUT_TLS = ("OpenSSL", "cryptography.x509", "service_identity", "twisted.internet.ssl")

SCRIPT = """
import json, os, sys
from mqhub.listener import ListenerService
from mqhub.tap import Options, build_service, makeService
options = Options()
options.parseOptions(["--protocols", "nats", "--data-dir", sys.argv[1], "--no-admin",
                      "--listen", "nats.tcp=tcp:0:interface=127.0.0.1", *sys.argv[2:]])
service = makeService(options)         # twistd's entry point: imports the reactor
from twisted.internet import reactor
print(json.dumps(sorted(sys.modules)))
def walk(s):
    yield s
    for child in getattr(s, "services", ()):
        yield from walk(child)
def listening():
    ports = [s for s in walk(service) if isinstance(s, ListenerService)]
    if ports and all(s.port is not None for s in ports):
        print(json.dumps(sorted(sys.modules)), flush=True)
        os._exit(0)
    reactor.callLater(0.001, listening)
service.startService()
reactor.callWhenRunning(listening)
reactor.callLater(30, os._exit, 3)
reactor.run()
"""


@pytest.mark.parametrize("roles", [[], ["--listen", "nats.monitor=tcp:0:interface=127.0.0.1",
                                          "--listen", "nats.ws=tcp:0:interface=127.0.0.1"]],
                         ids=["defaults", "monitor_and_ws"])
def test_nats_only_start_imports_only_what_it_uses(tmp_path: Path, roles: list[str]) -> None:
    """Options + build_service for --protocols nats leave the heavy modules unimported, also
    with the monitoring and WebSocket listeners configured (they load once bound); starting
    it up to its listening ports does not import Twisted's endpoint parser, nor (no TLS
    option being set) pyOpenSSL."""
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "data"), *roles],
                         capture_output=True, text=True, timeout=60, check=True)
    built, listening = (set(json.loads(line)) for line in out.stdout.strip().splitlines()[-2:])
    assert "mqhub.protocols.nats.server" in built          # the check can see imports
    assert "twisted.internet.tcp" in listening
    for loaded, banned in ((built, NOT_AT_START), (listening, NOT_UNTIL_LISTENING),
                           (listening, NOT_WITHOUT_TLS)):
        found = sorted(m for m in loaded for bad in banned
                       if m == bad or m.startswith(bad + "."))
        assert not found, f"imported at start: {found}"


def test_tls_settings_keep_the_reactor_s_tls() -> None:
    """Any TLS option (admin, a plugin's, WebSocket's) or an endpoint that is not plain TCP
    keeps pyOpenSSL in the reactor; a plain start does without it."""
    from mqhub.startup import needs_tls
    from mqhub.tap import Options, start_endpoints

    def parsed(*args: str) -> Options:
        options = Options()
        options.parseOptions(["--protocols", "nats,nsq", "--data-dir", "/nonexistent", *args])
        return options

    plain = parsed()
    assert not needs_tls(plain, start_endpoints(plain))
    for args in (["--option", "nats.tls_cert=c.pem"], ["--option", "nats.ws_tls_key=k.pem"],
                 ["--option", "nsq.tls_required=true"],
                 ["--listen", "nats.tcp=ssl:4443:privateKey=k.pem"],
                 ["--listen", "nats.tcp=unix:/tmp/n.sock"]):
        options = parsed(*args)
        assert needs_tls(options, start_endpoints(options)), args
