"""Build the ``admin.http`` listener: one twisted.web Site serving the page, the API and /metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twisted.web.resource import Resource
from twisted.web.server import Site
from twisted.web.static import File

from mqhub.introspect import Inspector
from mqhub.listener import ListenerService
from mqhub.web.api import ApiResource
from mqhub.web.metrics import DEFAULT_QUEUE_CAP, MetricsResource, build_registry

#: The admin listener's default endpoint (``--listen admin.http=ENDPOINT`` changes it).
DEFAULT_ENDPOINT = "tcp:8750:interface=127.0.0.1"
STATIC_DIR = Path(__file__).resolve().parent / "static"


def read_token(path: str) -> str:
    """The admin token: the file's first line, stripped.

    :raises ValueError: when the file is empty.
    """
    with open(path, encoding="utf-8") as f:
        token = f.readline().strip()
    if not token:
        raise ValueError(f"admin token file {path} is empty")
    return token


class QuietSite(Site):
    """A Site without a per-request access log line (the page polls every few seconds)."""

    def log(self, request: Any) -> None:
        """Log nothing per request."""


def build_site(inspector: Inspector, token: str | None = None,
               queue_cap: int = DEFAULT_QUEUE_CAP) -> Site:
    """The Site: ``/`` (page), ``/static/*``, ``/api/*``, ``/healthz``, ``/metrics``."""
    root = Resource()
    api = ApiResource(inspector, token)
    root.putChild(b"", File(str(STATIC_DIR / "index.html"), defaultType="text/html"))
    root.putChild(b"static", File(str(STATIC_DIR)))
    root.putChild(b"api", api)
    root.putChild(b"healthz", api)
    root.putChild(b"metrics", MetricsResource(build_registry(inspector, queue_cap)))
    site = QuietSite(root)
    site.displayTracebacks = False
    site.noisy = False
    return site


def make_admin_service(hub: Any, root: Any, endpoint: str = DEFAULT_ENDPOINT,
                       token: str | None = None, queue_cap: int = DEFAULT_QUEUE_CAP,
                       tls: Any = None) -> ListenerService:
    """The admin ListenerService (built, not started) over ``hub`` and its HubService ``root``.

    :param tls: a server TLS context (:func:`mqhub.tls.server_context`, possibly verifying
        client certificates): the listener then speaks HTTPS on ``endpoint``.
    """
    inspector = Inspector(hub, root)
    site: Any = build_site(inspector, token, queue_cap)
    if tls is not None:
        from twisted.protocols.tls import TLSMemoryBIOFactory

        site = TLSMemoryBIOFactory(tls, False, site)
    service = ListenerService(endpoint, site, reactor=hub.reactor)
    service.setName("admin")
    service.inspector = inspector  # type: ignore[attr-defined]
    return service
