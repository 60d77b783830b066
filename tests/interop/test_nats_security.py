"""nkeys, operator JWTs, client-certificate verification and TLS-first with nats-py."""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable
from pathlib import Path

import nats
import nkeys
import pytest
import trustme
from nats.errors import Error as NatsError

from tests.interop.broker import BrokerProcess
from tests.interop.nats_keys import Operator, keypair
from tests.interop.test_nats_auth_tls import echo_roundtrip
from tests.interop.test_nats_py import run, until
from tests.unit.protocols.nats.test_auth import sign


def no_retry() -> dict[str, object]:
    """nats.connect options for a connection attempt that must fail once, not retry."""
    return {"allow_reconnect": False, "max_reconnect_attempts": 0, "connect_timeout": 3}


def test_nkey_users(make_broker: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    """An nkey user connects with its seed; an unknown key and a bad signature are refused."""
    seed, pub = keypair(nkeys.PREFIX_BYTE_USER)
    stranger, _ = keypair(nkeys.PREFIX_BYTE_USER)
    broker = make_broker(["nats"], extra_args=["--option", f"nats.nkeys={pub}"])
    port = broker.port("mq9")

    async def main() -> None:
        nc = await nats.connect(f"nats://127.0.0.1:{port}", nkeys_seed_str=seed.decode())
        assert await echo_roundtrip(nc) == b"hello"
        await nc.close()
        with pytest.raises(NatsError, match="Authorization Violation"):
            await nats.connect(f"nats://127.0.0.1:{port}", nkeys_seed_str=stranger.decode(),
                               **no_retry())
    run(main())
    # the right key with a signature over something else than this connection's nonce
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        info = s.recv(4096)
        assert b'"nonce"' in info
        s.sendall(b'CONNECT {"nkey":"%s","sig":"%s","protocol":1}\r\nPING\r\n'
                  % (pub.encode(), sign(seed, "not-the-nonce").encode()))
        assert s.recv(4096).startswith(b"-ERR 'Authorization Violation'")


def test_operator_jwt_users(make_broker: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    """Operator mode: a user's .creds work with their permissions; expired and foreign-signed
    JWTs are refused."""
    op = Operator(tmp_path)
    broker = make_broker(["nats"], extra_args=op.options())
    url = f"nats://127.0.0.1:{broker.port('mq9')}"
    good = op.user_creds("alice", pub={"allow": ["secure.>"]},
                         sub={"allow": ["secure.>", "_INBOX.>"]})
    expired = op.user_creds("old", exp=int(time.time()) - 10)
    rogue, _ = keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    foreign = op.user_creds("mallory", signer=rogue)

    async def main() -> None:
        errors: list[Exception] = []

        async def on_error(e: Exception) -> None:
            errors.append(e)

        nc = await nats.connect(url, user_credentials=str(good), error_cb=on_error)
        assert await echo_roundtrip(nc) == b"hello"
        await nc.publish("payroll", b"x")
        await nc.flush()
        await until(lambda: any("permissions violation for publish" in str(e) for e in errors))
        assert nc.is_connected
        await nc.close()
        for creds in (expired, foreign):
            with pytest.raises(NatsError, match="Authorization Violation"):
                await nats.connect(url, user_credentials=str(creds), **no_retry())
    run(main())


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1, and a client certificate from the CA and
    one from another CA, as PEM files."""
    ca, other = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    paths = {name: tmp_path / f"{name}.pem" for name in
             ("ca", "cert", "key", "client", "client_key", "stranger", "stranger_key")}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    server.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    server.private_key_pem.write_to_path(str(paths["key"]))
    for who, issuer in (("client", ca), ("stranger", other)):
        cert = issuer.issue_cert(f"{who}@example.com", common_name=who)
        cert.cert_chain_pems[0].write_to_path(str(paths[who]))
        cert.private_key_pem.write_to_path(str(paths[f"{who}_key"]))
    return paths


def client_tls(pki: dict[str, Path], who: str | None) -> ssl.SSLContext:
    """A client context trusting the CA, presenting ``who``'s certificate (or none)."""
    ctx = ssl.create_default_context(cafile=str(pki["ca"]))
    if who is not None:
        ctx.load_cert_chain(str(pki[who]), str(pki[f"{who}_key"]))
    return ctx


@pytest.mark.parametrize("first", [False, True], ids=["tls_after_info", "handshake_first"])
def test_client_certificates_verified(make_broker: Callable[..., BrokerProcess],
                                      pki: dict[str, Path], first: bool) -> None:
    """tls_verify: a client certificate from the CA connects (INFO says tls_verify); none, or
    one from another CA, fails the handshake. With tls_handshake_first TLS comes before INFO."""
    options = [f"nats.tls_cert={pki['cert']}", f"nats.tls_key={pki['key']}",
               f"nats.tls_ca={pki['ca']}", "nats.tls_verify=true"]
    if first:
        options.append("nats.tls_handshake_first=true")
    broker = make_broker(["nats"], extra_args=[a for o in options for a in ("--option", o)])
    url = f"tls://127.0.0.1:{broker.port('mq9')}"

    async def main() -> None:
        nc = await nats.connect(url, tls=client_tls(pki, "client"), tls_hostname="127.0.0.1",
                                tls_handshake_first=first)
        assert nc._server_info.get("tls_verify") is True
        assert await echo_roundtrip(nc) == b"hello"
        await nc.close()
        for who in (None, "stranger"):
            with pytest.raises((NatsError, OSError, ssl.SSLError, TimeoutError)):
                await nats.connect(url, tls=client_tls(pki, who), tls_hostname="127.0.0.1",
                                   tls_handshake_first=first, **no_retry())
    run(main())
    if first:
        # a plain client reading for INFO gets none: the server waits for a ClientHello
        with socket.create_connection(("127.0.0.1", broker.port("mq9")), timeout=1) as s:
            with pytest.raises(TimeoutError):
                s.recv(10)
