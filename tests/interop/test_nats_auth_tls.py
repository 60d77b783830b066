"""Token and user/password auth, and TLS, with nats-py against a real broker."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from nats.errors import Error as NatsError

from tests.interop.broker import BrokerProcess
from tests.interop.test_nats_py import barrier, collector, run, until


def self_signed(tmp: Path) -> tuple[Path, Path]:
    """A throwaway certificate for 127.0.0.1 / localhost and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


async def echo_roundtrip(nc: Any) -> bytes:
    """Subscribe, publish, and return what came back."""
    got: list[Any] = []
    await nc.subscribe("secure.x", cb=collector(got))
    await barrier(nc)
    await nc.publish("secure.x", b"hello")
    await nc.flush()
    await until(lambda: bool(got))
    return bytes(got[0].data)


@pytest.mark.parametrize(("options", "good", "bad"), [
    (["nats.token=s3cret"], "s3cret@", "wrong@"),
    (["nats.user=agent", "nats.password=pw"], "agent:pw@", "agent:nope@"),
], ids=["token", "user_password"])
def test_auth(make_broker: Callable[..., BrokerProcess], options: list[str], good: str,
              bad: str) -> None:
    """nats-py with token or user/password auth; wrong credentials are an Authorization Violation."""
    broker = make_broker(["nats"], extra_args=[a for o in options for a in ("--option", o)])
    port = broker.port("mq9")

    async def main() -> None:
        nc = await nats.connect(f"nats://{good}127.0.0.1:{port}")
        assert await echo_roundtrip(nc) == b"hello"
        await nc.close()
        with pytest.raises(NatsError, match="Authorization Violation"):
            await nats.connect(f"nats://{bad}127.0.0.1:{port}", allow_reconnect=False,
                               max_reconnect_attempts=0)
    run(main())


def test_tls(make_broker: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    """nats-py over TLS with the configured certificate."""
    cert, key = self_signed(tmp_path)
    broker = make_broker(["nats"], extra_args=["--option", f"nats.tls_cert={cert}",
                                                "--option", f"nats.tls_key={key}"])
    port = broker.port("mq9")

    async def main() -> None:
        ctx = ssl.create_default_context(cafile=str(cert))
        nc = await nats.connect(f"tls://127.0.0.1:{port}", tls=ctx, tls_hostname="localhost")
        assert nc.connected_server_version.major >= 2
        assert await echo_roundtrip(nc) == b"hello"
        await nc.close()
    run(main())
