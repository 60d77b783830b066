"""NATS authentication: nkey and JWT signatures, permissions and expiry (Clock, StringTransport)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import nkeys
import pytest

from mqhub.protocols.nats import codec
from mqhub.protocols.nats.auth import (
    Authenticator,
    AuthError,
    Credentials,
    JwtCheck,
    NkeyCheck,
    Permissions,
    Principal,
    TokenCheck,
    covers,
    overlaps,
    users_checks,
)
from mqhub.protocols.nats.codec import OP_ERR, OP_MSG
from mqhub.protocols.nats.server import NatsServer, NatsSettings
from tests.interop.nats_keys import Operator, jwt, keypair
from tests.unit.protocols.nats.helpers import Client, make_hub


def sign(seed: bytes, nonce: str) -> str:
    """What nats.py sends as ``sig``: standard base64 of the Ed25519 signature."""
    return base64.b64encode(nkeys.from_seed(bytearray(seed)).sign(nonce.encode())).decode()


def creds_parts(path: Path) -> tuple[str, bytes]:
    """(user JWT, user seed) of a .creds file."""
    lines = path.read_text().splitlines()
    return lines[1], lines[5].encode()


def test_pattern_cover_and_overlap() -> None:
    """Subscription rights: a pattern covers narrower ones; deny refuses any overlap."""
    assert covers("foo.>", "foo.*") and covers("foo.*", "foo.bar") and covers(">", "a.b.c")
    assert not covers("foo.*", "foo.>") and not covers("foo.bar", "foo.*")
    assert not covers("foo.*", "foo.a.b")
    assert overlaps("foo.>", "*.secret") and overlaps("a.*", "a.b")
    assert not overlaps("a.*", "b.*") and not overlaps("a.b", "a.b.c")
    perms = Permissions(("orders.>", "_INBOX.>"), ("orders.secret",))
    assert perms.permits("orders.new") and perms.permits("_INBOX.x")
    assert not perms.permits("orders.secret") and not perms.permits("payroll")
    assert not perms.permits("orders.>")        # would receive orders.secret


def test_nkey_signature_good_and_bad() -> None:
    """An nkey user signs the nonce; a wrong key, a bad signature or no nonce is refused."""
    seed, pub = keypair(nkeys.PREFIX_BYTE_USER)
    other_seed, _ = keypair(nkeys.PREFIX_BYTE_USER)
    auth = Authenticator([NkeyCheck({pub: Principal("bob")}), TokenCheck("t")])
    assert auth.required and auth.needs_nonce
    ok = auth.authenticate(Credentials({"nkey": pub, "sig": sign(seed, "n1")}, "n1"), 0)
    assert ok.name == "bob"
    url_sig = sign(seed, "n1").replace("+", "-").replace("/", "_").rstrip("=")
    assert auth.authenticate(Credentials({"nkey": pub, "sig": url_sig}, "n1"), 0).name == "bob"
    for creds in (Credentials({"nkey": pub, "sig": sign(other_seed, "n1")}, "n1"),
                  Credentials({"nkey": pub, "sig": sign(seed, "n0")}, "n1"),
                  Credentials({"nkey": pub, "sig": "%%%"}, "n1"),
                  Credentials({"nkey": pub, "sig": sign(seed, "n1")}, None),
                  Credentials({"nkey": "UNKNOWN", "sig": sign(seed, "n1")}, "n1")):
        with pytest.raises(AuthError):
            auth.authenticate(creds, 0)
    # a client without an nkey is judged by the token check
    assert auth.authenticate(Credentials({"auth_token": "t"}, "n1"), 0).name == "token"


def test_jwt_chain_expiry_and_foreign_signer(tmp_path: Path) -> None:
    """User JWT -> account JWT -> operator: signed chain, expiry, untrusted signer."""
    op = Operator(tmp_path)
    check = JwtCheck([op.operator_file.read_text()],
                     {op.acc_pub: json.loads(op.preload.read_text())[op.acc_pub]})
    token, seed = creds_parts(op.user_creds("alice", sub={"allow": ["a.>"]}, exp=2_000))
    user = check.authenticate(Credentials({"jwt": token, "sig": sign(seed, "n")}, "n"), 1_000)
    assert user.name == "alice" and user.expires == 2_000 and user.account == op.acc_pub
    assert user.subscribe is not None and user.subscribe.permits("a.b")
    assert not user.subscribe.permits("b")
    with pytest.raises(AuthError, match="expired"):
        check.authenticate(Credentials({"jwt": token, "sig": sign(seed, "n")}, "n"), 2_000)
    with pytest.raises(AuthError, match="nonce"):
        check.authenticate(Credentials({"jwt": token, "sig": sign(seed, "x")}, "n"), 1_000)
    rogue, _ = keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    token, seed = creds_parts(op.user_creds("mallory", signer=rogue))
    with pytest.raises(AuthError):
        check.authenticate(Credentials({"jwt": token, "sig": sign(seed, "n")}, "n"), 1_000)
    tampered = token.split(".")
    tampered[1] = tampered[1][:-2] + ("AA" if tampered[1][-2:] != "AA" else "BB")
    with pytest.raises(AuthError):
        check.authenticate(Credentials({"jwt": ".".join(tampered), "sig": "x"}, "n"), 1_000)


def test_connection_rights_and_expiry_on_the_wire(tmp_path: Path) -> None:
    """INFO has a nonce; a JWT user's rights give nats-server's errors; expiry closes it."""
    op = Operator(tmp_path)
    hub = make_hub()
    hub.clock.advance(1_000)
    srv = NatsServer(hub, NatsSettings(), Authenticator([JwtCheck(
        [op.operator_file.read_text()], json.loads(op.preload.read_text()))]))
    token, seed = creds_parts(op.user_creds(
        "alice", pub={"allow": ["a.>"]}, sub={"allow": ["a.>"], "deny": ["a.secret"]},
        exp=1_060))
    c = Client(srv, handshake=False)
    assert c.info["auth_required"] is True and c.info["nonce"]
    c.send(codec.encode_connect({"jwt": token, "sig": sign(seed, c.info["nonce"]),
                                 "verbose": False, "pedantic": False, "protocol": 1})
           + b"SUB a.x 1\r\nSUB a.> 2\r\nSUB b 3\r\nPUB a.x 1\r\nx\r\nPUB b 1\r\ny\r\n")
    assert c.events() == [
        (OP_ERR, 'Permissions Violation for Subscription to "a.>"'),
        (OP_ERR, 'Permissions Violation for Subscription to "b"'),
        (OP_MSG, "a.x", "1", None, b"x"),
        (OP_ERR, 'Permissions Violation for Publish to "b"')]
    assert not c.closed
    hub.clock.advance(61)
    assert c.events() == [(OP_ERR, "User Authentication Expired")] and c.closed
    # a signature over another nonce is refused
    c = Client(srv, handshake=False)
    c.send(codec.encode_connect({"jwt": token, "sig": sign(seed, "other"), "protocol": 1}))
    assert c.events() == [(OP_ERR, "Authorization Violation")] and c.closed


def test_users_file_entries_with_permissions() -> None:
    """nats-server's users = [...]: nkey and password users, permissions as lists or
    allow/deny objects; unknown users and bad passwords are refused alike."""
    seed, pub = keypair(nkeys.PREFIX_BYTE_USER)
    auth = Authenticator(users_checks([
        {"nkey": pub, "permissions": {"publish": ["help", "_INBOX.>"],
                                      "subscribe": {"allow": ["help"], "deny": ["foo"]}}},
        {"user": "a", "password": "pa"}]))
    nkey_user = auth.authenticate(Credentials({"nkey": pub, "sig": sign(seed, "n")}, "n"), 0)
    assert nkey_user.publish is not None and nkey_user.publish.permits("_INBOX.x")
    assert not nkey_user.publish.permits("bar")
    assert nkey_user.subscribe is not None and not nkey_user.subscribe.permits("foo")
    assert auth.authenticate(Credentials({"user": "a", "pass": "pa"}, "n"), 0).name == "a"
    for creds in ({"user": "a", "pass": "no"}, {"user": "b", "pass": "pa"}, {}):
        with pytest.raises(AuthError):
            auth.authenticate(Credentials(creds, "n"), 0)
    for bad in ([{"nkey": "SUABC"}], [{"permissions": {}}], [{"user": "x", "permissions": 3}],
                ["x"]):
        with pytest.raises(ValueError):
            users_checks(bad)


def test_version_1_jwts_as_nats_py_fixtures_use() -> None:
    """Version 1 JWTs (top-level type, the payload alone signed) are verified too; a version 1
    signature over header.payload is not accepted."""
    op_seed, op_pub = keypair(nkeys.PREFIX_BYTE_OPERATOR)
    acc_seed, acc_pub = keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    user_seed, user_pub = keypair(nkeys.PREFIX_BYTE_USER)
    operator = jwt(op_seed, {"sub": op_pub, "type": "operator"}, version=1)
    account = jwt(op_seed, {"sub": acc_pub, "type": "account", "nats": {}}, version=1)
    user = jwt(acc_seed, {"sub": user_pub, "name": "v1", "type": "user",
                          "nats": {"pub": {"allow": ["a"]}, "sub": {}}}, version=1)
    check = JwtCheck([operator], {acc_pub: account})
    creds = Credentials({"jwt": user, "sig": sign(user_seed, "n")}, "n")
    principal = check.authenticate(creds, 0)
    assert principal.name == "v1" and principal.publish is not None
    assert principal.subscribe is None            # an empty block limits nothing
    head, payload, _ = user.split(".")
    wrong = nkeys.from_seed(bytearray(acc_seed)).sign(f"{head}.{payload}".encode())
    forged = f"{head}.{payload}.{base64.urlsafe_b64encode(wrong).rstrip(b'=').decode()}"
    with pytest.raises(AuthError, match="signature"):
        check.authenticate(Credentials({"jwt": forged, "sig": sign(user_seed, "n")}, "n"), 0)
