"""The Directory: credentials to principals, sessions and their cached decisions, reloads,
denial counting and logging (never a credential), and the failed-login slowdown."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.task import Clock
from twisted.logger import formatEvent, globalLogPublisher

from mqhub.identity import Directory, LoginThrottle, UsersFileError
from mqhub.identity.directory import LOG_BURST
from tests.unit.identity.helpers import USERS, directory, write_users


@pytest.fixture
def logged() -> Iterator[list[str]]:
    """Text of every log event of mqhub.identity while the test runs."""
    lines: list[str] = []

    def observe(event: dict[str, Any]) -> None:
        if event.get("log_namespace") == "mqhub.identity":
            lines.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    yield lines
    globalLogPublisher.removeObserver(observe)


def test_credentials_name_users(tmp_path: Path) -> None:
    """Tokens, passwords (plain or hashed), NSQ secrets and HTTP Authorization headers."""
    d = directory(tmp_path, Clock())
    assert d.enforcing and d.by_token("alice-token").name == "alice"
    assert d.by_token("alice-token ") is None and d.by_token("") is None
    assert d.by_password("alice", "wonderland").name == "alice"
    assert d.by_password("alice", "Wonderland") is None and d.by_password("eve", "x") is None
    assert d.by_password("bob", "builder").rights.admin
    assert d.by_secret("alice-token").name == "alice" and d.by_secret("bob:builder").name == "bob"
    assert d.by_secret("bob:nope") is None
    basic = "Basic " + base64.b64encode(b"bob:builder").decode()
    assert d.by_authorization(basic)[0].name == "bob"
    assert d.by_authorization("Bearer alice-token") == (d.by_token("alice-token"), True, None)
    assert d.by_authorization("Basic !!!") == (None, True, None)
    assert d.by_authorization("") == (None, False, None)
    assert d.anonymous is not None and d.anonymous.rights.publish.allows("public.x")


def test_no_users_file_enforces_nothing() -> None:
    """Without --users the directory only counts (legacy options still use it)."""
    d = Directory(Clock())
    d.load()
    assert not d.enforcing and d.anonymous is None and d.anonymous_session("nsq") is None
    assert d.by_token("x") is None and d.stats()["enforcing"] is False


def test_sessions_cache_decisions_and_count_refusals(tmp_path: Path) -> None:
    """A session decides once per address and counts each refusal by protocol and action."""
    d = directory(tmp_path, Clock())
    s = d.session("nats", d.by_token("alice-token"), "10.0.0.1")
    assert s.check_publish("orders.eu") and not s.check_publish("payroll.march")
    assert s.check_subscribe("orders.*") and not s.check_subscribe(">")
    assert not s.check_publish("payroll.march")
    assert d.counters == {("nats", "publish"): 2, ("nats", "subscribe"): 1}
    assert d.stats()["denied"] == {"nats": {"publish": 2, "subscribe": 1}}
    assert s.may_publish("orders.eu") is s._publish["orders.eu"]  # a dict lookup from now on


def test_reload_gives_sessions_their_new_rights(tmp_path: Path) -> None:
    """After a reload a session keeps its user with the new rights, a removed user keeps none,
    anonymous sessions follow [anonymous], and each session is asked to drop what it lost."""
    d = directory(tmp_path, Clock())
    alice = d.session("nsq", d.by_token("alice-token"))
    bob = d.session("nsq", d.by_password("bob", "builder"))
    anon = d.anonymous_session("nsq")
    assert alice.check_subscribe("orders.x") and anon.check_publish("public.x")
    revoked: list[str] = []
    for s in (alice, bob, anon):
        s.on_revoke = lambda session: revoked.append(session.user)
    write_users(tmp_path / "users.toml", USERS.replace('"orders.>", "_INBOX.>"', '"_INBOX.>"')
                .split("[[user]]\nname = \"bob\"")[0] + "[anonymous]\npublish = []\n")
    summary = d.reload()
    assert summary["users"] == 1 and summary["sessions"] == 3
    assert sorted(revoked) == ["(anonymous)", "alice", "bob"]
    assert not alice.may_subscribe("orders.x") and alice.may_subscribe("_INBOX.x")
    assert not bob.may_publish("payroll.x") and not bob.admin
    assert not anon.may_publish("public.x")
    assert d.by_password("bob", "builder") is None


def test_a_bad_reload_keeps_the_rights_in_force(tmp_path: Path, logged: list[str]) -> None:
    """A broken file is refused; sessions keep deciding as before."""
    d = directory(tmp_path, Clock())
    alice = d.session("nsq", d.by_token("alice-token"))
    (tmp_path / "users.toml").write_text("[[user]]\nname = 3\n")
    with pytest.raises(UsersFileError):
        d.reload()
    assert alice.may_publish("orders.x") and d.by_token("alice-token") is not None
    assert any("not reloaded" in line for line in logged)


def test_denials_are_logged_rate_limited_without_credentials(tmp_path: Path,
                                                             logged: list[str]) -> None:
    """At most LOG_BURST lines per window, then one summary; logins log the name, never the
    password or token."""
    clock = Clock()
    d = directory(tmp_path, clock)
    s = d.session("mqks", d.by_token("alice-token"), "10.0.0.9")
    for i in range(LOG_BURST + 5):
        s.check_publish(f"payroll.{i}")
    assert len(logged) == LOG_BURST and "user alice protocol mqks action publish" in logged[0]
    assert d.counters[("mqks", "publish")] == LOG_BURST + 5
    clock.advance(11)
    d.login_failed("nats", "10.0.0.9", "alice")
    assert "5 more auth refusals" in logged[-2] and "user alice" in logged[-1]
    assert not any("wonderland" in line or "alice-token" in line for line in logged)


def test_failed_logins_slow_a_peer_down() -> None:
    """Free attempts, then turns spaced by a doubling delay (capped); parallel attempts queue
    up; another peer is not affected; a success or quiet forgets the peer."""
    clock = Clock()
    t = LoginThrottle(clock, free=3, base=0.25, cap=2.0, forget=60.0)
    for _ in range(3):
        assert t.wait("a") == 0.0
        t.failed("a")
    assert t.wait("b") == 0.0                       # another peer
    first = t.wait("a")
    second = t.wait("a")                            # a parallel attempt waits behind it
    assert 0 < first < second
    for _ in range(10):
        t.failed("a")
    clock.advance(100)                              # quiet for longer than `forget`
    assert t.wait("a") == 0.0
    for _ in range(8):
        t.failed("c")
    waits = [t.wait("c") for _ in range(3)]
    assert waits[1] - waits[0] == pytest.approx(2.0)   # the cap
    t.succeeded("c")
    assert t.wait("c") == 0.0
