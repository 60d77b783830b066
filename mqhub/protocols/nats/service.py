"""Entry point of the ``mq9`` plugin (alias ``nats``): build the NATS server and its listener."""

from __future__ import annotations

import json
from typing import Any

from twisted.application.service import MultiService, Service
from twisted.internet.defer import Deferred, DeferredList, maybeDeferred
from twisted.logger import Logger

from mqhub.errors import PluginError
from mqhub.listener import DeferredFactory, ListenerService, build_soon
from mqhub.plugin_settings import apply_settings
from mqhub.protocols.nats.auth import (
    Authenticator,
    AuthError,
    JwtCheck,
    load_resolver_preload,
    shared_secret_checks,
    users_checks,
)
from mqhub.protocols.nats.bridge import CoreBridge
from mqhub.protocols.nats.mq9 import Mq9
from mqhub.protocols.nats.scan import frame_pattern
from mqhub.protocols.nats.server import NatsServer, NatsSettings
from mqhub.tls import TlsConfigError, server_context

log = Logger()

#: seconds after the client port is bound that the frame scanner's pattern is compiled
WARM_UP_DELAY = 0.05

def build_auth(settings: NatsSettings) -> Authenticator:
    """The credential checks the settings configure (see docs/protocols/nats.md, Security).

    ``operator`` (operator JWTs or their files, comma-separated) with ``resolver_preload``
    (account JWTs) is operator mode, as nats-server's ``resolver: MEMORY``: JWTs only.
    Otherwise ``nkeys`` (comma-separated public user keys), ``users`` (a JSON file of
    nats-server's ``users = [...]`` entries with permissions) and the single ``token`` or
    ``user``/``password`` may be combined (a token wins over passwords, as in nats-server).
    """
    operators = [p.strip() for p in (settings.operator or "").split(",") if p.strip()]
    if operators:   # operator mode: JWT users only
        resolver = (settings.resolver or "MEMORY").upper()
        if resolver != "MEMORY":
            raise PluginError(f"mq9: resolver {resolver!r} is not supported (only MEMORY)")
        preload = settings.resolver_preload
        try:
            tokens = []
            for item in operators:
                if item.startswith("eyJ") and item.count(".") == 2:   # the JWT itself
                    tokens.append(item)
                    continue
                with open(item, encoding="utf-8") as f:
                    tokens.append(f.read().strip())
            accounts = load_resolver_preload(preload) if preload else {}
        except (OSError, ValueError, AuthError) as exc:
            raise PluginError(f"mq9: cannot load the operator or account JWTs: {exc}") from exc
        return Authenticator([JwtCheck(tokens, accounts)])
    token = settings.token
    checks = shared_secret_checks(token, None, None)
    keys = [k.strip() for k in (settings.nkeys or "").split(",") if k.strip()]
    entries: list[Any] = [{"nkey": k} for k in keys]
    if settings.user and not token:      # the single user joins the users file's
        entries.append({"user": settings.user, "password": settings.password or ""})
    if settings.users:
        try:
            with open(settings.users, encoding="utf-8") as f:
                listed = json.load(f)
        except (OSError, ValueError) as exc:
            raise PluginError(f"mq9: cannot read the users file: {exc}") from exc
        if not isinstance(listed, list):
            raise PluginError("mq9: the users file must hold a JSON list of users")
        entries += listed
    try:
        checks += users_checks(entries)
    except ValueError as exc:
        raise PluginError(f"mq9: {exc}") from exc
    return Authenticator(checks)


def build_server(hub: Any, plugin_options: dict[str, Any]) -> NatsServer:
    """Build the NatsServer, its mq9 layer and (when the hub has a core) the core bridge.

    :raises PluginError: on an unknown option, a bad value, a TLS certificate that cannot be
        loaded or credentials that cannot be read.
    """
    settings = apply_settings(NatsSettings(), plugin_options, "mq9")
    if settings.tls_cert:
        try:
            settings.tls_context = server_context(
                settings.tls_cert, settings.tls_key, settings.tls_ca, settings.tls_verify)
        except TlsConfigError as exc:
            raise PluginError(f"mq9: {exc}") from exc
    elif settings.tls_verify or settings.tls_handshake_first:
        raise PluginError("mq9: tls_verify and tls_handshake_first need tls_cert")
    server = NatsServer(hub, settings, build_auth(settings))
    if settings.no_auth_user and not server.guard.knows(settings.no_auth_user):
        raise PluginError(f"mq9: no_auth_user {settings.no_auth_user!r} is not a user of the "
                          "users file (--users) or of the nats users/user options")
    broker = getattr(hub, "broker", None)
    server.mq9 = Mq9(server, hub.store, hub.clock, broker,
                     sweep_interval=settings.sweep_interval, max_unread=settings.max_unread,
                     max_mailboxes=settings.max_mailboxes)
    if broker is not None:
        server.bridge = CoreBridge(server, broker)
        # NATS moves its own traffic: the admin counters read these totals (core/counters.py)
        broker.counters.register_source("nats", lambda: {
            "published": server.stats["in_msgs"], "delivered": server.stats["out_msgs"]})
    return server


class NatsService(MultiService):
    """Recovers mq9 from the store, then listens; stops listening, then commits mq9.

    :ivar listener: the client port (role ``tcp``).
    :ivar extra: the optional listeners (``monitor``, ``ws``), started and stopped with it.
    """

    def __init__(self, server: NatsServer, listener: ListenerService,
                 extra: list[ListenerService] | None = None) -> None:
        """Own ``listener`` and the ``extra`` listeners as children."""
        super().__init__()
        self.server = server
        self.listener = listener
        self.extra = list(extra or ())
        for child in (listener, *self.extra):
            self.addService(child)
        self.ready: Deferred[None] = Deferred()

    def counters(self) -> dict[str, int]:
        """Monotonic totals the admin API and /metrics show beside published/delivered/acked
        (:meth:`mqhub.introspect.Inspector.protocol_counters`), named as nats-server's
        ``/varz`` names them where it has them; mq9's own totals are prefixed ``mq9_``."""
        stats = self.server.stats
        out = {"slow_consumers": stats["slow_consumers"],
               "total_connections": stats["connections"],
               "bridge_refused": stats["bridge_refused"]}
        mq9 = self.server.mq9
        if mq9 is not None:
            out.update((f"mq9_{name}", n) for name, n in mq9.stats.items())
        return out

    def lame_duck(self) -> None:
        """Hub lame-duck mode: every client gets ``INFO {"ldm": true}`` (see mqhub.lameduck)."""
        self.server.enter_lame_duck()

    def startService(self) -> None:
        """Recover mailboxes, then start the listeners."""
        Service.startService(self)
        d = maybeDeferred(self.server.mq9.start)

        def go(_: Any) -> None:
            """Recovered: listen (unless stopped meanwhile) and report readiness."""
            if self.running:
                for child in (self.listener, *self.extra):
                    child.startService()
                self.listener.listening.addCallback(self._warm_up)
            self.ready.callback(None)

        d.addCallback(go)
        d.addErrback(lambda f: log.failure("mq9: recovery failed", f))

    def _warm_up(self, port: Any) -> Any:
        """Listening: compile the frame scanner's pattern (~0.07 s) in a later reactor turn, so
        the port answers its first clients without waiting for it (and a large first read does
        not pay for it either, unless it comes within :data:`WARM_UP_DELAY`)."""
        self.server.clock.callLater(WARM_UP_DELAY, frame_pattern, self.server.settings.max_payload)
        return port

    def stopService(self) -> Deferred[None]:
        """Stop the listeners (closing connections), then flush mq9's pending writes."""
        Service.stopService(self)
        running = [c for c in (self.listener, *self.extra) if c.running]
        d: Deferred[Any] = DeferredList([maybeDeferred(c.stopService) for c in running],
                                        consumeErrors=True)
        d.addBoth(lambda _: self.server.mq9.stop())
        return d


def own_options(options: dict[str, Any]) -> dict[str, Any]:
    """This plugin's ``--option mq9.KEY=VALUE`` settings (``options["plugin_options"]["mq9"]``)."""
    every = options.get("plugin_options") or {}
    mine: dict[str, Any] = {}
    for name in ("nats", "mq9"):
        value = every.get(name)
        if isinstance(value, dict):
            mine.update(value)
    if not mine and every and not any(isinstance(v, dict) for v in every.values()):
        mine.update(every)       # already this plugin's flat settings
    return mine


def _port_of(endpoint: str, default: int) -> int:
    """The port number of a ``tcp:PORT:...`` / ``ssl:PORT:...`` endpoint string."""
    try:
        return int(endpoint.split(":")[1])
    except (IndexError, ValueError):
        return default


def _monitor_listener(hub: Any, server: NatsServer, endpoint: str, client: ListenerService,
                      websocket: dict[str, Any]) -> ListenerService:
    """The nats-server compatible monitoring listener (role ``monitor``); its site (twisted.web
    and :mod:`mqhub.protocols.nats.monitor`) is built on the first request or just after the
    port is bound."""
    http = {"addr": ("127.0.0.1", _port_of(endpoint, 0))}

    def build() -> Any:
        """The monitoring Site."""
        from twisted.web.server import Site

        from mqhub.protocols.nats.monitor import MonitorResource

        site = Site(MonitorResource(server, lambda: client.port is not None,
                                    lambda: websocket, lambda: http["addr"]))
        site.noisy = False
        return site

    factory = DeferredFactory(build)
    listener = ListenerService(endpoint, factory, reactor=getattr(hub, "reactor", None),
                               observer=True)
    listener.setName("mq9-monitor")

    def bound(port: Any) -> Any:
        """Report the bound address in /varz (``http_host``, ``http_port``)."""
        host = port.getHost()
        http["addr"] = (getattr(host, "host", "127.0.0.1"), int(getattr(host, "port", 0)))
        return port

    listener.listening.addCallback(bound)
    build_soon(listener, factory, hub.clock)
    return listener


#: interfaces a plain ws:// listener may bind without ``ws_no_tls``
LOOPBACK = ("127.", "localhost", "::1", "[::1]")


def _interface(endpoint: str) -> str | None:
    """The ``interface=`` of a Twisted endpoint string, or None (every interface)."""
    for part in endpoint.split(":")[2:]:
        if part.startswith("interface="):
            return part[len("interface="):]
    return None


def websocket_listener(hub: Any, server: NatsServer,
                       endpoint: str) -> tuple[ListenerService, dict[str, Any]]:
    """The WebSocket listener (role ``ws``) and the ``/varz`` ``websocket`` block describing it.

    TLS comes from an ``ssl:`` endpoint or the ``ws_tls_cert``/``ws_tls_key`` (``ws_tls_ca``,
    ``ws_tls_verify``) settings; as nats-server, plain ``ws://`` needs ``ws_no_tls=true`` unless
    it binds the loopback interface. autobahn (:mod:`mqhub.protocols.nats.websocket`) is
    imported on the first connection or just after the port is bound.

    :raises PluginError: on unusable TLS files, or plain ``ws://`` off loopback without
        ``ws_no_tls``.
    """
    settings = server.settings
    no_tls, compression, verify = (settings.ws_no_tls, settings.ws_compression,
                                   settings.ws_tls_verify)

    def build() -> Any:
        """The autobahn factory carrying NATS."""
        from mqhub.protocols.nats.websocket import NatsWebSocketFactory

        return NatsWebSocketFactory(server, compression)

    deferred = DeferredFactory(build)
    factory: Any = deferred
    tls = endpoint.startswith("ssl:")
    if settings.ws_tls_cert:
        from twisted.protocols.tls import TLSMemoryBIOFactory

        try:
            context = server_context(settings.ws_tls_cert, settings.ws_tls_key,
                                     settings.ws_tls_ca, verify)
        except TlsConfigError as exc:
            raise PluginError(f"mq9: websocket {exc}") from exc
        factory = TLSMemoryBIOFactory(context, False, deferred)
        tls = True
    interface = _interface(endpoint)
    if not tls and not no_tls and not (interface or "").startswith(LOOPBACK):
        raise PluginError("mq9: a websocket listener off the loopback interface needs TLS "
                          "(ws_tls_cert) or ws_no_tls=true, as nats-server's no_tls")
    listener = ListenerService(endpoint, factory, reactor=getattr(hub, "reactor", None))
    listener.setName("mq9-ws")
    build_soon(listener, deferred, hub.clock)
    block: dict[str, Any] = {"host": interface or "0.0.0.0", "port": _port_of(endpoint, 0),
                             "no_tls": not tls, "compression": compression}
    if tls and verify:
        block["tls_verify"] = True
    return listener, block


def make_service(hub: Any, endpoints: dict[str, str], options: dict[str, Any]) -> NatsService:
    """Build (not start) the NATS/mq9 service listening on ``endpoints["tcp"]``, with the
    monitoring (``monitor``) and WebSocket (``ws``) listeners when those roles are given."""
    mine = own_options(options)
    server = build_server(hub, mine)
    endpoint = endpoints.get("tcp") or "tcp:4222:interface=127.0.0.1"
    server.settings.port = _port_of(endpoint, server.settings.port)
    listener = ListenerService(endpoint, server, reactor=getattr(hub, "reactor", None))
    listener.setName("mq9-tcp")
    extra: list[ListenerService] = []
    websocket: dict[str, Any] = {}
    if endpoints.get("ws"):
        ws, websocket = websocket_listener(hub, server, endpoints["ws"])
        extra.append(ws)
    if endpoints.get("monitor"):
        extra.append(_monitor_listener(hub, server, endpoints["monitor"], listener, websocket))
    return NatsService(server, listener, extra)
