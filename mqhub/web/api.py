"""The admin JSON API (``/api/...`` and ``/healthz``) as one twisted.web resource.

Routes are dispatched from an explicit table on (method, first path segment). Every answer
is JSON; errors are ``{"error": "..."}`` with an HTTP status. Anything that changes state is a
POST or PATCH with a ``Content-Type: application/json`` request (so a cross-site form cannot
forge it) and, when the admin token is set, ``Authorization: Bearer TOKEN``.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from twisted.internet.defer import Deferred, maybeDeferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET

from mqhub.errors import InvalidName, MqhubError, NoSuchQueue
from mqhub.history import History
from mqhub.introspect import Inspector, clamp

log = Logger()

#: Largest request body accepted (bytes).
MAX_BODY = 1 << 20


class ApiError(Exception):
    """An error answered as ``{"error": message}`` with ``status``."""

    def __init__(self, status: int, message: str) -> None:
        """Remember the status and message."""
        super().__init__(message)
        self.status = status
        self.message = message


def _arg(request: Any, name: str, default: str = "") -> str:
    """The first value of query argument ``name`` as text."""
    values = request.args.get(name.encode())
    return values[0].decode("utf-8", "replace") if values else default


class ApiResource(Resource):
    """``/api/*`` and ``/healthz``: a leaf resource routing on the path itself."""

    isLeaf = True
    #: what ``/api/history`` and a queue's detail read (None: 404, and no series in the detail)
    history: History | None = None

    def __init__(self, inspector: Inspector, token: str | None = None,
                 identity: Any = None) -> None:
        """:param token: the admin token state changes need (None: none needed).
        :param identity: the hub's identity Directory (``/api/users/reload``, the ``auth``
            row of ``/api/stats``), or None."""
        super().__init__()
        self.inspector = inspector
        self.token = token
        self.identity = identity
        self.routes: dict[tuple[bytes, str], Callable[..., Any]] = {
            (b"GET", "healthz"): self.get_health,
            (b"GET", "stats"): self.get_stats,
            (b"GET", "queues"): self.get_queues,
            (b"PATCH", "queues"): self.patch_queue,
            (b"POST", "queues"): self.post_queue,
            (b"GET", "addresses"): self.get_addresses,
            (b"GET", "connections"): self.get_connections,
            (b"GET", "mailboxes"): self.get_mailboxes,
            (b"GET", "schedules"): self.get_schedules,
            (b"GET", "dlq"): self.get_dlq,
            (b"POST", "dlq"): self.post_dlq,
            (b"POST", "users"): self.post_users,
            (b"GET", "lameduck"): self.get_lameduck,
            (b"POST", "lameduck"): self.post_lameduck,
        }
        self.routes[(b"GET", "history")] = self.get_history

    # plumbing ----------------------------------------------------------------------------

    def render(self, request: Any) -> Any:
        """Route the request; write the JSON answer now or when its Deferred fires."""
        # /healthz or /api/<what>/<rest...>: split the raw path so %2F stays inside a name
        raw = request.path.decode("utf-8", "replace").split("?")[0].strip("/").split("/")
        parts = [unquote(p) for p in raw]
        if parts and parts[0] == "api":
            parts = parts[1:]
        what = parts[0] if parts else ""
        handler = self.routes.get((request.method, what))
        try:
            if handler is None:
                known = {m.decode() for (m, w) in self.routes if w == what}
                if known:
                    raise ApiError(405, f"method {request.method.decode()} not allowed; use "
                                        f"{', '.join(sorted(known))}")
                raise ApiError(404, f"no such endpoint /api/{what}")
            if request.method in (b"POST", b"PATCH", b"PUT", b"DELETE"):
                self.check_write(request)
            result = handler(request, parts[1:])
        except Exception as exc:  # noqa: BLE001 - every failure becomes a JSON error
            return self.error(request, exc)
        if isinstance(result, Deferred):
            result.addCallbacks(lambda r: self.finish(request, r),
                                lambda f: self.finish_error(request, f))
            return NOT_DONE_YET
        return self.body(request, result)

    def check_write(self, request: Any) -> None:
        """State changes: JSON content type, same-origin if an Origin is sent, the token if set.

        :raises ApiError: 415, 403 or 401.
        """
        ctype = (request.getHeader("content-type") or "").split(";")[0].strip().lower()
        if ctype != "application/json":
            raise ApiError(415, "state changes need Content-Type: application/json")
        origin = request.getHeader("origin")
        host = request.getHeader("host")
        if origin and host and origin.split("://", 1)[-1] != host:
            raise ApiError(403, "cross-origin state change refused")
        if self.token is not None:
            given = request.getHeader("authorization") or ""
            if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
                raise ApiError(401, "missing or wrong admin token (Authorization: Bearer TOKEN)")

    @staticmethod
    def json_body(request: Any) -> Any:
        """The request's JSON body (``{}`` when empty).

        :raises ApiError: 413 or 400.
        """
        data = request.content.read(MAX_BODY + 1) if request.content is not None else b""
        if len(data) > MAX_BODY:
            raise ApiError(413, "request body too large")
        if not data.strip():
            return {}
        try:
            return json.loads(data)
        except ValueError as exc:
            raise ApiError(400, f"body is not JSON: {exc}") from None

    @staticmethod
    def body(request: Any, result: Any, status: int = 200) -> bytes:
        """Serialise ``result`` as the JSON answer."""
        if isinstance(result, tuple):
            status, result = result
        request.setResponseCode(status)
        request.setHeader(b"content-type", b"application/json; charset=utf-8")
        request.setHeader(b"cache-control", b"no-store")
        return json.dumps(result, default=str).encode() + b"\n"

    def error(self, request: Any, exc: BaseException) -> bytes:
        """Map an exception to its status and JSON error body."""
        if isinstance(exc, ApiError):
            return self.body(request, (exc.status, {"error": exc.message}))
        if isinstance(exc, NoSuchQueue):
            return self.body(request, (404, {"error": f"no such queue: {exc}"}))
        if isinstance(exc, (ValueError, InvalidName, MqhubError)):
            return self.body(request, (400, {"error": str(exc)}))
        log.failure("admin API request failed", Failure(exc))
        return self.body(request, (500, {"error": "internal error (see the broker log)"}))

    def finish(self, request: Any, result: Any) -> None:
        """Write a late answer (unless the client went away)."""
        if not request.finished and not getattr(request, "_disconnected", False):
            request.write(self.body(request, result))
            request.finish()

    def finish_error(self, request: Any, failure: Failure) -> None:
        """Write a late error answer."""
        if not request.finished and not getattr(request, "_disconnected", False):
            request.write(self.error(request, failure.value))
            request.finish()

    def _queue_name(self, rest: list[str]) -> str:
        """The queue named by the path (``%2F`` inside a name is decoded).

        :raises ApiError: 404 when missing or unknown.
        """
        if not rest or not rest[0]:
            raise ApiError(404, "no queue named in the path")
        name = rest[0]
        if self.inspector.broker.queue(name) is None:
            raise ApiError(404, f"no such queue: {name}")
        return name

    # handlers ----------------------------------------------------------------------------

    def get_health(self, request: Any, rest: list[str]) -> Any:
        """200 when healthy, else 503, with the reasons."""
        ok, details = self.inspector.health()
        return (200 if ok else 503), details

    def get_stats(self, request: Any, rest: list[str]) -> Any:
        """/api/stats (with the identity directory's ``auth`` row: denials, sessions)."""
        stats = self.inspector.stats()
        if self.identity is not None:
            stats["auth"] = self.identity.stats()
        return stats

    def post_users(self, request: Any, rest: list[str]) -> Any:
        """POST /api/users/reload: re-read the users file (as SIGHUP does)."""
        from mqhub.identity import UsersFileError

        if rest[:1] != ["reload"]:
            raise ApiError(404, "users actions: reload")
        self.json_body(request)
        if self.identity is None or not self.identity.enforcing:
            raise ApiError(409, "no users file is configured (twistd mqhub --users FILE)")
        try:
            return {"reloaded": True, **self.identity.reload()}
        except UsersFileError as exc:
            raise ApiError(400, f"users file not reloaded, the rights in force stay: {exc}") from None

    def get_queues(self, request: Any, rest: list[str]) -> Any:
        """/api/queues (a page) or /api/queues/{name} (one queue)."""
        if rest and rest[0]:
            detail = self.inspector.queue_detail(rest[0])
            if detail is None:
                raise ApiError(404, f"no such queue: {rest[0]}")
            if self.history is not None:
                self.history.watch(rest[0])
                detail["history"] = self.history.queue_history(rest[0], _arg(request, "window", "10m"))
            return detail
        return self.inspector.queue_page(_arg(request, "offset", "0"), _arg(request, "limit", "50"),
                                         _arg(request, "sort", "name"), _arg(request, "q"))

    def patch_queue(self, request: Any, rest: list[str]) -> Any:
        """PATCH /api/queues/{name} with safe settings, e.g. ``{"max_attempts": 3}``."""
        name = self._queue_name(rest)
        settings = self.inspector.check_settings(self.json_body(request))
        self.inspector.broker.queue(name).configure(**settings)
        return self.inspector.queue_detail(name)

    def post_queue(self, request: Any, rest: list[str]) -> Any:
        """POST /api/queues/{name}/pause | resume | purge."""
        name = self._queue_name(rest)
        action = rest[1] if len(rest) > 1 else ""
        queue = self.inspector.broker.queue(name)
        self.json_body(request)
        if action == "pause":
            queue.pause()
        elif action == "resume":
            queue.unpause()
        elif action == "purge":
            d = maybeDeferred(queue.empty)
            return d.addCallback(lambda _: {"queue": name, "purged": True})
        else:
            raise ApiError(404, "queue actions: pause, resume, purge")
        return {"queue": name, "paused": queue.paused}

    def get_history(self, request: Any, rest: list[str]) -> Any:
        """/api/history?series=a,b&window=10m|24h (docs/operations.md)."""
        if self.history is None:
            raise ApiError(404, "no history on this listener")
        series = [s.strip() for s in _arg(request, "series").split(",")]
        return self.history.read(_arg(request, "window", "10m"), series)

    def get_addresses(self, request: Any, rest: list[str]) -> Any:
        """/api/addresses."""
        return self.inspector.addresses(_arg(request, "offset", "0"), _arg(request, "limit", "100"),
                                        _arg(request, "q"))

    def get_connections(self, request: Any, rest: list[str]) -> Any:
        """/api/connections."""
        conns = self.inspector.connections()
        return {"total": len(conns), "connections": conns,
                "by_protocol": self.inspector.connection_counts()}

    def get_mailboxes(self, request: Any, rest: list[str]) -> Any:
        """/api/mailboxes (mq9)."""
        return self.inspector.mailboxes(_arg(request, "offset", "0"), _arg(request, "limit", "100"))

    def get_schedules(self, request: Any, rest: list[str]) -> Any:
        """/api/schedules (eMQP schedules and delayed messages)."""
        return self.inspector.schedules(_arg(request, "limit", "100"))

    def get_dlq(self, request: Any, rest: list[str]) -> Any:
        """/api/dlq (queues with dead letters) or /api/dlq/{queue}?offset=&limit= (letters)."""
        if not rest or not rest[0]:
            queues = self.inspector.dlq_queues()
            return self._with_reasons(queues)
        name = self._queue_name(rest)
        offset = clamp(_arg(request, "offset", "0"), 0, 0, 10_000)
        limit = clamp(_arg(request, "limit", "50"), 50, 1)
        d = self.inspector.broker.dead_letters(name, limit=offset + limit)

        def page(letters: list[Any]) -> Any:
            """The requested slice in JSON form."""
            q = self.inspector.broker.queue(name)
            return {"queue": name, "total": q.dead_letter_count if q else 0, "offset": offset,
                    "limit": limit,
                    "dead_letters": [Inspector.dead_letter_row(x) for x in letters[offset:]]}

        return d.addCallback(page)

    def _with_reasons(self, queues: list[dict[str, Any]]) -> Deferred[Any]:
        """Add counts by reason to each listed queue (from its first 1,000 dead letters)."""
        broker = self.inspector.broker
        result: dict[str, Any] = {"total": len(queues), "queues": queues[:MAX_REASON_QUEUES]}
        d: Deferred[Any] = Deferred()
        rows = result["queues"]

        def next_one(i: int) -> None:
            """Count reasons of queue ``i``, then the next one."""
            if i >= len(rows):
                d.callback(result)
                return

            def got(letters: list[Any]) -> None:
                """Tally the reasons of this queue."""
                reasons: dict[str, int] = {}
                for dl in letters:
                    reasons[dl.reason] = reasons.get(dl.reason, 0) + 1
                rows[i]["reasons"] = reasons
                rows[i]["reasons_sampled"] = len(letters) >= 1000
                next_one(i + 1)

            dd = broker.dead_letters(rows[i]["queue"], limit=1000)
            dd.addCallbacks(got, d.errback)

        next_one(0)
        return d

    def post_dlq(self, request: Any, rest: list[str]) -> Any:
        """POST /api/dlq/{queue}/replay | purge, body ``{}`` (all) or ``{"ids": [...]}``."""
        name = self._queue_name(rest)
        action = rest[1] if len(rest) > 1 else ""
        body = self.json_body(request)
        ids = None
        if isinstance(body, dict) and body.get("ids") is not None:
            ids = Inspector.parse_ids(body["ids"])
        broker = self.inspector.broker
        if action == "replay":
            d = broker.replay_dead_letters(name, ids)
            return d.addCallback(lambda n: {"queue": name, "replayed": n})
        if action == "purge":
            d = broker.purge_dead_letters(name, ids)
            return d.addCallback(lambda n: {"queue": name, "purged": n})
        raise ApiError(404, "dead-letter actions: replay, purge")

    def _lame_duck(self) -> Any:
        """The hub's lame-duck controller.

        :raises ApiError: 501 when this hub has none (not started by twistd).
        """
        lame = getattr(self.inspector.root, "lame_duck", None)
        if lame is None:
            raise ApiError(501, "this hub has no lame-duck mode (not run by twistd)")
        return lame

    def get_lameduck(self, request: Any, rest: list[str]) -> Any:
        """/api/lameduck: whether lame-duck mode is on, its timing and the clients left."""
        return self._lame_duck().status()

    def post_lameduck(self, request: Any, rest: list[str]) -> Any:
        """POST /api/lameduck, body ``{}`` or ``{"duration": s, "grace": s}``: enter lame-duck
        mode (as SIGUSR2); 202 with the status, since the hub stops once clients are gone."""
        body = self.json_body(request)
        if not isinstance(body, dict):
            raise ApiError(400, "body must be a JSON object")
        timing = {}
        for key in ("duration", "grace"):
            value = body.get(key)
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                    raise ApiError(400, f"{key} must be a number of seconds >= 0")
                timing[key] = float(value)
        return 202, self._lame_duck().start(**timing)


#: Queues whose dead-letter reasons /api/dlq tallies (the rest are listed without them).
MAX_REASON_QUEUES = 100
