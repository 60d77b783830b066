"""nsqd's HTTP API (port 4151) plus the nsqlookupd queries, on twisted.web.

Every response carries ``X-NSQ-Content-Type: nsq; version=1.0``. Errors are JSON
``{"message": "CODE"}`` with nsqd's status codes. With a users file (``--users``), POSTs act as
the user of their ``Authorization`` header (``Bearer TOKEN`` or ``Basic``), else as anonymous:
``/pub`` and ``/mpub`` need the right to publish to the topic, the other POSTs (topics and
channels) ``admin``; refusals are 401 ``AUTH_REQUIRED``/``AUTH_FAILED`` and 403
``UNAUTHORIZED``. nsqd's HTTP API has no auth; reads stay open. Publishing answers ``OK`` only after the store
commit holding the messages. The lookupd endpoints (/lookup, /topics, /channels, /nodes) list
this broker as a producer (with the hub's other NSQ nodes, ``ICore.peers``: none for one node),
so clients configured with lookupd HTTP addresses find it.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Callable
from typing import Any

from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import server
from twisted.web.resource import Resource

from mqhub.errors import MqhubError
from mqhub.protocols.nsq.codec import is_valid_name
from mqhub.protocols.nsq.stats import build_stats, render_text_stats
from mqhub.protocols.nsq.topics import topic_address

log = Logger(namespace="mqhub.nsq.http")

_JSON = b"application/json; charset=utf-8"
_TEXT = b"text/plain; charset=utf-8"


def _host(request: Any) -> str:
    """The client's host (failed logins are counted per host)."""
    addr = request.getClientAddress()
    return str(getattr(addr, "host", "") or addr)


class HttpError(Exception):
    """An HTTP error answer: status and nsqd's message code."""

    def __init__(self, status: int, message: str) -> None:
        """:param message: e.g. ``MISSING_ARG_TOPIC``."""
        super().__init__(status, message)
        self.status = status
        self.message = message


class BoundedRequest(server.Request):
    """A request that keeps at most ``max_body`` body bytes, in memory or spooled to disk.

    Twisted spools a large body to a temporary file and sets no limit, so one POST could fill
    the disk. Past ``max_body`` the rest of the body is read and dropped (the connection stays
    usable) and :class:`NsqHttpResource` answers nsqd's 413.
    """

    max_body = 5 * 1024 * 1024 + 1
    body_too_big = False
    _body_seen = 0
    content: Any

    def gotLength(self, length: int | None) -> None:
        """Refuse to spool a declared length over the limit."""
        if length is not None and length > self.max_body:
            self._drop_body()
            return
        super().gotLength(length)

    def handleContentChunk(self, data: bytes) -> None:
        """Keep body bytes up to the limit (chunked bodies declare no length)."""
        if self.body_too_big:
            return
        self._body_seen += len(data)
        if self._body_seen > self.max_body:
            self._drop_body()
            return
        super().handleContentChunk(data)

    def _drop_body(self) -> None:
        """Forget what was kept and keep nothing more."""
        old = getattr(self, "content", None)
        if old is not None:
            old.close()
        self.body_too_big = True
        self.content = io.BytesIO()


def request_factory(max_body: int) -> type[BoundedRequest]:
    """A :class:`BoundedRequest` class keeping at most ``max_body`` bytes (for Site.requestFactory)."""
    return type("NsqHttpRequest", (BoundedRequest,), {"max_body": max_body})


class NsqHttpResource(Resource):
    """The whole nsqd (and lookupd-query) HTTP surface as one leaf resource.

    :param service: the :class:`mqhub.protocols.nsq.service.NsqService` (config, registry,
        factory with its clients, bound ports, hub).
    """

    isLeaf = True

    def __init__(self, service: Any) -> None:
        """Build the route table."""
        super().__init__()
        self.service = service
        self.config = service.config
        get, post = (b"GET", b"HEAD"), (b"POST", b"PUT")
        self.routes: dict[bytes, tuple[tuple[bytes, ...], Callable[[Any], Any]]] = {
            b"/ping": (get, self.ping),
            b"/info": (get, self.info),
            b"/pub": (post, self.pub),
            b"/mpub": (post, self.mpub),
            b"/stats": (get, self.stats),
            b"/topic/create": (post, self.topic_create),
            b"/topic/delete": (post, self.topic_delete),
            b"/topic/empty": (post, self.topic_empty),
            b"/topic/pause": (post, self.topic_pause),
            b"/topic/unpause": (post, self.topic_unpause),
            b"/channel/create": (post, self.channel_create),
            b"/channel/delete": (post, self.channel_delete),
            b"/channel/empty": (post, self.channel_empty),
            b"/channel/pause": (post, self.channel_pause),
            b"/channel/unpause": (post, self.channel_unpause),
            b"/lookup": (get, self.lookup),
            b"/topics": (get, self.topics),
            b"/channels": (get, self.channels),
            b"/nodes": (get, self.nodes),
        }

    # plumbing ---------------------------------------------------------------------------------

    def render(self, request: Any) -> Any:
        """Dispatch by path and method; map HttpError and domain errors to nsqd's answers."""
        request.setHeader(b"X-NSQ-Content-Type", b"nsq; version=1.0")
        route = self.routes.get(request.path.rstrip(b"/") or b"/")
        if route is None:
            return self._error(request, HttpError(404, "NOT_FOUND"))
        methods, handler = route
        if request.method not in methods:
            return self._error(request, HttpError(405, "METHOD_NOT_ALLOWED"))
        if getattr(request, "body_too_big", False):
            too_big = "MSG_TOO_BIG" if request.path.rstrip(b"/") == b"/pub" else "BODY_TOO_BIG"
            return self._error(request, HttpError(413, too_big))
        guard = self.service.factory.guard
        if guard.enforcing and request.method in (b"POST", b"PUT") and request.getHeader(
                "authorization") and not getattr(request, "mqhub_turn", False):
            wait = guard.wait(_host(request))
            if wait > 0:  # failed logins from this peer: its turn comes later
                request.mqhub_turn = True
                call = self.service.hub.clock.callLater(wait, self._render_later, request)
                request.notifyFinish().addErrback(lambda _: call.active() and call.cancel())
                return server.NOT_DONE_YET
        try:
            if guard.enforcing and request.method in (b"POST", b"PUT"):
                request.mqhub_session = self._caller(request, guard)
            result = handler(request)
        except HttpError as exc:
            return self._error(request, exc)
        except MqhubError as exc:
            log.info("nsq http: {path} failed: {exc}", path=request.path, exc=exc)
            return self._error(request, HttpError(500, "INTERNAL_ERROR"))
        if hasattr(result, "addCallbacks"):
            result.addCallbacks(lambda body: self._finish(request, body),
                                lambda f: self._failed(request, f))
            return server.NOT_DONE_YET
        return self._body(request, result)

    def _render_later(self, request: Any) -> None:
        """Answer a request whose login turn has come."""
        if getattr(request, "_disconnected", False):
            return
        body = self.render(request)
        if body is not server.NOT_DONE_YET:
            request.write(body)
            request.finish()

    @staticmethod
    def _caller(request: Any, guard: Any) -> Any:
        """The session a POST acts as (users file in force).

        :raises HttpError: 401 when the credentials are wrong, or absent and anonymous
            clients are refused.
        """
        directory = guard.identity
        peer = _host(request)
        who, given, tried = directory.by_authorization(request.getHeader("authorization") or "")
        if given and who is None:
            directory.login_failed("nsq", peer, tried)
            raise HttpError(401, "AUTH_FAILED")
        if who is None:
            session = directory.anonymous_session("nsq", peer)
            if session is None:
                raise HttpError(401, "AUTH_REQUIRED")
            return session
        if given:
            directory.login_succeeded(peer)
        return directory.session("nsq", who, peer)

    @staticmethod
    def _admin(request: Any) -> None:
        """Topic and channel changes need an admin when a users file is in force.

        :raises HttpError: 403 ``UNAUTHORIZED``.
        """
        session = getattr(request, "mqhub_session", None)
        if session is not None and not session.admin:
            session.refuse("admin", request.path.decode("utf-8", "replace"))
            raise HttpError(403, "UNAUTHORIZED")

    def _body(self, request: Any, body: Any) -> bytes:
        """Encode a handler's result: bytes as text, dicts as JSON, None as empty."""
        if body is None:
            return b""
        if isinstance(body, bytes):
            request.setHeader(b"Content-Type", _TEXT)
            return body
        request.setHeader(b"Content-Type", _JSON)
        return json.dumps(body).encode()

    def _finish(self, request: Any, body: Any) -> None:
        """Complete a deferred answer (unless the client went away)."""
        if getattr(request, "_disconnected", False):
            return
        request.write(self._body(request, body))
        request.finish()

    def _failed(self, request: Any, failure: Failure) -> None:
        """A deferred answer failed: HttpError as is, anything else 500."""
        if getattr(request, "_disconnected", False):
            return
        exc = failure.value
        if not isinstance(exc, HttpError):
            log.failure("nsq http: {path} failed", failure, path=request.path)
            exc = HttpError(500, "INTERNAL_ERROR")
        request.write(self._error(request, exc))
        request.finish()

    def _error(self, request: Any, exc: HttpError) -> bytes:
        """nsqd's JSON error body."""
        request.setResponseCode(exc.status)
        request.setHeader(b"Content-Type", _JSON)
        return json.dumps({"message": exc.message}).encode()

    @staticmethod
    def _arg(request: Any, name: str) -> str | None:
        """First value of query argument ``name``, or None."""
        values = request.args.get(name.encode())
        if not values:
            return None
        return values[0].decode("utf-8", "replace")

    def _name_arg(self, request: Any, kind: str, invalid: str = "") -> str:
        """A required, valid ``kind`` (``topic`` or ``channel``) argument.

        :raises HttpError: 400 ``MISSING_ARG_<KIND>``, or ``invalid`` (default
            ``INVALID_ARG_<KIND>``) for a name NSQ does not allow.
        """
        value = self._arg(request, kind)
        if value is None:
            raise HttpError(400, f"MISSING_ARG_{kind.upper()}")
        if not is_valid_name(value.encode()):
            raise HttpError(400, invalid or f"INVALID_ARG_{kind.upper()}")
        return value

    def _existing_topic(self, request: Any) -> Any:
        """The topic named by the request, or 404 TOPIC_NOT_FOUND."""
        name = self._name_arg(request, "topic")
        topic = self.service.registry.get_topic(name)
        if topic is None:
            raise HttpError(404, "TOPIC_NOT_FOUND")
        return topic

    def _existing_channel(self, request: Any) -> tuple[Any, str]:
        """(topic, channel name) of an existing channel, or 404."""
        topic = self._existing_topic(request)
        channel = self._name_arg(request, "channel")
        if channel not in topic.channels:
            raise HttpError(404, "CHANNEL_NOT_FOUND")
        return topic, channel

    # nsqd -------------------------------------------------------------------------------------

    def ping(self, request: Any) -> bytes:
        """Health: ``OK``."""
        return b"OK"

    def info(self, request: Any) -> dict[str, Any]:
        """Version, addresses and limits (the two timeouts in nanoseconds, like nsqd)."""
        svc = self.service
        return {
            "version": self.config.version,
            "broadcast_address": self.config.broadcast_address,
            "hostname": self.config.hostname,
            "http_port": svc.http_port,
            "tcp_port": svc.tcp_port,
            "start_time": svc.start_time,
            "max_heartbeat_interval": self.config.max_heartbeat_interval * 1_000_000,
            "max_output_buffer_size": self.config.max_output_buffer_size,
            "max_output_buffer_timeout": self.config.max_output_buffer_timeout * 1_000_000,
            "max_deflate_level": self.config.max_deflate_level,
        }

    def _read_body(self, request: Any, limit: int, too_big: str) -> bytes:
        """The request body, refusing more than ``limit`` bytes with 413 ``too_big``."""
        body: bytes = request.content.read(limit + 1)
        if len(body) > limit:
            raise HttpError(413, too_big)
        return body

    def pub(self, request: Any) -> Any:
        """POST /pub?topic=T[&defer=ms]: one message."""
        topic = self._name_arg(request, "topic", "INVALID_TOPIC")
        defer_ms = 0
        raw_defer = self._arg(request, "defer")
        if raw_defer is not None:
            try:
                defer_ms = int(raw_defer)
            except ValueError:
                raise HttpError(400, "INVALID_DEFER") from None
            if defer_ms < 0 or defer_ms > self.config.max_req_timeout:
                raise HttpError(400, "INVALID_DEFER")
        body = self._read_body(request, self.config.max_msg_size, "MSG_TOO_BIG")
        if not body:
            raise HttpError(400, "MSG_EMPTY")
        return self._publish(topic, [body], defer_ms, request)

    def mpub(self, request: Any) -> Any:
        """POST /mpub?topic=T[&binary=true]: newline-separated or binary-framed messages."""
        topic = self._name_arg(request, "topic", "INVALID_TOPIC")
        body = self._read_body(request, self.config.max_body_size, "BODY_TOO_BIG")
        binary = (self._arg(request, "binary") or "").lower() in ("true", "1")
        limit = self.config.max_msg_size
        if binary:
            bodies = self._binary_messages(body)
        else:
            bodies = [line for line in body.split(b"\n") if line]
            for line in bodies:
                if len(line) > limit:
                    raise HttpError(413, "MSG_TOO_BIG")
        if not bodies:
            raise HttpError(400, "MSG_EMPTY")
        return self._publish(topic, bodies, 0, request)

    def _binary_messages(self, body: bytes) -> list[bytes]:
        """Decode ``[int32 count]([int32 size][data])*``."""
        if len(body) < 4:
            raise HttpError(400, "BAD_BODY")
        (count,) = struct.unpack_from(">i", body, 0)
        if count <= 0 or count > (self.config.max_body_size - 4) // 5:
            raise HttpError(400, "BAD_BODY")
        out: list[bytes] = []
        pos = 4
        for _ in range(count):
            if pos + 4 > len(body):
                raise HttpError(400, "BAD_BODY")
            (size,) = struct.unpack_from(">i", body, pos)
            if size <= 0:
                raise HttpError(400, "BAD_MESSAGE")
            if size > self.config.max_msg_size:
                raise HttpError(413, "MSG_TOO_BIG")
            end = pos + 4 + size
            if end > len(body):
                raise HttpError(400, "BAD_BODY")
            out.append(body[pos + 4:end])
            pos = end
        return out

    def _publish(self, topic_name: str, bodies: list[bytes], defer_ms: int,
                 request: Any = None) -> Any:
        """Publish through the core; the Deferred fires with ``OK`` once durable.

        :raises HttpError: 403 ``UNAUTHORIZED`` when the caller may not publish to the topic.
        """
        session = getattr(request, "mqhub_session", None)
        if session is not None and not session.check_publish(topic_address(topic_name)):
            raise HttpError(403, "UNAUTHORIZED")
        return self.service.registry.publish(topic_name, bodies, defer_ms).addCallback(
            lambda _: b"OK")

    def stats(self, request: Any) -> Any:
        """GET /stats: text report, or nsqd's JSON shape with ``format=json``."""
        svc = self.service
        data = build_stats(
            svc,
            topic=self._arg(request, "topic"),
            channel=self._arg(request, "channel"),
            include_clients=(self._arg(request, "include_clients") or "true") != "false",
        )
        if (self._arg(request, "format") or "") == "json":
            return data
        return render_text_stats(data).encode()

    def topic_create(self, request: Any) -> None:
        """Create a topic (idempotent)."""
        self._admin(request)
        self.service.registry.ensure_topic(self._name_arg(request, "topic"))

    def topic_delete(self, request: Any) -> Any:
        """Delete a topic and its channels."""
        self._admin(request)
        topic = self._existing_topic(request)
        return self.service.registry.delete_topic(topic.name).addCallback(lambda _: None)

    def topic_empty(self, request: Any) -> Any:
        """Drop the topic's own backlog."""
        self._admin(request)
        topic = self._existing_topic(request)
        return self.service.registry.empty_topic(topic.name).addCallback(lambda _: None)

    def topic_pause(self, request: Any) -> Any:
        """Stop the topic handing messages to its channels."""
        self._admin(request)
        topic = self._existing_topic(request)
        return self.service.registry.pause_topic(topic.name, True).addCallback(lambda _: None)

    def topic_unpause(self, request: Any) -> Any:
        """Resume a paused topic."""
        self._admin(request)
        topic = self._existing_topic(request)
        return self.service.registry.pause_topic(topic.name, False).addCallback(lambda _: None)

    def channel_create(self, request: Any) -> None:
        """Create a channel of an existing topic."""
        self._admin(request)
        topic = self._existing_topic(request)
        self.service.registry.ensure_channel(topic.name, self._name_arg(request, "channel"))

    def channel_delete(self, request: Any) -> Any:
        """Delete a channel."""
        self._admin(request)
        topic, channel = self._existing_channel(request)
        return self.service.registry.delete_channel(topic.name, channel).addCallback(lambda _: None)

    def channel_empty(self, request: Any) -> Any:
        """Drop every message of a channel."""
        self._admin(request)
        topic, channel = self._existing_channel(request)
        return topic.channels[channel].empty().addCallback(lambda _: None)

    def channel_pause(self, request: Any) -> None:
        """Stop delivery from a channel."""
        self._admin(request)
        topic, channel = self._existing_channel(request)
        topic.channels[channel].pause()

    def channel_unpause(self, request: Any) -> None:
        """Resume a paused channel."""
        self._admin(request)
        topic, channel = self._existing_channel(request)
        topic.channels[channel].unpause()

    # nsqlookupd queries -----------------------------------------------------------------------

    def _producer(self) -> dict[str, Any]:
        """This broker as a lookupd producer record."""
        svc = self.service
        return {
            "remote_address": f"{self.config.broadcast_address}:{svc.tcp_port}",
            "hostname": self.config.hostname,
            "broadcast_address": self.config.broadcast_address,
            "tcp_port": svc.tcp_port,
            "http_port": svc.http_port,
            "version": self.config.version,
        }

    def _peers(self) -> list[dict[str, Any]]:
        """The hub's other nodes serving NSQ (``ICore.peers``) as lookupd producer records;
        none for one node."""
        return [{
            "remote_address": f"{peer.host}:{peer.ports.get('tcp', 0)}",
            "hostname": peer.node,
            "broadcast_address": peer.host,
            "tcp_port": peer.ports.get("tcp", 0),
            "http_port": peer.ports.get("http", 0),
            "version": self.config.version,
        } for peer in self.service.registry.broker.peers("nsq")]

    def lookup(self, request: Any) -> dict[str, Any]:
        """/lookup?topic=T: this broker (and every other node of the hub) produces every topic
        (each creates them on first use)."""
        name = self._name_arg(request, "topic")
        topic = self.service.registry.get_topic(name)
        channels = sorted(topic.channels) if topic is not None else []
        return {"channels": channels, "producers": [self._producer(), *self._peers()]}

    def topics(self, request: Any) -> dict[str, Any]:
        """/topics: every known topic."""
        return {"topics": sorted(self.service.registry.topics)}

    def channels(self, request: Any) -> dict[str, Any]:
        """/channels?topic=T."""
        name = self._name_arg(request, "topic")
        topic = self.service.registry.get_topic(name)
        return {"channels": sorted(topic.channels) if topic is not None else []}

    def nodes(self, request: Any) -> dict[str, Any]:
        """/nodes: this broker with its topics."""
        topics = sorted(self.service.registry.topics)
        producers = [self._producer(), *self._peers()]
        for producer in producers:
            producer["tombstones"] = [False] * len(topics)
            producer["topics"] = topics
        return {"producers": producers}
