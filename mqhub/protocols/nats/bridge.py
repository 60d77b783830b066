"""The bridge between NATS subscriptions and the core's address space.

Every NATS SUB is also a live binding in the core (``broker.subscribe``), so a message another
protocol publishes to a matching address reaches the NATS subscriber, rendered as MSG/HMSG.
A NATS publish is delivered to NATS subscribers by the server's own fast path; only when the
core has *foreign* bindings on the subject (another protocol's subscriber or a queue) is the
message also handed to ``broker.publish_batch`` with ``origin="nats"``, and the NATS target
skips entries of NATS origin so nobody gets a message twice.

Nothing the core refuses goes unnoticed: a bridged message whose headers cannot fit an entry
(``ICore.entry_fits``; the embedded store's meta field is 64 KiB, NATS allows headers up to
``max_payload``) is left
out of the batch before the core sees it, so it cannot sink the other messages of that batch;
a batch the core refuses (synchronously, e.g. a ``reject`` queue that is full, or when its
commit fails) counts all its messages. Both are counted in the server's
``stats["bridge_refused"]`` and logged at most once per :data:`REFUSAL_LOG_INTERVAL`. None of
this runs for a subject without foreign bindings (the NATS-to-NATS fast path).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.logger import Logger
from zope.interface import implementer

from mqhub.errors import MqhubError
from mqhub.interfaces import ICore, IDeliveryTarget
from mqhub.protocols.nats import codec
from mqhub.protocols.nats.mailbox import RESERVED_REPLY, rendered
from mqhub.records import BODY, HEADERS, ORIGIN

if TYPE_CHECKING:  # pragma: no cover
    from mqhub.protocols.nats.server import NatsServer, Subscription

log = Logger()
ORIGIN_NAME = "nats"
#: seconds between two log lines about refused bridged messages (the rest are only counted)
REFUSAL_LOG_INTERVAL = 10.0
#: header block plus reply bytes from which a bridged message's meta is checked before the
#: core sees it. Below it the meta surely fits: stored as JSON a header byte takes at most 6
#: bytes (``\u00XX``), and 6 x 8192 + a 4 KiB address + the origin is under MAX_META
META_CHECK_FROM = 8192


@implementer(IDeliveryTarget)
class NatsTarget:
    """The IDeliveryTarget of every NATS subscription (the binding's tag is the Subscription)."""

    protocol_name = ORIGIN_NAME

    def __init__(self, server: NatsServer) -> None:
        """Deliver through ``server``."""
        self.server = server

    def deliver_batch(self, binding: Any, address: str, messages: list[tuple]) -> None:
        """Render foreign messages for the binding's NATS subscription and write them."""
        sub: Subscription | None = getattr(binding, "tag", None)
        if sub is None:
            return
        srv = self.server
        for entry in messages:
            if entry[ORIGIN] == ORIGIN_NAME:
                continue
            reply, hdr = rendered(entry[HEADERS])
            srv.deliver(sub, address, reply, hdr, entry[BODY])
        srv.flush()


class CoreBridge:
    """Binds NATS subscriptions in the core and forwards NATS publishes to foreign bindings."""

    def __init__(self, server: NatsServer, broker: ICore) -> None:
        """Attach to ``broker`` (the hub's ICore)."""
        self.server = server
        self.broker = broker
        self.target = NatsTarget(server)
        self._foreign: dict[str, bool] = {}
        self._epoch = -1
        self._pending: dict[str, tuple[list[bytes], list[dict[str, str] | None]]] = {}
        self._logged_at: float | None = None
        self._unlogged = 0

    def bind(self, sub: Subscription) -> None:
        """Register ``sub`` as a live binding (subjects the core refuses stay NATS-only)."""
        try:
            sub.core_handle = self.broker.subscribe(sub.subject, self.target, group=sub.queue,
                                                    tag=sub)
        except (MqhubError, ValueError) as exc:
            log.debug("nats: {subject} not bound in the core: {error}", subject=sub.subject,
                      error=exc)
            sub.core_handle = None

    def unbind(self, sub: Subscription) -> None:
        """Remove ``sub``'s binding."""
        handle, sub.core_handle = sub.core_handle, None
        if handle is not None:
            self.broker.unbind(handle)

    @property
    def epoch(self) -> int:
        """The core's binding epoch."""
        return int(self.broker.epoch)

    def has_foreign(self, subject: str) -> bool:
        """True when a non-NATS binding (queue, other protocol's subscriber) matches ``subject``."""
        epoch = self.broker.epoch
        if epoch != self._epoch:
            self._foreign.clear()
            self._epoch = epoch
        hit = self._foreign.get(subject)
        if hit is not None:
            return hit
        try:
            route = self.broker.route(subject)
        except (MqhubError, ValueError):
            hit = False
        else:
            mine = self.target
            hit = bool(route.queues) or route.park is not None \
                or any(b.target is not mine for b in route.targets) \
                or any(any(m.target is not mine for m in g) for g in route.groups)
        if len(self._foreign) > 65536:
            self._foreign.clear()
        self._foreign[subject] = hit
        return hit

    def publish(self, subject: str, reply: str | None, hdr: bytes | None,
                payload: bytes) -> int:
        """Queue one NATS message for the core's foreign bindings (sent by :meth:`flush`)."""
        headers: dict[str, str] | None = None
        if hdr:
            try:
                headers = dict(codec.parse_headers(hdr)[2]) or None
            except codec.ProtocolError:
                headers = None
        if reply:
            headers = dict(headers or {})
            headers[RESERVED_REPLY] = reply
        if headers is not None and len(hdr or b"") + len(reply or "") >= META_CHECK_FROM:
            if not self.broker.entry_fits(subject, headers, ORIGIN_NAME):
                self.refused(subject, 1, ValueError("headers too large for an entry"))
                return 0
        pending = self._pending.get(subject)
        if pending is None:
            pending = self._pending[subject] = ([], [])
        pending[0].append(payload)
        pending[1].append(headers)
        return 1

    def flush(self) -> None:
        """Hand everything queued during this read to the core: one call per subject."""
        if not self._pending:
            return
        pending, self._pending = self._pending, {}
        for subject, (bodies, headers) in pending.items():
            hdrs: Any = None if not any(headers) else headers
            try:
                d = self.broker.publish_batch(subject, bodies, origin=ORIGIN_NAME, headers=hdrs)
            except (MqhubError, ValueError) as exc:
                self.refused(subject, len(bodies), exc)
                continue
            d.addErrback(self._failed, subject, len(bodies))

    def _failed(self, failure: Any, subject: str, n: int) -> None:
        """A batch's commit failed: its ``n`` messages are not kept."""
        self.refused(subject, n, failure.value)

    def refused(self, subject: str, n: int, error: BaseException) -> None:
        """Count ``n`` bridged messages the core did not take; log at most once an interval."""
        self.server.stats["bridge_refused"] += n
        self._unlogged += n
        now = self.server.clock.seconds()
        if self._logged_at is not None and now - self._logged_at < REFUSAL_LOG_INTERVAL:
            return
        self._logged_at = now
        log.warn("nats: {n} bridged message(s) not kept by the core (last: {subject}: {error}); "
                 "counted in bridge_refused", n=self._unlogged, subject=subject, error=error)
        self._unlogged = 0
