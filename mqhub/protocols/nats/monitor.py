"""nats-server's HTTP monitoring endpoints (``/varz``, ``/connz``, ``/subsz``, ``/routez``,
``/healthz``) over the NATS server's own state, for tools written for nats-server
(prometheus-nats-exporter, nats-top, nats.py's tests).

Field names and JSON types are nats-server's (durations in ``/varz`` as integer nanoseconds,
``uptime``/``idle`` as Go-style ``1d2h3m4s``, times as RFC 3339 UTC). A field is present only
when mqhub has its value; what is left out, and why, is listed in docs/protocols/nats.md
(Monitoring). The JSON documents are built by plain functions of the server
(:func:`varz`, :func:`connz`, ...), served by :class:`MonitorResource` (twisted.web).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from twisted.web.resource import Resource
from twisted.web.server import Request

from mqhub import __version__ as MQHUB_VERSION
from mqhub.protocols.nats.connection import NatsConnection
from mqhub.protocols.nats.server import SERVER_VERSION, NatsServer
from mqhub.protocols.nats.sublist import subject_matches

__all__ = ["MonitorResource", "varz", "connz", "subsz", "routez", "healthz", "go_duration",
           "rfc3339", "MonitorError", "SORT_KEYS"]

#: /connz and /subsz page size when ``limit`` is not given (nats-server's default)
DEFAULT_LIMIT = 1024
#: nats-server's global account name (mqhub has one address space)
GLOBAL_ACCOUNT = "$G"
NANOS = 1_000_000_000


class MonitorError(ValueError):
    """A bad query parameter (answered 400 with the message as text, as nats-server does)."""


def rfc3339(seconds: float) -> str:
    """POSIX seconds as nats-server writes times: RFC 3339 in UTC with a ``Z``."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def go_duration(seconds: float) -> str:
    """A duration as nats-server's uptime/idle strings: ``0s``, ``42s``, ``3m2s``, ``1d2h0m5s``."""
    total = int(max(0.0, seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h{minutes}m{secs}s"
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def _number(value: float) -> float | int:
    """A seconds setting as Go's float64 marshals it (2, not 2.0)."""
    return int(value) if float(value).is_integer() else value


def _rss_bytes() -> int:
    """The process's resident memory (Linux /proc; elsewhere the peak from getrusage)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


class CpuMeter:
    """Process CPU use in percent of one core since the previous reading (nats-server's cpu)."""

    def __init__(self) -> None:
        """Start measuring now."""
        self._last = (time.monotonic(), self._cpu())
        self.percent = 0.0

    @staticmethod
    def _cpu() -> float:
        """User + system CPU seconds of this process."""
        t = os.times()
        return t.user + t.system

    def read(self) -> float:
        """Percent since the last reading (the last value again when read twice at once)."""
        now, cpu = time.monotonic(), self._cpu()
        elapsed = now - self._last[0]
        if elapsed >= 0.1:
            self.percent = round(100.0 * (cpu - self._last[1]) / elapsed, 2)
            self._last = (now, cpu)
        return self.percent


def varz(server: NatsServer, http: tuple[str, int], requests: dict[str, int], cpu: float,
         websocket: dict[str, Any]) -> dict[str, Any]:
    """The ``/varz`` document: identity, limits, and the server-wide totals."""
    s = server.settings
    now = server.clock.seconds()
    server.fold_counts()
    stats = server.stats
    doc: dict[str, Any] = {
        "server_id": server.server_id, "server_name": s.server_name, "version": SERVER_VERSION,
        "proto": 1, "git_commit": MQHUB_VERSION, "go": f"python{sys.version.split()[0]}",
        "host": s.host, "port": s.port,
        "ping_interval": int(s.ping_interval * NANOS), "ping_max": s.ping_max,
        "http_host": http[0], "http_port": http[1], "http_base_path": "", "https_port": 0,
        "auth_timeout": _number(s.auth_timeout), "max_control_line": s.max_control_line,
        "max_payload": s.max_payload, "max_pending": s.max_pending,
        "cluster": {}, "gateway": {}, "leaf": {}, "mqtt": {}, "websocket": websocket,
        "jetstream": {}, "write_deadline": int(s.write_deadline * NANOS),
        "start": rfc3339(server.started), "now": rfc3339(now),
        "uptime": go_duration(now - server.started), "mem": _rss_bytes(),
        "cores": os.cpu_count() or 1, "cpu": cpu,
        "connections": len(server.connections), "total_connections": stats["connections"],
        "routes": 0, "remotes": 0, "leafnodes": 0,
        "in_msgs": stats["in_msgs"], "in_bytes": stats["in_bytes"],
        "out_msgs": stats["out_msgs"], "out_bytes": stats["out_bytes"],
        "slow_consumers": stats["slow_consumers"],
        "subscriptions": server.sublist.count,
        "http_req_stats": dict(requests),
        "config_load_time": rfc3339(server.started),
        "slow_consumer_stats": {"clients": stats["slow_consumers"], "routes": 0, "gateways": 0,
                                "leafs": 0},
    }
    if server.auth.required:
        doc["auth_required"] = True
    if s.tls_context is not None:
        doc["tls_required"] = True
        doc["tls_verify"] = s.tls_verify
    return doc


def _subscriptions(conn: NatsConnection, detail: bool, account: bool = False) -> list[Any]:
    """A connection's subscriptions, as subjects or as nats-server's detail objects (with the
    account, as /subsz lists them)."""
    if not detail:
        return [sub.wire_subject for sub in conn.subs.values()]
    out = []
    for sub in conn.subs.values():
        item: dict[str, Any] = (
            {"account": GLOBAL_ACCOUNT, "account_tag": GLOBAL_ACCOUNT} if account else {})
        item["subject"] = sub.wire_subject
        if sub.queue:
            item["qgroup"] = sub.queue
        item.update(sid=sub.sid, cid=conn.cid)
        if sub.max is not None:
            item["max"] = sub.max
        out.append(item)
    return out


def _conn_info(conn: NatsConnection, now: float, subs: str, auth: bool) -> dict[str, Any]:
    """One ``/connz`` connection."""
    peer = conn.transport.getPeer() if conn.transport is not None else None
    info: dict[str, Any] = {
        "cid": conn.cid, "kind": "Client", "type": "websocket" if conn.websocket else "nats",
        "ip": conn.peer_host, "port": int(getattr(peer, "port", 0) or 0),
        "start": rfc3339(conn.start), "last_activity": rfc3339(conn.last_activity),
        "uptime": go_duration(now - conn.start), "idle": go_duration(now - conn.last_activity),
        "pending_bytes": conn.paused_bytes,
        "in_msgs": conn.in_msgs, "out_msgs": conn.out_msgs,
        "in_bytes": conn.in_bytes, "out_bytes": conn.out_bytes,
        "subscriptions": len(conn.subs),
        "name": conn.name, "lang": conn.lang, "version": conn.version,
    }
    if auth and conn.principal.name:
        info["authorized_user"] = conn.principal.name
        if conn.principal.account:
            info["account"] = conn.principal.account
    if subs and conn.subs:
        detail = subs == "detail"
        info["subscriptions_list_detail" if detail else "subscriptions_list"] = \
            _subscriptions(conn, detail)
    return info


#: /connz ``sort`` values mqhub can order by -> the key (ties broken by cid, as nats-server)
SORT_KEYS: dict[str, Callable[[NatsConnection], Any]] = {
    "cid": lambda c: c.cid,
    "start": lambda c: c.start,
    "subs": lambda c: -len(c.subs),
    "pending": lambda c: -c.paused_bytes,
    "msgs_from": lambda c: -c.in_msgs,
    "msgs_to": lambda c: -c.out_msgs,
    "bytes_to": lambda c: -c.out_bytes,
    "bytes_from": lambda c: -c.in_bytes,
    "last": lambda c: -c.last_activity,
    "idle": lambda c: c.last_activity,
    "uptime": lambda c: c.start,
}


def _int_arg(args: dict[str, str], name: str, default: int) -> int:
    """A non-negative integer query parameter."""
    text = args.get(name)
    if text in (None, ""):
        return default
    try:
        value = int(text)
    except ValueError:
        raise MonitorError(f"invalid {name}: {text!r}") from None
    if value < 0:
        raise MonitorError(f"invalid {name}: {text!r}")
    return value


def _subs_arg(args: dict[str, str]) -> str:
    """``subs``: "" (none), "list" (1/true) or "detail"."""
    value = args.get("subs", "").lower()
    if value in ("", "0", "false"):
        return ""
    if value == "detail":
        return "detail"
    if value in ("1", "true"):
        return "list"
    raise MonitorError(f"invalid subs: {value!r}")


def connz(server: NatsServer, args: dict[str, str]) -> dict[str, Any]:
    """The ``/connz`` document: open connections, sorted and paged (``sort``, ``offset``,
    ``limit``, ``subs``, ``auth``, ``cid``, ``state``)."""
    sort = args.get("sort", "cid") or "cid"
    key = SORT_KEYS.get(sort)
    if key is None:
        raise MonitorError(f"invalid sorting option: {sort} "
                           f"(mqhub sorts by {', '.join(SORT_KEYS)})")
    state = args.get("state", "open") or "open"
    if state not in ("open", "closed", "any", "all"):
        raise MonitorError(f"invalid state: {state!r}")
    offset = _int_arg(args, "offset", 0)
    limit = _int_arg(args, "limit", DEFAULT_LIMIT) or DEFAULT_LIMIT
    subs = _subs_arg(args)
    auth = args.get("auth", "").lower() in ("1", "true")
    server.fold_counts()
    conns = [] if state == "closed" else list(server.connections.values())
    if "cid" in args:
        cid = _int_arg(args, "cid", 0)
        conns = [c for c in conns if c.cid == cid]
    conns.sort(key=lambda c: (key(c), c.cid))
    page = conns[offset:offset + limit]
    now = server.clock.seconds()
    return {"server_id": server.server_id, "now": rfc3339(now), "num_connections": len(page),
            "total": len(conns), "offset": offset, "limit": limit,
            "connections": [_conn_info(c, now, subs, auth) for c in page]}


def subsz(server: NatsServer, args: dict[str, str]) -> dict[str, Any]:
    """The ``/subsz`` document: trie totals, fan-out of the cached routes and (``subs=1``) the
    subscriptions, optionally only those matching the subject ``test``."""
    offset = _int_arg(args, "offset", 0)
    limit = _int_arg(args, "limit", DEFAULT_LIMIT) or DEFAULT_LIMIT
    fanouts = [len(heads) for heads, _ in server.sroutes.values()]
    doc: dict[str, Any] = {
        "server_id": server.server_id, "now": rfc3339(server.clock.seconds()),
        "num_subscriptions": server.sublist.count, "num_cache": len(server.sroutes),
        "num_inserts": server.stats["sub_inserts"], "num_removes": server.stats["sub_removes"],
        "max_fanout": max(fanouts, default=0),
        "avg_fanout": sum(fanouts) / len(fanouts) if fanouts else 0.0,
    }
    if _subs_arg(args):
        test = args.get("test")
        found = [item for conn in sorted(server.connections.values(), key=lambda c: c.cid)
                 for sub, item in zip(conn.subs.values(), _subscriptions(conn, True, True),
                                     strict=True)
                 if not sub.mq9 and (not test or subject_matches(sub.subject, test))]
        doc.update(total=len(found), offset=offset, limit=limit,
                   subscriptions_list=found[offset:offset + limit])
    else:
        doc.update(total=server.sublist.count, offset=offset, limit=limit)
    return doc


def routez(server: NatsServer) -> dict[str, Any]:
    """The ``/routez`` document: mqhub has no NATS cluster routes."""
    return {"server_id": server.server_id, "server_name": server.settings.server_name,
            "now": rfc3339(server.clock.seconds()), "num_routes": 0, "routes": []}


def healthz(listening: bool) -> tuple[int, dict[str, Any]]:
    """The ``/healthz`` status and document: ok while the client port accepts."""
    if listening:
        return 200, {"status": "ok"}
    return 503, {"status": "unavailable", "error": "the NATS client port is not listening"}


class MonitorResource(Resource):
    """The monitoring site's root: one JSON document per endpoint (GET only).

    :param server: the NATS server whose state is shown.
    :param listening: whether the client port accepts now (for ``/healthz``).
    :param websocket: the ``/varz`` ``websocket`` block (empty without a ws listener).
    :param http: (host, port) of this monitoring listener (known once it is bound).
    """

    isLeaf = True

    def __init__(self, server: NatsServer, listening: Callable[[], bool],
                 websocket: Callable[[], dict[str, Any]],
                 http: Callable[[], tuple[str, int]]) -> None:
        """Serve ``server``'s state."""
        super().__init__()
        self.nats = server
        self.listening = listening
        self.websocket = websocket
        self.http = http
        self.requests: dict[str, int] = {}
        self.cpu = CpuMeter()

    def render_GET(self, request: Request) -> bytes:
        """Answer one endpoint (nats-server's paths, with or without a trailing slash)."""
        path = request.path.decode("utf-8", "replace").rstrip("/") or "/"
        query: dict[bytes, list[bytes]] = request.args or {}
        args = {k.decode("utf-8", "replace"): v[-1].decode("utf-8", "replace")
                for k, v in query.items() if v}
        status = 200
        try:
            if path == "/varz":
                doc: Any = varz(self.nats, self.http(), self._count(path), self.cpu.read(),
                                self.websocket())
            elif path == "/connz":
                doc = connz(self.nats, args)
            elif path == "/subsz" or path == "/subscriptionsz":
                doc = subsz(self.nats, args)
            elif path == "/routez":
                doc = routez(self.nats)
            elif path == "/healthz":
                status, doc = healthz(self.listening())
            elif path == "/":
                doc = {"endpoints": ["/varz", "/connz", "/subsz", "/routez", "/healthz"]}
            else:
                status, doc = 404, {"error": f"no monitoring endpoint {path}"}
        except MonitorError as exc:   # nats-server answers a bad parameter in plain text
            request.setResponseCode(400)
            request.setHeader(b"Content-Type", b"text/plain; charset=utf-8")
            return str(exc).encode() + b"\n"
        if status < 400 and path != "/varz":
            self._count(path)
        request.setResponseCode(status)
        request.setHeader(b"Content-Type", b"application/json")
        request.setHeader(b"Cache-Control", b"no-cache")
        return json.dumps(doc, indent=2).encode() + b"\n"

    def _count(self, path: str) -> dict[str, int]:
        """Count one request of ``path`` (nats-server's ``http_req_stats``)."""
        self.requests[path] = self.requests.get(path, 0) + 1
        return self.requests
