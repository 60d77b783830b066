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
from tests.interop.test_nats_py import barrier, run, until


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
    got: list[bytes] = []

    async def cb(msg: Any) -> None:
        got.append(msg.data)

    await nc.subscribe("secure.x", cb=cb)
    await barrier(nc)
    await nc.publish("secure.x", b"hello")
    await nc.flush()
    await until(lambda: bool(got))
    return got[0]


def test_token_auth(make_broker: Callable[..., BrokerProcess]) -> None:
    """Token auth: a wrong token or no CONNECT first is an Authorization Violation."""
    broker = make_broker(["nats"], extra_args=["--option", "nats.token=s3cret"])
    port = broker.port("mq9")

    async def main() -> None:
        nc = await nats.connect(f"nats://s3cret@127.0.0.1:{port}")
        assert await echo_roundtrip(nc) == b"hello"
        await nc.close()
        with pytest.raises(NatsError, match="Authorization Violation"):
            await nats.connect(f"nats://wrong@127.0.0.1:{port}", allow_reconnect=False,
                               max_reconnect_attempts=0)
    run(main())


def test_user_password_auth(make_broker: Callable[..., BrokerProcess]) -> None:
    """nats-py with user/password auth; a wrong password is refused."""
    broker = make_broker(["nats"], extra_args=["--option", "nats.user=agent",
                                                "--option", "nats.password=pw"])
    port = broker.port("mq9")

    async def main() -> None:
        nc = await nats.connect(f"nats://agent:pw@127.0.0.1:{port}")
        assert await echo_roundtrip(nc) == b"hello"
        await nc.close()
        with pytest.raises(NatsError, match="Authorization Violation"):
            await nats.connect(f"nats://agent:nope@127.0.0.1:{port}", allow_reconnect=False,
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
