"""mq9: agent mailboxes on ``$mq9.AI.*`` NATS subjects (the original mq9 text + DESIGN.md §7).

- ``$mq9.AI.MAILBOX.CREATE`` → ``{mail_id, token, inbox, type, ttl}``;
  ``$mq9.AI.MAILBOX.QUERY.{id}`` with ``{"token"}`` → ``{mail_id, unread, messages}``.
- ``$mq9.AI.INBOX.{id}.urgent|normal|notify``: each mailbox priority is a core queue bound to
  that address (see :mod:`mqhub.protocols.nats.mailbox`): urgent/normal durable with default
  TTLs 86400 s / 3600 s (the entry's expiry), notify memory-tier; a ``latest`` mailbox's queues
  are durable with ``max_size=1`` drop-oldest; the mailbox TTL is the queues' ``expires_at``.
  INBOX publishes of one read are grouped per subject (a group is a run of one expiry) and
  handed to the core as one ``publish_batch`` per group at the end of the read, urgent groups
  first: one core call per subject per read and one store commit per read. A subject's
  mailbox, priority and default TTL are resolved once and cached (cleared when a mailbox is
  created or removed); ``latest`` mailboxes publish only their newest message of the read.
- A SUB on ``$mq9.AI.INBOX.{id}.*`` (or ``.>``, or one priority) attaches one core consumer per
  priority queue (urgent first: the backlog arrives urgent → normal → notify, FIFO within each,
  then live). A consumer's deliveries wait behind the commit that stored them (an ``OP_PUSH``
  operation), then go to every subscriber (one member per queue group) and are acked:
  delivered = read (rendering: :mod:`mqhub.protocols.nats.mq9_push`).
- ``$mq9.AI.BROADCAST.{domain}.{event}`` is plain NATS (``#`` at the end of a SUB means ``>``);
  with header ``mq9-persist: true`` the message is also stored (store list
  :data:`BCAST_QUEUE`, which the core's recovery leaves alone) for its TTL (``mq9-ttl``,
  default 3600 s), delivered after its commit, and replayed to late subscribers that have not
  had it: once per queue group, or once per distinct SUB subject without a group (receiver sets
  are records ``mq9/bk/<msg_id>``; this has no core counterpart, hence mq9 keeps it itself).
- Every mq9 error is a JSON ``{"error": "..."}`` reply on the request's reply subject.

This module is the layer (:class:`Mq9`, one object per NATS server): the mailbox requests,
recovery, the INBOX publish path, mailbox subscribers and pushes, persisted broadcasts, the
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

from mqhub.errors import MqhubError
from mqhub.interfaces import IAdapterState, ICore
from mqhub.protocols.nats import codec
from mqhub.protocols.nats.mailbox import (
    INBOX,
    ORDER,
    PRIORITIES,
    PRIORITY_NAMES,
    QUEUE_PREFIX,
    RESERVED_REPLY,
    Mailbox,
    MailboxPusher,
    inbox_address,
    mailbox_queue,
    mailbox_queues,
    query_item,
    rendered,
)
from mqhub.protocols.nats.mq9_common import (
    BROADCAST,
    DEFAULT_MAX_MAILBOXES,
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
from mqhub.protocols.nats.mq9_push import PUSH_BATCH, render_plain
from mqhub.protocols.nats.sublist import subject_matches
from mqhub.records import (
    ADDRESS,
    BODY,
    EXPIRES_AT,
    HEADERS,
    MSG_ID,
    PRIORITY,
    REASON_QUEUE_EXPIRED,
    id_time,
    make_entry,
)

if TYPE_CHECKING:  # pragma: no cover
    from mqhub.protocols.nats.server import NatsConnection, NatsServer, Subscription

__all__ = ["Mq9", "mailbox_queue", "mailbox_queues", "Mailbox"]

log = Logger()

DEFAULT_MAILBOX_TTL = 86400
QUERY_LIMIT = 1000
#: the QUERY request subject prefix (``$mq9.AI.MAILBOX.QUERY.{id}``)
QUERY = MAILBOX + "QUERY."

#: the most INBOX subjects whose resolution is cached (the cache is cleared past that)
INBOX_CACHE_LIMIT = 100_000
DEFAULT_BROADCAST_TTL = 3600.0
META_BCAST_KEYS = "mq9/bk/"
#: persisted broadcasts live under a store queue name the core's recovery leaves alone (``~``)
BCAST_QUEUE = "~mq9/bc"
OLD_BCAST_QUEUE = "mq9/bc"

META_MAILBOX = "mq9/mb/"


class Mq9:
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
        #: this read's INBOX groups ``[box, priority, subject, expires, bodies, headers]``, the
        #: open (last) group of each subject, and the newest group of each ``latest`` mailbox
        self._pubs: list[list[Any]] = []
        self._open: dict[str, list[Any]] = {}
        self._latest: dict[str, list[Any]] = {}
        self._now = 0.0
        self.inbox_cache: dict[str, Any] = {}
        self._id_next = 0
        self._id_end = 0
        self.subs: dict[str, list[Subscription]] = {}
        self.filters: dict[int, tuple[int, ...]] = {}
        self.pushers: dict[tuple[str, int], Any] = {}
        self._rr: dict[str, dict[str, int]] = {}
        self._pushing = 0
        self._actions: list[tuple[Any, list[int] | None]] = []
        self.broadcasts: list[tuple[tuple, set[str]]] = []
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
            self._known_mailbox(key, value)
        self.state.watch(META_MAILBOX, self.record_changed)
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

    def _known_mailbox(self, key: str, value: bytes) -> Mailbox | None:
        """Know the mailbox a record describes, on its core queues (None when unreadable)."""
        mail_id = key[len(META_MAILBOX):]
        try:
            box = Mailbox.from_record(mail_id, value)
        except (ValueError, KeyError):
            log.warn("mq9: unreadable mailbox record {key}", key=key)
            return None
        self.mailboxes[mail_id] = box
        box.declare(self.broker)
        self._due(box.expires_at, mail_id)
        return box

    def _forget_mailbox(self, mail_id: str) -> Mailbox | None:
        """Drop mailbox ``mail_id`` from this layer (not its queues); None if unknown."""
        box = self.mailboxes.pop(mail_id, None)
        if box is not None:
            self.inbox_cache.clear()
            for prio in ORDER:
                self.pushers.pop((mail_id, prio), None)
        return box

    def record_changed(self, key: str, value: bytes | None) -> None:
        """Another node of the hub created or removed a mailbox (``IAdapterState.watch``): know
        it here (its queues are the core's), or forget it (the node that removed it deleted its
        queues)."""
        mail_id = key[len(META_MAILBOX):]
        if value is None:
            self._forget_mailbox(mail_id)
        elif mail_id not in self.mailboxes:
            if self._known_mailbox(key, value) is not None:
                self.inbox_cache.clear()

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
            self._forget_mailbox(mail_id)
            for name in mailbox_queues(mail_id):
                self.broker.delete_queue(name, reason=REASON_QUEUE_EXPIRED)
            batch.delete_meta(META_MAILBOX + mail_id)
        self.expire_broadcasts(now)
        if self.batch:
            self.end_turn()


    # -- INBOX publishes: one core call per subject and priority of a read ----------------

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
            session = getattr(pub, "session", None)
            if session is not None and subject.startswith(QUERY) and \
                    not session.check_subscribe(INBOX + subject[len(QUERY):] + ".*"):
                # QUERY hands out the mailbox's messages: it needs the right to read them
                self.error(reply, "not authorized to read this mailbox")
                return 1
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

    # -- mailbox subscribers and the consumers that push to them --------------------------

    def subscribe(self, sub: Subscription) -> None:
        """Attach a mailbox subscriber; the queues it covers push their backlog, urgent first."""
        mail_id, last = sub.subject[len(INBOX):].split(".")
        prios = ORDER if last in ("*", ">") else (PRIORITIES[last][0],)
        self.filters[id(sub)] = prios
        self.subs.setdefault(mail_id, []).append(sub)
        self.flush_pubs()
        box = self.live(mail_id)
        if box is not None:
            for prio in prios:
                self._attach(box, prio)

    def _attach(self, box: Mailbox, prio: int) -> None:
        """Make sure a pushing consumer is attached to ``box``'s queue of ``prio``."""
        key = (box.mail_id, prio)
        if key in self.pushers:
            return
        q = box.queues.get(prio)
        if q is None or q.deleted:
            return
        self.pushers[key] = None           # attaching: a push inside attach() sees the slot
        consumer = self.broker.attach(q, MailboxPusher(self, box.mail_id, prio), ready=PUSH_BATCH)
        if self.pushers.get(key, 0) is None:
            self.pushers[key] = consumer
        self.settle()

    def forget(self, mail_id: str, prio: int, consumer: Any) -> None:
        """Stop using ``consumer`` for new subscribers; it is detached by :meth:`settle`."""
        if self.pushers.get((mail_id, prio), 0) in (consumer, None):
            self.pushers.pop((mail_id, prio), None)
        self._actions.append((consumer, None))

    def settle(self) -> None:
        """Apply the acks and detaches pushes asked for, after the push loop is done.

        Acking from inside a push would re-enter the core's dispatch (and detaching would
        hand entries back while the loop still walks them), so pushes only record what to do.
        Pushes run after the commit that stored their entries, so the deletes of the acks are
        always committed after the puts.
        """
        while self._actions:
            actions, self._actions = self._actions, []
            for consumer, ids in actions:
                if not consumer.attached:
                    continue
                if ids is None:
                    consumer.queue.detach(consumer, requeue=True)
                else:
                    consumer.queue.ack(consumer, ids)

    def _receivers(self, mail_id: str, prio: int) -> list[Subscription]:
        """The connected subscribers of ``mail_id`` covering ``prio``."""
        filters = self.filters
        return [s for s in self.subs.get(mail_id, ())
                if prio in filters.get(id(s), ()) and s.conn.connected]

    def unsubscribe(self, sub: Subscription) -> None:
        """Detach a mailbox subscriber (and the consumers nobody else needs)."""
        mail_id = sub.subject[len(INBOX):].split(".")[0]
        lst = self.subs.get(mail_id)
        if lst and sub in lst:
            lst.remove(sub)
            if not lst:
                del self.subs[mail_id]
                self._rr.pop(mail_id, None)
        prios = self.filters.pop(id(sub), ())
        if self._pushing:
            return              # the running push re-checks its receivers when it ends
        for prio in prios:
            consumer = self.pushers.get((mail_id, prio))
            if consumer is not None and not self._receivers(mail_id, prio):
                self.forget(mail_id, prio, consumer)
        self.settle()

    def push(self, pusher: MailboxPusher, consumer: Any, entries: list[tuple]) -> None:
        """A mailbox queue delivered ``entries`` to its consumer: push them once durable.

        They wait (in flight on the consumer) behind every write before them, as any reply
        does, so a message is pushed only after the commit that stored it.
        """
        self.ops.append((OP_PUSH, pusher, consumer, entries))
        self.kick()

    def push_now(self, pusher: MailboxPusher, consumer: Any, entries: list[tuple]) -> None:
        """Push ``entries`` to the subscribers and record their acks (delivered = read).

        With a message-limited SUB, what no subscriber can take any more goes back to the
        queue (unread) and the consumer detaches.
        """
        if not consumer.attached:
            return          # detached meanwhile: its in-flight entries are ready again
        mail_id = pusher.mail_id
        prio = pusher.priority
        receivers = self._receivers(mail_id, prio)
        if not receivers or self.live(mail_id) is None:
            self.forget(mail_id, prio, consumer)
            return
        self._pushing += 1
        try:
            if any(s.max is not None for s in receivers):
                taken = self._push_limited(mail_id, prio, entries)
            else:
                self._push_all(mail_id, receivers, entries)
                taken = len(entries)
        finally:
            self._pushing -= 1
        if taken:
            self._actions.append((consumer, [e[MSG_ID] for e in entries[:taken]]))
            self.stats["pushed"] += taken
        if taken < len(entries) or not self._receivers(mail_id, prio):
            self.forget(mail_id, prio, consumer)

    def _push_all(self, mail_id: str, receivers: list[Subscription],
                  entries: list[tuple]) -> None:
        """Render every entry for every plain subscriber and one member of each group.

        Plain MSGs (no headers) are rendered into one bytes per subscriber per push, with the
        ``MSG subject sid size`` line built once per distinct (subject, size).
        """
        srv = self.server
        deliver = srv.deliver
        dirty = srv.dirty
        plain = [s for s in receivers if s.queue is None]
        groups: dict[str, list[Any]] = {}
        for s in receivers:
            if s.queue is not None:
                groups.setdefault(s.queue, []).append(s)
        if not groups and not any(e[HEADERS] for e in entries):
            nbytes = sum(len(e[BODY]) for e in entries)
            for sub in plain:
                conn = sub.conn
                out = conn.out
                if not out:
                    dirty.append(conn)
                out.append(render_plain(entries, sub.sid))
                conn.out_msgs += len(entries)
                conn.out_bytes += nbytes
            srv.stats["out_msgs"] += len(plain) * len(entries)
            srv.stats["out_bytes"] += len(plain) * nbytes
            return
        members = list(groups.values())
        rr = self._rr.setdefault(mail_id, {}) if members else {}
        for e in entries:
            reply, hdr = rendered(e[HEADERS])
            body = e[BODY]
            for sub in plain:
                deliver(sub, e[ADDRESS], reply, hdr, body)
            for grp in members:
                rr[grp[0].queue] = k = rr.get(grp[0].queue, -1) + 1
                deliver(grp[k % len(grp)], e[ADDRESS], reply, hdr, body)

    def _push_limited(self, mail_id: str, prio: int, entries: list[tuple]) -> int:
        """Push ``entries`` one at a time while a receiver is left; return how many were taken."""
        deliver = self.server.deliver
        rr = self._rr.setdefault(mail_id, {})
        taken = 0
        for e in entries:
            live = [s for s in self._receivers(mail_id, prio)
                    if s.max is None or s.delivered < s.max]
            if not live:
                break
            taken += 1
            reply, hdr = rendered(e[HEADERS])
            groups: dict[str, list[Any]] = {}
            for s in live:
                if s.queue is None:
                    deliver(s, e[ADDRESS], reply, hdr, e[BODY])
                else:
                    groups.setdefault(s.queue, []).append(s)
            for name, grp in groups.items():
                rr[name] = k = rr.get(name, -1) + 1
                deliver(grp[k % len(grp)], e[ADDRESS], reply, hdr, e[BODY])
        return taken

    # -- persisted broadcasts -------------------------------------------------------------

    def migrate_broadcasts(self, _: Any = None) -> Any:
        """Move persisted broadcasts stored by older versions (queue ``mq9/bc``, which the core
        recovers as one of its own queues) under :data:`BCAST_QUEUE`."""
        if self.broker.queue(OLD_BCAST_QUEUE) is None:
            return None
        d = self.state.read_entries(OLD_BCAST_QUEUE, None, 1 << 30)

        def move(entries: list[tuple]) -> Any:
            """Write them under the new name, then drop the old queue."""
            batch = self.state.batch()
            if entries:
                batch.put_entries(BCAST_QUEUE, entries)
            d2 = self.state.commit(batch) if batch else succeed(None)
            d2.addCallback(lambda _: self.broker.delete_queue(OLD_BCAST_QUEUE))
            return d2
        d.addCallback(move)
        return d

    def recover_broadcasts(self, entries: list[tuple]) -> Any:
        """Load persisted broadcasts and the consumers that already received each."""
        for e in entries:
            self._observe(e[MSG_ID])
            self.broadcasts.append((e, set()))
        if not entries:
            return None
        d = self.state.scan_meta(META_BCAST_KEYS)

        def keys(rows: list[tuple[str, bytes]]) -> None:
            """Attach the stored receiver sets to their broadcasts."""
            by_id = {str(e[MSG_ID]): seen for e, seen in self.broadcasts}
            for key, value in rows:
                seen = by_id.get(key[len(META_BCAST_KEYS):])
                if seen is not None:
                    seen.update(json.loads(value))
        d.addCallback(keys)
        return d

    def _observe(self, msg_id: int) -> None:
        """Tell the id generator about a recovered id."""
        self.ids.observe(msg_id)

    def broadcast_subscribed(self, sub: Subscription) -> None:
        """Replay persisted broadcasts to a new subscriber whose group/subject has not had them."""
        if not self.broadcasts:
            return
        now = self.clock.seconds()
        key = self._consumer_key(sub)
        for entry, seen in self.broadcasts:
            if key in seen or (entry[EXPIRES_AT] and entry[EXPIRES_AT] <= now):
                continue
            if not subject_matches(sub.subject, entry[ADDRESS]):
                continue
            seen.add(key)
            hdrs = entry[HEADERS]
            self.server.deliver(sub, entry[ADDRESS], None,
                                codec.build_headers(hdrs) if hdrs else None, entry[BODY])
            self.batch.put_meta(META_BCAST_KEYS + str(entry[MSG_ID]),
                                json.dumps(sorted(seen)).encode())
        self.kick()

    @staticmethod
    def _consumer_key(sub: Subscription) -> str:
        """Who counts as "already received" for a persisted broadcast."""
        return "q:" + sub.queue if sub.queue is not None else "s:" + sub.wire_subject

    def persisted_broadcast(self, pub: NatsConnection | None, subject: str,
                            reply: str | None, hdr: bytes | None, payload: bytes) -> int:
        """Store a broadcast with ``mq9-persist: true``; it is delivered after the commit.

        Past ``max_unread`` stored broadcasts it is delivered live only (not stored).
        """
        if len(self.broadcasts) >= self.max_unread:
            self.stats["refused"] += 1
            return self.server.publish(pub, subject, reply, hdr, payload) or 1
        headers = headers_dict(hdr)
        now = self.clock.seconds()
        ttl = ttl_header(headers) or DEFAULT_BROADCAST_TTL
        entry = make_entry(self.new_id(), payload, subject, expires_at=now + ttl, headers=headers,
                           origin="nats")
        self.batch.put_entries(BCAST_QUEUE, (entry,))
        seen: set[str] = set()
        self.broadcasts.append((entry, seen))
        self.ops.append((OP_BROADCAST, pub, entry, seen, reply, hdr))
        return 1

    def deliver_broadcast(self, pub: NatsConnection | None, entry: tuple, seen: set[str],
                          reply: str | None, hdr: bytes | None) -> None:
        """Deliver a committed persisted broadcast and remember who got it."""
        srv = self.server
        subject = entry[ADDRESS]
        plain, groups = srv.sublist.match(subject)
        echo_off = pub is not None and not pub.echo
        for sub in plain:
            if echo_off and sub.conn is pub:
                continue
            srv.deliver(sub, subject, reply, hdr, entry[BODY])
            seen.add(self._consumer_key(sub))
        for name, members in groups.items():
            live = [m for m in members if m.conn.connected and not (echo_off and m.conn is pub)]
            if live:
                srv.deliver(live[entry[MSG_ID] % len(live)], subject, reply, hdr, entry[BODY])
                seen.add("q:" + name)
        if srv.bridge is not None and srv.bridge.has_foreign(subject):
            srv.bridge.publish(subject, reply, hdr, entry[BODY])
        if seen:
            self.batch.put_meta(META_BCAST_KEYS + str(entry[MSG_ID]),
                                json.dumps(sorted(seen)).encode())

    def expire_broadcasts(self, now: float) -> None:
        """Forget persisted broadcasts past their TTL (their deletes go into ``batch``)."""
        if not self.broadcasts:
            return
        batch = self.batch
        alive = []
        for entry, seen in self.broadcasts:
            if entry[EXPIRES_AT] and entry[EXPIRES_AT] <= now:
                batch.delete_entries(BCAST_QUEUE, [(entry[PRIORITY], entry[MSG_ID])])
                batch.delete_meta(META_BCAST_KEYS + str(entry[MSG_ID]))
            else:
                alive.append((entry, seen))
        self.broadcasts = alive


def _expiry(box: Mailbox, entry: tuple) -> float:
    """An old-layout message's expiry: its id's time plus its TTL rule, capped by the mailbox's."""
    ttl = ttl_header(entry[HEADERS]) or PRIORITIES[PRIORITY_NAMES.get(entry[PRIORITY],
                                                                       "normal")][1]
    expires = id_time(entry[MSG_ID]) + ttl if ttl else 0.0
    if box.expires_at and (not expires or box.expires_at < expires):
        expires = box.expires_at
    return expires


def _group_rank(group: list[Any]) -> int:
    """Sort key of an INBOX group at flush time: urgent first."""
    return -group[1]


def _log_commit_failure(failure: Any) -> None:
    """Log a failed store commit of INBOX messages (their publishers got no PONG)."""
    log.failure("mq9: store commit failed", failure)
