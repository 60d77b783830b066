"""Who may use the admin listener when a users file is in force (``twistd mqhub --users``).

:class:`AdminGate` is the Site's root. Without a users file it passes every request through
(the admin token, if set, is checked by the API for state changes, as before). With one:

- ``/healthz`` stays open (load balancers);
- everything else (the page, ``/api/*``, ``/metrics``) needs a user: ``Authorization: Bearer
  TOKEN`` (a user's ``token``, or the ``--admin-token`` file's, which acts as an admin) or
  ``Basic`` with the user's name and password; otherwise 401 with a Basic challenge;
- state changes (POST, PATCH, PUT, DELETE) and reads of message bodies (``/api/dlq/QUEUE``,
  the dead letters themselves) need ``admin = true``: 403 otherwise, counted as an ``admin``
  denial of protocol ``admin``.

Failed logins are counted and slowed down per peer like every protocol's
(:class:`mqhub.identity.LoginThrottle`): a request from a peer that must wait is answered
after its turn.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from twisted.web.resource import Resource, getChildForRequest
from twisted.web.server import NOT_DONE_YET

from mqhub.identity import ADMIN, ALL_RIGHTS, Principal

PROTOCOL = "admin"
WRITES = (b"POST", b"PATCH", b"PUT", b"DELETE")


class _Answer(Resource):
    """A JSON error answer (401 with a Basic challenge, or 403)."""

    isLeaf = True

    def __init__(self, status: int, message: str) -> None:
        """Remember what to answer."""
        super().__init__()
        self.status = status
        self.message = message

    def render(self, request: Any) -> bytes:
        """Write the status and ``{"error": ...}``."""
        request.setResponseCode(self.status)
        if self.status == 401:
            request.setHeader(b"www-authenticate", b'Basic realm="mqhub", charset="UTF-8"')
        request.setHeader(b"content-type", b"application/json; charset=utf-8")
        request.setHeader(b"cache-control", b"no-store")
        return json.dumps({"error": self.message}).encode() + b"\n"


class _Later(Resource):
    """Evaluates the request once the peer's login turn has come (failed-login slowdown)."""

    isLeaf = True

    def __init__(self, gate: AdminGate, delay: float) -> None:
        """Wait ``delay`` seconds before ``gate`` looks at the request."""
        super().__init__()
        self.gate = gate
        self.delay = delay

    def render(self, request: Any) -> Any:
        """Answer later."""
        call = self.gate.clock.callLater(self.delay, self._go, request)
        request.notifyFinish().addErrback(lambda _: call.cancel() if call.active() else None)
        return NOT_DONE_YET

    def _go(self, request: Any) -> None:
        """Route the request as if it had just arrived (its turn has come)."""
        request.postpath.insert(0, request.prepath.pop())
        request.render(getChildForRequest(self.gate.decide(request), request))


class AdminGate(Resource):
    """The admin Site's root: checks credentials, then hands the request to ``inner``."""

    def __init__(self, inner: Resource, identity: Any, token: str | None, clock: Any) -> None:
        """:param identity: the hub's Directory (None or not enforcing: pass everything).
        :param token: the ``--admin-token`` value (an admin credential under a users file)."""
        super().__init__()
        self.inner = inner
        self.identity = identity
        self.token = token
        self.clock = clock

    @property
    def enforcing(self) -> bool:
        """True when a users file is in force."""
        return self.identity is not None and self.identity.enforcing

    def getChildWithDefault(self, path: bytes, request: Any) -> Resource:
        """The resource for ``path`` if the request may have it, else an error answer."""
        if not self.enforcing or path == b"healthz":
            return self.inner.getChildWithDefault(path, request)
        delay = self.identity.login_wait(_peer(request)) if _has_credentials(request) else 0.0
        if delay > 0:
            return _Later(self, delay)
        resource = self.decide(request)
        if resource is not self.inner:
            return resource
        return self.inner.getChildWithDefault(path, request)

    def decide(self, request: Any) -> Resource:
        """``inner`` when the request may go on, else the error to answer."""
        who = self.principal(request)
        if who is None:
            return _Answer(401, "this admin listener needs a user (Authorization: Basic or "
                                "Bearer; see docs/security.md)")
        if (request.method in WRITES or _reads_bodies(request)) and not who.rights.admin:
            self.identity.refused(PROTOCOL, who.label, ADMIN, request.method.decode() + " "
                                  + request.path.decode("utf-8", "replace"))
            return _Answer(403, f"user {who.label} is not an admin (admin = true in the "
                                "users file)")
        return self.inner

    def principal(self, request: Any) -> Principal | None:
        """The user the request's credentials name (failures counted per peer), or None."""
        header = request.getHeader("authorization") or ""
        scheme, _, value = header.strip().partition(" ")
        if self.token is not None and scheme.lower() == "bearer" and hmac.compare_digest(
                value.strip().encode(), self.token.encode()):
            return Principal("admin-token", ALL_RIGHTS, "option")
        who, given, tried = self.identity.by_authorization(header)
        if not given:
            return None
        peer = _peer(request)
        if who is None:
            self.identity.login_failed(PROTOCOL, peer, tried)
        else:
            self.identity.login_succeeded(peer)
        return who


def _peer(request: Any) -> str:
    """The client's host (no port)."""
    addr = request.getClientAddress()
    return str(getattr(addr, "host", "") or addr)


def _has_credentials(request: Any) -> bool:
    """True when the request carries an Authorization header."""
    return bool(request.getHeader("authorization"))


def _reads_bodies(request: Any) -> bool:
    """``GET /api/dlq/QUEUE``: the dead letters themselves, bodies included."""
    parts = [p for p in request.path.split(b"?")[0].split(b"/") if p]
    return len(parts) >= 3 and parts[0] == b"api" and parts[1] == b"dlq"
