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
from mqhub.web.auth import AdminGate
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
    """The Site: ``/`` (page), ``/static/*``, ``/api/*``, ``/healthz``, ``/metrics``, behind
    the :class:`AdminGate` (users and admin rights when the hub has a users file)."""
    root = Resource()
    identity = getattr(inspector.hub, "identity", None)
    enforcing = identity is not None and identity.enforcing
    # under a users file the gate checks every credential (the token acts as an admin's)
    api = ApiResource(inspector, None if enforcing else token, identity)
    root.putChild(b"", File(str(STATIC_DIR / "index.html"), defaultType="text/html"))
    root.putChild(b"static", File(str(STATIC_DIR)))
    root.putChild(b"api", api)
    root.putChild(b"healthz", api)
    root.putChild(b"metrics", MetricsResource(build_registry(inspector, queue_cap)))
    site = QuietSite(AdminGate(root, identity, token, inspector.hub.clock))
    site.displayTracebacks = False
    site.noisy = False
    return site


def make_admin_service(hub: Any, root: Any, endpoint: str = DEFAULT_ENDPOINT,
                       token: str | None = None, queue_cap: int = DEFAULT_QUEUE_CAP) -> ListenerService:
    """The admin ListenerService (built, not started) over ``hub`` and its HubService ``root``."""
    inspector = Inspector(hub, root)
    service = ListenerService(endpoint, build_site(inspector, token, queue_cap),
                              reactor=hub.reactor)
    service.setName("admin")
    service.inspector = inspector  # type: ignore[attr-defined]
    return service
