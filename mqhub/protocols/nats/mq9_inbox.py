"""mq9 INBOX publishes: accepted per message, handed to the core once per read.

``$mq9.AI.INBOX.{id}.urgent|normal|notify`` publishes of one read are grouped per subject (a
group is a run of one expiry) and handed to the core as one ``publish_batch`` per group at the
end of the read, urgent groups first, so mixed mailboxes and priorities cost one core call per
subject per read and one store commit per read. A subject's mailbox, priority and default TTL
are resolved once and cached (the cache is cleared when a mailbox is created or removed); the
first message of a read to a subject checks the mailbox's expiry and room, the next ones of that
read only the room. ``latest`` mailboxes publish only their newest message of the read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.logger import Logger

from mqhub.errors import MqhubError
from mqhub.protocols.nats.mailbox import INBOX, PRIORITIES, RESERVED_REPLY, Mailbox
from mqhub.protocols.nats.mq9_common import (
    BROADCAST,
    MAILBOX,
    headers_dict,
    no_mailbox,
    ttl_header,
)

if TYPE_CHECKING:  # pragma: no cover
    from mqhub.interfaces import ICore
    from mqhub.protocols.nats.server import NatsConnection

log = Logger()

#: the most INBOX subjects whose resolution is cached (the cache is cleared past that)
INBOX_CACHE_LIMIT = 100_000


class InboxWriter:
    """The INBOX publish path of :class:`~.mq9.Mq9` (one of its bases).

    Reads ``broker``, ``clock``, ``ids``, ``mailboxes``, ``max_unread``, ``stats``,
    ``inflight``, ``landed``, ``settle``, ``error``, ``mailbox_request`` and
    ``persisted_broadcast`` of the assembled class.
    """

    broker: ICore
    clock: Any
    ids: Any
    mailboxes: dict[str, Mailbox]
    max_unread: int
    stats: dict[str, int]
    inflight: int
    landed: Callable[[Any], Any]
    settle: Callable[[], None]
    error: Callable[[str | None, str], None]
    mailbox_request: Callable[[str, str | None, bytes], None]
    persisted_broadcast: Callable[..., int]

    def __init__(self) -> None:
        """Nothing accepted yet."""
        #: this read's INBOX groups ``[box, priority, subject, expires, bodies, headers]``, the
        #: open (last) group of each subject, and the newest group of each ``latest`` mailbox
        self._pubs: list[list[Any]] = []
        self._open: dict[str, list[Any]] = {}
        self._latest: dict[str, list[Any]] = {}
        self._now = 0.0
        self.inbox_cache: dict[str, Any] = {}
        self._id_next = 0
        self._id_end = 0

    def pending_publishes(self) -> bool:
        """True while INBOX messages of this read wait for :meth:`flush_pubs`."""
        return bool(self._pubs)

    def publish(self, pub: NatsConnection | None, subject: str, reply: str | None,
                hdr: bytes | None, payload: bytes) -> int:
        """Handle one mq9 publish; returns 1 (mq9 always "responds", so no 503).

        The common case, a plain PUB to an INBOX subject seen before in a live mailbox with
        room, only appends the payload to its subject's group (see :meth:`_inbox`).
        """
        group = self._open.get(subject)
        if group is not None and hdr is None and reply is None and not group[3]:
            box = group[0]
            pending = box.pending
            if pending and pending < box.room:
                box.pending = pending + 1
                group[4].append(payload)
                if group[5] is not None:
                    group[5].append(None)
                if box.kind == "latest":
                    self._latest[box.mail_id] = group
                return 1
        if subject.startswith(INBOX):
            self._inbox(subject, reply, hdr, payload)
        elif subject.startswith(MAILBOX):
            self.mailbox_request(subject, reply, payload)
        elif subject.startswith(BROADCAST):
            return self.persisted_broadcast(pub, subject, reply, hdr, payload)
        return 1

    def _resolve_inbox(self, subject: str) -> Any:
        """``(box, priority, default_ttl)`` for an INBOX subject, or an error text.

        Cached per subject; the cache is cleared whenever a mailbox is created or removed.
        """
        parts = subject[len(INBOX):].split(".")
        if len(parts) != 2 or parts[1] not in PRIORITIES:
            return f"invalid mq9 inbox subject: {subject}"
        box = self.mailboxes.get(parts[0])
        if box is None:
            return no_mailbox(parts[0])
        prio, ttl, _ = PRIORITIES[parts[1]]
        hit = (box, prio, ttl)
        if len(self.inbox_cache) >= INBOX_CACHE_LIMIT:
            self.inbox_cache.clear()
        self.inbox_cache[subject] = hit
        return hit

    def new_id(self) -> int:
        """Next message id, from a block reserved for this read."""
        n = self._id_next
        if n >= self._id_end:
            n = self.ids.reserve(256)
            self._id_end = n + 256
        self._id_next = n + 1
        return n

    def _inbox(self, subject: str, reply: str | None, hdr: bytes | None,
               payload: bytes) -> None:
        """Accept one mailbox message; it goes to the core with the rest of the read.

        The messages of one read are grouped per INBOX subject (a group holds a run of one
        expiry: a message with another ``mq9-ttl`` starts a new group of that subject), so
        mixed mailboxes and priorities still make one core call per subject per read
        (:meth:`flush_pubs`). The first message of a read to a subject checks the mailbox's
        expiry and room here; the next ones only the room (in :meth:`publish`).
        """
        hit = self.inbox_cache.get(subject)
        if hit is None:
            hit = self._resolve_inbox(subject)
            if hit.__class__ is str:
                if hit.startswith("mailbox "):
                    self.stats["no_mailbox"] += 1
                self.error(reply, hit)
                return
        box, prio, ttl = hit
        now = self._now
        if not now:     # one time per read, so a read's messages share their expiry (one batch)
            now = self._now = self.clock.seconds()
        box_exp = box.expires_at
        if box_exp and box_exp <= now:
            self.stats["no_mailbox"] += 1
            self.error(reply, no_mailbox(box.mail_id))
            return
        if not box.pending or box.pending >= box.room:
            # the room left is counted once per read (pending counts what this read added)
            box.room = self.max_unread - box.count() + box.pending
        if box.pending >= box.room:
            self.stats["refused"] += 1
            self.error(reply, f"mailbox {box.mail_id} is full")
            return
        headers = None
        if hdr is not None or reply:
            headers = headers_dict(hdr) if hdr is not None else None
            if reply:
                headers = dict(headers or {})
                headers[RESERVED_REPLY] = reply
        # the priority's TTL is the queue's own ``ttl`` (cut by id time: no expiry index row in
        # the store); only a shorter ``mq9-ttl`` needs the entry's expiry. The mailbox TTL is
        # the queues' ``expires_at``: no message outlives its mailbox.
        expires = 0.0
        if headers is not None:
            own = ttl_header(headers)
            if own and (not ttl or own < ttl):
                expires = now + own
        box.pending += 1
        group = self._open.get(subject)
        if group is None or group[3] != expires or group[0] is not box:
            group = [box, prio, subject, expires, [], None]
            self._open[subject] = group
            self._pubs.append(group)
        group[4].append(payload)
        if headers is not None and group[5] is None:
            group[5] = [None] * (len(group[4]) - 1)
        if group[5] is not None:
            group[5].append(headers)
        if box.kind == "latest":
            self._latest[box.mail_id] = group

    def end_read(self) -> None:
        """The read is over: hand its INBOX messages to the core; the next read takes its time
        and its ids afresh."""
        self.flush_pubs()
        self._now = 0.0
        self._id_next = self._id_end     # ids of the next read come from a fresh block

    def flush_pubs(self) -> None:
        """Hand the accepted INBOX messages to the core: one publish_batch per group (a subject
        and expiry), urgent groups first; a ``latest`` mailbox publishes only its newest."""
        if not self._pubs:
            return
        pubs, self._pubs = self._pubs, []
        latest, self._latest = self._latest, {}
        self._open.clear()
        self._now = 0.0
        if len(pubs) > 1:
            pubs.sort(key=_group_rank)      # stable: a subject's groups keep their order
        publish = self.broker.publish_batch
        mailboxes = self.mailboxes
        box: Mailbox
        for group in pubs:
            box, prio, subject, expires, bodies, headers = group
            box.pending = 0
            if mailboxes.get(box.mail_id) is not box:
                self._gone(box, bodies, headers)
                continue
            if box.kind == "latest":
                if latest.get(box.mail_id) is not group:
                    continue
                bodies = bodies[-1:]
                headers = headers[-1:] if headers is not None else None
                for p, q in box.queues.items():
                    if p != prio and q.depth and not q.deleted:
                        q.take(q.depth)
            try:
                d = publish(subject, bodies, origin="nats", priority=prio, expires_at=expires,
                            headers=headers if headers is not None and any(headers) else None)
            except MqhubError as exc:
                log.warn("mq9: core refused {subject}: {error}", subject=subject, error=exc)
                continue
            self.stats["stored"] += len(bodies)
            if not d.called:
                self.inflight += 1
                d.addBoth(self.landed)
            d.addErrback(_log_commit_failure)
        self.settle()

    def _gone(self, box: Mailbox, bodies: list[bytes], headers: list[Any] | None) -> None:
        """Accepted messages whose mailbox went away before the flush: counted in
        ``stats["no_mailbox"]``, logged, and each one that carried a reply subject gets mq9's
        ``mailbox … does not exist`` error (never dropped silently)."""
        self.stats["no_mailbox"] += len(bodies)
        log.warn("mq9: {n} message(s) for removed mailbox {mail_id} not stored",
                 n=len(bodies), mail_id=box.mail_id)
        for h in headers or ():
            if h and h.get(RESERVED_REPLY):
                self.error(h[RESERVED_REPLY], no_mailbox(box.mail_id))


def _group_rank(group: list[Any]) -> int:
    """Sort key of an INBOX group at flush time: urgent first."""
    return -group[1]


def _log_commit_failure(failure: Any) -> None:
    """Log a failed store commit of INBOX messages (their publishers got no PONG)."""
    log.failure("mq9: store commit failed", failure)
