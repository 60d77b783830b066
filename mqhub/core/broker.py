"""The Broker: queues, bindings, routes, publishing and dead letters over one store.

Protocol adapters hand the broker one batch per read (``publish_batch``); it resolves the route
once per address (cached until the binding epoch changes), fills one WriteBatch and makes one
store commit, and delivers to live targets synchronously. It is the embedded implementation of
the core seam (``mqhub.interfaces.ICore``) and an owner of parts:

- ``router`` (:mod:`mqhub.core.routing`): bindings, the address trie, the route cache;
- ``commits`` (:mod:`mqhub.core.commits`): every write batch and its store commit;
- ``delays`` (:mod:`mqhub.core.delays`): deferred messages until due, and clock ``timers``;
- ``parking`` (:mod:`mqhub.core.parking`): parked and paused addresses and their queues;
- ``expiry`` (:mod:`mqhub.core.expiry`): queues with an expiry of their own.

Durable state lives in store meta: ``q/<queue>`` (settings, JSON, written by the queue),
``b/<queue>\\x1f<pattern>`` (bindings), ``park/<address>``, ``pause/<address>`` and
``pcut/<address>``; deferred messages are due rows until due.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from typing import Any, cast

from twisted.internet.defer import Deferred, DeferredList, inlineCallbacks, succeed
from twisted.internet.task import LoopingCall
from zope.interface import implementer

from mqhub.core.account import MemoryAccount
from mqhub.core.address import pattern_matches, validate_address, validate_pattern
from mqhub.core.backlog import WINDOW_BYTES
from mqhub.core.commits import Commits
from mqhub.core.consumer import Consumer
from mqhub.core.counters import Counters
from mqhub.core.deadletter import DeadLetter, all_dead_letters, dlq_name, from_dead
from mqhub.core.delays import PARK_PREFIX, Delays, Timers
from mqhub.core.expiry import QueueExpiry
from mqhub.core.ids import IdGenerator
from mqhub.core.message import TIER_DURABLE, TIER_MEMORY
from mqhub.core.parking import PARK_CUT_PREFIX, Parking
from mqhub.core.queue import SETTINGS_PREFIX, Queue, QueueContext
from mqhub.core.routing import Binding, Route, Router
from mqhub.core.state import StoreState
from mqhub.core.tail import TAILS_BYTES
from mqhub.core.window import WINDOW_FLOOR, WINDOWS_BYTES
from mqhub.errors import InvalidName, NoSuchQueue, QueueFull
from mqhub.interfaces import IBinding, ICore, IQueue
from mqhub.records import DELIVER_AT, MSG_ID, Peer, get_msg_id
from mqhub.store.batch import WriteBatch
from mqhub.store.codec import encode_meta
from mqhub.store.journal_recorder import NULL_RECORDER, NullRecorder
from mqhub.store.records import Entry, entry_order

log = logging.getLogger(__name__)

SEP = "\x1f"
_NAME_BAD = re.compile(r"[\s\x00-\x1f]")

Headers = None | dict[str, str] | list[dict[str, str] | None]


def validate_queue_name(name: str) -> None:
    """Raise InvalidName unless ``name`` may name a queue (1-255 chars, no space, no leading ``~``)."""
    if not name or len(name) > 255 or _NAME_BAD.search(name) or name.startswith("~"):
        raise InvalidName(f"invalid queue name {name[:64]!r}")


@implementer(ICore)
class Broker:
    """The protocol-neutral broker core, the embedded implementation of ICore (docs/core-api.md)."""

    def __init__(self, store: Any, clock: Any, *, scheduler: Any = None,
                 window: int = 10_000, window_bytes: int = WINDOW_BYTES,
                 tails_bytes: int = TAILS_BYTES, windows_bytes: int = WINDOWS_BYTES) -> None:
        """:param store: an opened IMessageStore. :param clock: IReactorTime.
        :param scheduler: the SchedulerService for durable delays and TTL sweeps (optional).
        :param window: ready entries a durable queue keeps in memory; :param window_bytes: and
        the most body bytes they may hold (the rest stays in the store, paged in as it drains).
        :param tails_bytes: the memory all durable queues' remembered tails may hold together.
        :param windows_bytes: the body bytes all durable queues' windows may hold together (a
        window's budget shrinks to what is left, never below ``WINDOW_FLOOR``).
        """
        self.store = store
        self.clock = clock
        self.scheduler = scheduler
        self.window, self.window_bytes = window, window_bytes
        #: the memory all durable queues' remembered tails hold together (core/tail.py)
        self.tails = MemoryAccount(tails_bytes)
        #: the body bytes all durable queues' windows hold together (core/window.py)
        self.windows = MemoryAccount(windows_bytes, WINDOW_FLOOR)
        self.ids = IdGenerator(clock)
        self.counters = Counters()  # admin/metrics totals, batch granularity (core/counters.py)
        #: adapters' own durable records (NSQ topics, mq9 mailboxes...): store meta and lists
        self.state = StoreState(store)
        self.router = Router()
        #: address -> Route cache (read-only for adapters; cleared in place on epoch changes)
        self.routes = self.router.cache
        self.last_ids: range = range(0)
        #: the write batches and their commits (see mqhub.core.commits)
        self.commits = Commits(store, clock)
        self.timers = Timers(clock)
        self.delays = Delays(clock, scheduler, self.commits, self.counters, self.timers,
                             self._any_queue, self.router.route)
        self.expiry = QueueExpiry(clock, scheduler, self._expired, self._queues_get)
        self._journal: NullRecorder = NULL_RECORDER
        self._ctx = self._context()
        self.parking = Parking(self.router, self.commits, clock, self.counters, self.ids,
                               self.delays, self.timers, self._parking_queue)
        self._queues: dict[str, Queue] = {}
        self._bindings: dict[int, Binding] = {}
        #: queue name -> pattern -> its binding (a queue's bindings without a scan)
        self._queue_bindings: dict[str, dict[str, Binding]] = {}
        self._next_binding = 0
        self._sweep_cursor = 0
        #: without a scheduler the broker runs its TTL sweep on a clock timer of its own
        self._sweeper: LoopingCall | None = None
        if scheduler is not None:
            scheduler.add_sweep("ttl", self.sweep_ttl, 1.0)

    def _context(self) -> QueueContext:
        """What the queues of this broker may use of it."""
        return QueueContext(
            clock=self.clock, store=self.store, ids=self.ids, commits=self.commits,
            counters=self.counters, journal=self._journal, tails=self.tails,
            windows=self.windows, window=self.window, window_bytes=self.window_bytes,
            defer=self.delays.defer, unused=self._unused, expiry_changed=self.expiry.arm)

    @property
    def journal(self) -> NullRecorder:
        """The flow journal's recorder (the hub sets it; a NullRecorder until then)."""
        return self._journal

    @journal.setter
    def journal(self, recorder: NullRecorder) -> None:
        """Record the flow from now on with ``recorder`` (every queue gets it)."""
        self._journal = recorder
        self._ctx = self._context()
        for q in self._every_queue():
            q.rewire(self._ctx)

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """Changes whenever bindings, parking or pauses change."""
        return self.router.epoch

    def start(self) -> Deferred[None]:
        """Recover queues, bindings, parked addresses and dead-letter counts from the store."""
        return self._recover()

    @inlineCallbacks
    def _recover(self) -> Any:
        """The recovery steps of :meth:`start` (cold path)."""
        for key, value in (yield self.store.scan_meta(SETTINGS_PREFIX)):
            settings = json.loads(value)
            name = key[len(SETTINGS_PREFIX):]
            own = int(settings.pop("window", 0) or 0)
            self._queues[name] = Queue(self._ctx, name, window=own or self.window,
                                       window_setting=own, **settings)
        for prefix in ("park/", "pause/"):
            for key, _ in (yield self.store.scan_meta(prefix)):
                self.parking.recover(key[len(prefix):], prefix == "pause/")
        for key, value in (yield self.store.scan_meta(PARK_CUT_PREFIX)):
            self.delays.cut(key[len(PARK_CUT_PREFIX):], int(value))
        for name in (yield self.store.queue_names()):
            # entries without queue metadata (written before a crash cut the meta commit, or by
            # an older layout) are never orphaned: recover them as a default durable queue
            if name.startswith(PARK_PREFIX):
                if name not in self.parking.queues:
                    self.parking.queue_of(name[len(PARK_PREFIX):])
            elif not name.startswith("~") and name not in self._queues:
                log.warning("recovering queue %r, which had entries but no settings", name)
                orphan = self._queues[name] = Queue(self._ctx, name, window=self.window,
                                                    incarnation=self.ids.next_id())
                orphan.save_settings()
        for key, _ in (yield self.store.scan_meta("b/")):
            name, _, pattern = key[2:].partition(SEP)
            bound = self._queues.get(name)
            if bound is not None:
                self._add_binding(pattern, bound, None, None, None)
        for q in self._every_queue():
            if q.durable:
                count = yield self.store.count_entries(q.name)
                q.dead_letter_count = yield self.store.count_entries(dlq_name(q.name))
                q.recovered(count)
            if q.expires_at and self.scheduler is None:
                self.expiry.arm_timed(q)
        self.router.changed()
        self.delays.started = self.expiry.started = True
        if self.scheduler is None:
            self._sweeper = LoopingCall(self._sweep_all)
            self._sweeper.clock = self.clock
            self._sweeper.start(1.0, now=False)

    def _sweep_all(self) -> None:
        """The TTL sweep of a broker without a scheduler (the scheduler slices it otherwise)."""
        now = self.clock.seconds()
        while self.sweep_ttl(now, 10_000):
            pass

    def stop(self) -> Deferred[None]:
        """Stop timers and fire when every pending store commit has fired."""
        if self._sweeper is not None and self._sweeper.running:
            self._sweeper.stop()
        self._sweeper = None
        self.timers.stop()
        self.expiry.stop()
        for q in self._every_queue():
            q.stop_timer()
        pending = list(self.commits.pending)
        if not pending:
            return succeed(None)
        return DeferredList(pending, consumeErrors=True).addCallback(lambda _: None)

    def barrier(self) -> Deferred[None]:
        """Fire once every store write the broker issued so far is durable (acks included).

        Covers publishes, acks, requeues, rejects, dead letters, settings and bindings (every
        commit made through the core); nothing is written for it. Fires at once when nothing is
        pending; errbacks with the store's error when one of those commits failed.
        """
        return self.commits.barrier()

    def settled(self, handle: Any) -> Deferred[None]:
        """A handle of the embedded core is in effect when it is returned."""
        return succeed(None)

    def peers(self, protocol: str) -> list[Peer]:
        """One node: no peers."""
        return []

    def session(self, principal: Any) -> ICore:
        """The handle a connection of ``principal`` acts through (docs/core-api.md, "Sessions"):
        the core itself when ``principal`` is None (no rights in force, or not authenticated);
        otherwise the handle the principal makes of this core, ``principal.handle(core)`` (an
        :class:`mqhub.identity.Session`: its rights enforced at this seam)."""
        if principal is None:
            return self
        return principal.handle(self)

    # -- queues --------------------------------------------------------------------------------

    def _every_queue(self) -> list[Queue]:
        """Declared and parking queues."""
        return list(self._queues.values()) + list(self.parking.queues.values())

    def _any_queue(self, name: str) -> Queue | None:
        """The queue named ``name``: a declared one, else a parking one, else None."""
        return self._queues.get(name) or self.parking.queues.get(name)

    def _queues_get(self, name: str) -> Queue | None:
        """The declared queue named ``name``, or None."""
        return self._queues.get(name)

    def _parking_queue(self, name: str) -> Queue:
        """A new (durable) parking queue."""
        return Queue(self._ctx, name, window=self.window)

    def _unused(self, queue: Queue) -> None:
        """An ``auto_delete`` queue lost its last consumer: delete it."""
        self.delete_queue(queue.name)

    def _expired(self, queue: Queue, now: float) -> None:
        """``queue``'s own time may have come: delete it if it is still the live queue of its
        name and expired."""
        if (self._queues.get(queue.name) is queue and queue.expires_at
                and queue.expires_at <= now):
            self.delete_queue(queue.name)

    def declare_queue(self, name: str, *, tier: str = TIER_DURABLE, max_size: int = 0,
                      overflow: str = "drop_oldest", ttl: float = 0.0, max_attempts: int = 0,
                      msg_timeout: float = 60.0, expires_at: float = 0.0,
                      auto_delete: bool = False, expire_to_dead_letters: bool = False,
                      mode: str = "competing", window: int = 0) -> Queue:
        """Create the queue or return the existing one (whose settings are kept).

        ``window``: ready entries this queue keeps in memory (0 = the broker's ``window``).
        """
        q = self._queues.get(name)
        if q is not None:
            return q
        validate_queue_name(name)
        window = max(0, int(window))
        q = Queue(self._ctx, name, tier=tier, max_size=max_size, overflow=overflow, ttl=ttl,
                  max_attempts=max_attempts, msg_timeout=msg_timeout, expires_at=expires_at,
                  auto_delete=auto_delete, expire_to_dead_letters=expire_to_dead_letters,
                  window=window or self.window, incarnation=self.ids.next_id(), mode=mode,
                  window_setting=window)
        self._queues[name] = q
        q.save_settings()
        if expires_at:
            self.expiry.arm(q)
        return q

    def queue(self, name: str) -> Queue | None:
        """The queue called ``name``, or None."""
        return self._queues.get(name)

    def queues(self) -> list[IQueue]:
        """Every user queue (hidden parking queues excluded)."""
        return list(self._queues.values())

    def delete_queue(self, name: str) -> Deferred[None]:
        """Unbind and forget the queue, dropping its messages and dead letters."""
        q = self._queues.pop(name, None)
        if q is None:
            return succeed(None)
        b = WriteBatch()
        for binding in self._queue_bindings.pop(name, {}).values():
            self.router.trie.remove(binding.pattern, binding)
            self._bindings.pop(binding.id, None)
            if q.durable:
                b.delete_meta("b/" + name + SEP + binding.pattern)
        self.router.changed()
        q.close()
        if q.durable:
            b.purge_queue(name)
            b.purge_queue(dlq_name(name))
            b.delete_meta(SETTINGS_PREFIX + name)
            if q.expires_at:
                self.expiry.forget(name, b)
        return self.commits.commit(b)

    def attach(self, queue: IQueue, target: Any, *, ready: int = 0, credit: int = 0,
               timeout: float | None = None, tag: Any = None) -> Consumer:
        """Attach a consumer to ``queue`` (one of this core's: see :meth:`Queue.attach`)."""
        return cast(Queue, queue).attach(target, ready=ready, credit=credit, timeout=timeout,
                                         tag=tag)

    # -- bindings ------------------------------------------------------------------------------

    def _add_binding(self, pattern: str, queue: Queue | None, target: Any,
                     group: str | None, tag: Any) -> Binding:
        """Create and index a binding (no validation, no persistence)."""
        self._next_binding += 1
        b = Binding(self._next_binding, pattern, queue, target, group, tag, self)
        self._bindings[b.id] = b
        if queue is not None:
            self._queue_bindings.setdefault(queue.name, {})[pattern] = b
        self.router.trie.add(pattern, b)
        self.router.changed()
        return b

    def bind_queue(self, pattern: str, queue_name: str) -> Binding:
        """Bind ``pattern`` to the queue (idempotent; persisted for durable queues)."""
        existing = self._queue_bindings.get(queue_name, {}).get(pattern)
        if existing is not None:
            return existing
        validate_pattern(pattern)
        q = self._queues.get(queue_name)
        if q is None:
            raise NoSuchQueue(queue_name)
        b = self._add_binding(pattern, q, None, None, None)
        if q.durable:
            wb = WriteBatch()
            wb.put_meta("b/" + queue_name + SEP + pattern, b"")
            self.commits.commit(wb)
        self.parking.drain_matching(lambda address: pattern_matches(pattern, address))
        return b

    def subscribe(self, pattern: str, target: Any, *, group: str | None = None,
                  tag: Any = None) -> Binding:
        """Bind ``pattern`` to a live IDeliveryTarget (never persisted)."""
        validate_pattern(pattern)
        return self._add_binding(pattern, None, target, group or None, tag)

    def unbind(self, binding: IBinding) -> None:
        """Remove ``binding``."""
        if self._bindings.pop(binding.id, None) is None:
            return
        self.router.trie.remove(binding.pattern, binding)
        queue = binding.queue
        if queue is not None:
            own = self._queue_bindings.get(queue.name)
            if own is not None and own.get(binding.pattern) is binding:
                del own[binding.pattern]
                if not own:
                    del self._queue_bindings[queue.name]
            if queue.durable:
                wb = WriteBatch()
                wb.delete_meta("b/" + queue.name + SEP + binding.pattern)
                self.commits.commit(wb)
        self.router.changed()

    def bindings(self, queue_name: str | None = None) -> list[IBinding]:
        """Every binding, or those of one queue."""
        if queue_name is None:
            return list(self._bindings.values())
        return list(self._queue_bindings.get(queue_name, {}).values())

    def route(self, address: str) -> Route:
        """The cached route of ``address`` (see :class:`mqhub.core.routing.Route`); raises
        InvalidName for an address :func:`validate_address` refuses."""
        r = self.routes.get(address)
        if r is None:
            # publish_batch trusts a cached route's address: only a valid one may be cached
            validate_address(address)
            r = self.router.route(address)
        return r

    # -- parked and paused addresses -----------------------------------------------------------

    def park(self, address: str) -> Deferred[None]:
        """Keep publishes to ``address`` while no queue is bound to it (NSQ topic without
        channels); see :class:`mqhub.core.parking.Parking`."""
        return self.parking.park(address)

    def unpark(self, address: str) -> Deferred[None]:
        """Stop parking ``address``; parked messages go to the bound queues (or are dropped)."""
        return self.parking.unpark(address)

    def pause_address(self, address: str) -> Deferred[None]:
        """Keep every publish to ``address`` until resumed."""
        return self.parking.pause(address)

    def resume_address(self, address: str) -> Deferred[None]:
        """Release a paused address: its parked messages go to the bound queues."""
        return self.parking.resume(address)

    def parked_depth(self, address: str) -> int:
        """Messages parked for ``address`` (parked or paused)."""
        return self.parking.depth(address)

    def empty_parked(self, address: str) -> Deferred[None]:
        """Drop every message parked for ``address`` (NSQ ``/topic/empty``)."""
        return self.parking.empty(address)

    # -- publishing ----------------------------------------------------------------------------

    def publish_batch(self, address: str, bodies: list[bytes], *, origin: str = "",
                      headers: Headers = None, priority: int = 0, ttl: float = 0.0,
                      expires_at: float = 0.0, deliver_at: float = 0.0,
                      persist: bool = True) -> Deferred[None]:
        """Publish ``bodies`` to ``address``; fire when every store write is durable."""
        route = self.route(address)
        n = len(bodies)
        if not n:
            return succeed(None)
        if priority and not 0 <= priority <= 9:
            priority = 0 if priority < 0 else 9
        first = self.ids.reserve(n)
        ids = range(first, first + n)
        self.last_ids = ids
        self.counters.publish(origin, n)
        if ttl:
            expires_at = self.clock.seconds() + ttl
        entries: list[Entry]
        if n == 1:
            h = headers[0] if isinstance(headers, list) else headers
            entries = [(first, priority, 0, deliver_at, expires_at, address, h, bodies[0], origin)]
        elif isinstance(headers, list):
            entries = [(i, priority, 0, deliver_at, expires_at, address, h, b, origin)
                       for i, b, h in zip(ids, bodies, headers, strict=False)]
        else:
            entries = [(i, priority, 0, deliver_at, expires_at, address, headers, b, origin)
                       for i, b in zip(ids, bodies, strict=False)]
        # a run (every field but id and body shared) unless each entry has its own headers
        return self._publish(route, address, entries, persist, deliver_at, True,
                             n == 1 or not isinstance(headers, list))

    def publish_entries(self, address: str, entries: list[Entry], *,
                        persist: bool = True) -> Deferred[None]:
        """Publish prebuilt entry tuples (replays, moves) to ``address``."""
        route = self.route(address)
        deliver_at = max((e[DELIVER_AT] for e in entries), default=0.0)
        return self._publish(route, address, entries, persist, deliver_at)

    def entry_fits(self, address: str, headers: dict[str, str] | None, origin: str) -> bool:
        """True when the store can hold an entry with these fields (64 KiB of meta)."""
        try:
            encode_meta(address, headers, origin)
        except ValueError:
            return False
        return True

    def put_entries(self, queue_name: str, entries: list[Entry]) -> Deferred[None]:
        """Put prebuilt entries into queue ``queue_name`` only (no routing, no live targets).

        MQKS reject re-queues at the tail this way; entries keep their attempts. Raises NoSuchQueue.
        """
        q, b = self._get(queue_name), WriteBatch()
        return self.commits.fill(b, lambda: q.put(entries, b, True, self.clock.seconds()))

    def _publish(self, route: Route, address: str, entries: list[Entry], persist: bool,
                 deliver_at: float, uniform: bool = False, run: bool = False) -> Deferred[None]:
        """Route ``entries``: queues get a copy (one WriteBatch), live targets are called
        (``uniform`` and ``run``: see ``Queue.put``)."""
        queues = route.queues if route.park is None else (route.park,)
        n = len(entries)
        for q in queues:
            if q.max_size and q.overflow == "reject" and q.room() < n:
                raise QueueFull(q.name)
        self._journal.published(address, entries, queues, persist, route, uniform)
        now = self.clock.seconds() if deliver_at else 0.0
        if not queues:
            # live subscribers only: nothing to store
            if deliver_at > now and (route.targets or route.groups):
                # live subscribers see a delayed message when it is due (on a clock timer,
                # at-most-once like all live delivery)
                self.timers.later(deliver_at - now, self._deliver_live, address, entries)
            else:
                self._deliver_live(address, entries, route)
            return succeed(None)
        commits = self.commits
        # the batch is being filled while its entries are delivered: commits issued meanwhile
        # (acks in deliver_batch) join it or follow it, never precede it
        batch, outer = commits.begin()
        try:
            if deliver_at > now:
                self.delays.defer_address(address, queues, entries, deliver_at, batch, persist)
            else:
                now = now or self.clock.seconds()
                for q in queues:
                    q.put(entries, batch, persist, now, uniform, run)
            if deliver_at > now and (route.targets or route.groups):
                self.timers.later(deliver_at - now, self._deliver_live, address, entries)
            else:
                self._deliver_live(address, entries, route)
        except BaseException:
            commits.abort(batch, outer)
            raise
        return commits.finish(batch, outer)

    def _deliver_live(self, address: str, entries: list[Entry], route: Route | None = None) -> None:
        """Hand ``entries`` to the live subscribers of ``address`` (one call per binding)."""
        if route is None:
            route = self.route(address)
        n = len(entries)
        if route.targets:
            for b in route.targets:
                self.counters.deliver(b.target, n)
                try:
                    b.target.deliver_batch(b, address, entries)
                except Exception:
                    log.exception("deliver_batch of %r failed", b.target)
        if route.groups:
            for i in range(len(route.groups)):
                b = route.pick(i)
                self.counters.deliver(b.target, n)
                try:
                    b.target.deliver_batch(b, address, entries)
                except Exception:
                    log.exception("deliver_batch of %r failed", b.target)

    # -- message TTL ---------------------------------------------------------------------------

    def sweep_ttl(self, now: float, budget: int) -> bool:
        """Drop expired ready messages from queue windows, at most ``budget`` scanned; True =
        more to do."""
        queues = [q for q in self._queues.values() if q.needs_sweep]
        if not queues:
            return False
        used = 0
        i = self._sweep_cursor % len(queues)
        visited = 0
        while visited < len(queues) and used < budget:
            used += queues[i].sweep(now, budget - used)
            i = (i + 1) % len(queues)
            visited += 1
        self._sweep_cursor = i
        return visited < len(queues)

    # -- dead letters --------------------------------------------------------------------------

    def _get(self, queue_name: str) -> Queue:
        """The queue or NoSuchQueue."""
        q = self._queues.get(queue_name)
        if q is None:
            raise NoSuchQueue(queue_name)
        return q

    def dead_letters(self, queue_name: str, *, limit: int = 100,
                     after: int | None = None) -> Deferred[list[DeadLetter]]:
        """List up to ``limit`` dead letters of the queue, oldest first, after msg id ``after``."""
        q = self._get(queue_name)
        if not q.durable:
            items = [e for e in q.memory_dead_letters() if after is None or e[MSG_ID] > after][:limit]
            return succeed([DeadLetter.from_entry(e, queue_name) for e in items])
        d = self.store.read_entries(dlq_name(queue_name),
                                    None if after is None else (0, after), limit)
        return d.addCallback(lambda es: [DeadLetter.from_entry(e, queue_name) for e in es])

    @inlineCallbacks
    def replay_dead_letters(self, queue_name: str,
                            msg_ids: Iterable[int] | None = None) -> Any:
        """Put dead letters back on their queue (attempts reset); fire with how many."""
        q = self._get(queue_name)
        wanted = None if msg_ids is None else set(msg_ids)
        dead = yield all_dead_letters(self.store, q)
        chosen = [e for e in dead if wanted is None or e[MSG_ID] in wanted]
        if not chosen:
            return 0
        b = WriteBatch()
        if q.durable:
            b.delete_entries(dlq_name(queue_name), [(0, e[MSG_ID]) for e in chosen])
        else:
            ids = set(map(get_msg_id, chosen))
            q.keep_memory_dead_letters([e for e in q.memory_dead_letters() if e[MSG_ID] not in ids],
                                       replace=True)
        entries = sorted((from_dead(e) for e in chosen), key=entry_order)
        q.dead_letter_count = max(0, q.dead_letter_count - len(chosen))
        yield self.commits.fill(b, lambda: q.put(entries, b, True, self.clock.seconds()))
        return len(chosen)

    @inlineCallbacks
    def purge_dead_letters(self, queue_name: str,
                           msg_ids: Iterable[int] | None = None) -> Any:
        """Delete dead letters (all, or the given ids); fire with how many were removed."""
        q = self._get(queue_name)
        dead = yield all_dead_letters(self.store, q)
        wanted = None if msg_ids is None else set(msg_ids)
        chosen = [e for e in dead if wanted is None or e[MSG_ID] in wanted]
        if q.durable:
            b = WriteBatch()
            if wanted is None:
                b.purge_queue(dlq_name(queue_name))
            else:
                b.delete_entries(dlq_name(queue_name), [(0, e[MSG_ID]) for e in chosen])
            yield self.commits.commit(b)
        else:
            ids = set(map(get_msg_id, chosen))
            q.keep_memory_dead_letters([e for e in q.memory_dead_letters() if e[MSG_ID] not in ids],
                                       replace=True)
        q.dead_letter_count = max(0, q.dead_letter_count - len(chosen))
        return len(chosen)

    # -- introspection -------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters for the admin surfaces and the manhole."""
        return {"queues": len(self._queues), "parked": len(self.router.parking),
                "bindings": len(self._bindings), "epoch": self.router.epoch,
                "routes_cached": len(self.router.cache), "last_id": self.ids.last,
                "pending_commits": len(self.commits.pending),
                "refused_retried": dict(self.counters.retried)}


__all__ = ["Broker", "validate_queue_name", "TIER_DURABLE", "TIER_MEMORY", "InvalidName"]
