"""pynsq with tls_v1, deflate and AUTH against a real broker started with a certificate and secrets."""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable
from pathlib import Path

import nsq
import pytest

from tests.interop.broker import BrokerProcess
from tests.interop.nsq_client import stats
from tests.interop.test_nats_auth_tls import self_signed
from tests.interop.test_nsq_pynsq import call, run, until

pytestmark = pytest.mark.interop


def test_pynsq_tls_deflate_and_auth(make_broker: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    """tls_v1 is accepted with a certificate, deflate on top works, and AUTH gates publishing."""
    cert, key = self_signed(tmp_path)
    secrets = tmp_path / "secrets.json"
    secrets.write_text(json.dumps({"secrets": {"s3cret": {"identity": "svc", "authorizations": [
        {"topic": "^secure$", "channels": [".*"], "permissions": ["publish", "subscribe"]}]}}}))
    broker = make_broker(["nsq"], extra_args=["--nsq-tls-cert", str(cert), "--nsq-tls-key", str(key),
                                            "--nsq-auth-secrets", str(secrets)])
    addr = f"127.0.0.1:{broker.port('nsq', 'tcp')}"
    tls_options = {"cert_reqs": ssl.CERT_NONE}
    got: list[bytes] = []
    features: list[dict] = []

    async def scenario() -> None:
        """Publish over TLS+deflate with AUTH, then consume over TLS."""
        writer = nsq.Writer([addr], tls_v1=True, tls_options=tls_options, deflate=True,
                            auth_secret="s3cret")
        await until(lambda: bool(writer.conns), what="TLS writer connection")
        assert await call(writer.pub, "secure", b"over tls") == b"OK"
        features.extend(stats(broker)["producers"])
        refused = await call(writer.pub, "other", b"nope")
        assert isinstance(refused, nsq.Error) and "E_UNAUTHORIZED" in str(refused)
        reader = nsq.Reader(topic="secure", channel="c", message_handler=lambda m: got.append(m.body) or True,
                            nsqd_tcp_addresses=[addr], tls_v1=True, tls_options=tls_options,
                            auth_secret="s3cret", max_in_flight=5)
        try:
            await until(lambda: got == [b"over tls"], what="message over TLS")
        finally:
            reader.close()

    run(scenario)
    (producer,) = features  # the writer, as /stats saw it while connected
    assert producer["tls"] is True and producer["deflate"] is True
    assert producer["authed"] is True and producer["auth_identity"] == "svc"
