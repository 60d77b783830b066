"""Client-certificate verification on the NSQ tls_v1 upgrade and on the admin listener."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import nsq
import pytest
from click.testing import CliRunner

from mqhub.cli import main
from tests.interop.broker import BrokerProcess
from tests.interop.test_nats_security import client_tls, pki  # noqa: F401  (the PKI fixture)
from tests.interop.test_nsq_pynsq import call, run, until


def tls_options(pki: dict[str, Path], who: str | None) -> dict[str, object]:  # noqa: F811
    """pynsq's tls_options: trust the CA, present ``who``'s certificate (or none)."""
    opts: dict[str, object] = {"cert_reqs": ssl.CERT_REQUIRED, "ca_certs": str(pki["ca"])}
    if who is not None:
        opts.update(certfile=str(pki[who]), keyfile=str(pki[f"{who}_key"]))
    return opts


def test_nsq_tls_v1_verifies_client_certificates(make_broker: Callable[..., BrokerProcess],
                                                 pki: dict[str, Path]) -> None:  # noqa: F811
    """nsq.tls_ca + nsq.tls_verify: a writer with a certificate from the CA publishes over
    tls_v1; one without a certificate, or with one from another CA, never gets a connection."""
    broker = make_broker(["nsq"], extra_args=[
        "--nsq-tls-cert", str(pki["cert"]), "--nsq-tls-key", str(pki["key"]),
        "--option", f"nsq.tls_ca={pki['ca']}", "--option", "nsq.tls_verify=true"])
    addr = f"127.0.0.1:{broker.port('nsq', 'tcp')}"

    async def scenario() -> None:
        good = nsq.Writer([addr], tls_v1=True, tls_options=tls_options(pki, "client"))
        await until(lambda: bool(good.conns), what="the verified writer")
        assert await call(good.pub, "t", b"x") == b"OK"
        for who in (None, "stranger"):
            bad = nsq.Writer([addr], tls_v1=True, tls_options=tls_options(pki, who))
            refused = await call(bad.pub, "t", b"y")
            assert isinstance(refused, nsq.Error), refused
    run(scenario)


def test_admin_https_with_client_certificates(make_broker: Callable[..., BrokerProcess],
                                              pki: dict[str, Path],  # noqa: F811
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """--admin-tls-cert/--admin-tls-ca/--admin-tls-verify: the API answers a client with a
    certificate from the CA (the CLI through $MQHUB_ADMIN_CERT), refuses one without."""
    broker = make_broker(["nats"], extra_args=[
        "--admin-tls-cert", str(pki["cert"]), "--admin-tls-key", str(pki["key"]),
        "--admin-tls-ca", str(pki["ca"]), "--admin-tls-verify"])
    url = f"https://127.0.0.1:{broker.port('admin', 'http')}"
    with urllib.request.urlopen(url + "/api/stats", timeout=5,
                                context=client_tls(pki, "client")) as resp:
        assert resp.status == 200
    for who in (None, "stranger"):
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            urllib.request.urlopen(url + "/api/stats", timeout=5, context=client_tls(pki, who))
    monkeypatch.setenv("MQHUB_ADMIN_CA", str(pki["ca"]))
    monkeypatch.setenv("MQHUB_ADMIN_CERT", str(pki["client"]))
    monkeypatch.setenv("MQHUB_ADMIN_KEY", str(pki["client_key"]))
    result = CliRunner().invoke(main, ["lameduck", "--status", "--url", url])
    assert result.exit_code == 0 and "not in lame-duck mode" in result.output, result.output
