"""mq9: agent mailboxes on ``$mq9.AI.*`` NATS subjects (the original mq9 text + DESIGN.md §7).

- ``$mq9.AI.MAILBOX.CREATE`` → ``{mail_id, token, inbox, type, ttl}``;
  ``$mq9.AI.MAILBOX.QUERY.{id}`` with ``{"token"}`` → ``{mail_id, unread, messages}``.
- ``$mq9.AI.INBOX.{id}.urgent|normal|notify``: stored first (urgent/normal durable with default
  TTLs 86400 s / 3600 s, notify memory-tier; everything durable in a ``latest`` mailbox), then
  pushed to the mailbox's subscribers; without a subscriber it waits (unread).
- A SUB on ``$mq9.AI.INBOX.{id}.*`` (or ``.>``, or one priority) gets the unread backlog in
  priority order (urgent → normal → notify, FIFO within each), then live messages.
- ``$mq9.AI.BROADCAST.{domain}.{event}`` is plain NATS (``#`` at the end of a SUB means ``>``);
  with header ``mq9-persist: true`` the message is also stored for its TTL and replayed to
  late subscribers: once per queue group, or once per distinct SUB subject without a group.
- Every mq9 error is a JSON ``{"error": "..."}`` reply on the request's reply subject.

Mailboxes keep their unread messages in memory (a mirror of the store, rebuilt on start); each
read's writes go to the store as one batch, and pushes happen only after that batch commits.
"""

from __future__ import annotations

import base64
import heapq
import json
import secrets
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import succeed
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from mqhub.protocols.nats import codec
from mqhub.protocols.nats.sublist import subject_matches
from mqhub.store.batch import WriteBatch
from mqhub.store.records import BODY, EXPIRES_AT, HEADERS, MSG_ID, PRIORITY

if TYPE_CHECKING:  # pragma: no cover
    from mqhub.protocols.nats.server import NatsConnection, NatsServer, Subscription

log = Logger()

INBOX = "$mq9.AI.INBOX."
MAILBOX = "$mq9.AI.MAILBOX."
BROADCAST = "$mq9.AI.BROADCAST."

#: priority name -> (store priority, default TTL seconds or 0, durable in a standard mailbox)
PRIORITIES: dict[str, tuple[int, float, bool]] = {
    "urgent": (2, 86400.0, True),
    "normal": (1, 3600.0, True),
    "notify": (0, 0.0, False),
}
PRIORITY_NAMES = {2: "urgent", 1: "normal", 0: "notify"}
_NEVER = float(1 << 62)      # "no expiry" while taking a minimum (``% _NEVER`` maps it to 0)
DEFAULT_MAILBOX_TTL = 86400
DEFAULT_BROADCAST_TTL = 3600.0
QUERY_LIMIT = 1000
RESERVED_REPLY = "mqhub-reply"

META_MAILBOX = "mq9/mb/"
META_BCAST_KEYS = "mq9/bk/"
BCAST_QUEUE = "mq9/bc"


def mailbox_queue(mail_id: str) -> str:
    """Store queue name holding a mailbox's durable messages."""
    return "mq9/box/" + mail_id


class Mailbox:
    """One mailbox: its settings and its unread messages per priority (entry tuples)."""

    __slots__ = ("mail_id", "token", "kind", "ttl", "created", "expires_at", "unread")

    def __init__(self, mail_id: str, token: str, kind: str, ttl: int, created: float) -> None:
        """Record the settings; ``ttl`` 0 means the mailbox never expires."""
        self.mail_id = mail_id
        self.token = token
        self.kind = kind
        self.ttl = ttl
        self.created = created
        self.expires_at = created + ttl if ttl else 0.0
        self.unread: dict[int, list[tuple]] = {2: [], 1: [], 0: []}

    def record(self) -> bytes:
        """The metadata value persisted for this mailbox."""
        return json.dumps({"token": self.token, "type": self.kind, "ttl": self.ttl,
                           "created": self.created}).encode()

    @classmethod
    def from_record(cls, mail_id: str, data: bytes) -> Mailbox:
        """Rebuild a mailbox from its metadata value."""
        d = json.loads(data)
        return cls(mail_id, d["token"], d["type"], int(d["ttl"]), float(d["created"]))

    def count(self) -> int:
        """Number of unread messages."""
        u = self.unread
        return len(u[2]) + len(u[1]) + len(u[0])


def _headers_dict(hdr: bytes | None) -> dict[str, str] | None:
    """A header block as a dict (last value wins), or None."""
    if not hdr:
        return None
    try:
        _, _, items = codec.parse_headers(hdr)
    except codec.ProtocolError:
        return None
    return dict(items) if items else None


def _header(headers: dict[str, str] | None, name: str) -> str | None:
    """Case-insensitive header lookup."""
    if not headers:
        return None
    low = name.lower()
    for k, v in headers.items():
        if k.lower() == low:
            return v
    return None


def _ttl_header(headers: dict[str, str] | None) -> float:
    """The ``mq9-ttl`` header as positive seconds, or 0."""
    raw = _header(headers, "mq9-ttl")
    if raw is None:
        return 0.0
    try:
        ttl = float(raw)
    except ValueError:
        return 0.0
    return ttl if ttl > 0 else 0.0


class Mq9:
    """The mq9 layer of one NATS server.

    :param server: the :class:`NatsServer` (used to deliver and to find subscribers).
    :param store: the hub's IMessageStore.
    :param clock: the hub's clock.
    :param ids: an id source with ``reserve(n)`` (and optionally ``observe(msg_id)``).
    """

    def __init__(self, server: NatsServer, store: Any, clock: Any, ids: Any,
                 sweep_interval: float = 1.0, max_unread: int = 1_000_000,
                 max_mailboxes: int = 1_000_000) -> None:
        """Start with no mailboxes; call :meth:`start` to recover from the store."""
        self.server = server
        self.store = store
        self.clock = clock
        self.ids = ids
        self.sweep_interval = sweep_interval
        self.max_unread = max_unread
        self.max_mailboxes = max_mailboxes
        self.mailboxes: dict[str, Mailbox] = {}
        self.subs: dict[str, list[Subscription]] = {}
        self.filters: dict[int, tuple[int, ...]] = {}
        self._rr: dict[str, dict[str, int]] = {}
        self.broadcasts: list[tuple[tuple, set[str]]] = []
        self._batch = WriteBatch()
        self._ops: list[tuple] = []
        self._kick_call: Any = None
        self._inflight = 0
        self._due_heap: list[tuple[float, str]] = []
        self._sweeper: LoopingCall | None = None
        self._inbox_cache: dict[str, Any] = {}
        self._id_next = 0
        self._id_end = 0
        self.stats = {"stored": 0, "pushed": 0, "expired": 0, "queried": 0, "refused": 0}

    # lifecycle ---------------------------------------------------------------------------

    def start(self) -> Any:
        """Recover mailboxes, unread messages and persisted broadcasts; start the TTL sweep."""
        d = self.store.scan_meta(META_MAILBOX)
        d.addCallback(self._recover_mailboxes)
        d.addCallback(lambda _: self.store.read_entries(BCAST_QUEUE, None, 1 << 30))
        d.addCallback(self._recover_broadcasts)
        d.addCallback(self._start_sweep)
        return d

    def _recover_mailboxes(self, rows: list[tuple[str, bytes]]) -> Any:
        """Load each mailbox and its stored messages."""
        pending = []
        for key, value in rows:
            mail_id = key[len(META_MAILBOX):]
            try:
                box = Mailbox.from_record(mail_id, value)
            except (ValueError, KeyError):
                log.warn("mq9: unreadable mailbox record {key}", key=key)
                continue
            self.mailboxes[mail_id] = box
            d = self.store.read_entries(mailbox_queue(mail_id), None, 1 << 30)
            d.addCallback(self._load_entries, box)
            pending.append(d)
        from twisted.internet.defer import gatherResults
        return gatherResults(pending, consumeErrors=True) if pending else succeed(None)

    def _load_entries(self, entries: list[tuple], box: Mailbox) -> None:
        """Put recovered entries back in a mailbox (a ``latest`` box keeps only the newest)."""
        if box.kind == "latest" and len(entries) > 1:
            newest = max(entries, key=lambda e: e[MSG_ID])
            stale = [(e[PRIORITY], e[MSG_ID]) for e in entries if e is not newest]
            self._batch.delete_entries(mailbox_queue(box.mail_id), stale)
            entries = [newest]
        self._due(box.expires_at, box.mail_id)
        nearest = _NEVER
        for e in entries:
            e = e[:EXPIRES_AT] + (_expiry(box, e),) + e[EXPIRES_AT + 1:]
            box.unread[e[PRIORITY]].append(e)
            if e[EXPIRES_AT] and e[EXPIRES_AT] < nearest:
                nearest = e[EXPIRES_AT]
            self._observe(e[MSG_ID])
        self._due(nearest % _NEVER, box.mail_id)
        for lst in box.unread.values():
            lst.sort(key=lambda e: e[MSG_ID])

    def _recover_broadcasts(self, entries: list[tuple]) -> Any:
        """Load persisted broadcasts and the consumers that already received each."""
        for e in entries:
            self._observe(e[MSG_ID])
            self.broadcasts.append((e, set()))
        if not entries:
            return None
        d = self.store.scan_meta(META_BCAST_KEYS)

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
        """Tell the id generator about a recovered id, when it can listen."""
        observe = getattr(self.ids, "observe", None)
        if observe is not None:
            observe(msg_id)

    def _start_sweep(self, _: Any = None) -> None:
        """Run the TTL sweep every ``sweep_interval`` seconds (and commit recovery clean-ups)."""
        if self._batch:
            self.kick()
        if self.sweep_interval > 0 and self._sweeper is None:
            self._sweeper = LoopingCall(self.sweep)
            self._sweeper.clock = self.clock
            self._sweeper.start(self.sweep_interval, now=False)

    def stop(self) -> Any:
        """Stop the sweep and commit what is pending."""
        if self._sweeper is not None and self._sweeper.running:
            self._sweeper.stop()
        self._sweeper = None
        if self._kick_call is not None and self._kick_call.active():
            self._kick_call.cancel()
        self._kick_call = None
        return self._commit()

    # what mq9 owns -----------------------------------------------------------------------

    def claims(self, subject: str) -> bool:
        """True for publishes mq9 handles itself: MAILBOX.* and INBOX.*."""
        return subject.startswith(INBOX) or subject.startswith(MAILBOX)

    def persist_requested(self, hdr: bytes) -> bool:
        """True when a header block asks for ``mq9-persist: true``."""
        if b"mq9-persist" not in hdr.lower():
            return False
        return (_header(_headers_dict(hdr), "mq9-persist") or "").strip().lower() == "true"

    def claims_subscription(self, sub: Subscription) -> bool:
        """True for ``$mq9.AI.INBOX.{literal id}.{urgent|normal|notify|*|>}`` subscriptions."""
        subject = sub.subject
        if not subject.startswith(INBOX):
            return False
        parts = subject[len(INBOX):].split(".")
        if len(parts) != 2 or parts[0] in ("*", ">"):
            return False
        return parts[1] in PRIORITIES or parts[1] in ("*", ">")

    # subscriptions -------------------------------------------------------------------------

    def subscribe(self, sub: Subscription) -> None:
        """Attach a mailbox subscriber and push the unread backlog it covers."""
        mail_id, last = sub.subject[len(INBOX):].split(".")
        prios = (2, 1, 0) if last in ("*", ">") else (PRIORITIES[last][0],)
        self.filters[id(sub)] = prios
        self.subs.setdefault(mail_id, []).append(sub)
        box = self.mailboxes.get(mail_id)
        if box is not None and box.count():
            self._drain(box)
            self.kick()

    def unsubscribe(self, sub: Subscription) -> None:
        """Detach a mailbox subscriber."""
        mail_id = sub.subject[len(INBOX):].split(".")[0]
        lst = self.subs.get(mail_id)
        if lst and sub in lst:
            lst.remove(sub)
            if not lst:
                del self.subs[mail_id]
                self._rr.pop(mail_id, None)
        self.filters.pop(id(sub), None)

    def broadcast_subscribed(self, sub: Subscription) -> None:
        """Replay persisted broadcasts to a new subscriber whose group/subject has not had them."""
        if not self.broadcasts:
            return
        now = self.clock.seconds()
        key = self._consumer_key(sub)
        for entry, seen in self.broadcasts:
            if key in seen or (entry[EXPIRES_AT] and entry[EXPIRES_AT] <= now):
                continue
            if not subject_matches(sub.subject, entry[5]):
                continue
            seen.add(key)
            hdrs = entry[HEADERS]
            self.server.deliver(sub, entry[5], None, codec.build_headers(hdrs) if hdrs else None,
                                entry[BODY])
            self._batch.put_meta(META_BCAST_KEYS + str(entry[MSG_ID]),
                                 json.dumps(sorted(seen)).encode())
        self.kick()

    @staticmethod
    def _consumer_key(sub: Subscription) -> str:
        """Who counts as "already received" for a persisted broadcast."""
        return "q:" + sub.queue if sub.queue is not None else "s:" + sub.wire_subject

    # publishes ---------------------------------------------------------------------------

    def publish(self, pub: NatsConnection | None, subject: str, reply: str | None,
                hdr: bytes | None, payload: bytes) -> int:
        """Handle one mq9 publish; returns 1 (mq9 always "responds", so no 503)."""
        if subject.startswith(INBOX):
            self._inbox(subject, reply, hdr, payload)
        elif subject.startswith(MAILBOX):
            self._mailbox_request(subject, reply, payload)
        elif subject.startswith(BROADCAST):
            return self._persisted_broadcast(pub, subject, reply, hdr, payload)
        return 1

    def _resolve_inbox(self, subject: str) -> Any:
        """``(box, priority, default_ttl, stored, queue)`` for an INBOX subject, or an error text.

        Cached per subject; the cache is cleared whenever a mailbox is created or removed.
        """
        parts = subject[len(INBOX):].split(".")
        if len(parts) != 2 or parts[1] not in PRIORITIES:
            return f"invalid mq9 inbox subject: {subject}"
        box = self.mailboxes.get(parts[0])
        if box is None:
            return f"mailbox {parts[0]} does not exist"
        prio, ttl, durable = PRIORITIES[parts[1]]
        hit = (box, prio, ttl, durable or box.kind == "latest", mailbox_queue(box.mail_id))
        if len(self._inbox_cache) > 100000:
            self._inbox_cache.clear()
        self._inbox_cache[subject] = hit
        return hit

    def _new_id(self) -> int:
        """Next message id, from a block reserved for this read."""
        n = self._id_next
        if n >= self._id_end:
            n = self.ids.reserve(256)
            self._id_end = n + 256
        self._id_next = n + 1
        return n

    def _inbox(self, subject: str, reply: str | None, hdr: bytes | None,
               payload: bytes) -> None:
        """Store one mailbox message; it is pushed after the read's batch commits."""
        hit = self._inbox_cache.get(subject)
        if hit is None:
            hit = self._resolve_inbox(subject)
            if hit.__class__ is str:
                self._error(reply, hit)
                return
        box, prio, ttl, stored, queue = hit
        now = self.clock.seconds()
        box_exp = box.expires_at
        if box_exp and box_exp <= now:
            self._error(reply, f"mailbox {box.mail_id} does not exist")
            return
        unread = box.unread
        if len(unread[2]) + len(unread[1]) + len(unread[0]) >= self.max_unread:
            self.stats["refused"] += 1
            self._error(reply, f"mailbox {box.mail_id} is full")
            return
        headers = None
        if hdr is not None or reply:
            headers = _headers_dict(hdr) if hdr is not None else None
            if reply:
                headers = dict(headers or {})
                headers[RESERVED_REPLY] = reply
            ttl = _ttl_header(headers) or ttl
        expires = now + ttl if ttl else 0.0
        if box_exp and (not expires or box_exp < expires):
            expires = box_exp
        msg_id = self._new_id()
        if stored:
            # the store keeps no expiry: it is derived again on recovery (id time + TTL rule)
            puts = self._batch.puts
            lst = puts.get(queue)
            if lst is None:
                lst = puts[queue] = []
            lst.append((msg_id, prio, 0, 0.0, 0.0, subject, headers, payload, "nats"))
        entry = (msg_id, prio, 0, 0.0, expires, subject, headers, payload, "nats")
        ops = self._ops
        if ops:
            last = ops[-1]
            if last[0] == 0 and last[1] is box:
                last[2].append(entry)
                return
        ops.append((0, box, [entry]))

    def _live(self, mail_id: str) -> Mailbox | None:
        """The mailbox ``mail_id`` unless it is unknown or past its TTL (sweep pending)."""
        box = self.mailboxes.get(mail_id)
        if box is not None and box.expires_at and box.expires_at <= self.clock.seconds():
            return None
        return box

    def _mailbox_request(self, subject: str, reply: str | None, payload: bytes) -> None:
        """MAILBOX.CREATE and MAILBOX.QUERY.{id}."""
        rest = subject[len(MAILBOX):]
        try:
            req = json.loads(payload) if payload.strip() else {}
        except ValueError as exc:
            self._error(reply, f"invalid JSON request: {exc}")
            return
        if not isinstance(req, dict):
            self._error(reply, "request must be a JSON object")
            return
        if rest == "CREATE":
            self._create(reply, req)
        elif rest.startswith("QUERY.") and rest.count(".") == 1 and len(rest) > 6:
            self._ops.append((1, rest[6:], req, reply))
        else:
            self._error(reply, f"unknown mq9 request: {subject}")

    def _create(self, reply: str | None, req: dict[str, Any]) -> None:
        """Create a mailbox (its record commits with this read's batch, then the reply goes)."""
        kind = req.get("type", "standard")
        if kind not in ("standard", "latest"):
            self._error(reply, "type must be 'standard' or 'latest'")
            return
        ttl = req.get("ttl", DEFAULT_MAILBOX_TTL)
        if ttl is None:
            ttl = DEFAULT_MAILBOX_TTL
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or ttl < 0:
            self._error(reply, "ttl must be a non-negative number of seconds")
            return
        if len(self.mailboxes) >= self.max_mailboxes:
            self._error(reply, "too many mailboxes")
            return
        mail_id = "m" + secrets.token_hex(12)
        token = "tok-" + secrets.token_urlsafe(24)
        box = Mailbox(mail_id, token, kind, int(ttl), self.clock.seconds())
        self.mailboxes[mail_id] = box
        self._inbox_cache.clear()
        self._due(box.expires_at, mail_id)
        self._batch.put_meta(META_MAILBOX + mail_id, box.record())
        body = {"mail_id": mail_id, "token": token, "inbox": INBOX + mail_id, "type": kind,
                "ttl": int(ttl)}
        self._reply(reply, body)

    def _persisted_broadcast(self, pub: NatsConnection | None, subject: str,
                             reply: str | None, hdr: bytes | None, payload: bytes) -> int:
        """Store a broadcast with ``mq9-persist: true``; it is delivered after the commit.

        Past ``max_unread`` stored broadcasts it is delivered live only (not stored).
        """
        if len(self.broadcasts) >= self.max_unread:
            self.stats["refused"] += 1
            return self.server.publish(pub, subject, reply, hdr, payload) or 1
        headers = _headers_dict(hdr)
        now = self.clock.seconds()
        ttl = _ttl_header(headers) or DEFAULT_BROADCAST_TTL
        entry = (self._new_id(), 0, 0, 0.0, now + ttl, subject, headers, payload, "nats")
        self._batch.put_entries(BCAST_QUEUE, (entry,))
        seen: set[str] = set()
        self.broadcasts.append((entry, seen))
        self._ops.append((2, pub, entry, seen, reply, hdr))
        return 1

    # replies -----------------------------------------------------------------------------

    def _reply(self, reply: str | None, body: dict[str, Any]) -> None:
        """Send a JSON reply after this read's batch commits (nothing without a reply subject)."""
        if reply:
            self._ops.append((3, reply, json.dumps(body, separators=(",", ":")).encode()))

    def _error(self, reply: str | None, text: str) -> None:
        """Reply ``{"error": text}``; never a -ERR."""
        self._reply(reply, {"error": text})

    # commit and push -----------------------------------------------------------------------

    def kick(self) -> None:
        """Arrange a commit on the next turn for writes made outside a read."""
        if self._kick_call is None:
            self._kick_call = self.clock.callLater(0, self._kicked)

    def _kicked(self) -> None:
        """Commit pending writes that no read picked up."""
        self._kick_call = None
        self.end_turn()

    def end_turn(self) -> None:
        """Commit this read's batch; run its operations (pushes, replies) once durable.

        Operations always run in commit order: while a commit is in flight, even a batch
        without writes goes through the store so its operations (a PONG barrier) wait.
        """
        self._id_next = self._id_end     # ids of the next read come from a fresh block
        if not self._batch and not self._ops:
            return
        ops, self._ops = self._ops, []
        batch, self._batch = self._batch, WriteBatch()
        if batch or self._inflight:
            self._inflight += 1
            d = self.store.commit(batch)
            d.addBoth(self._landed)
        else:
            d = succeed(None)
        if ops:
            d.addCallback(self._run_ops, ops)
            d.addErrback(self._failed, ops)

    def _landed(self, result: Any) -> Any:
        """One commit finished (successfully or not)."""
        self._inflight -= 1
        return result

    def barrier(self, conn: NatsConnection) -> bool:
        """Queue a PONG for ``conn`` behind every pending mq9 write; False when none is pending.

        This makes a client's flush() (PING/PONG) a durability barrier for its mq9 publishes.
        """
        if not (self._batch or self._ops or self._inflight):
            return False
        self._ops.append((4, conn))
        return True

    def _commit(self) -> Any:
        """Hand the pending batch to the store now (used outside reads: stop, deletes)."""
        batch, self._batch = self._batch, WriteBatch()
        if not batch:
            return succeed(None)
        self._inflight += 1
        d = self.store.commit(batch)
        d.addBoth(self._landed)
        return d

    def _failed(self, failure: Any, ops: list[tuple]) -> None:
        """A commit failed: tell requesters; stored messages were not confirmed to anyone."""
        log.failure("mq9: store commit failed", failure)
        for op in ops:
            if op[0] == 1:
                self._send(op[3], {"error": "store unavailable"})
            elif op[0] == 4 and op[1].connected:
                op[1].out_ctl(codec.PONG)
        self.server.flush()

    def _run_ops(self, _: Any, ops: list[tuple]) -> None:
        """Apply committed operations in order, then push and write."""
        touched: dict[str, Mailbox] = {}
        for op in ops:
            kind = op[0]
            if kind == 0:
                box: Mailbox = op[1]
                entries: list[tuple] = op[2]
                if self.mailboxes.get(box.mail_id) is not box:
                    continue
                unread = box.unread
                if box.kind == "latest":
                    self._clear(box)
                    if len(entries) > 1:
                        self._batch.delete_entries(mailbox_queue(box.mail_id),
                                                   [(e[PRIORITY], e[MSG_ID]) for e in entries[:-1]])
                        entries = entries[-1:]
                if len(entries) == 1 or all(e[PRIORITY] == entries[0][PRIORITY] for e in entries):
                    unread[entries[0][PRIORITY]].extend(entries)
                else:
                    for e in entries:
                        unread[e[PRIORITY]].append(e)
                self._due(min(e[EXPIRES_AT] or _NEVER for e in entries) % _NEVER, box.mail_id)
                touched[box.mail_id] = box
            elif kind == 1:
                for tbox in touched.values():
                    self._drain(tbox)
                touched.clear()
                self._query(op[1], op[2], op[3])
            elif kind == 2:
                self._deliver_broadcast(op[1], op[2], op[3], op[4], op[5])
            elif kind == 4:
                if op[1].connected:
                    op[1].out_ctl(codec.PONG)
            else:
                self.server.publish(None, op[1], None, None, op[2])
        for tbox in touched.values():
            self._drain(tbox)
        if self._batch:
            self.kick()     # deletes ride with the next read's commit (or the next turn)
        if self.server.bridge is not None:
            self.server.bridge.flush()
        self.server.flush()

    def _clear(self, box: Mailbox) -> None:
        """Drop every unread message of a mailbox (``latest`` overwrite)."""
        keys: list[tuple[int, int]] = []
        for lst in box.unread.values():
            keys.extend((e[PRIORITY], e[MSG_ID]) for e in lst)
            lst.clear()
        if keys:
            self._batch.delete_entries(mailbox_queue(box.mail_id), keys)

    def _drain(self, box: Mailbox) -> None:
        """Push unread messages to the mailbox's subscribers, highest priority first."""
        subs = self.subs.get(box.mail_id)
        if not subs:
            return
        now = self.clock.seconds()
        srv = self.server
        deliver = srv.deliver
        dirty = srv.dirty
        deleted: list[tuple[int, int]] = []
        filters = self.filters
        latest = box.kind == "latest"
        for prio in (2, 1, 0):
            entries = box.unread[prio]
            if not entries:
                continue
            receivers = [s for s in subs if prio in filters.get(id(s), ())
                         and s.conn.connected]
            if not receivers:
                continue
            plain = [s for s in receivers if s.queue is None]
            groups: dict[str, list[Any]] = {}
            for s in receivers:
                if s.queue is not None:
                    groups.setdefault(s.queue, []).append(s)
            members = list(groups.values())
            rr = self._rr.setdefault(box.mail_id, {}) if members else {}
            if any(s.max is not None for s in receivers):
                # a SUB with a message limit: one by one, and what nobody can take stays unread
                taken = self._drain_limited(box, prio, entries, now)
                box.unread[prio] = entries[taken:]
                if prio or latest:
                    deleted.extend([(prio, e[MSG_ID]) for e in entries[:taken]])
                subs = self.subs.get(box.mail_id)
                if not subs:
                    break
                continue
            # fast path: plain subscribers, messages without headers
            fast = [(s.conn, s.conn.out, s.sid) for s in plain]
            heads: dict[tuple[str, str], bytes] = {}
            box.unread[prio] = []
            if prio or latest:
                deleted.extend([(prio, e[MSG_ID]) for e in entries])
            for e in entries:
                if e[EXPIRES_AT] and e[EXPIRES_AT] <= now:
                    self.stats["expired"] += 1
                    continue
                headers = e[HEADERS]
                body = e[BODY]
                if headers is None:
                    subject = e[5]
                    for conn, out, sid in fast:
                        head = heads.get((subject, sid))
                        if head is None:
                            head = heads[(subject, sid)] = f"MSG {subject} {sid} ".encode()
                        if not out:
                            dirty.append(conn)
                        out.append(head + b"%d\r\n" % len(body))
                        out.append(body)
                        out.append(b"\r\n")
                    reply = hdr = None
                else:
                    reply, hdr = _rendered(headers)
                    for sub in plain:
                        deliver(sub, e[5], reply, hdr, body)
                for grp in members:
                    rr[grp[0].queue] = k = rr.get(grp[0].queue, -1) + 1
                    deliver(grp[k % len(grp)], e[5], reply, hdr, body)
            self.stats["pushed"] += len(entries)
            subs = self.subs.get(box.mail_id)   # a max-limited SUB may have gone
            if not subs:
                break
        if deleted:
            self._batch.delete_entries(mailbox_queue(box.mail_id), deleted)

    def _drain_limited(self, box: Mailbox, prio: int, entries: list[tuple], now: float) -> int:
        """Push ``entries`` one at a time while a receiver is left; return how many were taken."""
        filters = self.filters
        deliver = self.server.deliver
        rr = self._rr.setdefault(box.mail_id, {})
        taken = 0
        for e in entries:
            live = [s for s in self.subs.get(box.mail_id, ())
                    if prio in filters.get(id(s), ()) and s.conn.connected
                    and (s.max is None or s.delivered < s.max)]
            if not live:
                break
            taken += 1
            if e[EXPIRES_AT] and e[EXPIRES_AT] <= now:
                self.stats["expired"] += 1
                continue
            reply, hdr = _rendered(e[HEADERS])
            groups: dict[str, list[Any]] = {}
            for s in live:
                if s.queue is None:
                    deliver(s, e[5], reply, hdr, e[BODY])
                else:
                    groups.setdefault(s.queue, []).append(s)
            for name, grp in groups.items():
                rr[name] = k = rr.get(name, -1) + 1
                deliver(grp[k % len(grp)], e[5], reply, hdr, e[BODY])
            self.stats["pushed"] += 1
        return taken

    def _query(self, mail_id: str, req: dict[str, Any], reply: str | None) -> None:
        """Answer QUERY: every unread message (up to ``limit``), which becomes read."""
        box = self._live(mail_id)
        if box is None:
            self._send(reply, {"error": f"mailbox {mail_id} does not exist"})
            return
        token = req.get("token")
        if not isinstance(token, str) or not secrets.compare_digest(token, box.token):
            self._send(reply, {"error": "invalid token"})
            return
        limit = req.get("limit", QUERY_LIMIT)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
            limit = QUERY_LIMIT
        now = self.clock.seconds()
        unread = box.count()
        items: list[dict[str, Any]] = []
        deleted: list[tuple[int, int]] = []
        for prio in (2, 1, 0):
            entries = box.unread[prio]
            take = 0
            for e in entries:
                if len(items) >= limit:
                    break
                take += 1
                if prio or box.kind == "latest":
                    deleted.append((prio, e[MSG_ID]))
                if e[EXPIRES_AT] and e[EXPIRES_AT] <= now:
                    unread -= 1
                    continue
                items.append(_item(e))
            del entries[:take]
        if deleted:
            self._batch.delete_entries(mailbox_queue(mail_id), deleted)
        self.stats["queried"] += len(items)
        self._send(reply, {"mail_id": mail_id, "unread": unread, "messages": items})

    def _send(self, reply: str | None, body: dict[str, Any]) -> None:
        """Publish a JSON reply now (used after the commit)."""
        if reply:
            self.server.publish(None, reply, None, None,
                                json.dumps(body, separators=(",", ":")).encode())

    def _deliver_broadcast(self, pub: NatsConnection | None, entry: tuple, seen: set[str],
                           reply: str | None, hdr: bytes | None) -> None:
        """Deliver a committed persisted broadcast and remember who got it."""
        srv = self.server
        subject = entry[5]
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
            self._batch.put_meta(META_BCAST_KEYS + str(entry[MSG_ID]),
                                 json.dumps(sorted(seen)).encode())

    # expiry ------------------------------------------------------------------------------

    def _due(self, when: float, mail_id: str) -> None:
        """Make the sweep look at ``mail_id`` at ``when`` (0 = never)."""
        if when:
            heapq.heappush(self._due_heap, (when, mail_id))

    def sweep(self) -> None:
        """Remove expired mailboxes (with everything in them), messages and broadcasts.

        Only mailboxes whose earliest expiry (their own or a message's) is due are visited:
        a heap of (time, mail_id) is fed by CREATE, by each committed group of messages and
        by recovery, so a sweep costs nothing when nothing is due.
        """
        now = self.clock.seconds()
        batch = self._batch
        heap = self._due_heap
        while heap and heap[0][0] <= now:
            _, mail_id = heapq.heappop(heap)
            box = self.mailboxes.get(mail_id)
            if box is None:
                continue
            if box.expires_at and box.expires_at <= now:
                del self.mailboxes[mail_id]
                self._inbox_cache.clear()
                batch.purge_queue(mailbox_queue(mail_id))
                batch.delete_meta(META_MAILBOX + mail_id)
                self.stats["expired"] += box.count()
                continue
            nearest = 0.0
            for prio, entries in box.unread.items():
                if not entries:
                    continue
                keep = [e for e in entries if not e[EXPIRES_AT] or e[EXPIRES_AT] > now]
                if len(keep) != len(entries):
                    gone = [(prio, e[MSG_ID]) for e in entries
                            if e[EXPIRES_AT] and e[EXPIRES_AT] <= now]
                    if prio or box.kind == "latest":
                        batch.delete_entries(mailbox_queue(mail_id), gone)
                    self.stats["expired"] += len(gone)
                    box.unread[prio] = keep
                for e in keep:
                    if e[EXPIRES_AT] and (not nearest or e[EXPIRES_AT] < nearest):
                        nearest = e[EXPIRES_AT]
            self._due(nearest, mail_id)
        if self.broadcasts:
            alive = []
            for entry, seen in self.broadcasts:
                if entry[EXPIRES_AT] and entry[EXPIRES_AT] <= now:
                    batch.delete_entries(BCAST_QUEUE, [(entry[PRIORITY], entry[MSG_ID])])
                    batch.delete_meta(META_BCAST_KEYS + str(entry[MSG_ID]))
                else:
                    alive.append((entry, seen))
            self.broadcasts = alive
        if batch:
            self.end_turn()


def _rendered(headers: dict[str, str] | None) -> tuple[str | None, bytes | None]:
    """The reply subject and NATS header block a stored message is delivered with."""
    if not headers:
        return None, None
    reply = None
    if RESERVED_REPLY in headers:
        headers = dict(headers)
        reply = headers.pop(RESERVED_REPLY)
    return reply, (codec.build_headers(headers) if headers else None)


def _expiry(box: Mailbox, entry: tuple) -> float:
    """A recovered message's expiry: its id's time plus its TTL rule, capped by the mailbox's."""
    ttl = _ttl_header(entry[HEADERS]) or PRIORITIES[PRIORITY_NAMES[entry[PRIORITY]]][1]
    expires = _id_ms(entry[MSG_ID]) / 1000.0 + ttl if ttl else 0.0
    if box.expires_at and (not expires or box.expires_at < expires):
        expires = box.expires_at
    return expires


def _item(entry: tuple) -> dict[str, Any]:
    """A QUERY message item: payload as UTF-8 text, or base64 with ``encoding: base64``."""
    headers = dict(entry[HEADERS] or {})
    reply = headers.pop(RESERVED_REPLY, None)
    body = entry[BODY]
    try:
        payload, encoding = body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        payload, encoding = base64.b64encode(body).decode(), "base64"
    item: dict[str, Any] = {
        "msg_id": str(entry[MSG_ID]), "subject": entry[5],
        "priority": PRIORITY_NAMES[entry[PRIORITY]], "payload": payload, "encoding": encoding,
        "headers": headers, "ts": int(_id_ms(entry[MSG_ID])),
    }
    if reply:
        item["reply_to"] = reply
    return item


def _id_ms(msg_id: int) -> float:
    """Milliseconds since the epoch encoded in a hub id (ms since 2020-01-01 << 22)."""
    return (msg_id >> 22) + 1577836800000
