"""mq9 persisted broadcasts: ``$mq9.AI.BROADCAST.…`` publishes with ``mq9-persist: true``.

Such a broadcast is stored (store queue :data:`BCAST_QUEUE`, which the core's recovery leaves
alone) for its TTL (``mq9-ttl``, default 3600 s), delivered after its commit, and replayed to
late subscribers that have not had it: once per queue group, or once per distinct SUB subject
without a group. The receiver sets are meta rows ``mq9/bk/<msg_id>``. "Once per queue group or
SUB subject" has no core counterpart, hence mq9 keeps these itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import succeed

from mqhub.protocols.nats import codec
from mqhub.protocols.nats.mq9_common import OP_BROADCAST, headers_dict, ttl_header
from mqhub.protocols.nats.sublist import subject_matches
from mqhub.records import ADDRESS, BODY, EXPIRES_AT, HEADERS, MSG_ID, PRIORITY, make_entry

if TYPE_CHECKING:  # pragma: no cover
    from mqhub.interfaces import IAdapterState, ICore, IStateBatch
    from mqhub.protocols.nats.server import NatsConnection, NatsServer, Subscription

DEFAULT_BROADCAST_TTL = 3600.0
META_BCAST_KEYS = "mq9/bk/"
#: persisted broadcasts live under a store queue name the core's recovery leaves alone (``~``)
BCAST_QUEUE = "~mq9/bc"
OLD_BCAST_QUEUE = "mq9/bc"


class PersistedBroadcasts:
    """The persisted broadcasts of :class:`~.mq9.Mq9` (one of its bases).

    Reads ``broker``, ``server``, ``state``, ``clock``, ``ids``, ``max_unread``, ``stats``,
    ``batch``, ``ops``, ``kick`` and ``new_id`` of the assembled class.
    """

    broker: ICore
    server: NatsServer
    state: IAdapterState
    clock: Any
    ids: Any
    max_unread: int
    stats: dict[str, int]
    batch: IStateBatch
    ops: list[tuple]
    kick: Callable[[], None]
    new_id: Callable[[], int]

    def __init__(self) -> None:
        """No persisted broadcasts."""
        self.broadcasts: list[tuple[tuple, set[str]]] = []

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
