"""MQKS queues and consumers over the core (the registry shared by every MQKS connection).

Mapping (see docs/protocols/mqks.md):

- MQKS queue ``Q`` is the durable core queue ``mqks/Q``; each of its events is a durable core
  binding of that queue (an event is a hub address, or a hub pattern when it holds a ``*``), so
  the queue, its bindings and its messages survive a restart.
- ``--delete-queue-when-unused[=S]`` is kept in store metadata ``mqks/queue/Q`` (JSON); it is
  the only MQKS queue setting (``--manual-ack`` belongs to a consumer, and consumers are not
  durable: the original client re-sends ``consume`` after a reconnect).
- a rejected message goes back to the *tail* of its queue with ``retry`` + 1, as in the
  original: it is put back into that queue only (``broker.put_entries``) under a new core id,
  keeping its MQKS id, event and attempts, and the old entry is acked.
- an MQKS consumer is one core consumer attached with ``ready = prefetch``.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.defer import Deferred, DeferredList, succeed
from twisted.logger import Logger
from zope.interface import implementer

from mqhub.errors import MqhubError
from mqhub.interfaces import IAdapterState, ICore, IDeliveryTarget, IQueue
from mqhub.protocols.mqks.codec import ConsumeArgs, RequestError, apply_rebind, render_update
from mqhub.records import MSG_ID, Entry, validate_pattern

log = Logger(namespace="mqhub.mqks")

QUEUE_PREFIX = "mqks/"
META_PREFIX = "mqks/queue/"
MAX_QUEUE_NAME = 250
#: in-flight deadline of an MQKS consumer's messages: MQKS has no message timeout
NO_TIMEOUT = 10.0 * 365 * 24 * 3600
#: the credit of a consumer left alone on its queue (deliveries never exhaust it)
UNLIMITED = 1 << 62


def _unused_setting(name: str, raw: bytes | None) -> bool | float | None:
    """The ``delete_when_unused`` seconds of a stored settings row (None: none, or a row that
    cannot be read, which is logged and skipped like VibeMQ's: the queue itself still recovers)."""
    if not raw:
        return None
    try:
        value = json.loads(raw).get("delete_when_unused")
    except (ValueError, AttributeError):  # not JSON, or not a JSON object
        value = raw
    if value is None or isinstance(value, (bool, int, float)):
        return value
    log.warn("mqks queue {name!r}: unreadable settings row {raw!r} skipped", name=name,
             raw=raw[:80])
    return None


class MqksQueue:
    """One MQKS queue: its core queue, events, delete-when-unused setting and consumers."""

    __slots__ = ("name", "core", "events", "bindings", "delete_when_unused", "consumers", "timer")

    def __init__(self, name: str, core: Any) -> None:
        """Start with no events and no consumers."""
        self.name = name
        self.core = core
        self.events: set[str] = set()
        self.bindings: dict[str, Any] = {}
        self.delete_when_unused: bool | float | None = None
        self.consumers: dict[bytes, MqksConsumer] = {}
        self.timer: Any = None


@implementer(IDeliveryTarget)
class MqksConsumer:
    """One MQKS consumer: the core consumer's delivery target, rendering on its connection.

    ``unacked`` maps MQKS message ids to in-flight entries (manual ack); ``held`` are ids of an
    auto-ack consumer delivered while its connection's writes were paused (acked on resume).
    """

    protocol_name = "mqks"
    __slots__ = ("cid", "conn", "queue", "core", "manual_ack", "unacked", "dupes", "held",
                 "metered")

    def __init__(self, cid: bytes, conn: Any, queue: MqksQueue, manual_ack: bool) -> None:
        """Not attached yet (the registry attaches it)."""
        self.cid = cid
        self.conn = conn
        self.queue = queue
        self.core: Any = None
        self.manual_ack = manual_ack
        self.unacked: dict[bytes, tuple] = {}
        self.dupes: dict[bytes, list[tuple]] = {}
        self.held: list[int] = []
        #: the queue has several consumers: one message per dispatch round (see MqksRegistry)
        self.metered = False

    def deliver_batch(self, binding: Any, address: str, entries: list[tuple]) -> None:
        """Write the entries to the connection; auto-ack them unless writes are paused."""
        conn = self.conn
        ids = conn.deliver(self, entries)
        if self.manual_ack:
            unacked = self.unacked
            for mid, entry in zip(ids, entries, strict=True):
                if unacked.setdefault(mid, entry) is not entry:
                    self.dupes.setdefault(mid, []).append(entry)
        elif conn.writes_paused or conn.closed:
            self.held.extend([e[MSG_ID] for e in entries])
        else:
            self.queue.core.ack(binding, [e[MSG_ID] for e in entries])
        if self.metered:
            binding.add_credit(len(entries))  # the next round serves the other consumers too

    def resume(self) -> None:
        """The connection drains again: ack what was held."""
        if self.held and self.core is not None:
            held, self.held = self.held, []
            self.queue.core.ack(self.core, held)

    def pop_unacked(self, mid: bytes) -> tuple | None:
        """Remove and return the unacked entry with MQKS id ``mid`` (None if unknown)."""
        entry = self.unacked.pop(mid, None)
        more = self.dupes.get(mid) if entry is not None and self.dupes else None
        if more:
            self.unacked[mid] = more.pop()
            if not more:
                del self.dupes[mid]
        return entry

    def pop_all(self) -> list[tuple]:
        """Remove and return every unacked entry."""
        out = list(self.unacked.values())
        for more in self.dupes.values():
            out.extend(more)
        self.unacked = {}
        self.dupes = {}
        return out


class MqksRegistry:
    """Every MQKS queue and consumer of the hub.

    :param broker: the core (ICore).
    :param state: where queue settings records are kept (the core's IAdapterState, or
        anything that adapts to it).
    :param clock: IReactorTime for the delete-when-unused timers.
    :param prefetch: unacked messages per consumer.
    :param window: ready messages a queue keeps in memory (the core queue's ``window``).
    """

    def __init__(self, broker: ICore, state: Any, clock: Any, prefetch: int = 1000,
                 window: int = 50_000) -> None:
        """Start empty; call :meth:`load` to recover the queues."""
        self.broker = broker
        self.state: IAdapterState = IAdapterState(state)
        self.clock = clock
        self.prefetch = prefetch
        self.window = window
        self.queues: dict[str, MqksQueue] = {}
        self.consumers: dict[bytes, MqksConsumer] = {}
        self.published = 0
        self.consumed = 0

    # recovery -----------------------------------------------------------------------------------

    def load(self) -> Deferred[None]:
        """Recover queues and events from the core, settings from metadata; arm unused timers."""
        d = self.state.scan_meta(META_PREFIX)

        def restore(rows: list[tuple[str, bytes]]) -> None:
            """Rebuild the queues from the core's ``mqks/`` queues and their bindings."""
            settings = {key[len(META_PREFIX):]: value for key, value in rows}
            for core in self.broker.queues():
                if not core.name.startswith(QUEUE_PREFIX):
                    continue
                name = core.name[len(QUEUE_PREFIX):]
                q = self._adopt(name, core)
                q.delete_when_unused = _unused_setting(name, settings.get(name))
                if q.delete_when_unused is not None:
                    self._start_unused(q)
            self.state.watch(META_PREFIX, self.record_changed)

        return d.addCallback(restore)

    def _adopt(self, name: str, core: IQueue) -> MqksQueue:
        """Know the core queue of MQKS queue ``name`` with its events (its bindings)."""
        q = self.queues[name] = MqksQueue(name, core)
        if core.window_setting != self.window:
            core.configure(window=self.window)
        for binding in self.broker.bindings(core.name):
            q.events.add(binding.pattern)
            q.bindings[binding.pattern] = binding
        return q

    def record_changed(self, key: str, value: bytes | None) -> None:
        """Another node of the hub wrote queue ``key``'s settings (``IAdapterState.watch``):
        know the queue if the core has it, and its ``delete_when_unused`` (the timer is armed
        here when a consumer of this node leaves)."""
        name = key[len(META_PREFIX):]
        q = self.queues.get(name)
        if q is None:
            core = self.broker.queue(QUEUE_PREFIX + name)
            if core is None:
                return      # learned when it is used here (ensure_queue)
            q = self._adopt(name, core)
        q.delete_when_unused = _unused_setting(name, value)

    # queues -------------------------------------------------------------------------------------

    def ensure_queue(self, name: str) -> MqksQueue:
        """The MQKS queue ``name``, created (durable) if new.

        :raises RequestError: for a name the core cannot hold.
        """
        q = self.queues.get(name)
        if q is not None:
            return q
        if len(name) > MAX_QUEUE_NAME:
            raise RequestError("queue name too long")
        try:
            core = self.broker.declare_queue(QUEUE_PREFIX + name, msg_timeout=NO_TIMEOUT,
                                             window=self.window)
        except MqhubError as exc:
            raise RequestError(str(exc)) from None
        q = self.queues[name] = MqksQueue(name, core)
        return q

    def _save_settings(self, q: MqksQueue) -> Deferred[Any]:
        """Persist the queue's delete-when-unused setting (metadata row)."""
        batch = self.state.batch()
        if q.delete_when_unused is None:
            batch.delete_meta(META_PREFIX + q.name)
        else:
            batch.put_meta(META_PREFIX + q.name,
                           json.dumps({"delete_when_unused": q.delete_when_unused}).encode())
        d: Deferred[Any] = self.state.commit(batch)
        return d

    def consume(self, conn: Any, cid: bytes, args: ConsumeArgs) -> Deferred[Any]:
        """Start consumer ``cid`` on ``args.queue`` (see the original's ``consume``).

        Returns a Deferred that fires once the bindings and settings it changed are durable.

        :raises RequestError: for a bad queue name or event (nothing changed then).
        """
        self._check_events(args.replace + args.add)
        q = self.ensure_queue(args.queue)
        self._cancel_unused(q)
        writes: list[Deferred[Any]] = []
        update = False
        if args.delete_when_unused is None:
            if q.delete_when_unused is not None:
                q.delete_when_unused = None
                update = True
        elif q.delete_when_unused != args.delete_when_unused:
            q.delete_when_unused = args.delete_when_unused
            update = True
        if update:
            writes.append(self._save_settings(q))
        old = self.consumers.get(cid)
        if old is not None:  # the same consumer id again: the old one goes first
            self.delete_consumer(cid, unused_check=old.queue is not q)
        consumer = MqksConsumer(cid, conn, q, args.manual_ack)
        self.consumers[cid] = consumer
        q.consumers[cid] = consumer
        conn.consumers[cid] = consumer
        self._rebind(q, args.replace, [], [], args.add, update, None if args.adding else cid)
        self._meter(q, exclude=consumer)
        consumer.metered = len(q.consumers) > 1
        try:
            # through the connection's own core session (ICore.session)
            consumer.core = conn.broker.attach(q.core, consumer, ready=self.prefetch,
                                               credit=1 if consumer.metered else 0,
                                               timeout=NO_TIMEOUT, tag=cid)
        except MqhubError as exc:  # the core queue went away behind MQKS's back (admin)
            self.consumers.pop(cid, None)
            q.consumers.pop(cid, None)
            conn.consumers.pop(cid, None)
            if self.queues.get(q.name) is q:
                del self.queues[q.name]
            raise RequestError(f"queue unavailable: {exc}") from None
        writes.append(self.broker.barrier())
        return _all(writes)

    def rebind(self, name: str, replace: list[str], remove: list[str], remove_mask: list[str],
               add: list[str]) -> Deferred[Any]:
        """Change the events of queue ``name`` (created if new, as the original's ``_rebind``).

        :raises RequestError: for a bad queue name or event.
        """
        self._check_events(replace + add)
        q = self.ensure_queue(name)
        self._rebind(q, replace, remove, remove_mask, add, False, None)
        return self.broker.barrier()

    def _check_events(self, events: list[str]) -> None:
        """Every event must be a hub address or pattern."""
        for event in events:
            try:
                validate_pattern(event)
            except MqhubError:
                raise RequestError(f"bad event {event!r}") from None

    def _rebind(self, q: MqksQueue, replace: list[str], remove: list[str],
                remove_mask: list[str], add: list[str], update: bool,
                skip: bytes | None) -> None:
        """Apply a rebind to the core bindings and send ``--update`` when something changed."""
        old = q.events
        new = apply_rebind(old, replace, remove, remove_mask, add)
        if new != old:
            qname = q.core.name
            for event in old - new:
                binding = q.bindings.pop(event, None)
                if binding is not None:
                    self.broker.unbind(binding)
            for event in sorted(new - old):
                q.bindings[event] = self.broker.bind_queue(event, qname)
            q.events = new
        if update or new != old:
            self._notify(q, skip)

    def _notify(self, q: MqksQueue, skip: bytes | None = None) -> None:
        """Send ``--update`` to every consumer of ``q`` but ``skip``."""
        for cid, consumer in list(q.consumers.items()):
            if cid != skip:
                consumer.conn.push(cid, render_update(q.name, q.events, q.delete_when_unused,
                                                      consumer.manual_ack))

    def _meter(self, q: MqksQueue, exclude: MqksConsumer | None = None) -> None:
        """Round-robin per message while a queue has several consumers, as the original.

        The core serves consumers in turn per dispatch round, each taking a batch; a consumer
        of a shared queue gets one credit per round (topped up after each delivery), so a burst
        is spread message by message. A lone consumer has no credit limit (batches, fast path).
        """
        shared = len(q.consumers) > 1
        for consumer in list(q.consumers.values()):
            if consumer is exclude or consumer.core is None or consumer.metered == shared:
                continue
            consumer.metered = shared
            consumer.core.set_credit(1 if shared else UNLIMITED)

    def delete_queue(self, name: str) -> Deferred[Any]:
        """Delete queue ``name``: notify and drop its consumers, unbind, drop its messages."""
        q = self.queues.pop(name, None)
        if q is None:
            return succeed(None)
        self._cancel_unused(q)
        if q.events:
            q.events = set()
            self._notify(q)
        for cid in list(q.consumers):
            consumer = q.consumers.pop(cid)
            self.consumers.pop(cid, None)
            consumer.conn.consumers.pop(cid, None)
            if consumer.core is not None:
                q.core.detach(consumer.core, requeue=False)
        writes = [self.broker.delete_queue(q.core.name)]
        if q.delete_when_unused is not None:
            q.delete_when_unused = None
            writes.append(self._save_settings(q))
        return _all(writes)

    # delete when unused -------------------------------------------------------------------------

    def _start_unused(self, q: MqksQueue) -> None:
        """The last consumer left: delete now (flag without seconds, or 0) or arm the timer."""
        when = q.delete_when_unused
        if when is None or q.consumers:
            return
        if when is True or not when:
            self.delete_queue(q.name)
            return
        self._cancel_unused(q)
        q.timer = self.clock.callLater(float(when), self._unused_expired, q)

    def _cancel_unused(self, q: MqksQueue) -> None:
        """A consumer came (or the queue goes): forget the unused timer."""
        if q.timer is not None and q.timer.active():
            q.timer.cancel()
        q.timer = None

    def _unused_expired(self, q: MqksQueue) -> None:
        """Nobody consumed ``q`` for its delay: delete it."""
        q.timer = None
        if self.queues.get(q.name) is q and not q.consumers:
            self.delete_queue(q.name)

    # consumers ----------------------------------------------------------------------------------

    def ack(self, cid: bytes, mid: bytes) -> bool:
        """Ack one message (or ``--all``) of consumer ``cid``; False if the consumer is unknown."""
        got = self.take_acked(cid, mid)
        if got is None:
            return False
        consumer, ids = got
        if ids and consumer.core is not None:
            consumer.queue.core.ack(consumer.core, ids)
        return True

    def take_acked(self, cid: bytes, mid: bytes) -> tuple[MqksConsumer, list[int]] | None:
        """Forget what ``ack {cid} {mid}`` settles; return the consumer and the core ids to ack.

        The caller acks them in the core (an adapter batches the acks of one read). None when
        the consumer is unknown.
        """
        consumer = self.consumers.get(cid)
        if consumer is None:
            return None
        if mid == b"--all":
            return consumer, [e[MSG_ID] for e in consumer.pop_all()]
        entry = consumer.pop_unacked(mid)
        return consumer, ([] if entry is None else [entry[MSG_ID]])

    def reject(self, cid: bytes, mid: bytes) -> bool:
        """Return one message (or ``--all``) of ``cid`` to its queue's tail with retry + 1."""
        consumer = self.consumers.get(cid)
        if consumer is None:
            return False
        if mid == b"--all":
            entries = consumer.pop_all()
        else:
            entry = consumer.pop_unacked(mid)
            entries = [] if entry is None else [entry]
        self._to_tail(consumer, entries)
        return True

    def _to_tail(self, consumer: MqksConsumer, entries: list[tuple]) -> None:
        """Put ``entries`` back at the queue's tail (new core ids), then ack the old ones."""
        if not entries or consumer.core is None:
            return
        q = consumer.queue
        first = self.broker.ids.reserve(len(entries))
        fresh: list[Entry] = [(first + i, prio, attempts, 0.0, expires, address, headers, body,
                               origin) for i, (_, prio, attempts, _, expires, address, headers,
                                               body, origin) in enumerate(entries)]
        self.broker.put_entries(q.core.name, fresh)
        q.core.ack(consumer.core, [e[MSG_ID] for e in entries])

    def delete_consumer(self, cid: bytes, unused_check: bool = True) -> bool:
        """Delete consumer ``cid``: reject all its unacked messages, maybe start the unused timer."""
        consumer = self.consumers.pop(cid, None)
        if consumer is None:
            return False
        q = consumer.queue
        q.consumers.pop(cid, None)
        consumer.conn.consumers.pop(cid, None)
        if consumer.core is not None:
            consumer.core.set_ready(0)
            self._to_tail(consumer, consumer.pop_all())
            consumer.held = []
            q.core.detach(consumer.core, requeue=True)
            consumer.core = None
            self._meter(q)
        if unused_check and self.queues.get(q.name) is q:
            self._start_unused(q)
        return True

    def disconnect(self, conn: Any) -> None:
        """The connection is gone: delete each of its consumers (reject --all)."""
        for cid in list(conn.consumers):
            self.delete_consumer(cid)

    # stats --------------------------------------------------------------------------------------

    def fact(self, name: str, queue: str | None = None) -> int:
        """A number for ``_eval``'s lookup table (see :mod:`mqhub.protocols.mqks.evals`).

        :raises KeyError: for an unknown fact or queue.
        """
        if queue is not None:
            q = self.queues[queue]
            if name == "queue_depth":
                return int(q.core.depth)
            if name == "queue_consumers":
                return len(q.consumers)
            if name == "queue_events":
                return len(q.events)
            raise KeyError(name)
        qs = self.queues.values()
        table = {
            "published": lambda: self.published,
            "queued": lambda: sum(q.core.message_count for q in qs),
            "consumed": lambda: self.consumed,
            "queues": lambda: len(self.queues),
            "queues_used": lambda: sum(1 for q in qs if q.consumers),
            "queues_to_delete_when_unused":
                lambda: sum(1 for q in qs if q.delete_when_unused is not None),
            "messages_in_queues": lambda: sum(q.core.depth for q in qs),
            "messages_waiting_ack": lambda: sum(len(c.unacked) for c in self.consumers.values()),
            "events_subscribed": lambda: len({e for q in qs for e in q.events}),
            "queues_subscribed": lambda: sum(1 for q in qs if q.events),
            "consumers": lambda: len(self.consumers),
            "clients_of_consumers": lambda: len({id(c.conn) for c in self.consumers.values()}),
        }
        return int(table[name]())


def _all(ds: list[Deferred[Any]]) -> Deferred[Any]:
    """Fire when every Deferred fired; errback with the first failure."""
    if len(ds) == 1:
        return ds[0]
    d = DeferredList(ds, fireOnOneErrback=True, consumeErrors=True)
    d.addErrback(lambda f: f.value.subFailure)
    return d
