"""Build the ``admin.http`` listener: one twisted.web Site serving the page, the API and /metrics."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from twisted.internet.protocol import Factory

from mqhub.listener import ListenerService

#: The admin listener's default endpoint (``--listen admin.http=ENDPOINT`` changes it).
DEFAULT_ENDPOINT = "tcp:8750:interface=127.0.0.1"
STATIC_DIR = Path(__file__).resolve().parent / "static"
#: seconds after its port is bound that the admin site is built (its web stack imported):
#: the protocol ports answer their first clients first (issue 28, fast start)
BUILD_DELAY = 0.05


def read_token(path: str) -> str:
    """The admin token: the file's first line, stripped.

    :raises ValueError: when the file is empty.
    """
    with open(path, encoding="utf-8") as f:
        token = f.readline().strip()
    if not token:
        raise ValueError(f"admin token file {path} is empty")
    return token


def build_site(inspector: Any, token: str | None = None, queue_cap: int | None = None) -> Any:
    """The Site: ``/`` (page), ``/static/*``, ``/api/*``, ``/healthz``, ``/metrics``
    (``queue_cap``: queues /metrics reports one by one; None: its default), behind the
    :class:`~mqhub.web.auth.AdminGate` (users and admin rights when the hub has a users file)."""
    from twisted.web.resource import Resource
    from twisted.web.server import Site
    from twisted.web.static import File

    from mqhub.web.api import ApiResource
    from mqhub.web.auth import AdminGate
    from mqhub.web.metrics import DEFAULT_QUEUE_CAP, MetricsResource, build_registry

    class QuietSite(Site):
        """A Site without a per-request access log line (the page polls every few seconds)."""

        def log(self, request: Any) -> None:
            """Log nothing per request."""

    root = Resource()
    identity = getattr(inspector.hub, "identity", None)
    enforcing = identity is not None and identity.enforcing
    # under a users file the gate checks every credential (the token acts as an admin's)
    api = ApiResource(inspector, None if enforcing else token, identity)
    root.putChild(b"", File(str(STATIC_DIR / "index.html"), defaultType="text/html"))
    root.putChild(b"static", File(str(STATIC_DIR)))
    root.putChild(b"api", api)
    root.putChild(b"healthz", api)
    cap = DEFAULT_QUEUE_CAP if queue_cap is None else queue_cap
    root.putChild(b"metrics", MetricsResource(build_registry(inspector, cap)))
    site = QuietSite(AdminGate(root, identity, token, inspector.hub.clock))
    site.displayTracebacks = False
    site.noisy = False
    return site


class DeferredSite(Factory):
    """The admin listener's factory: the Site is built on :meth:`ensure` (called shortly after
    the port is bound, or by the first connection), so importing twisted.web, prometheus_client
    and the introspection code does not hold up the protocol ports at startup."""

    noisy = False

    def __init__(self, build: Callable[[], Any]) -> None:
        """Build the site with ``build()`` when first needed."""
        self.build = build
        self.site: Any = None
        self.started = False

    def ensure(self) -> Any:
        """The Site, built now if it was not yet."""
        if self.site is None:
            self.site = self.build()
            if self.started:
                self.site.doStart()
        return self.site

    def doStart(self) -> None:
        """The port is listening."""
        self.started = True
        if self.site is not None:
            self.site.doStart()

    def doStop(self) -> None:
        """The port stopped."""
        self.started = False
        if self.site is not None:
            self.site.doStop()

    def buildProtocol(self, addr: Any) -> Any:
        """A protocol of the (built) Site."""
        return self.ensure().buildProtocol(addr)


def make_admin_service(hub: Any, root: Any, endpoint: str = DEFAULT_ENDPOINT,
                       token: str | None = None, queue_cap: int | None = None,
                       tls: Any = None) -> ListenerService:
    """The admin ListenerService (built, not started) over ``hub`` and its HubService ``root``.

    The site itself is built :data:`BUILD_DELAY` seconds after the port is bound
    (:class:`DeferredSite`); ``service.inspector`` is its Inspector once built.

    :param tls: a server TLS context (:func:`mqhub.tls.server_context`, possibly verifying
        client certificates): the listener then speaks HTTPS on ``endpoint``.
    """
    service: Any = None

    def build() -> Any:
        """Make the inspector and the site (the web stack is imported here)."""
        from mqhub.introspect import Inspector

        inspector = Inspector(hub, root)
        service.inspector = inspector
        return build_site(inspector, token, queue_cap)

    deferred = DeferredSite(build)
    factory: Any = deferred
    if tls is not None:
        from twisted.protocols.tls import TLSMemoryBIOFactory

        factory = TLSMemoryBIOFactory(tls, False, deferred)
    service = ListenerService(endpoint, factory, reactor=hub.reactor)
    service.setName("admin")
    service.site = deferred

    def bound(port: Any) -> Any:
        """Build the site soon, in a later reactor turn than the protocol ports' start."""
        hub.reactor.callLater(BUILD_DELAY, deferred.ensure)
        return port

    service.listening.addCallback(bound)
    return service
