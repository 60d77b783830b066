"""Test-side NATS identities: nkey pairs, operator/account/user JWTs and .creds files.

What ``nsc`` would make, built here with the ``nkeys`` package so a test needs no Go tool.
"""

from __future__ import annotations

import base64
import json
import os
import time
from pathlib import Path
from typing import Any

import nkeys


def keypair(prefix: int) -> tuple[bytes, str]:
    """A fresh (seed, public key) of the role ``prefix`` (nkeys.PREFIX_BYTE_USER, ...)."""
    seed = nkeys.encode_seed(os.urandom(32), prefix)
    return seed, nkeys.from_seed(bytearray(seed)).public_key.decode()


def _b64(data: bytes) -> str:
    """Unpadded base64url."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwt(signer_seed: bytes, claims: dict[str, Any], version: int = 2) -> str:
    """A NATS JWT of ``claims`` signed by ``signer_seed``; iss/iat/jti filled. Version 2
    (``ed25519-nkey``) signs ``header.payload``; version 1 (``ed25519``, a top-level ``type``
    in the claims) signs the encoded payload alone."""
    kp = nkeys.from_seed(bytearray(signer_seed))
    body = {"jti": _b64(os.urandom(12)), "iat": int(time.time()),
            "iss": kp.public_key.decode(), **claims}
    alg = "ed25519-nkey" if version == 2 else "ed25519"
    head = _b64(json.dumps({"typ": "JWT", "alg": alg}).encode())
    payload = _b64(json.dumps(body).encode())
    signed = f"{head}.{payload}" if version == 2 else payload
    return f"{head}.{payload}.{_b64(kp.sign(signed.encode()))}"


class Operator:
    """An operator with one account, writing the broker's operator/resolver files."""

    def __init__(self, tmp: Path) -> None:
        """Make operator and account keys and their JWTs under ``tmp``."""
        self.tmp = tmp
        self.op_seed, self.op_pub = keypair(nkeys.PREFIX_BYTE_OPERATOR)
        self.acc_seed, self.acc_pub = keypair(nkeys.PREFIX_BYTE_ACCOUNT)
        self.operator_file = tmp / "operator.jwt"
        self.operator_file.write_text(jwt(self.op_seed, {
            "sub": self.op_pub, "name": "op", "nats": {"type": "operator", "version": 2}}))
        self.preload = tmp / "accounts.json"
        self.preload.write_text(json.dumps({self.acc_pub: jwt(self.op_seed, {
            "sub": self.acc_pub, "name": "acc", "nats": {"type": "account", "version": 2}})}))

    def options(self) -> list[str]:
        """The broker's ``--option`` arguments for operator mode."""
        return ["--option", f"nats.operator={self.operator_file}",
                "--option", "nats.resolver=MEMORY",
                "--option", f"nats.resolver_preload={self.preload}"]

    def user_creds(self, name: str, signer: bytes | None = None, **nats: Any) -> Path:
        """A .creds file for a new user of the account (``signer``: another key signs it)."""
        seed, pub = keypair(nkeys.PREFIX_BYTE_USER)
        exp = nats.pop("exp", None)
        claims: dict[str, Any] = {"sub": pub, "name": name,
                                  "nats": {"type": "user", "version": 2, **nats}}
        if exp is not None:
            claims["exp"] = exp
        token = jwt(signer or self.acc_seed, claims)
        path = self.tmp / f"{name}.creds"
        path.write_text(
            "-----BEGIN NATS USER JWT-----\n" + token + "\n------END NATS USER JWT------\n\n"
            "-----BEGIN USER NKEY SEED-----\n" + seed.decode()
            + "\n------END USER NKEY SEED------\n")
        return path
