"""``mqhub stats``, ``queues``, ``dlq`` and ``lameduck``: the admin JSON API from a terminal.

They talk HTTP to a running broker's ``admin.http`` listener (``--url``, default
http://127.0.0.1:8750, or ``$MQHUB_ADMIN_URL``) and print rich tables, or JSON with ``--json``.
Credentials, on every request: the token file (``--token-file`` or
``$MQHUB_ADMIN_TOKEN_FILE``), else ``$MQHUB_USER`` and ``$MQHUB_PASSWORD`` (Basic; a broker with
a users file needs one for reads too, and ``admin = true`` for changes).
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote, urlencode

import click
from rich.console import Console
from rich.table import Table

DEFAULT_URL = "http://127.0.0.1:8750"

url_option = click.option("--url", envvar="MQHUB_ADMIN_URL", default=DEFAULT_URL, show_default=True,
                          help="Base URL of the broker's admin listener ($MQHUB_ADMIN_URL).")
json_option = click.option("--json", "as_json", is_flag=True, help="Print the API's JSON answer.")
token_option = click.option("--token-file", type=click.Path(exists=True, dir_okay=False),
                            envvar="MQHUB_ADMIN_TOKEN_FILE",
                            help="File holding the admin token (when the broker has --admin-token).")


def call(url: str, path: str, method: str = "GET", body: Any = None,
         token_file: str | None = None) -> Any:
    """One API request; the decoded JSON answer.

    :raises click.ClickException: connection refused or an error answer (its message shown).
    """
    data = None
    headers = {}
    if method != "GET":
        data = json.dumps(body or {}).encode()
        headers["Content-Type"] = "application/json"
    token_file = token_file or os.environ.get("MQHUB_ADMIN_TOKEN_FILE")
    if token_file:
        with open(token_file, encoding="utf-8") as f:
            headers["Authorization"] = "Bearer " + f.readline().strip()
    elif os.environ.get("MQHUB_USER"):  # a users-file user (twistd mqhub --users)
        pair = f"{os.environ['MQHUB_USER']}:{os.environ.get('MQHUB_PASSWORD', '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
    req = urllib.request.Request(url.rstrip("/") + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10, context=https_context(url)) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as err:
        try:
            message = json.loads(err.read()).get("error", err.reason)
        except ValueError:
            message = err.reason
        raise click.ClickException(f"{err.code}: {message}") from None
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise click.ClickException(f"cannot reach {url}: {reason}") from None


def https_context(url: str) -> ssl.SSLContext | None:
    """For an https:// admin URL: trust ``$MQHUB_ADMIN_CA`` (else the system's CAs) and
    present ``$MQHUB_ADMIN_CERT`` (+ ``$MQHUB_ADMIN_KEY``) to a listener that verifies
    clients (``--admin-tls-verify``)."""
    if not url.startswith("https:"):
        return None
    ctx = ssl.create_default_context(cafile=os.environ.get("MQHUB_ADMIN_CA") or None)
    cert = os.environ.get("MQHUB_ADMIN_CERT")
    if cert:
        ctx.load_cert_chain(cert, os.environ.get("MQHUB_ADMIN_KEY") or None)
    return ctx


def print_json(data: Any) -> None:
    """Write ``data`` as indented JSON."""
    click.echo(json.dumps(data, indent=2, default=str))


def stats_tables(s: dict[str, Any]) -> list[Table]:
    """The /api/stats document as rich tables (protocols, then totals and store)."""
    protocols = Table(title=f"mqhub — up {s['uptime']:.0f} s")
    for col in ("protocol", "connections", "published", "in/s", "delivered", "out/s", "acked"):
        protocols.add_column(col, justify="left" if col == "protocol" else "right")
    for name, p in sorted(s["protocols"].items()):
        protocols.add_row(name, f"{p['connections']:,}", f"{p['published']:,}",
                          f"{p['published_rate']:,}", f"{p['delivered']:,}",
                          f"{p['delivered_rate']:,}", f"{p['acked']:,}")
    totals = Table(show_header=False, box=None)
    store = s.get("store", {})
    rows = [("queues", s["queues"]), ("ready", s["depth"]), ("in flight", s["in_flight"]),
            ("dead letters", s["dead_letters"]), ("store", store.get("kind", "?")),
            ("store commits", store.get("commits", "")),
            ("last commit ms", store.get("last_commit_ms", ""))]
    if "used_bytes" in store:
        rows.append(("store bytes", store["used_bytes"]))
    for label, value in rows:
        totals.add_row(label, f"{value:,}" if isinstance(value, int) else str(value))
    return [protocols, *counter_table(s["protocols"]), totals]


#: Fields of a /api/stats protocol row that the protocols table shows (the rest are counters).
ROW_FIELDS = frozenset({"connections", "published", "published_rate", "delivered",
                        "delivered_rate", "acked", "acked_rate"})


def counter_table(protocols: dict[str, dict[str, Any]]) -> list[Table]:
    """The protocols' own counters (``slow_consumers``, ``dropped``...) as one table, a row per
    protocol that reports any (none: no table)."""
    table = Table(title="protocol counters")
    table.add_column("protocol")
    table.add_column("counters")
    for name, row in sorted(protocols.items()):
        own = [f"{field} {value:,}" for field, value in row.items()
               if field not in ROW_FIELDS and isinstance(value, int)]
        if own:
            table.add_row(name, " · ".join(own))
    return [table] if table.row_count else []


@click.command()
@url_option
@json_option
@click.option("--watch", type=float, default=None, metavar="SECONDS",
              help="Refresh every SECONDS until interrupted (Ctrl-C); with --json, one JSON "
                   "line per refresh.")
def stats(url: str, as_json: bool, watch: float | None) -> None:
    """Uptime, per-protocol connections/published/delivered/acked and rates, store figures."""
    console = Console()
    if watch is None:
        data = call(url, "/api/stats")
        if as_json:
            print_json(data)
        else:
            for table in stats_tables(data):
                console.print(table)
        return
    try:
        watch_stats(url, as_json, max(0.2, watch), console)
    except KeyboardInterrupt:
        pass


def watch_stats(url: str, as_json: bool, every: float, console: Console) -> None:
    """Show /api/stats every ``every`` seconds until interrupted.

    A terminal gets the tables redrawn in place; a pipe or file gets each refresh appended
    (the tables, or one compact JSON document per line with ``as_json``), flushed at once.
    """
    if as_json or not console.is_terminal:
        while True:
            data = call(url, "/api/stats")
            if as_json:
                click.echo(json.dumps(data, default=str, separators=(",", ":")))
            else:
                for table in stats_tables(data):
                    console.print(table)
            console.file.flush()
            time.sleep(every)
    from rich.console import Group
    from rich.live import Live

    with Live(console=console, auto_refresh=False) as live:
        while True:
            live.update(Group(*stats_tables(call(url, "/api/stats"))), refresh=True)
            time.sleep(every)


@click.command()
@url_option
@json_option
@click.option("--filter", "q", default="", help="Only queues whose name contains this.")
@click.option("--sort", default="name", show_default=True,
              help="name, depth, in_flight, deferred, dead, consumers, messages; -KEY = descending.")
@click.option("--offset", default=0, show_default=True)
@click.option("--limit", default=50, show_default=True)
def queues(url: str, as_json: bool, q: str, sort: str, offset: int, limit: int) -> None:
    """List queues with depth, in-flight, deferred, dead letters and consumers."""
    query = urlencode({"q": q, "sort": sort, "offset": offset, "limit": limit})
    page = call(url, f"/api/queues?{query}")
    if as_json:
        print_json(page)
        return
    shown = len(page["queues"])
    table = Table(title=f"queues {offset + 1 if shown else 0}–{offset + shown} of {page['total']:,}")
    for col in ("queue", "depth", "in flight", "deferred", "dead", "consumers", "msg/s",
                "max attempts"):
        table.add_column(col, justify="left" if col == "queue" else "right",
                         no_wrap=col == "queue")
    for row in page["queues"]:
        table.add_row(row["name"], f"{row['depth']:,}", f"{row['in_flight']:,}",
                      f"{row['deferred']:,}", f"{row['dead']:,}", str(row["consumers"]),
                      str(row["rate"]), str(row["max_attempts"] or "-"))
    Console().print(table)


@click.group()
def dlq() -> None:
    """Dead letters: list queues that have them, show, replay or purge them."""


@dlq.command("list")
@url_option
@json_option
def dlq_list(url: str, as_json: bool) -> None:
    """Queues with dead letters and their counts by reason."""
    data = call(url, "/api/dlq")
    if as_json:
        print_json(data)
        return
    table = Table(title=f"{data['total']} queue(s) with dead letters")
    for col in ("queue", "dead", "reasons"):
        table.add_column(col)
    for row in data["queues"]:
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(row.get("reasons", {}).items()))
        table.add_row(row["queue"], f"{row['dead']:,}", reasons)
    Console().print(table)


@dlq.command("show")
@url_option
@json_option
@click.argument("queue")
@click.option("--offset", default=0, show_default=True)
@click.option("--limit", default=50, show_default=True)
def dlq_show(url: str, as_json: bool, queue: str, offset: int, limit: int) -> None:
    """The dead letters of QUEUE: id, reason, origin, address, attempts, last error, body."""
    data = call(url, f"/api/dlq/{quote(queue, safe='')}?offset={offset}&limit={limit}")
    if as_json:
        print_json(data)
        return
    table = Table(title=f"dead letters of {queue}: {data['total']:,}")
    for col in ("id", "reason", "origin", "address", "attempts", "last error", "body"):
        table.add_column(col, overflow="fold")
    for d in data["dead_letters"]:
        table.add_row(d["id"], d["reason"], d["origin"], d["address"], str(d["attempts"]),
                      d["last_error"] or "", d["preview"][:60])
    Console().print(table)


def _dlq_action(action: str, url: str, queue: str, ids: tuple[str, ...],
                token_file: str | None, as_json: bool) -> None:
    """POST /api/dlq/QUEUE/ACTION for all dead letters or the given ids."""
    body = {"ids": list(ids)} if ids else {}
    data = call(url, f"/api/dlq/{quote(queue, safe='')}/{action}", "POST", body, token_file)
    if as_json:
        print_json(data)
    else:
        done = data.get("replayed" if action == "replay" else "purged", 0)
        click.echo(f"{done} dead letter(s) of {queue} {action}ed" if action == "replay"
                   else f"{done} dead letter(s) of {queue} purged")


@dlq.command("replay")
@url_option
@json_option
@token_option
@click.argument("queue")
@click.option("--id", "ids", multiple=True, help="Replay only this message id (16 hex chars).")
def dlq_replay(url: str, as_json: bool, token_file: str | None, queue: str,
               ids: tuple[str, ...]) -> None:
    """Put the dead letters of QUEUE (all, or --id ...) back on it, attempts reset."""
    _dlq_action("replay", url, queue, ids, token_file, as_json)


@dlq.command("purge")
@url_option
@json_option
@token_option
@click.argument("queue")
@click.option("--id", "ids", multiple=True, help="Purge only this message id (16 hex chars).")
@click.confirmation_option(prompt="Delete these dead letters for good?")
def dlq_purge(url: str, as_json: bool, token_file: str | None, queue: str,
              ids: tuple[str, ...]) -> None:
    """Delete the dead letters of QUEUE (all, or --id ...)."""
    _dlq_action("purge", url, queue, ids, token_file, as_json)


@click.command()
@url_option
@json_option
@token_option
@click.option("--duration", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Seconds to close every client in (default: the broker's "
                   "--lame-duck-duration).")
@click.option("--grace", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Seconds before the first client is closed (default: --lame-duck-grace).")
@click.option("--status", "status_only", is_flag=True, help="Only show the lame-duck status.")
def lameduck(url: str, as_json: bool, token_file: str | None, duration: float | None,
             grace: float | None, status_only: bool) -> None:
    """Put the broker into lame-duck mode (as SIGUSR2): it stops accepting clients, closes the
    open ones over the lame-duck duration, then stops."""
    if status_only:
        answer = call(url, "/api/lameduck")
    else:
        body = {k: v for k, v in (("duration", duration), ("grace", grace)) if v is not None}
        answer = call(url, "/api/lameduck", "POST", body, token_file)
    if as_json:
        print_json(answer)
    elif not answer.get("lame_duck"):
        click.echo("not in lame-duck mode")
    else:
        click.echo(f"lame-duck mode: {answer.get('connections', 0)} client(s) open, "
                   f"{answer.get('closed', 0)} closed; clients close over "
                   f"{answer['duration']:g} s after a {answer['grace']:g} s grace period")


def register(group: click.Group) -> None:
    """Add the admin commands to the ``mqhub`` group."""
    for command in (stats, queues, dlq, lameduck):
        group.add_command(command)


__all__ = ["register", "call", "DEFAULT_URL"]
