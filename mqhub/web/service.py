"""Build the ``admin.http`` listener: one twisted.web Site serving the page, the API and /metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mqhub.listener import DeferredFactory, ListenerService, build_soon

#: The admin listener's default endpoint (``--listen admin.http=ENDPOINT`` changes it).
DEFAULT_ENDPOINT = "tcp:8750:interface=127.0.0.1"
STATIC_DIR = Path(__file__).resolve().parent / "static"
#: The chart library's files, installed from npm by ``make web`` (mqhub/web/package.json) and
#: served as /static/vendor/* by this listener (no CDN: the page works offline).
VENDOR_DIR = Path(__file__).resolve().parent / "node_modules" / "uplot" / "dist"


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

    from mqhub.history import History
    from mqhub.web.api import ApiResource
    from mqhub.web.auth import AdminGate
    from mqhub.web.metrics import DEFAULT_QUEUE_CAP, MetricsResource, build_registry

    class QuietSite(Site):
        """A Site without a per-request access log line (the page polls every few seconds),
        sampling the hub's history while it listens."""

        #: the hub's history (mqhub/history.py), sampled while the site listens
        history: History | None = None

        def log(self, request: Any) -> None:
            """Log nothing per request."""

        def startFactory(self) -> None:
            """Listening: start sampling the history."""
            super().startFactory()
            if self.history is not None:
                self.history.start()

        def stopFactory(self) -> None:
            """No longer listening: stop sampling."""
            if self.history is not None:
                self.history.stop()
            super().stopFactory()

    root = Resource()
    identity = getattr(inspector.hub, "identity", None)
    enforcing = identity is not None and identity.enforcing
    # under a users file the gate checks every credential (the token acts as an admin's)
    api = ApiResource(inspector, None if enforcing else token, identity)
    root.putChild(b"", File(str(STATIC_DIR / "index.html"), defaultType="text/html"))
    static = File(str(STATIC_DIR))
    static.putChild(b"vendor", File(str(VENDOR_DIR)))
    root.putChild(b"static", static)
    root.putChild(b"api", api)
    root.putChild(b"healthz", api)
    cap = DEFAULT_QUEUE_CAP if queue_cap is None else queue_cap
    root.putChild(b"metrics", MetricsResource(build_registry(inspector, cap)))
    site = QuietSite(AdminGate(root, identity, token, inspector.hub.clock))
    site.displayTracebacks = False
    site.noisy = False
    site.history = api.history = History(inspector)  # charts of the page and /api/history
    return site


def make_admin_service(hub: Any, root: Any, endpoint: str = DEFAULT_ENDPOINT,
                       token: str | None = None, queue_cap: int | None = None,
                       tls: Any = None) -> ListenerService:
    """The admin ListenerService (built, not started) over ``hub`` and its HubService ``root``.

    The site itself is built shortly after the port is bound
    (:class:`mqhub.listener.DeferredFactory`); ``service.inspector`` is its Inspector once
    built.

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

    deferred = DeferredFactory(build)
    factory: Any = deferred
    if tls is not None:
        from twisted.protocols.tls import TLSMemoryBIOFactory

        factory = TLSMemoryBIOFactory(tls, False, deferred)
    service = ListenerService(endpoint, factory, reactor=hub.reactor, observer=True)
    service.setName("admin")
    service.site = deferred
    build_soon(service, deferred, hub.reactor)
    return service
