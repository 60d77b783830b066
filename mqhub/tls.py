"""Server TLS contexts from PEM files, with optional client-certificate verification.

One place for what the NATS, NSQ and admin listeners share: a certificate and key (the key may
sit in the certificate file), and ``ca`` + ``verify``: with ``verify`` every client must present
a certificate signed by one of the CA file's certificates, or the handshake fails (nats-server's
``tls { ca_file, verify }``, nsqd's ``--tls-root-ca-file`` with
``--tls-client-auth-policy=require-verify``). Twisted is imported on first use only.
"""

from __future__ import annotations

from typing import Any

__all__ = ["server_context", "read_pem_certificates", "TlsConfigError"]

_END = b"-----END CERTIFICATE-----"


class TlsConfigError(ValueError):
    """A certificate, key or CA file cannot be used (the message names the file)."""


def read_pem_certificates(path: str) -> list[bytes]:
    """Every PEM certificate block of the file at ``path`` (a CA bundle may hold several)."""
    with open(path, "rb") as f:
        data = f.read()
    blocks = [part.strip() + b"\n" + _END for part in data.split(_END) if b"-----BEGIN" in part]
    if not blocks:
        raise TlsConfigError(f"{path}: no PEM certificate in it")
    return blocks


def server_context(cert: str, key: str | None = None, ca: str | None = None,
                   verify: bool = False) -> Any:
    """A Twisted ``IOpenSSLContextFactory`` for a TLS server.

    :param cert: PEM certificate file (may hold the key too).
    :param key: PEM key file when not in ``cert``.
    :param ca: PEM file of the CA certificates that client certificates must chain to.
    :param verify: require and verify a client certificate (needs ``ca``).
    :raises TlsConfigError: when a file cannot be read or parsed, or ``verify`` lacks ``ca``,
        or the process started without TLS support (:mod:`mqhub.startup`).
    """
    from mqhub.startup import tls_available

    if not tls_available():
        raise TlsConfigError("this process started without TLS support (no TLS option was set)")
    from twisted.internet import ssl

    if verify and not ca:
        raise TlsConfigError("client verification (tls_verify) needs a CA file (tls_ca)")
    try:
        with open(cert, "rb") as f:
            pem = f.read()
        if key and key != cert:
            with open(key, "rb") as f:
                pem += b"\n" + f.read()
        private = ssl.PrivateCertificate.loadPEM(pem)
        if not verify:
            return private.options()
        authorities = [ssl.Certificate.loadPEM(block) for block in read_pem_certificates(ca or "")]
    except TlsConfigError:
        raise
    except Exception as exc:   # OSError, OpenSSL and Twisted parse errors alike
        raise TlsConfigError(f"cannot load TLS files: {exc}") from exc
    return private.options(*authorities)
