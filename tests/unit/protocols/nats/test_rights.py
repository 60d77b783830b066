"""NATS per-subject rights on StringTransports: a restricted publisher routes through its own
tables, so a line the server's fast path already knows (published by someone allowed) is
still refused for it, in runs, at new sizes and across routing changes; SUB coverage; the
exact nats-server error texts; and a reload that drops a subscription."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mqhub.protocols.nats import codec
from tests.unit.identity.helpers import USERS, directory, write_users
from tests.unit.protocols.nats.helpers import Client, make_hub, make_server

#: every test here runs with the scanner's C loop and with its fallback (conftest.py)
pytestmark = pytest.mark.usefixtures("scan_impl")


def _msgs(events: list[tuple]) -> list[tuple[str, bytes]]:
    """(subject, payload) of every MSG."""
    return [(ev[1], bytes(ev[-1])) for ev in events if ev[0] == codec.OP_MSG]


def _errs(events: list[tuple]) -> list[str]:
    """The text of every -ERR."""
    return [ev[1] for ev in events if ev[0] == codec.OP_ERR]


def test_restricted_publishers_never_ride_the_shared_fast_path(tmp_path: Path) -> None:
    """bob may publish anywhere, alice only orders.*: the same PUB lines, one by one, in runs
    and at new sizes, reach the subscriber from bob only; alice gets one -ERR per PUB."""
    hub = make_hub()
    hub.identity = directory(tmp_path, hub.clock, USERS.replace('subscribe = ["payroll.>"',
                                                                'subscribe = [">"'))
    srv = make_server(hub)
    watcher = Client(srv, {"user": "bob", "pass": "builder"})
    bob = Client(srv, {"user": "bob", "pass": "builder"})
    alice = Client(srv, {"auth_token": "alice-token"})
    watcher.send(b"SUB > 1\r\nPING\r\n")
    watcher.events()
    line = b"PUB payroll.x 1\r\nx\r\n"
    for _ in range(3):   # the server's tables now route this line (and its head) directly
        bob.send(line * 20 + b"PUB payroll.x 2\r\nxy\r\n")
    assert len(_msgs(watcher.events())) == 63
    alice.send(line * 20 + b"PUB payroll.x 3\r\nxyz\r\nPUB orders.a 1\r\no\r\nPING\r\n")
    events = alice.events()
    assert _errs(events) == ['Permissions Violation for Publish to "payroll.x"'] * 21
    assert events[-1] == (codec.OP_PONG,) and not alice.closed
    assert _msgs(watcher.events()) == [("orders.a", b"o")]
    watcher.send(b"SUB extra.> 2\r\nPING\r\n")           # a routing change: tables start over
    watcher.events()
    alice.send(line + b"PUB orders.a 1\r\np\r\n" * 3)
    assert _errs(alice.events()) == ['Permissions Violation for Publish to "payroll.x"']
    assert _msgs(watcher.events()) == [("orders.a", b"p")] * 3


def test_subscriptions_must_be_covered(tmp_path: Path) -> None:
    """alice's SUBs outside orders.* / _INBOX.* are refused with nats-server's texts (queue
    named); the connection keeps working and gets what it may read."""
    hub = make_hub()
    hub.identity = directory(tmp_path, hub.clock)
    srv = make_server(hub)
    alice = Client(srv, {"user": "alice", "pass": "wonderland"})
    alice.send(b"SUB > 1\r\nSUB payroll.* q 2\r\nSUB orders.* 3\r\nPING\r\n")
    events = alice.events()
    assert _errs(events) == ['Permissions Violation for Subscription to ">"',
                             'Permissions Violation for Subscription to "payroll.*" using queue "q"']
    alice.send(b"PUB orders.x 2\r\nhi\r\nPING\r\n")
    assert _msgs(alice.events()) == [("orders.x", b"hi")]


def test_anonymous_and_bad_credentials(tmp_path: Path) -> None:
    """No credentials: the [anonymous] rights; wrong ones: Authorization Violation."""
    hub = make_hub()
    hub.identity = directory(tmp_path, hub.clock)
    srv = make_server(hub)
    anon = Client(srv)
    assert anon.info["auth_required"] is True
    anon.send(b"SUB public.> 1\r\nPUB public.x 1\r\na\r\nPUB orders.x 1\r\nb\r\nPING\r\n")
    events = anon.events()
    assert _msgs(events) == [("public.x", b"a")]
    assert _errs(events) == ['Permissions Violation for Publish to "orders.x"']
    bad = Client(srv, handshake=False)
    bad.send(codec.encode_connect({"user": "alice", "pass": "nope", "verbose": False}))
    assert _errs(bad.events()) == ["Authorization Violation"] and bad.closed
    assert hub.identity.counters[("nats", "login")] == 1


def test_reload_drops_subscriptions_no_longer_covered(tmp_path: Path) -> None:
    """After a reload that takes orders.* from alice, her SUB is dropped with the -ERR."""
    hub = make_hub()
    users = USERS.replace('publish = ["payroll.>"]', 'publish = [">"]')
    hub.identity = directory(tmp_path, hub.clock, users)
    srv = make_server(hub)
    alice = Client(srv, {"auth_token": "alice-token"})
    bob = Client(srv, {"user": "bob", "pass": "builder"})
    alice.send(b"SUB orders.> 1\r\nSUB _INBOX.> 2\r\nPING\r\n")
    alice.events()
    write_users(tmp_path / "users.toml", users.replace('"orders.>", "_INBOX.>"', '"_INBOX.>"'))
    hub.identity.reload()
    assert _errs(alice.events()) == ['Permissions Violation for Subscription to "orders.>"']
    bob.send(b"PUB orders.x 1\r\nx\r\nPUB _INBOX.y 1\r\ny\r\n")
    assert _msgs(alice.events()) == [("_INBOX.y", b"y")]


def test_mixed_stretches_through_the_scanner_stay_within_rights(tmp_path: Path) -> None:
    """Whole reads of mixed frames (many subjects and sizes, one receiver: the frame scanner's
    case) from a restricted publisher: every allowed frame arrives in order, every refused one
    is answered, even when an unrestricted publisher taught the server the refused heads."""
    import random

    hub = make_hub()
    hub.identity = directory(tmp_path, hub.clock, USERS.replace(
        'publish = ["orders.>"]', 'publish = ["bench.>"]').replace(
        'subscribe = ["payroll.>"', 'subscribe = [">"').replace(
        'publish = ["payroll.>"]', 'publish = [">"]'))
    srv = make_server(hub)
    watcher = Client(srv, {"user": "bob", "pass": "builder"})
    bob = Client(srv, {"user": "bob", "pass": "builder"})
    alice = Client(srv, {"auth_token": "alice-token"})
    watcher.send(b"SUB > 1\r\nPING\r\n")
    watcher.events()
    rnd = random.Random(3)

    def stream(sizes: tuple[int, int]) -> tuple[bytes, list[tuple[str, bytes]], int]:
        """600 frames over bench.s0..s7 with some payroll.x, bodies of ``sizes`` bytes."""
        frames, allowed, refused = [], [], 0
        for _ in range(600):
            subject = "payroll.x" if rnd.random() < 0.05 else f"bench.s{rnd.randrange(8)}"
            body = b"z" * rnd.randint(*sizes)
            frames.append(b"PUB %s %d\r\n%s\r\n" % (subject.encode(), len(body), body))
            if subject.startswith("bench"):
                allowed.append((subject, body))
            else:
                refused += 1
        return b"".join(frames), allowed, refused

    first, second = stream((10, 200)), stream((201, 400))
    for data, _, _ in (first, second):
        bob.send(data)           # the server's head tables now hold every head, payroll's too
    watcher.events()
    # cold: every line is new to alice; then new sizes on heads she knows (the head tables and
    # the whole-read frame scanner carry those)
    for data, allowed, refused in (first, second):
        alice.send(data + b"PING\r\n")
        events = alice.events()
        assert _errs(events) == ['Permissions Violation for Publish to "payroll.x"'] * refused
        assert _msgs(watcher.events()) == allowed


def test_users_file_nkey_and_tls_subject_users(tmp_path: Path) -> None:
    """A users-file user with an nkey logs in by signing the INFO nonce (a bad signature is
    an Authorization Violation); a verified certificate's subject names a users-file user."""
    import base64

    import nkeys

    from tests.interop.nats_keys import keypair

    seed, pub = keypair(nkeys.PREFIX_BYTE_USER)
    hub = make_hub()
    hub.identity = directory(tmp_path, hub.clock, f"""
[[user]]
name = "carol"
nkey = "{pub}"
publish = ["carol.>"]
subscribe = ["carol.>"]

[[user]]
name = "dave"
tls_subject = "CN=dave, O=Acme"
publish = ["dave.>"]
""")
    srv = make_server(hub)
    carol = Client(srv, handshake=False)
    nonce = carol.info["nonce"]
    sig = base64.b64encode(nkeys.from_seed(bytearray(seed)).sign(nonce.encode())).decode()
    carol.send(codec.encode_connect({"nkey": pub, "sig": sig, "verbose": False})
               + b"PUB carol.x 1\r\nc\r\nPUB dave.x 1\r\nd\r\nPING\r\n")
    events = carol.events()
    assert events[-1] == (codec.OP_PONG,)
    assert _errs(events) == ['Permissions Violation for Publish to "dave.x"']
    forger = Client(srv, handshake=False)
    forger.send(codec.encode_connect({"nkey": pub, "sig": sig, "verbose": False}))
    assert _errs(forger.events()) == ["Authorization Violation"] and forger.closed
    dave = Client(srv, handshake=False)
    dave.proto.tls_subject = lambda: "CN=dave,O=Acme"  # type: ignore[method-assign]
    dave.send(codec.encode_connect({"verbose": False}) + b"PUB carol.x 1\r\nx\r\nPING\r\n")
    assert _errs(dave.events()) == ['Permissions Violation for Publish to "carol.x"']


def test_plugin_users_are_shorthands_with_the_same_enforcement(tmp_path: Path) -> None:
    """Without a users file, the plugin's own `users` list (nats-server's, allow and deny)
    decides through the same session: refused subjects, covered wildcards, the fast path."""
    from mqhub.protocols.nats.auth import Authenticator, users_checks
    from mqhub.protocols.nats.server import NatsServer, NatsSettings

    hub = make_hub()
    auth = Authenticator(users_checks([
        {"user": "ed", "password": "pw", "permissions": {
            "publish": {"allow": ["ed.>"], "deny": ["ed.secret"]}, "subscribe": ["ed.>"]}}]))
    srv = NatsServer(hub, NatsSettings(), auth)
    ed = Client(srv, {"user": "ed", "pass": "pw"})
    assert ed.proto.fast and ed.proto.pub_tables is not None     # still the fast path
    ed.send(b"SUB ed.> 1\r\nSUB > 2\r\nPUB ed.a 1\r\na\r\nPUB ed.secret 1\r\ns\r\nPING\r\n")
    events = ed.events()
    assert _msgs(events) == [("ed.a", b"a")]
    assert _errs(events) == ['Permissions Violation for Subscription to ">"',
                             'Permissions Violation for Publish to "ed.secret"']


def test_no_auth_user_makes_clients_without_credentials_that_user(tmp_path: Path) -> None:
    """nats-server's ``no_auth_user`` (its nats.py test's accounts): a CONNECT without
    credentials acts as the named user of the plugin's ``users`` (request/reply within its
    rights), one with credentials as itself (bar may subscribe nowhere); with the hub's users
    file the name is a user of that file; an unknown name stops the start."""
    import pytest

    from mqhub.errors import PluginError
    from mqhub.protocols.nats.service import build_server

    users = tmp_path / "nats-users.json"
    users.write_text(json.dumps([
        {"user": "foo", "pass": "foo", "permissions": {
            "subscribe": {"allow": ["foo", "_INBOX.>"], "deny": ["bar"]},
            "publish": {"allow": ["foo", "_INBOX.>"], "deny": ["bar"]}}},
        {"user": "bar", "pass": "bar", "permissions": {
            "subscribe": {"allow": ["bar"], "deny": [">"]},
            "publish": {"allow": ["bar"], "deny": [">"]}}}]))
    srv = build_server(make_hub(), {"users": str(users), "no_auth_user": "foo"})
    bar = Client(srv, {"user": "bar", "pass": "bar"})
    bar.send(b"SUB foo 1\r\nPING\r\n")
    assert _errs(bar.events()) == ['Permissions Violation for Subscription to "foo"']
    anon = Client(srv)
    assert anon.info["auth_required"] is True and anon.proto.principal.name == "foo"
    anon.send(b"SUB foo 1\r\nSUB _INBOX.r.* 2\r\nPUB foo _INBOX.r.1 4\r\nping\r\n"
              b"PUB _INBOX.r.1 4\r\npong\r\nPUB bar 1\r\nx\r\nPING\r\n")
    events = anon.events()
    assert _msgs(events) == [("foo", b"ping"), ("_INBOX.r.1", b"pong")]
    assert _errs(events) == ['Permissions Violation for Publish to "bar"']
    wrong = Client(srv, handshake=False)
    wrong.send(codec.encode_connect({"user": "foo", "pass": "nope", "verbose": False}))
    assert _errs(wrong.events()) == ["Authorization Violation"] and wrong.closed

    hub = make_hub()
    hub.identity = directory(tmp_path, hub.clock)
    srv = build_server(hub, {"no_auth_user": "alice"})
    anon = Client(srv)
    anon.send(b"SUB orders.> 1\r\nSUB public.> 2\r\nPUB orders.x 1\r\no\r\nPING\r\n")
    events = anon.events()
    assert _msgs(events) == [("orders.x", b"o")]     # alice's rights, not [anonymous]'s
    assert _errs(events) == ['Permissions Violation for Subscription to "public.>"']
    with pytest.raises(PluginError, match="no_auth_user 'nobody'"):
        build_server(make_hub(), {"users": str(users), "no_auth_user": "nobody"})
