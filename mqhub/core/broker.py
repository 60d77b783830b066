"""The Broker: queues, bindings, routes, publishing, parking and dead letters over one store.

Protocol adapters hand the broker one batch per read (``publish_batch``); it resolves the route
once per address (cached until the binding epoch changes), fills one WriteBatch and makes one
store commit, and delivers to live targets synchronously. Durable state lives in store meta:
``q/<queue>`` (settings, JSON), ``b/<queue>\\x1f<pattern>`` (bindings), ``park/<address>`` and
``pause/<address>``; deferred messages are due rows ``dq/<queue>/<msg_id>`` until due.
"""

from __future__ import annotations

import heapq
import json
import logging
import re
from collections.abc import Callable, Iterable
from typing import Any

from twisted.internet.defer import Deferred, DeferredList, inlineCallbacks, succeed
from twisted.python.failure import Failure

from mqhub.core.address import pattern_matches, validate_address, validate_pattern
from mqhub.core.deadletter import DeadLetter, dlq_name, from_dead
from mqhub.core.ids import IdGenerator
from mqhub.core.message import TIER_DURABLE, TIER_MEMORY
from mqhub.core.queue import Queue
from mqhub.core.routing import Binding, Route, Router
from mqhub.errors import InvalidName, NoSuchQueue, QueueFull
from mqhub.store import due_rows
from mqhub.store.batch import WriteBatch
from mqhub.store.journal_recorder import NULL_RECORDER
from mqhub.store.records import Entry, entry_order

log = logging.getLogger(__name__)

DUE_PREFIX = b"dq/"
ADDRESS_DUE_PREFIX = b"da/"
PARK_CUT_PREFIX = "pcut/"
EXPIRY_PREFIX = b"qx/"
PARK_PREFIX = "~park/"
SEP = "\x1f"
_NAME_BAD = re.compile(r"[\s\x00-\x1f]")

Headers = None | dict[str, str] | list[dict[str, str] | None]


def validate_queue_name(name: str) -> None:
    """Raise InvalidName unless ``name`` may name a queue (1-255 chars, no space, no leading ``~``)."""
    if not name or len(name) > 255 or _NAME_BAD.search(name) or name.startswith("~"):
        raise InvalidName(f"invalid queue name {name[:64]!r}")


class _Barrier:
    """One ``Broker.barrier()`` call: counts the commits it still waits for."""

    __slots__ = ("left", "failure", "deferred")

    def __init__(self, left: int) -> None:
        """Wait for ``left`` commits."""
        self.left = left
        self.failure: Any = None
        self.deferred: Deferred[None] = Deferred()

    def one_done(self, result: Any) -> None:
        """One awaited commit fired with ``result`` (None or a Failure)."""
        if isinstance(result, Failure) and self.failure is None:
            self.failure = result
        self.left -= 1
        if not self.left:
            if self.failure is not None:
                self.deferred.errback(self.failure)
            else:
                self.deferred.callback(None)


class Broker:
    """The protocol-neutral broker core (see docs/core-api.md)."""

    def __init__(self, store: Any, clock: Any, *, scheduler: Any = None,
                 window: int = 10_000) -> None:
        """:param store: an opened IMessageStore. :param clock: IReactorTime.
        :param scheduler: the SchedulerService for durable delays and TTL sweeps (optional).
        :param window: ready entries a durable queue keeps in memory.
        """
        self.store = store
        self.clock = clock
        self.scheduler = scheduler
        self.window = window
        self.ids = IdGenerator(clock)
        self.router = Router()
        #: address -> Route cache (read-only for adapters; cleared in place on epoch changes)
        self.routes = self.router.cache
        self.last_ids: range = range(0)
        self.journal: Any = NULL_RECORDER  # the flow journal's recorder (set by the hub)
        self._queues: dict[str, Queue] = {}
        self._hidden: dict[str, Queue] = {}
        self._bindings: dict[int, Binding] = {}
        self._queue_bindings: dict[tuple[str, str], Binding] = {}
        self._next_binding = 0
        #: uncommitted store commits -> the barriers waiting for them
        self._pending: dict[Deferred[Any], list[_Barrier]] = {}
        self._unsettled: dict[int, list[Queue]] = {}
        #: the put batch being filled while its entries are delivered (see _join), the commits
        #: merged into it (their Deferreds) and the ones that must follow it
        self._open: WriteBatch | None = None
        self._joined: list[Deferred[None]] = []
        self._held: list[tuple[WriteBatch, Deferred[None]]] = []
        self._mem_timers: set[Any] = set()
        #: queue expiries without the scheduler: one heap, one clock timer for all of them
        self._expiries: list[tuple[float, int, Queue]] = []
        self._expiry_seq = 0
        self._expiry_call: Any = None
        self._expiry_at = float("inf")
        self._started = False
        self._sweep_cursor = 0
        #: address -> ids below this were held for it when empty_parked ran (their delays are dropped)
        self._park_cut: dict[str, int] = {}
        if scheduler is not None:
            scheduler.register(DUE_PREFIX, self._on_due)
            scheduler.register(ADDRESS_DUE_PREFIX, self._on_address_due)
            scheduler.register(EXPIRY_PREFIX, self._on_queue_expiry)
            scheduler.add_sweep("ttl", self.sweep_ttl, 1.0)

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
        for key, value in (yield self.store.scan_meta("q/")):
            settings = json.loads(value)
            name = key[2:]
            own = int(settings.pop("window", 0) or 0)
            self._queues[name] = Queue(self, name, window=own or self.window,
                                       window_setting=own, **settings)
        for prefix in ("park/", "pause/"):
            for key, _ in (yield self.store.scan_meta(prefix)):
                address = key[len(prefix):]
                self._park_queue(address)
                if prefix == "pause/":
                    self.router.paused.add(address)
        for key, value in (yield self.store.scan_meta(PARK_CUT_PREFIX)):
            self._park_cut[key[len(PARK_CUT_PREFIX):]] = int(value)
        for name in (yield self.store.queue_names()):
            # entries without queue metadata (written before a crash cut the meta commit, or by
            # an older layout) are never orphaned: recover them as a default durable queue
            if name.startswith(PARK_PREFIX):
                if name not in self._hidden:
                    self._park_queue(name[len(PARK_PREFIX):])
            elif not name.startswith("~") and name not in self._queues:
                log.warning("recovering queue %r, which had entries but no settings", name)
                self._queues[name] = Queue(self, name, window=self.window,
                                           incarnation=self.ids.next_id())
                self._queue_changed(self._queues[name])
        for key, _ in (yield self.store.scan_meta("b/")):
            name, _, pattern = key[2:].partition(SEP)
            q = self._queues.get(name)
            if q is not None:
                self._add_binding(pattern, q, None, None, None)
        for q in list(self._queues.values()) + list(self._hidden.values()):
            if q.durable:
                count = yield self.store.count_entries(q.name)
                q.dead_letter_count = yield self.store.count_entries(dlq_name(q.name))
                q._recovered(count)
            if q.expires_at and self.scheduler is None:
                self._arm_memory_expiry(q)
        self.router.changed()
        self._started = True

    def stop(self) -> Deferred[None]:
        """Stop timers and fire when every pending store commit has fired."""
        for t in list(self._mem_timers):
            if t.active():
                t.cancel()
        self._mem_timers.clear()
        if self._expiry_call is not None and self._expiry_call.active():
            self._expiry_call.cancel()
        self._expiry_call = None
        self._expiry_at = float("inf")
        for q in list(self._queues.values()) + list(self._hidden.values()):
            if q._timer is not None and q._timer.active():
                q._timer.cancel()
            q._timer = None
        pending = list(self._pending)
        if not pending:
            return succeed(None)
        return DeferredList(pending, consumeErrors=True).addCallback(lambda _: None)

    # -- store plumbing ------------------------------------------------------------------------

    def _unsettled_add(self, batch: WriteBatch, queue: Queue) -> None:
        """``queue`` put entries into ``batch``; tell it when that batch is committed."""
        self._unsettled.setdefault(id(batch), []).append(queue)

    def _settle_batch(self, result: Any, batch: WriteBatch) -> Any:
        """``batch`` was committed (or failed): settle the queues that put entries into it."""
        for q in self._unsettled.pop(id(batch), ()):
            q._settle()
        return result

    def _commit(self, batch: WriteBatch) -> Deferred[None]:
        """Commit ``batch`` (background write: failures are logged).

        While a put batch is open (its entries are being delivered) the commit joins it instead,
        so it can never reach the store before the puts it settles (see :meth:`_join`).
        """
        if not batch:
            return succeed(None)
        if self._open is not None:
            return self._join(batch)
        return self._commit_now(batch)

    def _commit_now(self, batch: WriteBatch,
                    joined: list[Deferred[None]] | None = None) -> Deferred[None]:
        """Hand ``batch`` to the store now; ``joined`` Deferreds fire with its result."""
        d = self.store.commit(batch)
        if id(batch) in self._unsettled:
            d.addBoth(self._settle_batch, batch)
        if joined:
            d.addBoth(self._fire_joined, joined)
        if d.called:
            d.addErrback(self._log_failure)
            return d
        self._pending[d] = []
        d.addBoth(self._done, d)
        d.addErrback(self._log_failure)
        return d

    def _join(self, batch: WriteBatch) -> Deferred[None]:
        """A commit issued while ``self._open`` is being filled and delivered (an adapter acking,
        rejecting or requeueing inside ``deliver_batch``, or publishing again from there).

        Attempt updates and entry deletes only (acks) are merged into the open batch: the store
        applies a batch's puts before its attempts and deletes, so the result is the same as
        committing them after it, in one commit. Anything else is held and committed right
        after the open batch, in issue order. Returns a Deferred that fires when it is stored.
        """
        d: Deferred[None] = Deferred()
        self._pending[d] = []
        d.addBoth(self._done, d)
        d.addErrback(self._log_failure)
        if (batch.purges or batch.puts or batch.due_puts or batch.due_deletes
                or batch.meta_puts or batch.meta_deletes):
            self._held.append((batch, d))
            return d
        into = self._open
        assert into is not None
        for name, items in batch.attempts.items():
            into.set_attempts(name, items)
        for name, keys in batch.deletes.items():
            into.delete_entries(name, keys)
        queues = self._unsettled.pop(id(batch), None)
        if queues:
            self._unsettled.setdefault(id(into), []).extend(queues)
        self._joined.append(d)
        return d

    @staticmethod
    def _fire_joined(result: Any, joined: list[Deferred[None]]) -> Any:
        """The batch ``joined`` were merged into was committed: fire them with its result."""
        for d in joined:
            if isinstance(result, Failure):
                d.errback(result)
            else:
                d.callback(None)
        return result

    def _open_window(self, batch: WriteBatch) -> WriteBatch | None:
        """Start filling ``batch`` with puts whose entries may be delivered at once."""
        prev = self._open
        self._open = batch
        return prev

    def _commit_window(self, batch: WriteBatch, prev: WriteBatch | None) -> Deferred[None]:
        """Close the window opened on ``batch`` and commit it, then the held batches (cold paths)."""
        if prev is not None:
            self._open = prev
            return self._commit(batch)
        self._open = None
        joined, self._joined = self._joined, []
        if batch:
            d = self._commit_now(batch, joined)
        else:
            d = succeed(None)
            self._fire_joined(None, joined)
        self._commit_held()
        return d

    def _in_window(self, batch: WriteBatch, fill: Callable[[], object]) -> Deferred[None]:
        """Run ``fill`` (puts into ``batch``) inside a window opened on ``batch``; commit it."""
        prev = self._open_window(batch)
        try:
            fill()
        finally:
            d = self._commit_window(batch, prev)
        return d

    def _commit_held(self) -> None:
        """Commit the batches held while a window was open, in the order they were issued."""
        if self._held:
            held, self._held = self._held, []
            for b, proxy in held:
                self._commit_now(b, [proxy])

    def _close_due_window(self, batch: WriteBatch, prev: WriteBatch | None) -> Any:
        """A scheduler handler filled ``batch``, which the scheduler commits after it returns.

        Returns the after-commit hook: it fires the merged commits and settles the queues.
        Held batches are committed on the next turn, after the scheduler's commit was issued.
        """
        self._open = prev
        if prev is not None:
            return None
        joined, self._joined = self._joined, []
        if self._held:
            self.clock.callLater(0, self._commit_held)
        if not joined and id(batch) not in self._unsettled:
            return None

        def committed() -> None:
            self._settle_batch(None, batch)
            self._fire_joined(None, joined)
        return committed

    def _done(self, result: Any, d: Deferred[Any]) -> Any:
        """A tracked commit fired: release the barriers that waited for it."""
        for barrier in self._pending.pop(d, ()):
            barrier.one_done(result)
        return result

    def barrier(self) -> Deferred[None]:
        """Fire once every store write the broker issued so far is durable (acks included).

        Covers publishes, acks, requeues, rejects, dead letters, settings and bindings (every
        commit made through the core); nothing is written for it. Fires at once when nothing is
        pending; errbacks with the store's error when one of those commits failed.
        """
        pending = list(self._pending)
        if not pending:
            return succeed(None)
        b = _Barrier(len(pending))
        for d in pending:
            self._pending[d].append(b)
        return b.deferred

    @staticmethod
    def _log_failure(failure: Any) -> None:
        """Log a background store failure."""
        log.error("store commit failed: %s", failure.getErrorMessage())

    def _queue_changed(self, queue: Queue, batch: WriteBatch | None = None) -> None:
        """Persist a durable queue's settings (into ``batch``, or in its own commit)."""
        if not queue.durable or queue.name.startswith("~") or queue.deleted:
            return
        b = batch if batch is not None else WriteBatch()
        b.put_meta("q/" + queue.name, json.dumps(queue.settings()).encode())
        if batch is None:
            self._commit(b)

    # -- queues --------------------------------------------------------------------------------

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
        q = Queue(self, name, tier=tier, max_size=max_size, overflow=overflow, ttl=ttl,
                  max_attempts=max_attempts, msg_timeout=msg_timeout, expires_at=expires_at,
                  auto_delete=auto_delete, expire_to_dead_letters=expire_to_dead_letters,
                  window=window or self.window, incarnation=self.ids.next_id(), mode=mode,
                  window_setting=window)
        self._queues[name] = q
        self._queue_changed(q)
        if expires_at:
            self._schedule_expiry(q)
        return q

    def _schedule_expiry(self, q: Queue) -> None:
        """(Re)arm the deletion of ``q`` at its ``expires_at`` (0 = cancel)."""
        key = EXPIRY_PREFIX + q.name.encode()
        if self.scheduler is not None and q.durable:
            if q.expires_at:
                self.scheduler.call_at(q.expires_at, key, b"")
            else:
                self.scheduler.cancel(key)
        elif q.expires_at:
            self._arm_memory_expiry(q)

    def _arm_memory_expiry(self, q: Queue) -> None:
        """Delete ``q`` at its ``expires_at`` (memory queues, or no scheduler).

        Every such queue shares one heap and one clock timer armed for the earliest (a timer
        per queue would cost more than an idle queue itself).
        """
        self._expiry_seq += 1
        heapq.heappush(self._expiries, (q.expires_at, self._expiry_seq, q))
        if q.expires_at < self._expiry_at:
            self._arm_expiry_timer(q.expires_at)

    def _arm_expiry_timer(self, when: float) -> None:
        """(Re)arm the shared queue-expiry timer for ``when``."""
        if self._expiry_call is not None and self._expiry_call.active():
            self._expiry_call.cancel()
        self._expiry_at = when
        self._expiry_call = self.clock.callLater(max(0.0, when - self.clock.seconds()),
                                                 self._run_expiries)

    def _run_expiries(self) -> None:
        """The shared timer fired: delete every queue whose time has come, then re-arm."""
        self._expiry_call = None
        self._expiry_at = float("inf")
        now = self.clock.seconds()
        heap = self._expiries
        while heap and heap[0][0] <= now:
            q = heapq.heappop(heap)[2]
            try:
                self._expire_queue(q)
            except Exception:
                log.exception("expiring queue %r failed", q.name)
        if heap:
            self._arm_expiry_timer(heap[0][0])

    def _later(self, delay: float, func: Any, *args: Any) -> None:
        """A plain clock timer that ``stop()`` cancels and that forgets itself when it runs."""
        holder: list[Any] = []

        def run() -> None:
            self._mem_timers.discard(holder[0])
            func(*args)
        t = self.clock.callLater(delay, run)
        holder.append(t)
        self._mem_timers.add(t)

    def _expire_queue(self, q: Queue) -> None:
        """Delete ``q`` if it is still the live queue of its name and has expired."""
        if self._queues.get(q.name) is q and q.expires_at and q.expires_at <= self.clock.seconds():
            self.delete_queue(q.name)

    def queue(self, name: str) -> Queue | None:
        """The queue called ``name``, or None."""
        return self._queues.get(name)

    def queues(self) -> list[Queue]:
        """Every user queue (hidden parking queues excluded)."""
        return list(self._queues.values())

    def delete_queue(self, name: str) -> Deferred[None]:
        """Unbind and forget the queue, dropping its messages and dead letters."""
        q = self._queues.pop(name, None)
        if q is None:
            return succeed(None)
        b = WriteBatch()
        for key in [k for k in self._queue_bindings if k[1] == name]:
            binding = self._queue_bindings.pop(key)
            self.router.trie.remove(binding.pattern, binding)
            self._bindings.pop(binding.id, None)
            if q.durable:
                b.delete_meta("b/" + name + SEP + binding.pattern)
        self.router.changed()
        q._close()
        if q.durable:
            b.purge_queue(name)
            b.purge_queue(dlq_name(name))
            b.delete_meta("q/" + name)
            if q.expires_at:
                b.delete_due(EXPIRY_PREFIX + name.encode())
        return self._commit(b)

    # -- bindings ------------------------------------------------------------------------------

    def _add_binding(self, pattern: str, queue: Queue | None, target: Any,
                     group: str | None, tag: Any) -> Binding:
        """Create and index a binding (no validation, no persistence)."""
        self._next_binding += 1
        b = Binding(self._next_binding, pattern, queue, target, group, tag, self)
        self._bindings[b.id] = b
        if queue is not None:
            self._queue_bindings[(pattern, queue.name)] = b
        self.router.trie.add(pattern, b)
        self.router.changed()
        return b

    def bind_queue(self, pattern: str, queue_name: str) -> Binding:
        """Bind ``pattern`` to the queue (idempotent; persisted for durable queues)."""
        existing = self._queue_bindings.get((pattern, queue_name))
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
            self._commit(wb)
        for address in list(self.router.parking):
            if pattern_matches(pattern, address):
                self._drain_park(address)
        return b

    def subscribe(self, pattern: str, target: Any, *, group: str | None = None,
                  tag: Any = None) -> Binding:
        """Bind ``pattern`` to a live IDeliveryTarget (never persisted)."""
        validate_pattern(pattern)
        return self._add_binding(pattern, None, target, group or None, tag)

    def unbind(self, binding: Binding) -> None:
        """Remove ``binding``."""
        if self._bindings.pop(binding.id, None) is None:
            return
        self.router.trie.remove(binding.pattern, binding)
        if binding.queue is not None:
            self._queue_bindings.pop((binding.pattern, binding.queue.name), None)
            if binding.queue.durable:
                wb = WriteBatch()
                wb.delete_meta("b/" + binding.queue.name + SEP + binding.pattern)
                self._commit(wb)
        self.router.changed()

    def bindings(self, queue_name: str | None = None) -> list[Binding]:
        """Every binding, or those of one queue."""
        if queue_name is None:
            return list(self._bindings.values())
        return [b for (_, n), b in self._queue_bindings.items() if n == queue_name]

    def route(self, address: str) -> Route:
        """The cached route of ``address`` (see :class:`mqhub.core.routing.Route`)."""
        r = self.routes.get(address)
        if r is None:
            r = self.router.route(address)
        return r

    # -- publishing ----------------------------------------------------------------------------

    def publish_batch(self, address: str, bodies: list[bytes], *, origin: str = "",
                      headers: Headers = None, priority: int = 0, ttl: float = 0.0,
                      expires_at: float = 0.0, deliver_at: float = 0.0,
                      persist: bool = True) -> Deferred[None]:
        """Publish ``bodies`` to ``address``; fire when every store write is durable."""
        route = self.routes.get(address)
        if route is None:
            validate_address(address)
            route = self.router.route(address)
        n = len(bodies)
        if not n:
            return succeed(None)
        if priority and not 0 <= priority <= 9:
            priority = 0 if priority < 0 else 9
        first = self.ids.reserve(n)
        ids = range(first, first + n)
        self.last_ids = ids
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
        return self._publish(route, address, entries, persist, deliver_at, True)

    def publish_entries(self, address: str, entries: list[Entry], *,
                        persist: bool = True) -> Deferred[None]:
        """Publish prebuilt entry tuples (replays, moves) to ``address``."""
        validate_address(address)
        route = self.router.route(address)
        deliver_at = max((e[3] for e in entries), default=0.0)
        return self._publish(route, address, entries, persist, deliver_at)

    def _publish(self, route: Route, address: str, entries: list[Entry], persist: bool,
                 deliver_at: float, uniform: bool = False) -> Deferred[None]:
        """Route ``entries``: queues get a copy (one WriteBatch), live targets are called."""
        queues = route.queues if route.park is None else (route.park,)
        n = len(entries)
        for q in queues:
            if q.max_size and q.overflow == "reject" and q.room() < n:
                raise QueueFull(q.name)
        self.journal.published(address, entries, queues, persist, route)
        batch = None
        now = self.clock.seconds() if deliver_at else 0.0
        outer = self._open
        if queues:
            # the batch stays open while its entries are delivered: commits issued meanwhile
            # (acks in deliver_batch) join it or follow it, never precede it
            batch = self._open = outer if outer is not None else WriteBatch()
        try:
            if batch is not None:
                if deliver_at > now:
                    self._defer_address(address, queues, entries, deliver_at, batch, persist)
                else:
                    now = now or self.clock.seconds()
                    for q in queues:
                        q._put(entries, batch, persist, now, uniform)
            if deliver_at > now and (route.targets or route.groups):
                # live subscribers see a delayed message when it is due (memory-held, like them)
                self._later(deliver_at - now, self._deliver_live, address, entries)
            else:
                self._deliver_live(address, entries, route)
        except BaseException:
            if batch is not None:
                self._open = outer
                if outer is None:
                    self._commit_window(batch, None)
            raise
        if batch is None:
            return succeed(None)
        if outer is not None:
            # published from inside another delivery: stored with the outer batch
            d: Deferred[None] = Deferred()
            self._pending[d] = []
            d.addBoth(self._done, d)
            self._joined.append(d)
            return d
        self._open = None
        if not batch:
            # nothing to store (memory queues); publishes nested in the delivery fire too
            if self._joined:
                joined, self._joined = self._joined, []
                self._fire_joined(None, joined)
            self._commit_held()
            return succeed(None)
        d = self.store.commit(batch)
        if id(batch) in self._unsettled:
            d.addBoth(self._settle_batch, batch)
        if not d.called:
            self._pending[d] = []
            d.addBoth(self._done, d)
        if self._joined:
            joined, self._joined = self._joined, []
            d.addBoth(self._fire_joined, joined)
        if self._held:
            self._commit_held()
        return d

    def _deliver_live(self, address: str, entries: list[Entry], route: Route | None = None) -> None:
        """Hand ``entries`` to the live subscribers of ``address`` (one call per binding)."""
        if route is None:
            route = self.route(address)
        if route.targets:
            for b in route.targets:
                try:
                    b.target.deliver_batch(b, address, entries)
                except Exception:
                    log.exception("deliver_batch of %r failed", b.target)
        if route.groups:
            for i in range(len(route.groups)):
                b = route.pick(i)
                try:
                    b.target.deliver_batch(b, address, entries)
                except Exception:
                    log.exception("deliver_batch of %r failed", b.target)

    # -- delays --------------------------------------------------------------------------------

    def _defer(self, queue: Queue, entries: list[Entry], when: float, batch: WriteBatch,
               persist: bool = True) -> None:
        """Hold ``entries`` for ``queue`` until ``when`` (due rows for durable queues)."""
        queue.deferred += len(entries)
        if queue.durable and persist and self.scheduler is not None:
            prefix = DUE_PREFIX + queue.name.encode() + b"/"
            inc = queue.incarnation
            for e in entries:
                batch.put_due(when, prefix + e[0].to_bytes(8, "big"), due_rows.encode_queue_row(inc, e))
            sched = self.scheduler
            self.clock.callLater(0, sched.note_due, when)
        else:
            self._later(max(0.0, when - self.clock.seconds()), self._undefer_memory, queue,
                        list(entries), queue.incarnation)

    def _defer_address(self, address: str, queues: tuple[Queue, ...], entries: list[Entry],
                       when: float, batch: WriteBatch, persist: bool) -> None:
        """Hold a delayed publish until ``when``, then route it by ``address`` (NSQ DPUB).

        ``queues`` (what the address reaches now) are counted in ``deferred`` and remembered
        with their incarnation: one of them that is emptied or re-created meanwhile does not
        get the batch. One due row per message (``da/<msg_id>``) when any of them is durable,
        otherwise a clock timer.
        """
        n = len(entries)
        for q in queues:
            q.deferred += n
        marks = tuple((q.name, q.incarnation) for q in queues)
        if persist and self.scheduler is not None and any(q.durable for q in queues):
            for e in entries:
                batch.put_due(when, ADDRESS_DUE_PREFIX + e[0].to_bytes(8, "big"),
                              due_rows.encode_address_row(address, marks, e))
            self.clock.callLater(0, self.scheduler.note_due, when)
        else:
            self._later(max(0.0, when - self.clock.seconds()), self._address_due_memory,
                        address, list(entries), marks, persist)

    def _address_due_memory(self, address: str, entries: list[Entry],
                            marks: tuple[tuple[str, int], ...], persist: bool) -> None:
        """A clock-held delayed publish came due."""
        b = WriteBatch()
        self._in_window(b, lambda: self._route_due(address, entries, marks, b, persist,
                                                   self.clock.seconds()))

    def _not_started_yet(self, rows: list[tuple[float, bytes, bytes]], batch: WriteBatch,
                         now: float) -> bool:
        """Before start(): put due ``rows`` back a second later and return True."""
        if self._started:
            return False
        for _, key, payload in rows:
            batch.put_due(now + 1.0, key, payload)
        return True

    def _on_address_due(self, rows: list[tuple[float, bytes, bytes]], batch: WriteBatch,
                        now: float) -> Any:
        """Scheduler handler for ``da/`` rows: route due publishes by their address now."""
        if self._not_started_yet(rows, batch, now):
            return None
        groups: dict[tuple[str, Any], list[Entry]] = {}
        for _, key, payload in rows:
            try:
                address, marks, entry = due_rows.decode_address_row(payload)
            except ValueError:
                log.error("dropping unreadable due row %r", key)
                continue
            groups.setdefault((address, tuple(map(tuple, marks))), []).append(entry)
        prev = self._open_window(batch)
        try:
            for (address, marks), entries in groups.items():
                self._route_due(address, entries, marks, batch, True, now)
        finally:
            hook = self._close_due_window(batch, prev)
        return hook

    def _route_due(self, address: str, entries: list[Entry], marks: tuple[tuple[str, int], ...],
                   batch: WriteBatch, persist: bool, now: float) -> None:
        """Put due ``entries`` into the queues ``address`` routes to now (or its parking queue).

        A queue counted at publish time whose incarnation changed since (emptied, deleted and
        re-created) is skipped; entries held for a parked address before ``empty_parked`` ran
        on it are dropped.
        """
        counted = dict(marks)
        n = len(entries)
        for name, inc in marks:
            q = self._queues.get(name) or self._hidden.get(name)
            if q is not None and q.incarnation == inc:
                q.deferred = max(0, q.deferred - n)
        cut = self._park_cut.get(address)
        if cut is not None and PARK_PREFIX + address in counted:
            entries = [e for e in entries if e[0] >= cut]
            if not entries:
                return
        route = self.route(address)
        dests = route.queues if route.park is None else (route.park,)
        if not dests:
            return
        entries.sort(key=entry_order)
        for q in dests:
            was = counted.get(q.name)
            if was is not None and was != q.incarnation and not q.name.startswith(PARK_PREFIX):
                continue
            q._put(entries, batch, persist, now)

    def _undefer_memory(self, queue: Queue, entries: list[Entry], incarnation: int) -> None:
        """A memory-held delay came due."""
        if queue.deleted or queue.incarnation != incarnation:
            return
        queue.deferred = max(0, queue.deferred - len(entries))
        b = WriteBatch()
        self._in_window(b, lambda: queue._put(entries, b, True, self.clock.seconds()))

    def _on_due(self, rows: list[tuple[float, bytes, bytes]], batch: WriteBatch,
                now: float) -> Any:
        """Scheduler handler for ``dq/`` rows: move due entries into their queues."""
        if self._not_started_yet(rows, batch, now):
            return None
        per_queue: dict[str, list[Entry]] = {}
        for _, key, payload in rows:
            name = key[len(DUE_PREFIX):-9].decode("utf-8", "replace")
            q = self._queues.get(name) or self._hidden.get(name)
            try:
                inc, entry = due_rows.decode_queue_row(payload)
            except ValueError:
                log.error("dropping unreadable due row %r", key)
                continue
            if q is None or q.deleted or inc != q.incarnation:
                continue
            per_queue.setdefault(name, []).append(entry)
        prev = self._open_window(batch)
        try:
            for name, entries in per_queue.items():
                q = self._queues.get(name) or self._hidden[name]
                q.deferred = max(0, q.deferred - len(entries))
                entries.sort(key=entry_order)
                q._put(entries, batch, True, now)
        finally:
            hook = self._close_due_window(batch, prev)
        return hook

    def _on_queue_expiry(self, rows: list[tuple[float, bytes, bytes]], batch: WriteBatch,
                         now: float) -> None:
        """Scheduler handler for ``qx/`` rows: delete queues whose own TTL ran out."""
        if not self._started:
            for _, key, payload in rows:
                batch.put_due(now + 1.0, key, payload)
            return
        for _, key, _ in rows:
            q = self._queues.get(key[len(EXPIRY_PREFIX):].decode("utf-8", "replace"))
            if q is not None and q.expires_at and q.expires_at <= now:
                self.delete_queue(q.name)

    def sweep_ttl(self, now: float, budget: int) -> bool:
        """Drop expired ready messages from queue windows, at most ``budget`` scanned; True = more."""
        queues = [q for q in self._queues.values() if q._nready and (q.ttl or q._may_expire)]
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

    # -- parking and pausing -------------------------------------------------------------------

    def _park_queue(self, address: str) -> Queue:
        """The hidden parking queue of ``address`` (created on demand)."""
        q = self.router.parking.get(address)
        if q is None:
            name = PARK_PREFIX + address
            q = self._hidden.get(name)
            if q is None:
                q = self._hidden[name] = Queue(self, name, window=self.window)
            self.router.parking[address] = q
            self.router.changed()
        return q

    def park(self, address: str) -> None:
        """Keep publishes to ``address`` while no queue is bound to it (NSQ topic without channels)."""
        validate_address(address)
        self._park_queue(address)
        b = WriteBatch()
        b.put_meta("park/" + address, b"1")
        self._commit(b)

    def unpark(self, address: str) -> Deferred[None]:
        """Stop parking ``address``; parked messages go to the bound queues (or are dropped)."""
        b = WriteBatch()
        b.delete_meta("park/" + address)
        self._commit(b)
        return self._release(address)

    def pause_address(self, address: str) -> None:
        """Hold every publish to ``address`` in its parking queue until resumed."""
        validate_address(address)
        self._park_queue(address)
        self.router.paused.add(address)
        self.router.changed()
        b = WriteBatch()
        b.put_meta("pause/" + address, b"1")
        self._commit(b)

    def resume_address(self, address: str) -> Deferred[None]:
        """Release a paused address: held messages go to the bound queues."""
        self.router.paused.discard(address)
        self.router.changed()
        b = WriteBatch()
        b.delete_meta("pause/" + address)
        self._commit(b)
        return self._drain_park(address)

    def _release(self, address: str) -> Deferred[None]:
        """Drain then forget the parking queue of ``address`` unless it is still paused."""
        d = self._drain_park(address)

        def forget(_: Any) -> None:
            if address in self.router.paused:
                return
            q = self.router.parking.pop(address, None)
            if q is not None:
                self._hidden.pop(q.name, None)
                if q.depth:
                    q.empty()
                self.router.changed()
        return d.addCallback(forget)

    def empty_parked(self, address: str) -> Deferred[None]:
        """Drop every message held for ``address`` (NSQ ``/topic/empty``); parking stays as it was.

        Held means: in the parking queue (in memory or stored), and delayed publishes made while
        the address was parked or paused that are not due yet (they would have come due into
        the parking queue). Messages already in bound queues are not touched. Fires when durable.
        """
        cut = self.ids.next_id()
        self._park_cut[address] = cut
        b = WriteBatch()
        b.put_meta(PARK_CUT_PREFIX + address, str(cut).encode())
        d = self._commit(b)
        q = self.router.parking.get(address)
        if q is None:
            return d
        return DeferredList([d, q.empty()], fireOnOneErrback=True,
                            consumeErrors=True).addCallback(lambda _: None)

    def parked_depth(self, address: str) -> int:
        """Messages held for ``address`` (parked or paused)."""
        q = self.router.parking.get(address)
        return q.depth if q is not None else 0

    def _drain_park(self, address: str) -> Deferred[None]:
        """Move everything held for ``address`` into the queues its route now reaches."""
        q = self.router.parking.get(address)
        if q is None or not q.depth:
            return succeed(None)
        route = self.router.route(address)
        if route.park is not None or not route.queues:
            return succeed(None)
        dests = route.queues
        now = self.clock.seconds()
        entries = q._pop_ready(q._nready)
        b = WriteBatch()

        def move() -> None:
            if entries:
                b.delete_entries(q.name, [(e[1], e[0]) for e in entries])
                for dest in dests:
                    dest._put(entries, b, True, now)

        d = self._in_window(b, move)
        if q._stored_only and not q._paging:
            q._paging = True
            after = q._horizon

            def got(page: list[Entry]) -> Any:
                q._paging = False
                if not page:
                    q._stored_only = 0
                    q._horizon = None
                    return None
                q._horizon = (page[-1][1], page[-1][0])
                q._stored_only = max(0, q._stored_only - len(page))
                for e in page:
                    q._insert(e)
                if not q._stored_only:
                    q._horizon = None
                return self._drain_park(address)
            return d.addCallback(lambda _: self.store.read_entries(q.name, after, 1000)) \
                    .addCallback(got)
        return d

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
            items = [e for e in q._mem_dead if after is None or e[0] > after][:limit]
            return succeed([DeadLetter.from_entry(e, queue_name) for e in items])
        d = self.store.read_entries(dlq_name(queue_name),
                                    None if after is None else (0, after), limit)
        return d.addCallback(lambda es: [DeadLetter.from_entry(e, queue_name) for e in es])

    @inlineCallbacks
    def _all_dead(self, q: Queue) -> Any:
        """Every stored dead-letter entry of ``q`` (cold path, read in pages)."""
        if not q.durable:
            return list(q._mem_dead)
        out: list[Entry] = []
        after = None
        while True:
            page = yield self.store.read_entries(dlq_name(q.name), after, 1000)
            out.extend(page)
            if len(page) < 1000:
                return out
            after = (page[-1][1], page[-1][0])

    @inlineCallbacks
    def replay_dead_letters(self, queue_name: str,
                            msg_ids: Iterable[int] | None = None) -> Any:
        """Put dead letters back on their queue (attempts reset); fire with how many."""
        q = self._get(queue_name)
        wanted = None if msg_ids is None else set(msg_ids)
        dead = yield self._all_dead(q)
        chosen = [e for e in dead if wanted is None or e[0] in wanted]
        if not chosen:
            return 0
        b = WriteBatch()
        if q.durable:
            b.delete_entries(dlq_name(queue_name), [(0, e[0]) for e in chosen])
        else:
            ids = {e[0] for e in chosen}
            q._keep_mem_dead([e for e in q._mem_dead if e[0] not in ids], replace=True)
        entries = sorted((from_dead(e) for e in chosen), key=entry_order)
        q.dead_letter_count = max(0, q.dead_letter_count - len(chosen))
        yield self._in_window(b, lambda: q._put(entries, b, True, self.clock.seconds()))
        return len(chosen)

    @inlineCallbacks
    def purge_dead_letters(self, queue_name: str,
                           msg_ids: Iterable[int] | None = None) -> Any:
        """Delete dead letters (all, or the given ids); fire with how many were removed."""
        q = self._get(queue_name)
        dead = yield self._all_dead(q)
        wanted = None if msg_ids is None else set(msg_ids)
        chosen = [e for e in dead if wanted is None or e[0] in wanted]
        if q.durable:
            b = WriteBatch()
            if wanted is None:
                b.purge_queue(dlq_name(queue_name))
            else:
                b.delete_entries(dlq_name(queue_name), [(0, e[0]) for e in chosen])
            yield self._commit(b)
        else:
            ids = {e[0] for e in chosen}
            q._keep_mem_dead([e for e in q._mem_dead if e[0] not in ids], replace=True)
        q.dead_letter_count = max(0, q.dead_letter_count - len(chosen))
        return len(chosen)

    # -- introspection -------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters for the admin surfaces and the manhole."""
        return {"queues": len(self._queues), "parked": len(self.router.parking),
                "bindings": len(self._bindings), "epoch": self.router.epoch,
                "routes_cached": len(self.router.cache), "last_id": self.ids.last,
                "pending_commits": len(self._pending)}


__all__ = ["Broker", "validate_queue_name", "TIER_DURABLE", "TIER_MEMORY", "InvalidName"]
