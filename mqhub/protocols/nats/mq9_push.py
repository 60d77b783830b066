"""mq9 mailbox subscriptions and pushes: one core consumer per covered mailbox priority.

A SUB on ``$mq9.AI.INBOX.{id}.*`` (or ``.>``, or one priority) attaches one core consumer per
priority queue (urgent first, so the backlog arrives urgent → normal → notify, FIFO within each,
then live). A consumer's deliveries wait behind the commit that stored them (an ``OP_PUSH``
operation), then go to every subscriber (one member per queue group) and are acked:
delivered = read. Header-less pushes to plain subscribers are rendered as one bytes per
subscriber per push (:func:`render_plain`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mqhub.protocols.nats.encoders import msg_prefix
from mqhub.protocols.nats.mailbox import (
    INBOX,
    ORDER,
    PRIORITIES,
    Mailbox,
    MailboxPusher,
    rendered,
)
from mqhub.protocols.nats.mq9_common import OP_PUSH
from mqhub.records import ADDRESS, BODY, HEADERS, MSG_ID

if TYPE_CHECKING:  # pragma: no cover
    from mqhub.interfaces import ICore
    from mqhub.protocols.nats.server import NatsServer, Subscription

#: in-flight limit of a mailbox's pushing consumer. Entries are in flight only from the core's
#: dispatch until the push after their commit (then acked), so this bounds nothing a read did
#: not already hold; a small limit (it was 65,536) let a fast publisher's backlog spill out of
#: the queue's window into the store, to be read back page by page (the before profile in
#: benchmarks/results/nats.md: a quarter of the server's time)
PUSH_BATCH = 1 << 20


class MailboxPushes:
    """Mailbox subscribers and the consumers that push to them (a base of :class:`~.mq9.Mq9`).

    Reads ``broker``, ``server``, ``stats``, ``ops``, ``kick``, ``live`` and ``flush_pubs`` of the
    assembled class.
    """

    broker: ICore
    server: NatsServer
    stats: dict[str, int]
    ops: list[tuple]
    kick: Callable[[], None]
    live: Callable[[str], Mailbox | None]
    flush_pubs: Callable[[], None]

    def __init__(self) -> None:
        """No subscribers."""
        self.subs: dict[str, list[Subscription]] = {}
        self.filters: dict[int, tuple[int, ...]] = {}
        self.pushers: dict[tuple[str, int], Any] = {}
        self._rr: dict[str, dict[str, int]] = {}
        self._pushing = 0
        self._actions: list[tuple[Any, list[int] | None]] = []

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
            for sub in plain:
                conn = sub.conn
                out = conn.out
                if not out:
                    dirty.append(conn)
                out.append(render_plain(entries, sub.sid))
            srv.stats["out_msgs"] += len(plain) * len(entries)
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


def render_plain(entries: list[tuple], sid: str) -> bytes:
    """``MSG subject sid size\\r\\n body\\r\\n`` for each header-less entry, as one bytes."""
    lines: dict[tuple[str, int], bytes] = {}
    parts: list[bytes] = []
    add = parts.append
    for e in entries:
        body = e[BODY]
        key = (e[ADDRESS], len(body))
        line = lines.get(key)
        if line is None:
            line = lines[key] = msg_prefix(key[0], sid, None, key[1])
        add(line)
        add(body)
        add(b"\r\n")
    return b"".join(parts)
