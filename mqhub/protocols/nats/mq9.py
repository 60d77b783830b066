"""mq9: agent mailboxes on ``$mq9.AI.*`` NATS subjects (the original mq9 text + DESIGN.md §7).

- ``$mq9.AI.MAILBOX.CREATE`` → ``{mail_id, token, inbox, type, ttl}``;
  ``$mq9.AI.MAILBOX.QUERY.{id}`` with ``{"token"}`` → ``{mail_id, unread, messages}``.
- ``$mq9.AI.INBOX.{id}.urgent|normal|notify``: each mailbox priority is a core queue bound to
  that address (see :mod:`mqhub.protocols.nats.mailbox`): urgent/normal durable with default
  TTLs 86400 s / 3600 s (the entry's expiry), notify memory-tier; a ``latest`` mailbox's queues
  are durable with ``max_size=1`` drop-oldest; the mailbox TTL is the queues' ``expires_at``.
  Publishes: :mod:`mqhub.protocols.nats.mq9_inbox`.
- SUBs on a mailbox and its pushes (delivered = read): :mod:`mqhub.protocols.nats.mq9_push`.
- ``$mq9.AI.BROADCAST.{domain}.{event}`` is plain NATS (``#`` at the end of a SUB means ``>``);
  with header ``mq9-persist: true`` the message is also stored for its TTL and replayed to
  late subscribers: :mod:`mqhub.protocols.nats.mq9_broadcast`.
- Every mq9 error is a JSON ``{"error": "..."}`` reply on the request's reply subject.

This module assembles the layer (:class:`Mq9`) and holds the mailbox requests, recovery, the
commit of each read with its after-commit operations (replies, pushes, PONGs), and the sweep.
INBOX publishes of one read reach the core at the end of the read; replies and PONGs wait
until every write before them is committed.
"""

from __future__ import annotations

import heapq
import json
import secrets
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import gatherResults, succeed
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from mqhub.interfaces import IAdapterState, ICore
from mqhub.protocols.nats import codec
from mqhub.protocols.nats.mailbox import (
    INBOX,
    ORDER,
    PRIORITIES,
    PRIORITY_NAMES,
    QUEUE_PREFIX,
    Mailbox,
    inbox_address,
    mailbox_queue,
    mailbox_queues,
    query_item,
)
from mqhub.protocols.nats.mq9_broadcast import (
    BCAST_QUEUE,
    PersistedBroadcasts,
)
from mqhub.protocols.nats.mq9_common import (
    MAILBOX,
    OP_BROADCAST,
    OP_PONG,
    OP_PUSH,
    OP_REPLY,
    header_value,
    headers_dict,
    no_mailbox,
    ttl_header,
)
from mqhub.protocols.nats.mq9_inbox import InboxWriter
from mqhub.protocols.nats.mq9_push import MailboxPushes
from mqhub.records import EXPIRES_AT, HEADERS, MSG_ID, PRIORITY, id_time

if TYPE_CHECKING:  # pragma: no cover
    from mqhub.protocols.nats.server import NatsConnection, NatsServer, Subscription

__all__ = ["Mq9", "mailbox_queue", "mailbox_queues", "Mailbox"]

log = Logger()

DEFAULT_MAILBOX_TTL = 86400
QUERY_LIMIT = 1000
#: live mailboxes by default: an empty one costs ~5.2 KB of RAM (three core queues, their
#: bindings and records; docs/core-api.md "Memory"), so 250,000 stay near 1.2 GiB
DEFAULT_MAX_MAILBOXES = 250_000

META_MAILBOX = "mq9/mb/"


class Mq9(InboxWriter, MailboxPushes, PersistedBroadcasts):
    """The mq9 layer of one NATS server.

    :param server: the :class:`NatsServer` (used to deliver and to find subscribers).
    :param store: the hub's IMessageStore (only for a private core, see ``broker``); mq9's
        records live in the core's ``state`` (IAdapterState).
    :param clock: the hub's clock.
    :param broker: the hub's core :class:`~mqhub.core.broker.Broker`; None makes a private one
        over ``store`` (a hub without a core, e.g. the NATS server's unit tests,
        :func:`mqhub.hub.standalone_core`), which :meth:`start` starts and :meth:`stop` stops.
    """

    def __init__(self, server: NatsServer, store: Any, clock: Any, broker: Any = None, *,
                 sweep_interval: float = 1.0, max_unread: int = 1_000_000,
                 max_mailboxes: int = DEFAULT_MAX_MAILBOXES) -> None:
        """Start with no mailboxes; call :meth:`start` to recover from the store."""
        InboxWriter.__init__(self)
        MailboxPushes.__init__(self)
        PersistedBroadcasts.__init__(self)
        self._own_broker = broker is None
        if broker is None:
            from mqhub.hub import standalone_core
            broker = standalone_core(store, clock)
        self.broker: ICore = broker
        self.server = server
        self.state: IAdapterState = broker.state
        self.clock = clock
        self.ids = broker.ids
        self.sweep_interval = sweep_interval
        self.max_unread = max_unread
        self.max_mailboxes = max_mailboxes
        self.mailboxes: dict[str, Mailbox] = {}
        self.batch = self.state.batch()
        self.ops: list[tuple] = []
        self._kick_call: Any = None
        self.inflight = 0
        self._due_heap: list[tuple[float, str]] = []
        self._sweeper: LoopingCall | None = None
        self.stats = {"stored": 0, "pushed": 0, "expired": 0, "queried": 0, "refused": 0,
                      "no_mailbox": 0}

    def start(self) -> Any:
        """Recover mailboxes (their queues are the core's) and persisted broadcasts; sweep."""
        d: Any = self.broker.start() if self._own_broker else succeed(None)
        d.addCallback(lambda _: self.state.scan_meta(META_MAILBOX))
        d.addCallback(self._recover_mailboxes)
        d.addCallback(self.migrate_broadcasts)
        d.addCallback(lambda _: self.state.read_entries(BCAST_QUEUE, None, 1 << 30))
        d.addCallback(self.recover_broadcasts)
        d.addCallback(self._start_sweep)
        return d

    def _recover_mailboxes(self, rows: list[tuple[str, bytes]]) -> Any:
        """Rebuild each mailbox on its core queues; drop queues of mailboxes that are gone."""
        for key, value in rows:
            mail_id = key[len(META_MAILBOX):]
            try:
                box = Mailbox.from_record(mail_id, value)
            except (ValueError, KeyError):
                log.warn("mq9: unreadable mailbox record {key}", key=key)
                continue
            self.mailboxes[mail_id] = box
            box.declare(self.broker)
            self._due(box.expires_at, mail_id)
        pending = []
        for q in self.broker.queues():
            if not q.name.startswith(QUEUE_PREFIX):
                continue
            mail_id, _, rest = q.name[len(QUEUE_PREFIX):].partition("/")
            owner = self.mailboxes.get(mail_id)
            if owner is None:
                pending.append(self.broker.delete_queue(q.name))
            elif not rest:
                pending.append(self._migrate(owner, q.name))
        return gatherResults(pending, consumeErrors=True) if pending else None

    def _migrate(self, box: Mailbox, old: str) -> Any:
        """Move a mailbox's entries from the one-queue layout of older versions to its queues."""
        d = self.state.read_entries(old, None, 1 << 30)

        def move(entries: list[tuple]) -> Any:
            """Re-publish each entry to its INBOX address with its expiry derived again."""
            entries = sorted(entries, key=lambda e: e[MSG_ID])
            if box.kind == "latest":
                entries = entries[-1:]
            for e in entries:
                e = e[:EXPIRES_AT] + (_expiry(box, e),) + e[EXPIRES_AT + 1:]
                name = PRIORITY_NAMES.get(e[PRIORITY], "normal")
                self.broker.publish_entries(inbox_address(box.mail_id, name), [e])
            return self.broker.delete_queue(old)
        d.addCallback(move)
        return d

    def _start_sweep(self, _: Any = None) -> None:
        """Run the TTL sweep every ``sweep_interval`` seconds (and commit recovery clean-ups)."""
        if self.batch:
            self.kick()
        if self.sweep_interval > 0 and self._sweeper is None:
            self._sweeper = LoopingCall(self.sweep)
            self._sweeper.clock = self.clock
            self._sweeper.start(self.sweep_interval, now=False)

    def stop(self) -> Any:
        """Stop the sweep and commit what is pending (and stop a private broker)."""
        if self._sweeper is not None and self._sweeper.running:
            self._sweeper.stop()
        self._sweeper = None
        if self._kick_call is not None and self._kick_call.active():
            self._kick_call.cancel()
        self._kick_call = None
        self.flush_pubs()
        self.settle()
        d = self._commit()
        if self._own_broker:
            d.addCallback(lambda _: self.broker.stop())
        return d

    def claims(self, subject: str) -> bool:
        """True for publishes mq9 handles itself: MAILBOX.* and INBOX.*."""
        return subject.startswith(INBOX) or subject.startswith(MAILBOX)

    def persist_requested(self, hdr: bytes) -> bool:
        """True when a header block asks for ``mq9-persist: true``."""
        if b"mq9-persist" not in hdr.lower():
            return False
        return (header_value(headers_dict(hdr), "mq9-persist") or "").strip().lower() == "true"

    def claims_subscription(self, sub: Subscription) -> bool:
        """True for ``$mq9.AI.INBOX.{literal id}.{urgent|normal|notify|*|>}`` subscriptions."""
        subject = sub.subject
        if not subject.startswith(INBOX):
            return False
        parts = subject[len(INBOX):].split(".")
        if len(parts) != 2 or parts[0] in ("*", ">"):
            return False
        return parts[1] in PRIORITIES or parts[1] in ("*", ">")

    def live(self, mail_id: str) -> Mailbox | None:
        """The mailbox ``mail_id`` unless it is unknown or past its TTL (sweep pending)."""
        box = self.mailboxes.get(mail_id)
        if box is not None and box.expires_at and box.expires_at <= self.clock.seconds():
            return None
        return box

    def mailbox_request(self, subject: str, reply: str | None, payload: bytes) -> None:
        """MAILBOX.CREATE and MAILBOX.QUERY.{id}."""
        rest = subject[len(MAILBOX):]
        try:
            req = json.loads(payload) if payload.strip() else {}
        except ValueError as exc:
            self.error(reply, f"invalid JSON request: {exc}")
            return
        if not isinstance(req, dict):
            self.error(reply, "request must be a JSON object")
            return
        if rest == "CREATE":
            self._create(reply, req)
        elif rest.startswith("QUERY.") and rest.count(".") == 1 and len(rest) > 6:
            self._query(rest[6:], req, reply)
        else:
            self.error(reply, f"unknown mq9 request: {subject}")

    def _create(self, reply: str | None, req: dict[str, Any]) -> None:
        """Create a mailbox: its queues in the core, its record with this read's batch."""
        kind = req.get("type", "standard")
        if kind not in ("standard", "latest"):
            self.error(reply, "type must be 'standard' or 'latest'")
            return
        ttl = req.get("ttl", DEFAULT_MAILBOX_TTL)
        if ttl is None:
            ttl = DEFAULT_MAILBOX_TTL
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or ttl < 0:
            self.error(reply, "ttl must be a non-negative number of seconds")
            return
        if len(self.mailboxes) >= self.max_mailboxes:
            self.error(reply, "too many mailboxes")
            return
        mail_id = "m" + secrets.token_hex(12)
        token = "tok-" + secrets.token_urlsafe(24)
        box = Mailbox(mail_id, token, kind, int(ttl), self.clock.seconds())
        box.declare(self.broker)
        self.mailboxes[mail_id] = box
        self.inbox_cache.clear()
        self._due(box.expires_at, mail_id)
        self.batch.put_meta(META_MAILBOX + mail_id, box.record())
        body = {"mail_id": mail_id, "token": token, "inbox": INBOX + mail_id, "type": kind,
                "ttl": int(ttl)}
        self.answer(reply, body)

    def _query(self, mail_id: str, req: dict[str, Any], reply: str | None) -> None:
        """Answer QUERY: unread messages (up to ``limit``) taken from the queues, urgent first."""
        self.flush_pubs()
        box = self.live(mail_id)
        if box is None:
            self.error(reply, no_mailbox(mail_id))
            return
        token = req.get("token")
        if not isinstance(token, str) or not secrets.compare_digest(token, box.token):
            self.error(reply, "invalid token")
            return
        limit = req.get("limit", QUERY_LIMIT)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
            limit = QUERY_LIMIT
        items: list[dict[str, Any]] = []
        for prio in ORDER:
            q = box.queues.get(prio)
            if q is None or q.deleted or len(items) >= limit:
                continue
            items.extend(query_item(e, prio) for e in q.take(limit - len(items)))
        self.stats["queried"] += len(items)
        self.answer(reply, {"mail_id": mail_id, "unread": len(items) + box.count(),
                            "messages": items})

    def answer(self, reply: str | None, body: dict[str, Any]) -> None:
        """Send a JSON reply after this read's batch commits (nothing without a reply subject)."""
        if reply:
            self.ops.append((OP_REPLY, reply, json.dumps(body, separators=(",", ":")).encode()))

    def error(self, reply: str | None, text: str) -> None:
        """Reply ``{"error": text}``; never a -ERR."""
        self.answer(reply, {"error": text})

    def kick(self) -> None:
        """Arrange a commit on the next turn for writes made outside a read."""
        if self._kick_call is None:
            self._kick_call = self.clock.callLater(0, self._kicked)

    def _kicked(self) -> None:
        """Commit pending writes that no read picked up."""
        self._kick_call = None
        self.end_turn()

    def end_turn(self) -> None:
        """Hand this read's INBOX messages to the core, commit mq9's own writes, and run the
        read's operations (replies, broadcast deliveries, PONGs) once everything before them
        is durable.

        While a write is in flight, even a batch without writes goes through the store so the
        operations wait for it (the store commits in order).
        """
        self.end_read()
        if not self.batch and not self.ops:
            return
        ops, self.ops = self.ops, []
        batch, self.batch = self.batch, self.state.batch()
        if batch or self.inflight:
            self.inflight += 1
            d = self.state.commit(batch)
            d.addBoth(self.landed)
        else:
            d = succeed(None)
        if ops:
            d.addCallback(self._run_ops, ops)
            d.addErrback(self._failed, ops)

    def landed(self, result: Any) -> Any:
        """One commit finished (successfully or not)."""
        self.inflight -= 1
        return result

    def barrier(self, conn: NatsConnection) -> bool:
        """Queue a PONG for ``conn`` behind every pending mq9 write; False when none is pending.

        This makes a client's flush() (PING/PONG) a durability barrier for its mq9 publishes.
        """
        if not (self.batch or self.ops or self.inflight or self.pending_publishes()):
            return False
        self.ops.append((OP_PONG, conn))
        return True

    def _commit(self) -> Any:
        """Hand the pending batch to the store now (used outside reads: stop)."""
        batch, self.batch = self.batch, self.state.batch()
        if not batch:
            return succeed(None)
        self.inflight += 1
        d = self.state.commit(batch)
        d.addBoth(self.landed)
        return d

    def _failed(self, failure: Any, ops: list[tuple]) -> None:
        """A commit failed: tell requesters; nothing in it was confirmed to anyone."""
        log.failure("mq9: store commit failed", failure)
        for op in ops:
            if op[0] == OP_REPLY:
                self._send(op[1], {"error": "store unavailable"})
            elif op[0] == OP_PONG and op[1].connected:
                op[1].out_ctl(codec.PONG)
            elif op[0] == OP_PUSH:
                self.forget(op[1].mail_id, op[1].priority, op[2])   # back to ready
        self.settle()
        self.server.flush()

    def _run_ops(self, _: Any, ops: list[tuple]) -> None:
        """Apply committed operations in order, then write."""
        for op in ops:
            kind = op[0]
            if kind == OP_PUSH:
                self.push_now(op[1], op[2], op[3])
            elif kind == OP_BROADCAST:
                self.deliver_broadcast(op[1], op[2], op[3], op[4], op[5])
            elif kind == OP_PONG:
                if op[1].connected:
                    op[1].out_ctl(codec.PONG)
            else:       # OP_REPLY
                self.server.publish(None, op[1], None, None, op[2])
        self.settle()
        if self.batch:
            self.kick()     # broadcast receiver sets ride with the next commit
        if self.server.bridge is not None:
            self.server.bridge.flush()
        self.server.flush()

    def _send(self, reply: str | None, body: dict[str, Any]) -> None:
        """Publish a JSON reply now (used after the commit)."""
        if reply:
            self.server.publish(None, reply, None, None,
                                json.dumps(body, separators=(",", ":")).encode())

    def _due(self, when: float, mail_id: str) -> None:
        """Make the sweep look at ``mail_id`` at ``when`` (0 = never)."""
        if when:
            heapq.heappush(self._due_heap, (when, mail_id))

    def sweep(self) -> None:
        """Remove expired mailboxes (their queues with them) and expired broadcasts.

        Only mailboxes whose TTL is due are visited (a heap of (time, mail_id) fed by CREATE
        and recovery). Message TTLs are entry expiries in the core queues, dropped by the
        core's own TTL sweep.
        """
        now = self.clock.seconds()
        batch = self.batch
        heap = self._due_heap
        while heap and heap[0][0] <= now:
            _, mail_id = heapq.heappop(heap)
            box = self.mailboxes.get(mail_id)
            if box is None or not box.expires_at or box.expires_at > now:
                continue
            self.stats["expired"] += box.count()
            del self.mailboxes[mail_id]
            self.inbox_cache.clear()
            for prio in ORDER:
                self.pushers.pop((mail_id, prio), None)
            for name in mailbox_queues(mail_id):
                self.broker.delete_queue(name)
            batch.delete_meta(META_MAILBOX + mail_id)
        self.expire_broadcasts(now)
        if self.batch:
            self.end_turn()


def _expiry(box: Mailbox, entry: tuple) -> float:
    """An old-layout message's expiry: its id's time plus its TTL rule, capped by the mailbox's."""
    ttl = ttl_header(entry[HEADERS]) or PRIORITIES[PRIORITY_NAMES.get(entry[PRIORITY],
                                                                       "normal")][1]
    expires = id_time(entry[MSG_ID]) + ttl if ttl else 0.0
    if box.expires_at and (not expires or box.expires_at < expires):
        expires = box.expires_at
    return expires
