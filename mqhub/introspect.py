"""Read-only views of a running hub, shared by the JSON API, /metrics, the manhole and the CLI.

Everything here uses the core's public API (docs/core-api.md) and the listener services'
public attributes; nothing is computed per message. Listings are paginated server-side and
sorted with a bounded heap, so a page over 100,000 queues stays cheap.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from operator import attrgetter
from typing import Any

from twisted.logger import Logger

from mqhub.listener import ListenerService, walk_listeners
from mqhub.records import format_id, parse_id

log = Logger(namespace="mqhub.introspect")

#: Sort keys accepted by :meth:`Inspector.queue_page` (prefix ``-`` for descending).
QUEUE_SORTS: dict[str, Callable[[Any], Any]] = {
    "name": attrgetter("name"),
    "depth": attrgetter("depth"),
    "in_flight": attrgetter("in_flight"),
    "deferred": attrgetter("deferred"),
    "dead": attrgetter("dead_letter_count"),
    "messages": attrgetter("message_count"),
    "consumers": lambda q: len(q.consumers),
}
#: Largest page any listing returns.
MAX_LIMIT = 1000
#: Keys of a rate tracker kept at most (older ones are forgotten).
RATE_KEYS = 20_000
#: Settings ``PATCH /api/queues/{name}`` may change, with their types.
SAFE_SETTINGS: dict[str, type] = {
    "max_attempts": int, "max_size": int, "ttl": float, "msg_timeout": float,
    "window": int, "overflow": str, "expire_to_dead_letters": bool,
}
#: Largest numeric setting accepted (seconds, counts).
MAX_SETTING = 10**12
#: Bytes of a dead letter's body shown as its preview.
PREVIEW_BYTES = 200


class RateTracker:
    """Per-key rates (per second) from monotonic totals sampled whenever they are read."""

    def __init__(self, min_interval: float = 1.0) -> None:
        """Recompute a key's rate at most every ``min_interval`` seconds."""
        self.min_interval = min_interval
        self._seen: dict[Any, tuple[float, float, float]] = {}

    def rate(self, key: Any, total: float, now: float) -> float:
        """The rate of ``total`` for ``key`` between its last two samples ≥ min_interval apart."""
        seen = self._seen.get(key)
        if seen is None:
            if len(self._seen) >= RATE_KEYS:
                self._seen.clear()
            self._seen[key] = (now, total, 0.0)
            return 0.0
        then, before, rate = seen
        if now - then >= self.min_interval:
            rate = max(0.0, (total - before) / (now - then))
            self._seen[key] = (now, total, rate)
        return rate


class CommitObservers:
    """Several observers of a store's group commits behind its one ``on_commit`` hook.

    Each observer is called with the commit's duration in seconds; one that raises is logged
    and the others (and the store) carry on.
    """

    def __init__(self) -> None:
        """No observers yet."""
        self.observers: list[Callable[[float], None]] = []

    def __call__(self, seconds: float) -> None:
        """Hand one commit's duration to every observer."""
        for observe in list(self.observers):
            try:
                observe(seconds)
            except Exception:  # noqa: BLE001 - an observer must never fail a commit
                log.failure("a store commit observer failed")


def add_commit_observer(store: Any, observer: Callable[[float], None]) -> bool:
    """Call ``observer(seconds)`` after each of ``store``'s group commits, beside any others.

    The store's ``on_commit`` becomes a :class:`CommitObservers` (keeping a hook set before).
    Returns False when the store reports no commits (it has no ``on_commit``).
    """
    if not hasattr(store, "on_commit"):
        return False
    hook = store.on_commit
    if not isinstance(hook, CommitObservers):
        fan = CommitObservers()
        if hook is not None:
            fan.observers.append(hook)
        store.on_commit = hook = fan
    hook.observers.append(observer)
    return True


def remove_commit_observer(store: Any, observer: Callable[[float], None]) -> None:
    """Stop calling ``observer`` after ``store``'s commits (nothing when it was not added)."""
    hook = getattr(store, "on_commit", None)
    if isinstance(hook, CommitObservers) and observer in hook.observers:
        hook.observers.remove(observer)


def clamp(value: Any, default: int, low: int = 0, high: int = MAX_LIMIT) -> int:
    """``value`` as an int within [low, high], or ``default`` when it is not a number."""
    try:
        n = int(value)
    except (TypeError, ValueError):
        return default
    return max(low, min(high, n))


class Inspector:
    """Views of one hub; ``root`` is its HubService (listeners), ``None`` in unit tests.

    :ivar skip: top-level service names not reported as protocols (the admin surfaces).
    """

    def __init__(self, hub: Any, root: Any = None) -> None:
        """Remember the hub and the start time (uptime)."""
        self.hub = hub
        self.root = root
        self.started_at = hub.clock.seconds()
        self.skip = {"admin", "manhole"}
        self.protocol_rates = RateTracker()
        self.queue_rates = RateTracker()
        #: protocol alias -> plugin name (the counters use wire names such as "nats" for mq9)
        self.aliases = {alias: p.name for p in hub.config.get("plugins") or ()
                        for alias in getattr(p, "aliases", ())}

    @property
    def broker(self) -> Any:
        """The hub's broker core."""
        return self.hub.broker

    def now(self) -> float:
        """The hub clock's time."""
        return float(self.hub.clock.seconds())

    # listeners and connections -------------------------------------------------------------

    def listeners(self) -> list[tuple[str, ListenerService]]:
        """``(protocol, listener)`` for every protocol listener (admin surfaces excluded)."""
        if self.root is None:
            return []
        return [(n, ls) for n, ls in walk_listeners(self.root)
                if n not in self.skip and not ls.observer]

    def protocols(self) -> list[str]:
        """Names of the protocol services the hub runs."""
        if self.root is None:
            return []
        return [c.name for c in self.root if c.name not in self.skip]

    def connections(self) -> list[dict[str, Any]]:
        """Every open client connection: protocol, listener, peer, since, counters; then the
        peers protocol services track themselves (:meth:`peer_connections`)."""
        out = []
        for protocol, ls in self.listeners():
            for conn in ls.connections:
                peer = conn.transport.getPeer()
                row: dict[str, Any] = {
                    "protocol": protocol, "listener": ls.name,
                    "peer": f"{getattr(peer, 'host', '?')}:{getattr(peer, 'port', '?')}",
                    "since": ls.connected_since(conn),
                }
                for attr in ("message_count", "finish_count", "requeue_count", "in_msgs",
                             "out_msgs", "client_id", "name"):
                    value = getattr(conn, attr, None)
                    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
                        row[attr] = value
                out.append(row)
        return out + self.peer_connections()

    def connection_counts(self) -> dict[str, int]:
        """Open connections per protocol (every protocol service listed, even with none)."""
        counts = dict.fromkeys(self.protocols(), 0)
        for protocol, ls in self.listeners():
            counts[protocol] = counts.get(protocol, 0) + len(ls.connections)
        for protocol, service in self._peer_sources():
            count = getattr(service, "peer_count", None)
            n = count() if callable(count) else len(service.peers())
            counts[protocol] = counts.get(protocol, 0) + n
        return counts

    def peer_connections(self) -> list[dict[str, Any]]:
        """Connections a protocol service tracks itself through a ``peers()`` method (eMQP:
        the ZeroMQ identities its router knows), each row with its ``protocol``."""
        return [{"protocol": protocol, **row}
                for protocol, service in self._peer_sources() for row in service.peers()]

    def _peer_sources(self) -> list[tuple[str, Any]]:
        """(protocol, service) of each protocol service that tracks its own peers: it has a
        ``peers()`` method, and may have ``peer_count()`` (counted without building the rows:
        eMQP's can hold 20,000, which took about 11 ms to build)."""
        return self._services_with("peers")

    def _services_with(self, method: str) -> list[tuple[str, Any]]:
        """(protocol, service) of each protocol service (skipped ones left out) that has a
        callable ``method``."""
        return [(child.name, child) for child in (list(self.root) if self.root is not None else [])
                if child.name not in self.skip and callable(getattr(child, method, None))]

    def protocol_counters(self) -> dict[str, dict[str, int]]:
        """Per protocol: the monotonic totals its service reports through a ``counters()``
        method (NATS: ``slow_consumers``, ``bridge_refused``...; eMQP: ``dropped``...), whole
        numbers only. A service whose ``counters()`` raises is logged and left out."""
        out: dict[str, dict[str, int]] = {}
        for name, service in self._services_with("counters"):
            try:
                row = service.counters()
            except Exception:  # noqa: BLE001 - one protocol must not break the stats page
                log.failure("counters of {name} failed", name=name)
                continue
            out[name] = {str(k): int(v) for k, v in row.items()
                               if isinstance(v, int) and not isinstance(v, bool)}
        return out

    def health(self) -> tuple[bool, dict[str, Any]]:
        """(healthy, details): the store is open and every protocol listener is listening.

        ``listener_states`` names every listener (the admin and manhole ones too) with its
        state (``listening``, ``starting``, ``failed``, ``draining``, ``stopped``) and endpoint; a service
        that binds its own sockets (eMQP) is listed under its name.
        """
        problems = []
        store_open = bool(getattr(self.hub.store, "is_open", True))
        if not store_open:
            problems.append("store is not open")
        listening = {}
        for protocol, ls in self.listeners():
            up = ls.running and ls.port is not None
            listening[ls.name or protocol] = up
            if not up:
                problems.append(f"listener {ls.name or protocol} is not listening")
        details: dict[str, Any] = {"store_open": store_open, "listeners": listening,
                                   "listener_states": self.listener_states()}
        cluster = getattr(self.broker, "health", None)   # cluster mode (docs/cluster.md)
        if cluster is not None:
            details["cluster"] = state = cluster()
            problems += [f"cluster: {state['problem']}"] if state.get("problem") else []
        return not problems, {"status": "ok" if not problems else "unhealthy", **details,
                              "problems": problems}

    def listener_states(self) -> dict[str, dict[str, Any]]:
        """Every listener's ``{"state": ..., "endpoint": ...}`` by name (see :meth:`health`)."""
        if self.root is None:
            return {}
        out: dict[str, dict[str, Any]] = {}
        tops = set()
        for top, ls in walk_listeners(self.root):
            tops.add(top)
            out[ls.name or top] = {"state": ls.state, "endpoint": ls.endpoint}
        for child in self.root:
            if child.name not in tops:
                out[child.name] = {"state": "listening" if child.running else "stopped",
                                   "endpoint": getattr(child, "endpoints", None)}
        return out

    # figures ------------------------------------------------------------------------------

    def totals(self) -> dict[str, dict[str, int]]:
        """The core's counters per protocol, keyed by plugin name (aliases folded in)."""
        out: dict[str, dict[str, int]] = {}
        for name, row in self.broker.counters.snapshot().items():
            mine = out.setdefault(self.aliases.get(name, name), dict.fromkeys(row, 0))
            for field, n in row.items():
                mine[field] = mine.get(field, 0) + n
        return out

    def protocol_stats(self) -> dict[str, dict[str, Any]]:
        """Per protocol: connections, published/delivered/acked totals and their rates, then
        the protocol's own counters (:meth:`protocol_counters`; never over those fields)."""
        now = self.now()
        totals = self.totals()
        counts = self.connection_counts()
        own = self.protocol_counters()
        out: dict[str, dict[str, Any]] = {}
        for name in sorted(set(totals) | set(counts) | set(own)):
            row: dict[str, Any] = {"connections": counts.get(name, 0)}
            for field in ("published", "delivered", "acked"):
                n = totals.get(name, {}).get(field, 0)
                row[field] = n
                row[f"{field}_rate"] = round(self.protocol_rates.rate((name, field), n, now), 1)
            for field, n in own.get(name, {}).items():
                row.setdefault(field, n)
            out[name] = row
        return out

    def store_stats(self) -> dict[str, Any]:
        """A copy of the store's own counters (``used_bytes``, ``commits``, ... as it has them)."""
        return dict(self.hub.store.stats())

    def stats(self) -> dict[str, Any]:
        """The /api/stats document: uptime, protocols, store, core and dead-letter totals."""
        queues = self.broker.queues()
        depth = in_flight = dead = 0
        for q in queues:
            depth += q.depth
            in_flight += q.in_flight
            dead += q.dead_letter_count
        return {
            "uptime": round(self.now() - self.started_at, 3),
            "protocols": self.protocol_stats(),
            "store": self.store_stats(),
            "core": self.broker.stats(),
            "queues": len(queues),
            "depth": depth,
            "in_flight": in_flight,
            "dead_letters": dead,
            "dead_lettered": dict(self.broker.counters.dead),
            "expired": dict(self.broker.counters.expired),
            "purged": dict(self.broker.counters.purged),
        }

    # queues -------------------------------------------------------------------------------

    def queue_row(self, q: Any, now: float) -> dict[str, Any]:
        """The listing row of one queue."""
        return {
            "name": q.name, "tier": q.tier, "mode": q.mode, "depth": q.depth,
            "in_flight": q.in_flight, "deferred": q.deferred, "dead": q.dead_letter_count,
            "consumers": len(q.consumers), "paused": q.paused, "messages": q.message_count,
            "rate": round(self.queue_rates.rate(q.name, q.message_count, now), 1),
            "max_attempts": q.max_attempts,
        }

    def queue_page(self, offset: Any = 0, limit: Any = 50, sort: str = "name",
                   q: str = "") -> dict[str, Any]:
        """One page of queues filtered by substring ``q`` and sorted by ``sort`` (``-`` = desc).

        :raises ValueError: for an unknown sort key.
        """
        offset = clamp(offset, 0, 0, 10**9)
        limit = clamp(limit, 50, 1)
        sort = sort or "name"
        reverse = sort.startswith("-")
        key = QUEUE_SORTS.get(sort.lstrip("-"))
        if key is None:
            raise ValueError(f"unknown sort {sort!r}; one of {', '.join(QUEUE_SORTS)}")
        queues = self.broker.queues()
        if q:
            queues = [x for x in queues if q in x.name]
        total = len(queues)
        want = offset + limit
        if want * 8 >= total:  # a deep page: one full sort beats a heap of most of the list
            chosen = sorted(queues, key=key, reverse=reverse)
        elif reverse:
            chosen = heapq.nlargest(want, queues, key=key)
        else:
            chosen = heapq.nsmallest(want, queues, key=key)
        now = self.now()
        rows = [self.queue_row(x, now) for x in chosen[offset:want]]
        return {"total": total, "offset": offset, "limit": limit, "sort": sort, "q": q,
                "queues": rows}

    def queue_detail(self, name: str) -> dict[str, Any] | None:
        """Everything about one queue (None when it does not exist)."""
        queue = self.broker.queue(name)
        if queue is None:
            return None
        row = self.queue_row(queue, self.now())
        row["stats"] = queue.stats()
        row["settings"] = {
            "max_attempts": queue.max_attempts, "max_size": queue.max_size,
            "overflow": queue.overflow, "ttl": queue.ttl, "msg_timeout": queue.msg_timeout,
            "expires_at": queue.expires_at, "auto_delete": queue.auto_delete,
            "window": queue.window,
        }
        row["bindings"] = [b.pattern for b in self.broker.bindings(name)]
        row["consumer_list"] = [
            {"protocol": getattr(c.target, "protocol_name", ""), "in_flight": c.in_flight}
            for c in queue.consumers
        ]
        return row

    @staticmethod
    def check_settings(body: Any) -> dict[str, Any]:
        """Validate a settings PATCH body; return the settings to apply.

        :raises ValueError: unknown key, wrong type or negative number.
        """
        if not isinstance(body, dict) or not body:
            raise ValueError("expected a JSON object of settings")
        out: dict[str, Any] = {}
        for key, value in body.items():
            kind = SAFE_SETTINGS.get(key)
            if kind is None:
                raise ValueError(f"{key!r} cannot be changed; settable: {', '.join(SAFE_SETTINGS)}")
            if kind is bool:
                if not isinstance(value, bool):
                    raise ValueError(f"{key} must be true or false")
            elif kind is str:
                if not isinstance(value, str):
                    raise ValueError(f"{key} must be a string")
            else:
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise ValueError(f"{key} must be a number")
                if not math.isfinite(value) or value < 0 or value > MAX_SETTING:
                    raise ValueError(f"{key} must be a finite number from 0 to {MAX_SETTING}")
                value = kind(value)
            out[key] = value
        return out

    # addresses, mailboxes, schedules --------------------------------------------------------

    def addresses(self, offset: Any = 0, limit: Any = 100, q: str = "") -> dict[str, Any]:
        """Bindings grouped per address pattern: bound queues and live subscribers per protocol."""
        grouped: dict[str, dict[str, Any]] = {}
        for b in self.broker.bindings():
            if q and q not in b.pattern:
                continue
            row = grouped.get(b.pattern)
            if row is None:
                row = grouped[b.pattern] = {"address": b.pattern, "queues": [], "subscribers": {}}
            if b.queue is not None:
                row["queues"].append(b.queue.name)
            else:
                proto = getattr(b.target, "protocol_name", "") or "?"
                row["subscribers"][proto] = row["subscribers"].get(proto, 0) + 1
        names = sorted(grouped)
        offset = clamp(offset, 0, 0, 10**9)
        limit = clamp(limit, 100, 1)
        return {"total": len(names), "offset": offset, "limit": limit,
                "addresses": [grouped[n] for n in names[offset:offset + limit]]}

    def mailboxes(self, offset: Any = 0, limit: Any = 100) -> dict[str, Any]:
        """mq9 mailboxes (their core queues ``mq9/box/<id>/<priority>``) with depths."""
        from mqhub.protocols.nats.mailbox import QUEUE_PREFIX

        boxes: dict[str, dict[str, Any]] = {}
        for queue in self.broker.queues():
            name = queue.name
            if not name.startswith(QUEUE_PREFIX):
                continue
            mail_id, _, priority = name[len(QUEUE_PREFIX):].rpartition("/")
            box = boxes.get(mail_id)
            if box is None:
                box = boxes[mail_id] = {"mail_id": mail_id, "expires_at": queue.expires_at,
                                        "consumers": 0}
            box[priority] = queue.depth
            box["consumers"] += len(queue.consumers)
        ids = sorted(boxes)
        offset = clamp(offset, 0, 0, 10**9)
        limit = clamp(limit, 100, 1)
        return {"total": len(ids), "offset": offset, "limit": limit,
                "mailboxes": [boxes[i] for i in ids[offset:offset + limit]]}

    def schedules(self, limit: Any = 100) -> dict[str, Any]:
        """Recurring schedules (eMQP SCHEDULE) and one-shot delays the scheduler holds."""
        scheduler = self.hub.scheduler
        limit = clamp(limit, 100, 1)
        if scheduler is None:
            return {"schedules": [], "pending": 0, "delayed": [], "deferred_messages": 0,
                    "workers": self.emqp_workers(limit)}
        runs = scheduler.run_counts()
        rows = []
        for key, spec in sorted(scheduler.schedules().items())[:limit]:
            rows.append({"key": key.decode("utf-8", "replace"), "interval": spec.interval,
                         "cron": spec.cron, "run_count": spec.run_count,
                         "runs": runs.get(key, 0)})
        pending = scheduler.pending_keys()
        delayed = [{"key": k.decode("utf-8", "replace"), "due": when}
                   for k, when in sorted(pending.items(), key=lambda kv: kv[1])[:limit]]
        deferred = sum(q.deferred for q in self.broker.queues())
        return {"schedules": rows, "pending": len(pending), "delayed": delayed,
                "deferred_messages": deferred, "workers": self.emqp_workers(limit)}

    def emqp_workers(self, limit: int = 100) -> list[dict[str, Any]]:
        """eMQP jobmanagers connected to the backend: queues, free slots, jobs in flight."""
        keys = ("protocol", "peer", "queues", "slots", "in_flight", "last_seen")
        workers = [row for row in self.peer_connections() if row.get("kind") == "worker"]
        return [{k: row[k] for k in keys} for row in workers[:limit]]

    # dead letters ---------------------------------------------------------------------------

    def dlq_queues(self) -> list[dict[str, Any]]:
        """Queues that hold dead letters, with their counts (by reason: :meth:`dlq_reasons`)."""
        return [{"queue": q.name, "dead": q.dead_letter_count, "depth": q.depth}
                for q in self.broker.queues() if q.dead_letter_count > 0]

    @staticmethod
    def dead_letter_row(dl: Any) -> dict[str, Any]:
        """The JSON form of one DeadLetter (the id as 16 hex chars: JSON numbers lose 64 bits)."""
        return {
            "id": format_id(dl.msg_id), "reason": dl.reason, "origin": dl.origin,
            "address": dl.address, "attempts": dl.attempts, "last_error": dl.last_error,
            "dead_at": dl.dead_at, "priority": dl.priority, "size": len(dl.body),
            "preview": dl.body[:PREVIEW_BYTES].decode("utf-8", "replace"),
        }

    @staticmethod
    def parse_ids(values: Any) -> list[int]:
        """Message ids given as 16-hex strings or integers.

        :raises ValueError: when one is neither.
        """
        if not isinstance(values, list):
            raise ValueError("ids must be a list")
        out = []
        for v in values:
            if isinstance(v, int) and not isinstance(v, bool):
                out.append(v)
            elif isinstance(v, str):
                out.append(parse_id(v))
            else:
                raise ValueError(f"bad message id {v!r}")
        return out


__all__ = ["Inspector", "RateTracker", "CommitObservers", "add_commit_observer",
           "remove_commit_observer", "walk_listeners", "QUEUE_SORTS", "SAFE_SETTINGS"]
