"""Users files for tests: write TOML into a directory, build a Directory on a Clock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mqhub.identity import Directory

#: a users file every identity test can start from
USERS = """
[[user]]
name = "alice"
password = "wonderland"
token = "alice-token"
publish = ["orders.>"]
subscribe = ["orders.>", "_INBOX.>"]

[[user]]
name = "bob"
password_hash = "HASH"
publish = ["payroll.>"]
subscribe = ["payroll.>", "jobs.> workers"]
admin = true

[anonymous]
publish = ["public.>"]
subscribe = ["public.>"]
"""


def write_users(path: Path, text: str = USERS, bob_password: str = "builder") -> Path:
    """Write ``text`` (HASH replaced by a cheap scrypt hash of ``bob_password``) to ``path``."""
    from mqhub.identity.passwords import hash_password

    path.write_text(text.replace("HASH", hash_password(bob_password, log_n=4)))
    return path


def directory(tmp_path: Path, clock: Any, text: str = USERS) -> Directory:
    """A loaded Directory over a users file in ``tmp_path``."""
    d = Directory(clock, str(write_users(tmp_path / "users.toml", text)))
    d.load()
    return d
