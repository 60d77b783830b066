"""A durable queue in cluster mode: one JetStream durable pull consumer, and this node's view
of it (its local consumers, what it pulled for them, what they hold in flight).

JetStream holds the queue: its messages (interest retention keeps a message while a queue has
not acked it), its delivery state across nodes, redelivery after ``ack_wait``, delivery counts.
A node pulls only what its own consumers have room for (the sum of their RDY / credit), so
messages never wait in one node's memory while another node's consumers are idle; what a node
pulled but cannot deliver (its consumers withdrew their credit) is naked back at once.

Message ids are stream sequences, so an id means the same message on every node. The
operations map one to one (docs/cluster.md, "Mapping"): ack ``+ACK``, requeue ``-NAK`` with
its delay, touch ``+WPI``; attempts are JetStream's delivery count; max attempts and reject
dead-letter through the broker (stored in ``MQHUB_DLQ`` before the original is terminated).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from zope.interface import implementer

from mqhub.cluster.jetstream import (
    IN_PROGRESS,
    STREAM,
    Puller,
    Stored,
    ack_frames,
    consumer_name,
    nak_frames,
    parse_ack_reply,
)
from mqhub.cluster.messages import BlockCache, entry_of
from mqhub.core.address import pattern_matches
from mqhub.core.consumer import Consumer
from mqhub.errors import InvalidName, NoSuchQueue
from mqhub.interfaces import IConsumer, IQueue
from mqhub.protocols.nats.codec import OP_HMSG, OP_MSG
from mqhub.records import (
    ADDRESS,
    ATTEMPTS,
    EXPIRES_AT,
    HEADERS,
    MAX_ATTEMPTS_HEADER,
    MSG_ID,
    NOT_IN_FLIGHT,
    NOT_OWNER,
    PRIORITY,
    REASON_EXPIRED,
    REASON_MAX_ATTEMPTS,
    REASON_REJECTED,
    Entry,
    entry_order,
)

if TYPE_CHECKING:  # pragma: no cover
    from twisted.internet.defer import Deferred
    from twisted.internet.interfaces import IReactorTime

    from mqhub.cluster.client import NatsConnection

__all__ = ["ClusterQueue", "QueueNode", "SETTINGS"]


class QueueNode(Protocol):
    """What a queue needs of its node: the connection, time, the journal, dead letters and
    the directory of queue records. The ClusterBroker provides it; it is named here so this
    module does not import the broker that makes its queues."""

    window: int
    conn: NatsConnection
    clock: IReactorTime
    journal: Any

    @property
    def name_token(self) -> str:
        """This node's name as one subject token."""

    def changing(self, name: str) -> bool:
        """Whether a change of queue ``name`` is still on its way to the cluster."""

    def save_queue(self, queue: ClusterQueue, then: Callable[[], object] | None = None) -> None:
        """Write ``queue``'s settings to the directory."""

    def save_member(self, member: ClusterQueue) -> None:
        """Write a fan-out member's record."""

    def drop_member(self, member: ClusterQueue) -> None:
        """Remove a fan-out member's record and consumer."""

    def conn_publish(self, frames: list[bytes]) -> None:
        """Send ready frames (acks, naks) on the cluster connection."""

    def delete_queue(self, name: str, *, reason: str = ...) -> Deferred[Any]:
        """Delete queue ``name`` across the cluster."""

    def reset_queue(self, queue: ClusterQueue) -> Deferred[Any]:
        """Drop ``queue``'s messages (a purge)."""

    def dead_letter(self, queue: ClusterQueue, dead: list[tuple[Entry, str]], reason: str,
                    error: str | None) -> None:
        """Store ``dead`` in the dead-letter stream, then terminate the originals."""

    def counted_delivery(self, consumer: Any, n: int) -> None:
        """Count ``n`` deliveries to ``consumer``."""

    def counted_ack(self, consumer: Any, n: int) -> None:
        """Count ``n`` acks by ``consumer``."""

    def consume_stored(self, queue: ClusterQueue,
                       items: list[tuple[Entry, tuple[int, str]]]) -> None:
        """Remove messages taken from ``queue``'s stored head from the stream."""

#: settings a queue keeps in its consumer's metadata
SETTINGS = ("tier", "max_size", "overflow", "ttl", "max_attempts", "msg_timeout",
            "expires_at", "auto_delete", "expire_to_dead_letters", "mode", "window")
#: most messages one node asks for at once for a consumer without a limit (credit -1)
UNLIMITED_PULL = 1000
#: seconds pulled messages wait for a local consumer before they go back to the cluster
HOLD_READY = 5.0
#: how many stored messages a node reads as a queue's head (peek/take/remove without a
#: consumer on this node): at first, and at most once a peek or take asked for more (for
#: :data:`HEAD_WIDE_FOR` seconds); each read also stops at 1 KiB a message on average
HEAD_FIRST = 100
HEAD_MAX = 1000
HEAD_WIDE_FOR = 60.0


def _header_limit(headers: dict[str, str], default: int) -> int:
    """A message's own max attempts (header ``mqhub-max-attempts``), else ``default``."""
    try:
        return max(0, int(headers[MAX_ATTEMPTS_HEADER]))
    except ValueError:
        return default


def _priority_first(entry: Entry) -> int:
    """Sort key: higher priority first (a stable sort keeps stream order within one)."""
    return -entry[PRIORITY]


@implementer(IQueue)
class ClusterQueue:
    """One queue as seen from this node (see the module docstring).

    :param broker: the node's cluster broker (connection, dead letters, deletion).
    :param name: the queue's name.
    """

    def __init__(self, broker: QueueNode, name: str, *, tier: str = "durable",
                 max_size: int = 0, overflow: str = "drop_oldest", ttl: float = 0.0,
                 max_attempts: int = 0, msg_timeout: float = 60.0, expires_at: float = 0.0,
                 auto_delete: bool = False, expire_to_dead_letters: bool = False,
                 mode: str = "competing", window: int = 0) -> None:
        """Made by :meth:`ClusterBroker.declare_queue`."""
        if not name or len(name) > 255 or any(c.isspace() for c in name) \
                or name.startswith("~"):
            raise InvalidName(f"invalid queue name {name[:64]!r}")
        self.broker = broker
        self.name = name
        self.consumer = consumer_name(name)
        self.tier = tier
        self.durable = True
        self.max_size = int(max_size)
        self.overflow = overflow
        self.ttl = float(ttl)
        self.max_attempts = int(max_attempts)
        self.msg_timeout = float(msg_timeout)
        self.expires_at = float(expires_at)
        self.auto_delete = bool(auto_delete)
        self.expire_to_dead_letters = bool(expire_to_dead_letters)
        self.mode = mode
        self.window_setting = int(window)
        self.window = int(window) or broker.window
        self.paused = False
        self.deleted = False
        #: why the cluster refused this queue's last consumer change (None: it took it)
        self.save_error: str | None = None
        #: fan-out: the queue a member belongs to (None: a queue of the directory), its local
        #: members, whether a member's consumer exists yet and when it was attached (the
        #: member's consumer starts there; the parent's older copies are its backlog)
        self.parent: ClusterQueue | None = None
        self.members: list[ClusterQueue] = []
        self.made = True
        #: never saved by this node yet (its first save may adopt a parked backlog)
        self.fresh = True
        self.made_waiters: list[Any] = []
        self.start_time = 0.0
        self._member_serial = 0
        #: the consumer's deliver policy when made: "new" (a new queue gets what is
        #: published from now on), "all" when its first binding takes a parked backlog
        self.deliver = "new"
        self.patterns: list[str] = []
        #: patterns whose filter is wider than the pattern (MQKS masks): checked here
        self.masks: list[str] = []
        self.consumers: list[Consumer] = []
        self._ready: list[Entry] = []
        self._replies: dict[int, str] = {}
        #: while no consumer of this node pulls the queue: its first undelivered messages as
        #: stored (read by the broker's directory reads), what peek/take/remove see then;
        #: each entry's (stream seq, subject); the consumer state the head was read at; a
        #: serial of local takes (a read started before one is dropped); stream seqs taken
        #: here whose removal from the stream is under way
        self.head: list[Entry] = []
        self.head_refs: dict[int, tuple[int, str]] = {}
        self.head_key: tuple[int, ...] = ()
        #: how many the next head read asks for, and when a peek or take last widened it
        self.head_want = HEAD_FIRST
        self.head_wide_at = 0.0
        self.head_serial = 0
        self.consuming: set[int] = set()
        #: in flight on a local consumer: msg_id -> [consumer, deadline, entry]
        self._flight: dict[int, list] = {}
        #: ids requeued with a delay (counted in ``deferred`` until they come back)
        self._delayed: set[int] = set()
        self._blocks = BlockCache()
        self._puller: Puller | None = None
        self._rr = 0
        self._stalled_at = 0.0
        #: the cluster's count of messages not yet delivered (from the last pull or info)
        self.pending = 0
        self.ack_pending = 0
        self.deferred = 0
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.expired_count = 0
        self.dropped_count = 0
        self.dead_letter_count = 0

    # -- settings ---------------------------------------------------------------------------

    def settings(self) -> dict[str, Any]:
        """The settings kept in the consumer's metadata."""
        return {"tier": self.tier, "max_size": self.max_size, "overflow": self.overflow,
                "ttl": self.ttl, "max_attempts": self.max_attempts,
                "msg_timeout": self.msg_timeout, "expires_at": self.expires_at,
                "auto_delete": self.auto_delete,
                "expire_to_dead_letters": self.expire_to_dead_letters,
                "mode": self.mode, "window": self.window_setting}

    def apply(self, settings: dict[str, Any]) -> None:
        """Take settings read back from the cluster (another node may have set them)."""
        for key in SETTINGS:
            if key not in settings:
                continue
            value = settings[key]
            if key == "window":
                self.window_setting = int(value)
                self.window = int(value) or self.broker.window
            elif key in ("tier", "overflow", "mode"):
                setattr(self, key, str(value))
            elif key in ("auto_delete", "expire_to_dead_letters"):
                setattr(self, key, bool(value))
            elif key in ("max_size", "max_attempts"):
                setattr(self, key, int(value))
            else:
                setattr(self, key, float(value))

    def configure(self, **settings: Any) -> None:
        """Change settings; stored in the consumer's config for every node."""
        for key in settings:
            if key not in SETTINGS or key in ("tier", "mode"):
                raise InvalidName(f"cannot configure {key!r}")
        self.apply(settings)
        self.broker.save_queue(self)

    # -- counts -----------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Messages ready for delivery cluster-wide (not in flight), as JetStream counted
        them at the last pull or consumer info, plus what this node holds ready."""
        return self.pending + len(self._ready)

    @property
    def deliverable(self) -> int:
        """Same as :attr:`depth` (nothing awaits a commit here)."""
        return self.depth

    @property
    def in_flight(self) -> int:
        """Messages in flight on this node's consumers."""
        return len(self._flight)

    @property
    def awaiting_commit(self) -> int:
        """Always 0: a publish is confirmed by JetStream, not by a local commit."""
        return 0

    def stats(self) -> dict[str, Any]:
        """Counters in the shape the admin surfaces and NSQ /stats use; depth and in flight
        are the cluster's (from consumer info) where known."""
        return {"name": self.name, "tier": self.tier, "depth": self.depth,
                "in_memory": len(self._ready),
                "in_flight": max(len(self._flight), self.ack_pending),
                "deferred": self.deferred, "message_count": self.message_count,
                "requeue_count": self.requeue_count, "timeout_count": self.timeout_count,
                "expired_count": self.expired_count, "dropped_count": self.dropped_count,
                "dead_letter_count": self.dead_letter_count,
                "consumers": len(self.consumers), "paused": self.paused, "mode": self.mode}

    def room(self) -> int:
        """How many more messages fit before ``max_size``, by the depth last read from the
        cluster (an estimate: docs/cluster.md, "Limits"); a large number when unbounded."""
        if not self.max_size:
            return 1 << 30
        return max(0, self.max_size - self.depth)

    # -- consumers ---------------------------------------------------------------------------

    def attach(self, target: Any, *, ready: int = 0, credit: int = 0,
               timeout: float | None = None, tag: Any = None) -> Consumer:
        """Attach a local consumer; pulling starts with the first one. On a fan-out queue
        the consumer gets a member queue of its own (a JetStream consumer of its own, so it
        gets a copy of every message published from then on)."""
        if self.deleted:
            raise NoSuchQueue(self.name)
        if self.mode == "fanout" and self.parent is None:
            member = self._new_member()
            return member.attach(target, ready=ready, credit=credit, timeout=timeout, tag=tag)
        consumer = Consumer(self, target, ready, credit,
                            self.msg_timeout if timeout is None else float(timeout), tag)
        self.consumers.append(consumer)
        if self._puller is None:
            self._puller = Puller(self.broker.conn, STREAM, self.consumer, self._want,
                                  self._pulled, max_batch=500, expires=2.0)
            self.resume_pulling()
        self.dispatch()
        return consumer

    def resume_pulling(self) -> None:
        """Start the puller once the queue's consumer exists (a pull request to a consumer
        that is still being made is dropped by the server without an answer)."""
        puller = self._puller
        if puller is not None and not puller.running and self.made and \
                (self.parent is not None or not self.broker.changing(self.name)):
            puller.start()

    # -- fan-out members ------------------------------------------------------------------------

    def _new_member(self) -> ClusterQueue:
        """A member queue for one fan-out consumer of this node (its consumer is made now)."""
        settings = {k: v for k, v in self.settings().items() if k != "mode"}
        member = ClusterQueue(self.broker, self.name, **settings)
        self._member_serial += 1
        member.consumer = f"{self.consumer}_m{self.broker.name_token}_{self._member_serial}"
        member.parent = self
        member.made = False
        member.start_time = self.broker.clock.seconds()
        member.patterns = self.patterns
        member.masks = self.masks
        self.members.append(member)
        self.broker.save_member(member)
        return member

    def member_made(self) -> None:
        """A member's consumer exists: it pulls; the parent pulls its backlog for it."""
        self.made = True
        self.resume_pulling()
        parent = self.parent
        if parent is not None and parent._puller is None and not parent.deleted:
            parent._puller = Puller(self.broker.conn, STREAM, parent.consumer, parent._want,
                                    parent._pulled, max_batch=500, expires=2.0)
            parent.resume_pulling()

    def _member_gone(self, member: ClusterQueue) -> None:
        """A member's last consumer detached: drop its consumer; the parent stops pulling
        backlog when no member is left here."""
        if member in self.members:
            self.members.remove(member)
        self.broker.drop_member(member)
        if not self.members and not self.consumers:
            self._stop_pulling()

    def _backlog(self, events: list[tuple]) -> None:
        """What the parent of local members pulled: a message stored after every local
        member attached reached them already through their own consumers (acked here); an
        older one is backlog and goes to one member (which acks it on the parent's reply)."""
        made = [m for m in self.members if m.made]
        if not made:
            self._nak([e[3] for e in events], 0.0)
            return
        floor = min(m.start_time for m in made) * 1e9
        seen: list[str] = []
        for event in events:
            reply = event[3]
            if parse_ack_reply(reply)[2] >= floor:
                seen.append(reply)
            else:
                self._rr += 1
                made[self._rr % len(made)]._pulled([event])
        if seen:
            self.broker.conn_publish(ack_frames(seen))

    def _member_of(self, consumer: IConsumer) -> ClusterQueue | None:
        """The member queue ``consumer`` belongs to, when it is not this queue."""
        queue = getattr(consumer, "queue", None)
        return queue if isinstance(queue, ClusterQueue) and queue is not self else None

    def detach(self, consumer: IConsumer, requeue: bool = True) -> None:
        """Detach: its in-flight messages go back to JetStream for redelivery (a node never
        drops a message it did not finish)."""
        member = self._member_of(consumer)
        if member is not None:
            member.detach(consumer, requeue)
            return
        if not isinstance(consumer, Consumer) or consumer not in self.consumers:
            return
        consumer.attached = False
        self.consumers.remove(consumer)
        mine = [mid for mid, rec in self._flight.items() if rec[0] is consumer]
        self._nak([self._drop_flight(mid) for mid in mine], 0.0)
        consumer.in_flight = 0
        if not self.consumers:
            self._stop_pulling()
            if self.parent is not None:
                self.parent._member_gone(self)
            elif self.auto_delete:
                self.broker.delete_queue(self.name)
        else:
            self.dispatch()

    def _stop_pulling(self) -> None:
        """No local consumer left: stop the puller and give back what was pulled."""
        if self._puller is not None:
            self._puller.stop()
            self._puller = None
        self._release_ready()

    def _release_ready(self) -> None:
        """Nak everything pulled but not delivered (other nodes may take it now)."""
        if self._ready:
            ready, self._ready = self._ready, []
            self._nak([self._replies.pop(e[MSG_ID]) for e in ready
                       if e[MSG_ID] in self._replies], 0.0)

    def _want(self) -> int:
        """What this node's consumers have room for, less what it holds ready (a fan-out
        parent: what its members have room for)."""
        if self.paused:
            return 0
        if self.members:
            return sum(max(0, m._want()) for m in self.members if m.made)
        room = 0
        for consumer in self.consumers:
            n = consumer.available()
            if n > 0:
                room += min(n, UNLIMITED_PULL)
        return room - len(self._ready)

    def _pulled(self, events: list[tuple]) -> None:
        """Turn pulled messages into entries: dead-letter those past max attempts, drop the
        expired, keep the rest ready (priority first), deliver."""
        if self.members:
            self._backlog(events)
            return
        now = self.broker.clock.seconds()
        blocks = self._blocks
        replies = self._replies
        flight = self._flight
        fresh: list[Entry] = []
        dead: list[tuple[Entry, str]] = []
        expired: list[tuple[Entry, str]] = []
        sort = False
        pending = -1
        for event in events:
            reply = event[3]
            tokens = reply.split(".")
            if len(tokens) >= 12:
                delivered, seq, pub_ns, pending = (int(tokens[6]), int(tokens[7]),
                                                   int(tokens[9]), int(tokens[10]))
            else:
                delivered, seq, pub_ns, pending = (int(tokens[4]), int(tokens[5]),
                                                   int(tokens[7]), int(tokens[8]))
            entry, scheduled = entry_of(event, seq, delivered, blocks)
            mid = entry[MSG_ID]
            if scheduled or mid in self._delayed:
                self._delayed.discard(mid)
                self.deferred = max(0, self.deferred - 1)
            if mid in flight:             # redelivered while still held here: keep one
                replies[mid] = reply
                continue
            if self.masks and not self._mask_ok(entry[ADDRESS]):
                self.broker.conn_publish(ack_frames([reply]))
                continue
            if (self.ttl and now - pub_ns / 1e9 > self.ttl) or \
                    (entry[EXPIRES_AT] and entry[EXPIRES_AT] <= now):
                expired.append((entry, reply))
                continue
            limit = self.max_attempts
            if entry[HEADERS] and MAX_ATTEMPTS_HEADER in entry[HEADERS]:
                limit = _header_limit(entry[HEADERS], limit)
            if limit and delivered > limit:
                dead.append((entry, reply))
                continue
            if entry[PRIORITY]:
                sort = True
            replies[mid] = reply
            fresh.append(entry)
        if pending >= 0:
            self.pending = pending
        if expired:
            self.expired_count += len(expired)
            self.broker.journal.expired(self, [e for e, _ in expired])
            if self.expire_to_dead_letters:
                self.broker.dead_letter(self, expired, REASON_EXPIRED, None)
            else:
                self.broker.conn_publish(ack_frames([r for _, r in expired]))
        if dead:
            self.broker.dead_letter(self, dead, REASON_MAX_ATTEMPTS, "max attempts reached")
        if fresh:
            self._ready.extend(fresh)
            if sort or self._ready[0][PRIORITY]:
                self._ready.sort(key=entry_order)
            self.message_count += len(fresh)
        self.dispatch()

    def _mask_ok(self, address: str) -> bool:
        """Whether ``address`` matches one of the queue's patterns (for mask filters)."""
        return any(pattern_matches(p, address) for p in self.patterns)

    def dispatch(self) -> None:
        """Deliver ready entries to consumers with room (round robin), then ask for more."""
        ready = self._ready
        if ready and not self.paused and self.consumers:
            now = self.broker.clock.seconds()
            consumers = self.consumers
            n_cons = len(consumers)
            start = self._rr % n_cons
            self._rr += 1
            for i in range(n_cons):
                if not ready:
                    break
                consumer = consumers[(start + i) % n_cons]
                n = consumer.available()
                if n <= 0:
                    continue
                batch = ready[:n]
                del ready[:n]
                deadline = now + consumer.timeout
                flight = self._flight
                for entry in batch:
                    flight[entry[MSG_ID]] = [consumer, deadline, entry]
                consumer.in_flight += len(batch)
                if consumer.credit > 0:
                    consumer.credit = max(0, consumer.credit - len(batch))
                self.broker.counted_delivery(consumer, len(batch))
                self.broker.journal.delivered(self, batch)
                consumer.target.deliver_batch(consumer, self.name, batch)
        if not ready:
            self._stalled_at = 0.0
        elif not self._stalled_at:
            self._stalled_at = self.broker.clock.seconds()
        if self._puller is not None:
            self._puller.refill()

    # -- message operations ---------------------------------------------------------------------

    def _drop_flight(self, msg_id: int) -> str:
        """Forget an in-flight message; return its ack reply subject."""
        del self._flight[msg_id]
        return self._replies.pop(msg_id)

    def _owned(self, consumer: IConsumer, msg_ids: Iterable[int]
               ) -> tuple[list[int], list[int]]:
        """Split ids into those ``consumer`` holds in flight here and the others."""
        flight = self._flight
        mine: list[int] = []
        failed: list[int] = []
        for mid in msg_ids:
            rec = flight.get(mid)
            if rec is not None and rec[0] is consumer:
                mine.append(mid)
            else:
                failed.append(mid)
        return mine, failed

    def ack(self, consumer: IConsumer, msg_ids: Iterable[int]) -> list[int]:
        """``+ACK`` what ``consumer`` holds; return the ids it did not hold."""
        member = self._member_of(consumer)
        if member is not None:
            return member.ack(consumer, msg_ids)
        mine, failed = self._owned(consumer, msg_ids)
        if mine:
            replies = [self._drop_flight(mid) for mid in mine]
            consumer.in_flight -= len(mine)
            self.broker.conn_publish(ack_frames(replies))
            self.broker.counted_ack(consumer, len(mine))
            self.broker.journal.acked(self, (), mine)
            self.dispatch()
        return failed

    def requeue(self, consumer: IConsumer, msg_ids: Iterable[int], delay: float = 0.0,
                error: str | None = None) -> list[int]:
        """``-NAK`` with ``delay`` (JetStream redelivers it then, to any node); a message on
        its last attempt goes to the dead letters instead."""
        member = self._member_of(consumer)
        if member is not None:
            return member.requeue(consumer, msg_ids, delay, error)
        mine, failed = self._owned(consumer, msg_ids)
        if not mine:
            return failed
        back: list[str] = []
        back_ids: list[int] = []
        back_entries: list[Entry] = []
        dead: list[tuple[Entry, str]] = []
        for mid in mine:
            entry = self._flight[mid][2]
            reply = self._drop_flight(mid)
            limit = self.max_attempts
            if entry[HEADERS] and MAX_ATTEMPTS_HEADER in entry[HEADERS]:
                limit = _header_limit(entry[HEADERS], limit)
            if limit and entry[ATTEMPTS] >= limit:
                dead.append((entry, reply))
            else:
                back.append(reply)
                back_ids.append(mid)
                back_entries.append(entry)
        consumer.in_flight -= len(mine)
        if back_entries:
            self.broker.journal.requeued(self, back_entries, error)
        self.requeue_count += len(back)
        if back:
            if delay > 0:
                self._delayed.update(back_ids)
                self.deferred += len(back_ids)
            self._nak(back, delay)
        if dead:
            self.broker.dead_letter(self, dead, REASON_MAX_ATTEMPTS, error or
                                    "max attempts reached")
        self.dispatch()
        return failed

    def touch(self, consumer: IConsumer, msg_ids: Iterable[int],
              extend: float | None = None) -> list[int]:
        """``+WPI`` (JetStream restarts its ack wait) and a new local deadline."""
        member = self._member_of(consumer)
        if member is not None:
            return member.touch(consumer, msg_ids, extend)
        mine, failed = self._owned(consumer, msg_ids)
        if mine:
            deadline = self.broker.clock.seconds() + (consumer.timeout if extend is None
                                                      else float(extend))
            for mid in mine:
                self._flight[mid][1] = deadline
            self.broker.conn_publish(ack_frames([self._replies[m] for m in mine], IN_PROGRESS))
        return failed

    def reject(self, consumer: IConsumer, msg_ids: Iterable[int],
               reason: str = REASON_REJECTED, error: str | None = None) -> list[int]:
        """Dead-letter now."""
        member = self._member_of(consumer)
        if member is not None:
            return member.reject(consumer, msg_ids, reason, error)
        mine, failed = self._owned(consumer, msg_ids)
        if mine:
            dead = [(self._flight[mid][2], self._drop_flight(mid)) for mid in mine]
            consumer.in_flight -= len(mine)
            self.broker.dead_letter(self, dead, reason, error)
            self.dispatch()
        return failed

    def failure_reasons(self, consumer: IConsumer,
                        msg_ids: Iterable[int]) -> list[tuple[int, str]]:
        """Why each id cannot be acked by ``consumer`` here."""
        member = self._member_of(consumer)
        if member is not None:
            return member.failure_reasons(consumer, msg_ids)
        out = []
        for mid in msg_ids:
            rec = self._flight.get(mid)
            if rec is None:
                out.append((mid, NOT_IN_FLIGHT))
            elif rec[0] is not consumer:
                out.append((mid, NOT_OWNER))
            else:
                out.append((mid, "ok"))
        return out

    def owner_of(self, msg_id: int) -> Consumer | None:
        """The local consumer holding ``msg_id`` in flight."""
        rec = self._flight.get(msg_id)
        return rec[0] if rec is not None else None

    @property
    def pulling(self) -> bool:
        """Whether consumers of this node pull the queue (then peek/take/remove see what
        it pulled, else the head read from the stream)."""
        return self._puller is not None

    def remove(self, msg_ids: Iterable[int]) -> list[int]:
        """Finish ready entries by id (pulled here, or in the stored head); return the ids
        not removed."""
        wanted = set(msg_ids)
        keep: list[Entry] = []
        done: list[str] = []
        for entry in self._ready:
            if entry[MSG_ID] in wanted:
                wanted.discard(entry[MSG_ID])
                done.append(self._replies.pop(entry[MSG_ID]))
            else:
                keep.append(entry)
        self._ready = keep
        if done:
            self.broker.conn_publish(ack_frames(done))
        if wanted and self.head:
            gone = [e for e in self.head if e[MSG_ID] in wanted]
            if gone:
                wanted.difference_update(e[MSG_ID] for e in gone)
                self._consume_head(gone)
        return sorted(wanted)

    def peek(self, limit: int) -> list[Entry]:
        """Ready entries in order, unchanged: pulled by this node's consumers, or (none here)
        the queue's stored head."""
        if self._puller is None:
            self._widen(limit)
            return self.head[:limit]
        return self._ready[:limit]

    def take(self, limit: int) -> list[Entry]:
        """Remove and return ready entries ("read and marked consumed"): pulled ones are
        acked, stored-head ones removed from the stream (docs/cluster.md)."""
        if self._puller is None:
            self._widen(limit)
            taken = self.head[:limit]
            if taken:
                self._consume_head(taken)
            return taken
        taken = self._ready[:limit]
        del self._ready[:limit]
        if taken:
            self.broker.conn_publish(ack_frames([self._replies.pop(e[MSG_ID])
                                                 for e in taken]))
        return taken

    def _consume_head(self, entries: list[Entry]) -> None:
        """Take ``entries`` out of the head; the broker removes them from the stream."""
        ids = {e[MSG_ID] for e in entries}
        self.head = [e for e in self.head if e[MSG_ID] not in ids]
        refs = [self.head_refs.pop(e[MSG_ID]) for e in entries]
        self.pending = max(0, self.pending - len(entries))
        self.head_serial += 1
        self.consuming.update(seq for seq, _ in refs)
        self.broker.consume_stored(self, list(zip(entries, refs, strict=True)))

    def _widen(self, limit: int) -> None:
        """A peek or take wants more than the head holds while the queue has more: the
        following head reads ask for up to ``limit`` (at most :data:`HEAD_MAX`)."""
        if limit > len(self.head) and self.pending > len(self.head) \
                and self.head_want < HEAD_MAX:
            self.head_want = min(HEAD_MAX, max(limit, 2 * self.head_want))
            self.head_key = ()              # read again at the next directory read
        if self.head_want > HEAD_FIRST:
            self.head_wide_at = self.broker.clock.seconds()

    def head_size(self) -> int:
        """How many stored messages the next head read asks for (back to
        :data:`HEAD_FIRST` once no peek or take widened it for a while)."""
        if self.head_want > HEAD_FIRST and \
                self.broker.clock.seconds() - self.head_wide_at > HEAD_WIDE_FOR:
            self.head_want = HEAD_FIRST
        return self.head_want

    def set_head(self, rows: list[Stored], key: tuple[int, ...], serial: int) -> None:
        """The head as read from the stream (``rows`` in stream order) at consumer state
        ``key``; dropped when a take or remove happened here since the read began."""
        if serial != self.head_serial:
            return
        now = self.broker.clock.seconds()
        head: list[Entry] = []
        refs: dict[int, tuple[int, str]] = {}
        for seq, subject, block, body in rows:
            if seq in self.consuming:
                continue
            event = (OP_HMSG, subject, "", "", block, body) if block else \
                (OP_MSG, subject, "", "", body)
            entry = entry_of(event, seq, 0, self._blocks)[0]
            if self.masks and not self._mask_ok(entry[ADDRESS]):
                continue
            if entry[EXPIRES_AT] and entry[EXPIRES_AT] <= now:
                continue
            head.append(entry)
            refs[entry[MSG_ID]] = (seq, subject)
        head.sort(key=_priority_first)    # stable: stream order within a priority
        self.head = head
        self.head_refs = refs
        self.head_key = key

    def clear_head(self) -> None:
        """Forget the head (the queue is consumed somewhere: it cannot be known here)."""
        self.head = []
        self.head_refs = {}
        self.head_key = ()

    def _nak(self, replies: list[str], delay: float) -> None:
        """Send ``-NAK`` (with a delay) for ``replies``."""
        if replies:
            self.broker.conn_publish(nak_frames(replies, delay))

    def expire_flight(self, now: float) -> None:
        """In-flight messages past their local deadline go back (``-NAK``), counted as
        timeouts; called by the broker's timer."""
        late = [mid for mid, rec in self._flight.items() if rec[1] <= now]
        if not late:
            return
        replies = []
        for mid in late:
            consumer = self._flight[mid][0]
            consumer.in_flight -= 1
            replies.append(self._drop_flight(mid))
        self.timeout_count += len(late)
        self._nak(replies, 0.0)
        self.dispatch()

    def tick(self) -> None:
        """Periodic: keep the puller's requests alive (or start it, once it may); give back
        what was pulled when no local consumer took it for :data:`HOLD_READY` seconds (its
        consumers withdrew their credit while pull requests were open)."""
        if self._ready and self._stalled_at and \
                self.broker.clock.seconds() - self._stalled_at > HOLD_READY:
            self._release_ready()
            self._stalled_at = 0.0
        if self._puller is not None:
            if self._puller.running:
                self._puller.tick()
            else:
                self.resume_pulling()

    # -- admin ------------------------------------------------------------------------------------

    def pause(self) -> None:
        """Stop delivering on this node (pulled messages go back)."""
        self.paused = True
        self._release_ready()

    def unpause(self) -> None:
        """Deliver again."""
        self.paused = False
        self.dispatch()

    def empty(self) -> Any:
        """Drop everything the queue holds: its consumer is made anew (deliver new)."""
        self._release_ready()
        return self.broker.reset_queue(self)

    def close(self) -> None:
        """The queue was deleted: stop pulling, forget local state."""
        self.deleted = True
        for member in list(self.members):
            member.close()
            self.broker.drop_member(member)
        self.members = []
        for consumer in list(self.consumers):
            consumer.attached = False
        self.consumers = []
        if self._puller is not None:
            self._puller.stop()
            self._puller = None
        self._ready = []
        self._replies.clear()
        self._flight.clear()

    def __repr__(self) -> str:
        """Readable form for the manhole."""
        return f"<ClusterQueue {self.name} consumers={len(self.consumers)} " \
               f"in_flight={len(self._flight)}>"

