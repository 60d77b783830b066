"""The users file: every key checked, errors name the user and key; password hashes."""

from __future__ import annotations

from pathlib import Path

import pytest

from mqhub.identity import UsersFile, UsersFileError
from mqhub.identity.passwords import check_password, hash_password, is_hash
from mqhub.protocols.vibemq.auth import hash_password as vibemq_hash
from tests.unit.identity.helpers import write_users


def test_a_valid_file(tmp_path: Path) -> None:
    """Users, their grants and credentials, and the anonymous rights."""
    users = UsersFile.load(str(write_users(tmp_path / "u.toml")))
    assert sorted(users.users) == ["alice", "bob"]
    alice = users.users["alice"]
    assert alice.token == "alice-token" and not alice.rights.admin
    assert alice.rights.publish.allows("orders.eu") and not alice.rights.publish.allows("payroll")
    assert users.users["bob"].rights.admin and is_hash(users.users["bob"].password_hash or "")
    assert users.anonymous is not None and users.anonymous.subscribe.allows("public.news")
    assert "wonderland" not in repr(alice) and "alice-token" not in repr(alice)


@pytest.mark.parametrize(("text", "message"), [
    ('[[user]]\nname = "a"\npasword = "x"\n', "unknown key 'pasword'"),
    ('[[user]]\nname = "a"\n[[user]]\nname = "a"\n', "defined twice"),
    ('[[user]]\nname = "a"\ntoken = "t"\n[[user]]\nname = "b"\ntoken = "t"\n', "share one token"),
    ('[[user]]\nname = "a"\npublish = ["a..b"]\n', "user 'a': publish"),
    ('[[user]]\nname = "a"\nsubscribe = "x"\n', "must be a list"),
    ('[[user]]\nname = "a"\npassword = "p"\npassword_hash = "h"\n', "not both"),
    ('[[user]]\nname = "a"\npassword_hash = "md5$x"\n', "password_hash"),
    ('[[user]]\nname = "a"\nnkey = "Nxyz"\n', "nkey"),
    ('[[user]]\nname = "a"\ncurve_key = "short"\n', "curve_key"),
    ('[[user]]\nname = "a"\nadmin = "yes"\n', "admin must be"),
    ('[[user]]\npassword = "p"\n', "needs a name"),
    ('[anonymous]\nadmin = true\n', "unknown key 'admin'"),
    ('[users]\n', "unknown section"),
    ('[[user]\n', "not TOML"),
])
def test_mistakes_are_reported_where_they_are(tmp_path: Path, text: str, message: str) -> None:
    """A bad file never loads; the message says which user and key."""
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(UsersFileError, match=message.replace("(", r"\(")):
        UsersFile.load(str(path))


def test_missing_file(tmp_path: Path) -> None:
    """An unreadable file is a UsersFileError naming it."""
    with pytest.raises(UsersFileError, match="nope.toml"):
        UsersFile.load(str(tmp_path / "nope.toml"))


def test_password_hashes() -> None:
    """scrypt hashes verify in constant time; VibeMQ's PBKDF2 hashes verify too."""
    stored = hash_password("s3cret", log_n=4)
    assert stored.startswith("scrypt$4$8$1$") and check_password("s3cret", stored)
    assert not check_password("S3cret", stored) and not check_password("s3cret", "garbage")
    assert hash_password("s3cret", log_n=4) != stored                  # salted
    assert check_password("pw", vibemq_hash("pw", iterations=1000))
    assert not check_password("x", "scrypt$40$8$1$AAAA$AAAA")          # absurd cost refused


def test_twistd_option(tmp_path: Path) -> None:
    """--users is checked when the options are parsed (a bad file is a usage error naming the
    problem) and becomes hub.identity, enforcing, with the file's users."""
    from twisted.internet.task import Clock
    from twisted.python import usage

    from mqhub.hub import build_hub
    from mqhub.tap import Options

    good = write_users(tmp_path / "u.toml")
    options = Options()
    options.parseOptions(["--protocols", "nsq", "--users", str(good)])
    hub = build_hub({**dict(options), "data-dir": None}, Clock())
    assert hub.identity.enforcing and hub.identity.by_token("alice-token").name == "alice"
    bad = tmp_path / "bad.toml"
    bad.write_text('[[user]]\nname = "x"\nsubscribe = [">.x"]\n')
    with pytest.raises(usage.UsageError, match=r"--users: .*user 'x': subscribe"):
        Options().parseOptions(["--protocols", "nsq", "--users", str(bad)])
    assert not build_hub({"data-dir": None}, Clock()).identity.enforcing
