"""``mqhub users``: make a password hash for the users file, check a users file, ask a running
broker to re-read it."""

from __future__ import annotations

import sys

import click

from mqhub.identity.passwords import hash_password
from mqhub.identity.users import UsersFile, UsersFileError


@click.group()
def users() -> None:
    """The users file (twistd -n mqhub --users FILE; see docs/security.md)."""


@users.command("hash")
@click.option("--stdin", "from_stdin", is_flag=True,
              help="Read the password from the first line of standard input (no prompt).")
def hash_command(from_stdin: bool) -> None:
    """Print a password_hash value (scrypt) for a password typed at the prompt."""
    if from_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    if not password:
        raise click.ClickException("the password is empty")
    click.echo(hash_password(password))


@users.command("check")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
def check_command(path: str) -> None:
    """Check a users file as the broker would; print its users."""
    try:
        found = UsersFile.load(path)
    except UsersFileError as exc:
        raise click.ClickException(str(exc)) from exc
    for name, entry in found.users.items():
        kinds = [k for k in ("password", "password_hash", "token", "nkey", "tls_subject",
                             "curve_key") if getattr(entry, k)]
        click.echo(f"{name}: credentials {', '.join(kinds) or 'none'}; "
                   f"{len(entry.rights.publish)} publish, {len(entry.rights.subscribe)} "
                   f"subscribe grants{'; admin' if entry.rights.admin else ''}")
    anon = found.anonymous
    click.echo("anonymous: refused" if anon is None else
               f"anonymous: {len(anon.publish)} publish, {len(anon.subscribe)} subscribe grants")


def register(group: click.Group) -> None:
    """Add ``mqhub users`` to the ``mqhub`` group."""
    group.add_command(users)
