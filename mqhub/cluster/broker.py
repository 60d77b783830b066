"""The cluster broker: what protocol adapters call on the core, over a JetStream cluster.

It has the adapter-facing surface of the embedded :class:`mqhub.core.broker.Broker`
(publish batches, queues, bindings, live subscriptions, consumers through its queues, dead
letters, parking) with JetStream holding every durable thing (docs/cluster.md):

* **Durable publishes** go to ``mq.<address>`` in stream ``MQHUB`` as one pipelined batch
  whose Deferred fires once every PubAck (the stream quorum's) came back; a batch the cluster
  does not take in time errbacks with :class:`~mqhub.errors.ClusterUnavailable`, which every
  adapter turns into its own publish error. A deferred publish is a JetStream message
  schedule; a TTL is ``Nats-TTL``.
* **Queues** are durable pull consumers (:class:`~mqhub.cluster.queue.ClusterQueue`); every
  node knows every queue of the cluster (a consumer list at start, again whenever a node says
  ``mqhub.dir`` changed and every few seconds), so routing, ``queues()`` and the admin views
  show the cluster.
* **Paused addresses** hold their publishes on ``mqp.<address>`` for a hold consumer and move
  them into the queues on resume (:mod:`mqhub.cluster.hold`); **peek/take/remove** of a queue
  no node consumes work on its stored head, read at directory reads (docs/cluster.md).
* **Live traffic** is delivered to this node's subscribers directly and forwarded on core
  subject ``ml.<address>`` when another node announced a matching live pattern (nodes
  announce theirs on ``mqhub.nodes``); what arrives on ``ml.`` goes to local subscribers only.
  Remote interest is a binding in the local router whose target is the forwarder, so an
  adapter sees it as a foreign binding (the NATS bridge hands such publishes to the core).
"""

from __future__ import annotations

import base64
import json
import os
import socket
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTCP, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from mqhub.cluster.client import Event, NatsConnection
from mqhub.cluster.coverage import write_marker
from mqhub.cluster.cron import ClusterScheduler
from mqhub.cluster.hold import PAUSE_PREFIX, HoldDrain, hold_config, hold_subject
from mqhub.cluster.jetstream import (
    DLQ_STREAM,
    SCHED_CONSUMER,
    STREAM,
    TERM,
    JetStream,
    JetStreamError,
    ack_frames,
    address_subject,
    consumer_name,
    nak_frames,
    pattern_filter,
    queue_subject,
    stream_config,
)
from mqhub.cluster.messages import H_MSG_ID, BlockCache, header_block, publish_frames
from mqhub.cluster.queue import ClusterQueue
from mqhub.cluster.state import ClusterState
from mqhub.core.address import is_pattern, validate_address, validate_pattern
from mqhub.core.counters import Counters
from mqhub.core.ids import IdGenerator
from mqhub.core.routing import Binding, Route, Router
from mqhub.errors import ClusterUnavailable, InvalidName, NoSuchQueue, QueueFull
from mqhub.interfaces import IBinding, ICore, IDeliveryTarget, IQueue
from mqhub.protocols.nats.codec import OP_HMSG, build_headers, parse_headers
from mqhub.records import (
    ADDRESS,
    ATTEMPTS,
    BODY,
    EXPIRES_AT,
    H_ERROR,
    H_PRIORITY,
    H_QUEUE,
    H_REASON,
    H_TIME,
    HEADERS,
    MSG_ID,
    ORIGIN,
    PRIORITY,
    DeadLetter,
    Entry,
    Peer,
)
from mqhub.store.codec import encode_meta
from mqhub.store.journal_recorder import NULL_RECORDER

__all__ = ["ClusterBroker", "Forwarder", "LIVE_PREFIX", "NODES_SUBJECT", "DIR_SUBJECT"]

log = Logger()

LIVE_PREFIX = "ml."
NODES_SUBJECT = "mqhub.nodes"
DIR_SUBJECT = "mqhub.dir"
#: seconds between a node's announcements; a node silent for 3 of them is gone
ANNOUNCE_INTERVAL = 2.0
#: seconds between the in-flight timeout checks, and between consumer-list refreshes
TICK = 0.25
REFRESH = 3.0
ORIGIN_REMOTE_NATS = "nats-cluster"
#: protocols served by a plugin of another name (NATS is the mq9 plugin's listener)
PROTOCOL_PLUGINS = {"nats": "mq9"}


@implementer(IDeliveryTarget)
class Forwarder:
    """The target of remote live interest: forwards a publish batch to ``ml.<address>``."""

    protocol_name = "cluster"

    def __init__(self, broker: ClusterBroker) -> None:
        self.broker = broker

    def deliver_batch(self, binding: Any, address: str, messages: list[tuple]) -> None:
        """Not called: :meth:`ClusterBroker.publish_batch` forwards once per batch itself."""


class ParkedAddress:
    """What a route's ``park`` is while an address is parked: its name and held count."""

    __slots__ = ("name", "broker")

    def __init__(self, address: str, broker: ClusterBroker) -> None:
        self.name = address
        self.broker = broker

    @property
    def depth(self) -> int:
        """Messages held for the address."""
        return self.broker.parked_depth(self.name)


@implementer(ICore)
class ClusterBroker:
    """See the module docstring.

    :param reactor: TCP connections for the cluster client.
    :param clock: time.
    :param urls: the cluster's ``nats://`` URLs.
    :param replicas: stream replicas (``--cluster-replicas``).
    :param name: this node's name (unique in the cluster).
    :param store: the node's local store (adapters keep their own metadata there).
    :param scheduler: the node's scheduler (eMQP schedules), or None.
    """

    def __init__(self, reactor: IReactorTCP, clock: IReactorTime, urls: list[str], *,
                 replicas: int = 3, name: str = "", store: Any = None, scheduler: Any = None,
                 window: int = 10_000, timeout: float = 5.0, tls_ca: str | None = None,
                 creds: str | None = None) -> None:
        self.clock = clock
        self.urls = list(urls)
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        # echo off: live copies this node forwards never come back to its own subscriptions
        self.conn = NatsConnection(reactor, clock, urls, name=f"mqhub {self.name}",
                                   timeout=timeout, echo=False, tls_ca=tls_ca, creds=creds)
        self.js = JetStream(self.conn)
        self.replicas = replicas
        self.store = store
        self.scheduler = scheduler
        self.journal: Any = NULL_RECORDER   # the flow journal's recorder (set by the hub)
        #: adapters' own records: the cluster's KV bucket, seen by every node
        self.state = ClusterState(self.conn, self.js, self.name, store,
                                  peer_count=lambda: len(self._remote),
                                  directory=self.directory_barrier)
        self.window = window
        self.ids = IdGenerator(clock)
        self.counters = Counters()
        self.router = Router()
        self.routes = self.router.cache
        self.last_ids: range = range(0)
        self.forwarder = Forwarder(self)
        self._queues: dict[str, ClusterQueue] = {}
        self._bindings: dict[int, Binding] = {}
        self._next_binding = 1
        self._remote: dict[str, dict] = {}          # node name -> its last announcement
        self._remote_bindings: dict[str, Binding] = {}  # remote live pattern -> binding
        self._live_subs: dict[str, str] = {}         # cluster subject (ml.) -> its sid
        self._parked: set[str] = set()
        #: parked address -> messages its park consumer holds (as last read)
        self._park_depth: dict[str, int] = {}
        #: address -> messages its hold consumer holds (paused or being resumed; last read),
        #: the drains this node runs, and unpaused holds nobody drains (first seen at)
        self._hold_depth: dict[str, int] = {}
        self._drains: dict[str, HoldDrain] = {}
        self._orphan_holds: dict[str, float] = {}
        #: every queue's (and park's: owner "") consumer filters and ack floor, as last read
        self._interest: list[tuple[str, list[str], int]] = []
        self.state.watch(PAUSE_PREFIX, self._pause_record)
        self._settling: list[defer.Deferred[Any]] = []
        #: queues whose consumer this node is creating or changing now
        self._creating: set[str] = set()
        self._resave: dict[str, str] = {}
        self._refreshing: defer.Deferred[None] | None = None
        self._refresh_again = False
        self._after_save: dict[str, list[Callable[[], object]]] = {}
        self._settled_waiters: dict[str, list[defer.Deferred[None]]] = {}
        #: a counter of this node's directory changes, and the count at each queue's last one
        self._generation = 0
        self._changed_at: dict[str, int] = {}
        self._blocks = BlockCache()
        self._ticker: Any = None
        self._refresher: Any = None
        self._announcer: Any = None
        self.started = False
        self.ready = False
        self.problem = "not connected"
        #: why the last durable publish was refused ("" once one was stored again)
        self.refusing = ""
        self.refused_at = 0.0
        self.endpoints: dict[str, str] = {}
        self.conn.on_state.append(self._on_state)

    @classmethod
    def from_options(cls, options: Any, reactor: Any, clock: IReactorTime, store: Any,
                     scheduler: Any) -> ClusterBroker:
        """The broker ``twistd mqhub --cluster URLS ...`` runs (options as tap.py gives them;
        ``endpoints`` become what this node announces: NATS and NSQ client addresses)."""
        urls = [u.strip() for u in str(options["cluster"]).split(",") if u.strip()]
        broker = cls(reactor, clock, urls, replicas=int(options.get("cluster-replicas") or 3),
                     name=options.get("cluster-name") or "", store=store, scheduler=scheduler,
                     window=int(options.get("window") or 10_000),
                     tls_ca=options.get("cluster-tls-ca"),
                     creds=options.get("cluster-creds"))
        broker.endpoints = announced_endpoints(options.get("endpoints") or {})
        if scheduler is not None:
            broker.scheduler = ClusterScheduler(scheduler, broker)
        return broker

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """Changes whenever bindings (local, remote, or remote interest) change."""
        return self.router.epoch

    def start(self) -> defer.Deferred[None]:
        """Connect and set up; fires once the streams exist and the queues are known, or
        after ``timeout`` seconds without the cluster (then the node runs refusing publishes
        and sets up as soon as the cluster answers)."""
        self.started = True
        path = getattr(self.store, "path", None)
        if path:   # tell snapshot/export/analytics what this node's files cover
            write_marker(os.path.dirname(path), self.name, self.urls)
        self.conn.start()
        self._ticker = self.clock.callLater(TICK, self._tick)
        first = self._setup_when_up()
        timeout = self.clock.callLater(self.conn.timeout * 2, self._start_timeout, first)
        result: defer.Deferred[None] = defer.Deferred()

        def done(outcome: object) -> None:
            if timeout.active():
                timeout.cancel()
            if not result.called:
                result.callback(None)
        first.addBoth(done)
        self._start_result = result
        return result

    def _start_timeout(self, first: defer.Deferred[None]) -> None:
        """Start without the cluster (it keeps trying)."""
        if not self._start_result.called:
            log.warn("cluster: not reachable yet ({problem}); publishes are refused until "
                     "it is", problem=self.conn.last_error or self.problem)
            self._start_result.callback(None)

    @defer.inlineCallbacks
    def _setup_when_up(self) -> Any:
        """Wait for a connection, then set up (retrying while the cluster refuses)."""
        while self.started:
            yield self.conn.when_ready()
            try:
                yield self._setup()
            except ClusterUnavailable as exc:
                self.problem = f"setup: {exc}"
                log.warn("cluster: setup failed ({err}); retrying", err=exc)
                yield _sleep(self.clock, 1.0)
                continue
            return

    @defer.inlineCallbacks
    def _setup(self) -> Any:
        """Streams, the schedule keeper, the queue directory, subscriptions."""
        for config in stream_config(self.replicas):
            yield self.js.ensure_stream(config)
        yield self.js.ensure_consumer(STREAM, {
            "durable_name": SCHED_CONSUMER, "ack_policy": "none",
            "filter_subject": "mqs.>", "deliver_policy": "all"})
        if not self._sub_sids:
            self._sub_sids = [
                self.conn.subscribe(NODES_SUBJECT, self._node_in),
                self.conn.subscribe(DIR_SUBJECT, self._dir_in)]
            self.state.subscribe()
        yield self.state.load()
        yield self.refresh()
        self.ready = True
        self.problem = ""
        self._announce()
        if self._refresher is None:
            self._refresher = self.clock.callLater(REFRESH, self._refresh_tick)

    _sub_sids: list[str] = []
    _start_result: defer.Deferred[None]

    def _on_state(self, up: bool) -> None:
        """Connection state: down = publishes refused; up = announce and refresh."""
        if not up:
            self.ready = False
            self.problem = f"cluster connection lost: {self.conn.last_error}"
            return
        if self.started and self._sub_sids:
            self.ready = True
            self.problem = ""
            self._announce()
            self.refresh().addErrback(lambda f: None)
            # notices of other nodes' records may have been missed meanwhile
            self.state.load().addErrback(
                lambda f: log.warn("cluster: re-reading adapter records failed: {err}",
                                   err=f.value))

    def stop(self) -> defer.Deferred[None]:
        """Stop timers, say goodbye, close the connection."""
        self.started = False
        for call in (self._ticker, self._refresher, self._announcer):
            if call is not None and call.active():
                call.cancel()
        for queue in self._queues.values():
            queue.close()
        for drain in list(self._drains.values()):
            drain.stop()
        try:
            self.conn.publish([_pub(NODES_SUBJECT, json.dumps(
                {"name": self.name, "gone": True}).encode())])
        except ClusterUnavailable:
            pass
        self.conn.stop()
        return defer.succeed(None)

    def barrier(self) -> defer.Deferred[None]:
        """Fires once every queue change (declaration, binding, setting, deletion) this node
        issued so far is in the cluster; publishes confirm themselves, and acks are not
        confirmed by JetStream (a lost ack is a redelivery: docs/cluster.md)."""
        return self.directory_barrier()

    def health(self) -> dict[str, Any]:
        """What /healthz and /api/stats say about the cluster."""
        problem = self.problem
        if not problem and self.refusing:
            problem = f"publishes refused: {self.refusing}"
        return {"mode": "cluster", "node": self.name, "connected": self.conn.connected,
                "ready": self.ready, "problem": problem or None,
                "server": (f"{self.conn.wire.url.host}:{self.conn.wire.url.port}"
                           if self.conn.wire is not None else None),
                "reconnects": max(0, self.conn.connects - 1),
                "directory_changes_pending": len(self._settling),
                "runs_schedules": bool(getattr(self.scheduler, "leader", False)),
                "nodes": sorted([self.name, *self._remote])}

    # -- timers ----------------------------------------------------------------------------------

    def _tick(self) -> None:
        """In-flight deadlines and pull requests."""
        now = self.clock.seconds()
        for queue in list(self._queues.values()):
            if queue.in_flight:
                queue.expire_flight(now)
            queue.tick()
        if self.started:
            self._ticker = self.clock.callLater(TICK, self._tick)

    def _refresh_tick(self) -> None:
        """Every few seconds: the queue directory and depths; forget silent nodes."""
        if self.conn.connected:
            self.refresh().addErrback(lambda f: None)
        now = self.clock.seconds()
        gone = [n for n, a in self._remote.items()
                if now - a.get("_seen", now) > 3 * ANNOUNCE_INTERVAL]
        for name in gone:
            del self._remote[name]
        if gone:
            self._remote_patterns_changed()
        if self.started:
            self._refresher = self.clock.callLater(REFRESH, self._refresh_tick)

    # -- the directory (every queue of the cluster) -------------------------------------------------

    def refresh(self) -> defer.Deferred[None]:
        """Read the directory again; while a read is under way, one more follows it (any
        number of calls meanwhile are one read)."""
        if self._refreshing is not None:
            self._refresh_again = True
            return self._refreshing
        d = self._refreshing = self._read_directory()

        def done(result: object) -> object:
            self._refreshing = None
            if self._refresh_again and self.started:
                self._refresh_again = False
                self.refresh().addErrback(lambda f: None)
            return result
        d.addBoth(done)
        return d

    @defer.inlineCallbacks
    def _read_directory(self) -> Any:
        """Read every consumer of ``MQHUB``: learn queues made or deleted elsewhere, their
        bindings and settings, and their depths."""
        asked_at = self._generation
        busy = set(self._creating)     # changes in flight when asked: the list may predate them
        infos = yield self.js.consumers(STREAM)
        seen: set[str] = set()
        holds: dict[str, int] = {}
        interest: list[tuple[str, list[str], int]] = []
        heads: list[tuple[ClusterQueue, int, list[str], tuple[int, ...]]] = []
        changed = False
        for info in infos:
            config = info.get("config") or {}
            meta = config.get("metadata") or {}
            filters = list(config.get("filter_subjects") or ())
            if config.get("filter_subject"):
                filters.append(str(config["filter_subject"]))
            owner = meta.get("mqhub_queue") or meta.get("mqhub_member") or ""
            if owner or meta.get("mqhub_park"):
                interest.append((owner, filters, int((info.get("ack_floor") or {}).get(
                    "stream_seq", 0))))
            park = meta.get("mqhub_park")
            if park:
                self._park_depth[park] = int(info.get("num_pending", 0))
                continue
            hold = meta.get("mqhub_hold")
            if hold:
                holds[hold] = int(info.get("num_pending", 0)) + \
                    int(info.get("num_ack_pending", 0))
                continue
            name = meta.get("mqhub_queue")
            if not name:
                continue
            if name not in self._queues and '"tier": "memory"' in (meta.get("mqhub_settings")
                                                                  or ""):
                continue     # a memory-tier queue is known only on the node that declared it
            seen.add(name)
            queue = self._queues.get(name)
            if queue is None:
                queue = ClusterQueue(self, name)
                self._queues[name] = queue
                changed = True
            queue.pending = int(info.get("num_pending", 0))
            queue.ack_pending = int(info.get("num_ack_pending", 0))
            if queue.pulling or queue.mode == "fanout" or not queue.pending \
                    or int(info.get("num_waiting", 0)):
                queue.clear_head()   # consumed here (its pulled entries) or elsewhere
            else:
                delivered = int((info.get("delivered") or {}).get("stream_seq", 0))
                key = (delivered, queue.pending, queue.ack_pending)
                if key != queue.head_key:
                    heads.append((queue, delivered + 1, filters, key))
            if name not in self._creating:
                queue.deliver = str(config.get("deliver_policy") or queue.deliver)
            if self._changed_at.get(name, -1) > asked_at or name in self._creating \
                    or name in busy:
                continue   # changed here since this list was asked for: ours is newer
            try:
                queue.apply(json.loads(meta.get("mqhub_settings") or "{}"))
            except ValueError:
                pass
            patterns = json.loads(meta.get("mqhub_patterns") or "[]")
            if patterns != queue.patterns:
                self._rebind(queue, patterns)
                changed = True
        for name in list(self._queues):
            if name not in seen and not self._queues[name].consumers \
                    and name not in self._creating \
                    and name not in busy and self._changed_at.get(name, -1) <= asked_at:
                self._forget(name)
                changed = True
        if changed:
            self.router.changed()
        self._hold_depth = holds
        self._collect_orphan_holds(holds)
        self._interest = interest
        if heads:
            yield defer.DeferredList([self._read_head(*h) for h in heads], consumeErrors=True)
        # dead letters per queue: the DLQ stream's count of each queue's subject
        info = yield self.js.api(f"STREAM.INFO.{DLQ_STREAM}", {"subjects_filter": "dlq.>"})
        counts = (info.get("state") or {}).get("subjects") or {}
        for queue in self._queues.values():
            queue.dead_letter_count = int(counts.get(_dlq_subject(queue.name), 0))

    @defer.inlineCallbacks
    def _read_head(self, queue: ClusterQueue, start: int, filters: list[str],
                   key: tuple[int, ...]) -> Any:
        """Read the first undelivered stored messages of a queue no consumer pulls (one
        batched direct get per filter subject, merged in stream order)."""
        serial = queue.head_serial
        count = queue.head_size()
        rows = []
        for subject in filters:
            got = yield self.js.direct_batch(STREAM, start, subject, count,
                                             max_bytes=count * 1024)
            rows.extend(got)
        rows.sort(key=lambda row: row[0])
        queue.set_head(rows[:count], key, serial)

    def consume_stored(self, queue: ClusterQueue,
                       items: list[tuple[Entry, tuple[int, str]]]) -> None:
        """Messages taken or removed from ``queue``'s stored head leave the queue (see
        :meth:`_remove_stored`); ``barrier`` covers it."""
        seqs = [ref[0] for _, ref in items]
        d = self._remove_stored(queue, items)

        def done(result: object) -> object:
            queue.consuming.difference_update(seqs)
            return result
        d.addBoth(done)
        self._settle(d, f"take from {queue.name}")

    @defer.inlineCallbacks
    def _remove_stored(self, queue: ClusterQueue,
                       items: list[tuple[Entry, tuple[int, str]]]) -> Any:
        """Delete stored messages from the stream for ``queue``. Another queue that still
        needs one (its filter matches, above its ack floor, as of the last directory read)
        first gets a copy on its own ``mqq.`` subject under the same id (at its tail); one a
        park holds stays stored (this queue then gets it again: at least once)."""
        copies: dict[str, list[Entry]] = {}
        delete: list[int] = []
        for entry, (seq, subject) in items:
            owners = {owner for owner, filters, floor in self._interest
                      if owner != queue.name and seq > floor
                      and any(_covers(f, subject) for f in filters)}
            if "" in owners:
                continue
            for owner in owners:
                copies.setdefault(owner, []).append(entry)
            delete.append(seq)
        for owner, entries in sorted(copies.items()):
            blocks = [header_block(e[ORIGIN], e[PRIORITY], 0.0, e[EXPIRES_AT], e[HEADERS],
                                   address=e[ADDRESS], msg_id=e[MSG_ID]) for e in entries]
            bodies = [e[BODY] for e in entries]
            yield self.conn.publish_acked(_framer(queue_subject(owner), bodies, blocks),
                                          len(bodies))
        gone = []
        for seq in delete:
            d = self.js.delete_message(STREAM, seq)
            d.addErrback(_ignore_not_found)
            gone.append(d)
        yield _all(gone)

    def _dir_in(self, events: list[Event]) -> None:
        """Another node changed a queue: refresh now."""
        if self.conn.connected:
            self.refresh().addErrback(lambda f: None)

    def _changed_dir(self) -> None:
        """Tell the other nodes to refresh."""
        try:
            self.conn.publish([_pub(DIR_SUBJECT, self.name.encode())])
        except ClusterUnavailable:
            pass

    def _rebind(self, queue: ClusterQueue, patterns: list[str]) -> None:
        """Make the router's bindings of ``queue`` be ``patterns``."""
        for bid, b in list(self._bindings.items()):
            if b.queue is queue:
                self.router.trie.remove(b.pattern, b)
                del self._bindings[bid]
        queue.patterns = list(patterns)
        queue.masks = [p for p in patterns if pattern_filter(p)[1]]
        for pattern in patterns:
            b = Binding(self._next_binding, pattern, queue, None, None, None, self)  # type: ignore[arg-type]
            self._next_binding += 1
            self._bindings[b.id] = b
            self.router.trie.add(pattern, b)
        self.router.changed()

    def _forget(self, name: str) -> None:
        """A queue is gone from the cluster."""
        queue = self._queues.pop(name)
        self._rebind(queue, [])
        queue.close()

    # -- queues ----------------------------------------------------------------------------------

    def _consumer_config(self, queue: ClusterQueue) -> dict:
        """The durable consumer of ``queue`` (its deliver policy is the one it was made
        with: JetStream does not change it later)."""
        deliver = queue.deliver
        filters = _filters(queue.patterns) + [queue_subject(queue.name)]
        # memory tier: kept in the servers' memory, gone a minute after its last pull (an
        # interest stream's consumers must have the stream's replicas: no R1 consumer here)
        memory = {"mem_storage": True, "inactive_threshold": 60_000_000_000} \
            if queue.tier == "memory" else {}
        return {**memory, "durable_name": queue.consumer, "ack_policy": "explicit",
                "ack_wait": int(max(1.0, queue.msg_timeout) * 1e9), "max_deliver": -1,
                "filter_subjects": filters, "deliver_policy": deliver,
                "max_ack_pending": 100_000, "max_waiting": 4096,
                "metadata": {"mqhub_queue": queue.name,
                             "mqhub_settings": json.dumps(queue.settings()),
                             "mqhub_patterns": json.dumps(queue.patterns)}}

    def _settle(self, d: defer.Deferred[Any], what: str) -> None:
        """Track a directory change until it is made (publishes wait for it)."""
        self._settling.append(d)

        def done(result: object) -> object:
            self._settling.remove(d)
            self._changed_dir()
            return result

        def failed(failure: Any) -> None:
            log.warn("cluster: {what} failed: {err}", what=what, err=failure.value)
        d.addBoth(done).addErrback(failed)

    def declare_queue(self, name: str, **settings: Any) -> ClusterQueue:
        """Create or return the queue (an existing one keeps its settings)."""
        queue = self._queues.get(name)
        if queue is not None and not queue.deleted:
            return queue
        queue = ClusterQueue(self, name, **settings)
        self._queues[name] = queue
        self.save_queue(queue)
        return queue

    def save_queue(self, queue: ClusterQueue, then: Callable[[], object] | None = None) -> None:
        """Create or update the queue's consumer in the cluster; ``then`` runs once the
        config is in. One request per queue is in flight at a time (the server may apply
        concurrent updates of one consumer in any order): a change made meanwhile is sent
        after it, with the queue's config of that moment."""
        self._generation += 1
        self._changed_at[queue.name] = self._generation
        if then is not None:
            self._after_save.setdefault(queue.name, []).append(then)
        if queue.name in self._creating:
            self._resave[queue.name] = "again"
            return
        self._creating.add(queue.name)
        # sent at the end of this turn: a declare, its bindings and settings made together
        # (an NSQ SUB, a mailbox) become one consumer create, with its filters from the start
        placeholder: defer.Deferred[Any] = defer.Deferred()
        self._settle(placeholder, f"queue {queue.name}")

        def go() -> None:
            self._resave.pop(queue.name, None)
            if queue.fresh and queue.deliver == "new":
                d = self._adopt_parked(queue)
                d.addCallback(lambda _: self._send_save(queue))
                d.chainDeferred(placeholder)
            else:
                self._send_save(queue).chainDeferred(placeholder)
        self.clock.callLater(0, go)

    @defer.inlineCallbacks
    def _adopt_parked(self, queue: ClusterQueue) -> Any:
        """A new queue bound to an address another node parked takes what the park holds
        (deliver all), and the park goes once the queue's consumer exists."""
        for pattern in queue.patterns:
            if is_pattern(pattern) or pattern in self._parked:
                continue
            try:
                yield self.js.consumer_info(STREAM, _park_name(pattern))
            except JetStreamError as exc:
                if exc.not_found:
                    continue
                raise
            queue.deliver = "all"

            def unpark(address: str = pattern) -> None:
                d = self.js.delete_consumer(STREAM, _park_name(address))
                d.addErrback(_ignore_not_found)
                self._settle(d, f"unpark {address}")
            self._after_save.setdefault(queue.name, []).append(unpark)

    def _send_save(self, queue: ClusterQueue) -> defer.Deferred[Any]:
        """One consumer create/update request (see :meth:`save_queue`)."""
        d = self.js.ensure_consumer(STREAM, self._consumer_config(queue))

        def adopt(failure: Any) -> Any:
            """Another node made the consumer with the other deliver policy: keep theirs."""
            failure.trap(JetStreamError)
            if failure.value.err_code != 10012:
                return failure
            info = self.js.consumer_info(STREAM, queue.consumer)

            def retry(reply: dict) -> Any:
                queue.deliver = str(reply["config"].get("deliver_policy") or queue.deliver)
                return self.js.ensure_consumer(STREAM, self._consumer_config(queue))
            return info.addCallback(retry)
        d.addErrback(adopt)

        def made(result: object) -> object:
            if self._resave.pop(queue.name, None) is not None and not queue.deleted:
                self._send_save(queue)
                return result
            self._creating.discard(queue.name)
            failed = isinstance(result, Failure)
            if not failed:
                queue.fresh = False
            queue.save_error = result.getErrorMessage() if isinstance(result, Failure) else None
            for hook in self._after_save.pop(queue.name, []):
                hook()
            for waiter in self._settled_waiters.pop(queue.name, []):
                if failed:
                    waiter.errback(ClusterUnavailable(queue.save_error or "refused"))
                else:
                    waiter.callback(None)
            queue.resume_pulling()
            return result
        d.addBoth(made)
        self._settle(d, f"queue {queue.name}")
        return d

    def save_member(self, member: ClusterQueue) -> None:
        """Make a fan-out member's consumer (it gets what is published from its attach time
        on; gone a minute after its node stops pulling, should the node die)."""
        config = self._consumer_config(member)
        # from the moment it attached: what is published while its consumer is being made
        # is its too (a subscriber told "subscribed" gets every later publish)
        config["deliver_policy"] = "by_start_time"
        config["opt_start_time"] = datetime.fromtimestamp(member.start_time, UTC).strftime(
            "%Y-%m-%dT%H:%M:%S.%fZ")
        config["inactive_threshold"] = 60_000_000_000
        config["metadata"] = {"mqhub_member": member.name}
        d = self.js.ensure_consumer(STREAM, config)

        def made(reply: dict) -> None:
            member.member_made()
            for waiter in member.made_waiters:
                waiter.callback(None)
            member.made_waiters = []

        def failed(failure: Any) -> Any:
            member.save_error = failure.getErrorMessage()
            for waiter in member.made_waiters:
                waiter.errback(ClusterUnavailable(member.save_error or "refused"))
            member.made_waiters = []
            return failure
        d.addCallbacks(made, failed)
        self._settle(d, f"fan-out member of {member.name}")

    def drop_member(self, member: ClusterQueue) -> None:
        """Delete a fan-out member's consumer (its unfinished copies go with it)."""
        d = self.js.delete_consumer(STREAM, member.consumer)
        d.addErrback(_ignore_not_found)
        self._settle(d, f"drop fan-out member of {member.name}")

    def session(self, principal: Any) -> ICore:
        """The handle a connection acts through (docs/core-api.md, "Sessions"): the broker
        itself when ``principal`` is None, else the principal's guarded handle of it (its
        rights enforced at the seam, as in the embedded core)."""
        if principal is None:
            return self
        return principal.handle(self)

    def settled(self, handle: Any) -> defer.Deferred[None]:
        """Fires once the queue behind ``handle`` (a queue, one of its bindings, or a consumer
        attached to it) is in effect in the cluster: its consumer made or updated with every
        change issued so far; fails when the cluster refused it. A live subscription is in
        effect at once (its interest reaches the other nodes with the next announcement)."""
        queue = handle if isinstance(handle, ClusterQueue) else getattr(handle, "queue", None)
        if isinstance(queue, ClusterQueue) and queue.parent is not None:   # a fan-out member
            if queue.made or queue.save_error is not None:
                return defer.succeed(None) if queue.made else \
                    defer.fail(ClusterUnavailable(queue.save_error or "refused"))
            member: defer.Deferred[None] = defer.Deferred()
            queue.made_waiters.append(member)
            return member
        if not isinstance(queue, ClusterQueue) or queue.name not in self._creating:
            if isinstance(queue, ClusterQueue) and queue.save_error is not None:
                return defer.fail(ClusterUnavailable(queue.save_error))
            return defer.succeed(None)
        d: defer.Deferred[None] = defer.Deferred()
        self._settled_waiters.setdefault(queue.name, []).append(d)
        return d

    def peers(self, protocol: str) -> list[Peer]:
        """The other live nodes serving ``protocol`` (from their announcements), with the
        ports of that protocol's listeners by role."""
        plugin_name = PROTOCOL_PLUGINS.get(protocol, protocol)
        out = []
        for name, info in sorted(self._remote.items()):
            ports: dict[str, int] = {}
            host = ""
            for key, endpoint in (info.get("endpoints") or {}).items():
                plugin, _, role = str(key).partition(".")
                h, _, port = str(endpoint).rpartition(":")
                if plugin == plugin_name and port.isdigit():
                    ports[role] = int(port)
                    host = host or h
            if ports:
                out.append(Peer(name, host, ports))
        return out

    def attach(self, queue: IQueue, target: Any, *, ready: int = 0, credit: int = 0,
               timeout: float | None = None, tag: Any = None) -> Any:
        """Attach a consumer to one of this broker's queues."""
        if not isinstance(queue, ClusterQueue):
            raise NoSuchQueue(getattr(queue, "name", "?"))
        return queue.attach(target, ready=ready, credit=credit, timeout=timeout, tag=tag)

    def entry_fits(self, address: str, headers: dict[str, str] | None, origin: str) -> bool:
        """True when a message with these fields fits (the same 64 KiB rule as the embedded
        store, so an adapter behaves alike in both modes)."""
        try:
            encode_meta(address, headers, origin)
        except ValueError:
            return False
        return True

    @property
    def parked(self) -> list[str]:
        """The addresses this node parked."""
        return sorted(self._parked)

    def directory_barrier(self) -> defer.Deferred[None]:
        """Fires once every queue change this node issued so far is in the cluster (made or
        refused: a refused one is the adapter's to hear through ``settled``)."""
        if not self._settling:
            return defer.succeed(None)
        d = defer.DeferredList(list(self._settling), consumeErrors=True)
        return d.addCallback(lambda _: None)

    @property
    def directory_settled(self) -> bool:
        """Whether every directory change this node made is in the cluster."""
        return not self._settling

    def changing(self, name: str) -> bool:
        """Whether this node is creating or changing queue ``name``'s consumer now."""
        return name in self._creating

    def queue(self, name: str) -> ClusterQueue | None:
        """The queue called ``name`` (any node's)."""
        return self._queues.get(name)

    def queues(self) -> list[IQueue]:
        """Every queue of the cluster."""
        return list(self._queues.values())

    def delete_queue(self, name: str, *, reason: str = "queue_deleted") -> defer.Deferred[Any]:
        """Delete the queue's consumer (its messages go with it unless another queue holds
        them) and its dead letters. ``reason`` is what the embedded core counts the purged
        messages under; JetStream drops them without a count here."""
        queue = self._queues.get(name)
        if queue is None:
            return defer.succeed(None)
        self._forget(name)
        d = self.js.delete_consumer(STREAM, queue.consumer)
        d.addErrback(_ignore_not_found)
        d.addCallback(lambda _: self.js.purge(DLQ_STREAM, _dlq_subject(name)))
        d.addErrback(_ignore_not_found)
        d.addCallback(lambda _: None)
        self._settle(d, f"delete {name}")
        return d

    def reset_queue(self, queue: ClusterQueue) -> defer.Deferred[Any]:
        """Empty a queue: its consumer is made again delivering only new messages."""
        queue.deliver = "new"
        d = self.js.delete_consumer(STREAM, queue.consumer)
        d.addErrback(_ignore_not_found)
        d.addCallback(lambda _: self.js.ensure_consumer(STREAM, self._consumer_config(queue)))
        d.addCallback(lambda _: None)
        self._settle(d, f"empty {queue.name}")
        return d

    # -- bindings --------------------------------------------------------------------------------

    def bind_queue(self, pattern: str, queue_name: str) -> Binding:
        """Bind ``queue_name`` to ``pattern`` (its consumer's filter subjects grow)."""
        validate_pattern(pattern)
        queue = self._queues.get(queue_name)
        if queue is None:
            raise NoSuchQueue(queue_name)
        for b in self._bindings.values():
            if b.queue is queue and b.pattern == pattern:
                return b
        self._rebind(queue, queue.patterns + [pattern])
        # the first queue of a parked address takes what the park held (deliver all)
        if pattern in self._parked:
            self._parked.discard(pattern)
            self._sync_parking(pattern)

            def unpark() -> None:
                d = self.js.delete_consumer(STREAM, _park_name(pattern))
                d.addErrback(_ignore_not_found)
                self._settle(d, f"unpark {pattern}")
            queue.deliver = "all"      # the first queue takes what the park held
            self.save_queue(queue, then=unpark)
        else:
            self.save_queue(queue)
        return next(b for b in self._bindings.values()
                    if b.queue is queue and b.pattern == pattern)

    def subscribe(self, pattern: str, target: Any, *, group: str | None = None,
                  tag: Any = None) -> Binding:
        """A live subscription of a local client (announced to the other nodes)."""
        validate_pattern(pattern)
        b = Binding(self._next_binding, pattern, None, target, group, tag, self)
        self._next_binding += 1
        self._bindings[b.id] = b
        self.router.trie.add(pattern, b)
        self.router.changed()
        self._live_patterns_changed()
        return b

    def unbind(self, binding: IBinding) -> None:
        """Remove a binding (a queue's: its consumer's filters shrink)."""
        if self._bindings.pop(binding.id, None) is None:
            return
        self.router.trie.remove(binding.pattern, binding)
        self.router.changed()
        if binding.queue is not None:
            queue = binding.queue
            assert isinstance(queue, ClusterQueue)
            self._rebind(queue, [p for p in queue.patterns if p != binding.pattern])
            self.save_queue(queue)
        else:
            self._live_patterns_changed()

    def bindings(self, queue_name: str | None = None) -> list[IBinding]:
        """Bindings (of one queue), remote interest not included."""
        out: list[IBinding] = [b for b in self._bindings.values()
                               if b.target is not self.forwarder]
        if queue_name is not None:
            out = [b for b in out if b.queue is not None and b.queue.name == queue_name]
        return out

    def route(self, address: str) -> Route:
        """The cached route of ``address`` (raises InvalidName for a bad address)."""
        r = self.routes.get(address)
        if r is None:
            validate_address(address)
            r = self.router.route(address)
        return r

    # -- parking (NSQ topics without channels) -------------------------------------------------------

    def park(self, address: str) -> defer.Deferred[Any]:
        """Hold what is published to ``address`` until a queue is bound to it: a consumer
        nobody pulls keeps the messages (interest retention)."""
        if any(b.pattern == address for b in self._bindings.values() if b.queue is not None):
            return defer.succeed(None)
        self._parked.add(address)
        self._sync_parking(address)
        d = self.js.ensure_consumer(STREAM, {
            "durable_name": _park_name(address), "ack_policy": "explicit",
            "filter_subject": address_subject(address), "deliver_policy": "all",
            "metadata": {"mqhub_park": address}})
        self._settle(d, f"park {address}")
        return d

    def unpark(self, address: str) -> defer.Deferred[Any]:
        """Stop holding ``address``."""
        self._parked.discard(address)
        self._sync_parking(address)
        d = self.js.delete_consumer(STREAM, _park_name(address))
        d.addErrback(_ignore_not_found)
        return d

    def _sync_parking(self, address: str) -> None:
        """The router holds ``address`` (its route's ``park``) while it is parked or paused;
        a paused address's route has no queues (publishes are held for the address)."""
        parking = self.router.parking
        if address in self._parked or address in self.router.paused:
            if address not in parking:
                parking[address] = ParkedAddress(address, self)  # type: ignore[assignment]
        else:
            parking.pop(address, None)
        self.router.changed()

    @property
    def paused(self) -> list[str]:
        """The addresses paused cluster-wide (as this node knows them)."""
        return sorted(self.router.paused)

    def pause_address(self, address: str) -> defer.Deferred[Any]:
        """Hold every publish to ``address`` for the address until resumed, cluster-wide
        (:mod:`mqhub.cluster.hold`): its hold consumer is made, then the pause record is
        written; fires once every live node has it. This node holds at once."""
        validate_address(address)
        drain = self._drains.get(address)
        if drain is not None:
            drain.stop()
        first = address not in self.router.paused
        self.router.paused.add(address)
        self._sync_parking(address)
        made = self.js.ensure_consumer(STREAM, hold_config(address))
        outcome: defer.Deferred[Any] = defer.Deferred()

        def record(result: object) -> None:
            if isinstance(result, Failure):
                # without its hold consumer a held publish would be dropped: not paused
                if first:
                    self.router.paused.discard(address)
                    self._sync_parking(address)
                outcome.errback(result)
                return
            batch = self.state.batch()
            batch.put_meta(PAUSE_PREFIX + address, b"1")
            self.state.commit(batch).chainDeferred(outcome)
        made.addBoth(record)
        self._settle(made, f"pause {address}")
        return outcome

    def resume_address(self, address: str) -> defer.Deferred[Any]:
        """Release a paused address: the record goes (every live node confirms), then what it
        held moves into its queues (republished, then acked: at least once); fires once the
        hold is empty."""
        if address in self.router.paused:
            self.router.paused.discard(address)
            self._sync_parking(address)
            batch = self.state.batch()
            batch.delete_meta(PAUSE_PREFIX + address)
            d = self.state.commit(batch)
        elif address in self._hold_depth or address in self._drains:
            d = defer.succeed(None)
        else:
            return defer.succeed(None)
        return d.addCallback(lambda _: self._drain(address))

    def _drain(self, address: str) -> defer.Deferred[None]:
        """Move what ``address``'s hold consumer holds into its queues (one drain per
        address on this node); fires once the hold is empty."""
        drain = self._drains.get(address)
        if drain is None:
            drain = HoldDrain(self.conn, self.js, self.clock, address,
                              lambda a: a in self.router.paused, self._drain_ended)
            self._drains[address] = drain
            drain.start()

        def emptied(_: object) -> None:
            if address not in self.router.paused:
                self._hold_depth.pop(address, None)
        return drain.emptied().addCallback(emptied)

    def _drain_ended(self, drain: HoldDrain) -> None:
        """A drain stopped (its hold deleted, or the address paused again)."""
        if self._drains.get(drain.address) is drain:
            del self._drains[drain.address]

    def _pause_record(self, key: str, value: bytes | None) -> None:
        """Another node paused or resumed an address (its drain is that node's)."""
        address = key[len(PAUSE_PREFIX):]
        if value is not None:
            drain = self._drains.get(address)
            if drain is not None:
                drain.stop()
            self.router.paused.add(address)
        else:
            self.router.paused.discard(address)
        self._sync_parking(address)

    def _collect_orphan_holds(self, holds: dict[str, int]) -> None:
        """Drain hold consumers of unpaused addresses that no node drains (their node died
        while resuming): seen so at reads at least two refresh periods apart (a pausing
        node makes the consumer just before it writes the record)."""
        now = self.clock.seconds()
        orphans = self._orphan_holds
        for address in list(orphans):
            if address not in holds or address in self.router.paused:
                del orphans[address]
        for address in holds:
            if address in self.router.paused or address in self._drains:
                continue
            since = orphans.setdefault(address, now)
            if now - since >= 2 * REFRESH:
                del orphans[address]
                self._drain(address)

    def parked_depth(self, address: str) -> int:
        """Messages held for ``address``: its park consumer's (while parked) and its hold
        consumer's (while paused or being resumed), as last read."""
        parked = self._park_depth.get(address, 0) if address in self._parked else 0
        return parked + self._hold_depth.get(address, 0)

    def empty_parked(self, address: str) -> defer.Deferred[Any]:
        """Drop what ``address`` holds: a parked address's park consumer is made again, a
        paused one's held publishes are purged from the stream."""
        ds: list[defer.Deferred[Any]] = []
        if address in self._parked:
            d = self.js.delete_consumer(STREAM, _park_name(address))
            d.addErrback(_ignore_not_found)
            d.addCallback(lambda _: self.park(address))
            ds.append(d)
        if address in self.router.paused or address in self._hold_depth:
            self._hold_depth[address] = 0
            ds.append(self.js.purge(STREAM, hold_subject(address)))
        if not ds:
            return defer.succeed(None)
        return _all(ds)

    # -- publishing ------------------------------------------------------------------------------

    def publish_batch(self, address: str, bodies: list[bytes], *, origin: str = "",
                      headers: dict[str, str] | list[dict[str, str] | None] | None = None,
                      priority: int = 0, ttl: float = 0.0, expires_at: float = 0.0,
                      deliver_at: float = 0.0, persist: bool = True) -> defer.Deferred[None]:
        """Publish ``bodies`` to ``address``: local live subscribers now, remote ones through
        ``ml.``, durable queues through JetStream; fires once every PubAck is in."""
        route = self.route(address)
        n = len(bodies)
        if not n:
            return defer.succeed(None)
        for queue in route.queues:
            if queue.overflow == "reject" and queue.max_size and queue.room() < n:
                raise QueueFull(f"queue {queue.name} is full")
        priority = 0 if priority < 0 else 9 if priority > 9 else priority
        first = self.ids.reserve(n)
        self.last_ids = range(first, first + n)
        self.counters.publish(origin, n)
        now = self.clock.seconds()
        if ttl:
            expires_at = now + ttl
        live, forward = self._live_targets(route)
        journal = self.journal
        if live or forward or journal is not NULL_RECORDER:
            entries = _entries(first, bodies, address, headers, priority, expires_at, origin)
            if journal is not NULL_RECORDER:   # this node's ids: see docs/cluster.md
                journal.published(address, entries, route.queues, persist, route,
                                  not isinstance(headers, list))
            if live:
                self._deliver_live(route, live, address, entries)
            if forward:
                self._forward(address, bodies, headers, origin, priority)
        if not persist:
            return defer.succeed(None)
        if not self.ready:   # this node cannot know the cluster's queues now: refuse
            return defer.fail(ClusterUnavailable(self.problem or "cluster not ready"))
        park = route.park
        if not (route.queues or park is not None) and (live or forward):
            return defer.succeed(None)   # only live subscribers know this address
        # an address this node knows no binding of still goes to JetStream: another node may
        # have bound a queue this node has not heard of yet, and the stream keeps a message
        # only for the consumers it matches (none: it is dropped there)
        return self._publish_durable(address_subject(address), bodies, headers, origin,
                                     priority, ttl, expires_at, deliver_at, now,
                                     address if park is not None else "")

    def publish_entries(self, address: str, entries: list[Entry], *,
                        persist: bool = True) -> defer.Deferred[None]:
        """Publish prebuilt entries (replays, moves): delivered under their own ids."""
        route = self.route(address)
        if not entries:
            return defer.succeed(None)
        live, forward = self._live_targets(route)
        if live:
            self._deliver_live(route, live, address, entries)
        if forward:
            for e in entries:
                self._forward(address, [e[BODY]], e[HEADERS], e[ORIGIN], e[PRIORITY])
        if not persist:
            return defer.succeed(None)
        if not self.ready:
            return defer.fail(ClusterUnavailable(self.problem or "cluster not ready"))
        park = route.park
        if not (route.queues or park is not None) and (live or forward):
            return defer.succeed(None)
        blocks = [header_block(e[ORIGIN], e[PRIORITY], 0.0, e[EXPIRES_AT], e[HEADERS],
                               msg_id=e[MSG_ID]) for e in entries]
        return self._acked(address_subject(address), [e[BODY] for e in entries], blocks,
                           address if park is not None else "")

    def put_entries(self, queue_name: str, entries: list[Entry]) -> defer.Deferred[None]:
        """Put entries into one queue only (its ``mqq.`` subject)."""
        queue = self._queues.get(queue_name)
        if queue is None:
            raise NoSuchQueue(queue_name)
        if not entries:
            return defer.succeed(None)
        blocks = [header_block(e[ORIGIN], e[PRIORITY], 0.0, e[EXPIRES_AT], e[HEADERS],
                               address=e[ADDRESS], msg_id=e[MSG_ID])
                  for e in entries]
        bodies = [e[BODY] for e in entries]
        return self._acked(queue_subject(queue_name), bodies, blocks)

    def _publish_durable(self, subject: str, bodies: list[bytes], headers: Any, origin: str,
                         priority: int, ttl: float, expires_at: float, deliver_at: float,
                         now: float, held: str = "") -> defer.Deferred[Any]:
        """One JetStream batch (or, for a future ``deliver_at``, one schedule a message);
        ``held``: the address when it was parked or paused (see :meth:`_acked`)."""
        if isinstance(headers, list):
            blocks: bytes | list[bytes] = [
                header_block(origin, priority, ttl, expires_at, h) for h in headers]
        else:
            blocks = header_block(origin, priority, ttl, expires_at, headers)
        if deliver_at > now + 0.5:
            d = self._schedule(subject, bodies, blocks, deliver_at)
            for queue in self.route(subject[3:]).queues:
                queue.deferred += len(bodies)
            return d
        return self._acked(subject, bodies, blocks, held)

    def _acked(self, subject: str, bodies: list[bytes], blocks: bytes | list[bytes],
               held: str = "") -> defer.Deferred[Any]:
        """Publish with PubAcks (after pending directory changes are made). ``held`` names
        an address that was parked or paused at publish time: if it is paused when the
        batch is sent (its hold consumer made), the batch goes to its hold subject."""
        if not self.ready:
            return defer.fail(ClusterUnavailable(self.problem or "cluster not ready"))

        def send(_: object = None) -> defer.Deferred[Any]:
            if self._settling:   # changes made (or chained) meanwhile: wait for those too
                wait = defer.DeferredList(list(self._settling), consumeErrors=True)
                return wait.addCallback(send)
            to = hold_subject(held) if held and held in self.router.paused else subject
            d = self.conn.publish_acked(
                lambda reply: publish_frames(to, reply, bodies, blocks), len(bodies))
            return d.addCallbacks(self._published, self._refused)
        return send()

    def _published(self, _: object) -> None:
        """A batch was stored: publishing works (again)."""
        self.refusing = ""

    def _refused(self, failure: Any) -> Any:
        """A batch was refused: remember why for /healthz (the stream's quorum may be gone
        while the connection is up)."""
        self.refusing = str(failure.value)
        self.refused_at = self.clock.seconds()
        return failure

    def _schedule(self, subject: str, bodies: list[bytes], blocks: bytes | list[bytes],
                  deliver_at: float) -> defer.Deferred[Any]:
        """Deferred publishes: one message schedule per message (``mqs.<id>``)."""
        if not self.ready:
            return defer.fail(ClusterUnavailable(self.problem or "cluster not ready"))
        when = datetime.fromtimestamp(deliver_at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        sched = [("Nats-Schedule", f"@at {when}"), ("Nats-Schedule-Target", subject)]
        frames_blocks: list[bytes] = []
        for i in range(len(bodies)):
            block = blocks if isinstance(blocks, bytes) else blocks[i]
            items = parse_headers(block)[2] if block else []
            frames_blocks.append(build_headers(items + sched))
        first = self.ids.reserve(len(bodies))
        subjects = [f"mqs.{self.name_token}.{first + i}" for i in range(len(bodies))]

        def build(reply: str) -> list[bytes]:
            out = []
            for subj, block, body in zip(subjects, frames_blocks, bodies, strict=True):
                out.extend(publish_frames(subj, reply, [body], block))
            return out
        d = self.conn.publish_acked(build, len(bodies))
        d.addCallback(lambda _: None)
        return d

    @property
    def name_token(self) -> str:
        """This node's name as one subject token."""
        return consumer_name(self.name)[1:]

    # -- live traffic ------------------------------------------------------------------------------

    def _live_targets(self, route: Route) -> tuple[bool, bool]:
        """(any local live binding, any remote interest) of a route."""
        fwd = self.forwarder
        live = bool(route.groups)
        forward = False
        for b in route.targets:
            if b.target is fwd:
                forward = True
            else:
                live = True
        return live, forward

    def _deliver_live(self, route: Route, live: bool, address: str,
                      entries: list[Entry]) -> None:
        """Deliver to local live subscribers (one member of each queue group)."""
        fwd = self.forwarder
        for b in route.targets:
            if b.target is not fwd:
                self.counters.deliver(b.target, len(entries))
                b.target.deliver_batch(b, address, entries)
        for i in range(len(route.groups)):
            b = route.pick(i)
            self.counters.deliver(b.target, len(entries))
            b.target.deliver_batch(b, address, entries)

    def _forward(self, address: str, bodies: list[bytes], headers: Any, origin: str,
                 priority: int) -> None:
        """Forward live copies to the other nodes (at most once, like all live traffic)."""
        if isinstance(headers, list):
            blocks: bytes | list[bytes] = [header_block(origin, priority, 0, 0, h)
                                           for h in headers]
        else:
            blocks = header_block(origin, priority, 0, 0, headers)
        subject = (LIVE_PREFIX + address).encode()
        frames = []
        for i, body in enumerate(bodies):
            block = blocks if isinstance(blocks, bytes) else blocks[i]
            if block:
                frames.append(b"HPUB %s %d %d\r\n%s%s\r\n" % (
                    subject, len(block), len(block) + len(body), block, body))
            else:
                frames.append(b"PUB %s %d\r\n%s\r\n" % (subject, len(body), body))
        try:
            self.conn.publish(frames)
        except ClusterUnavailable:
            self.counters.retry("live_dropped", len(bodies))

    def _live_in(self, events: list[Event]) -> None:
        """Live messages from other nodes: to this node's live subscribers only."""
        by_address: dict[str, list[Entry]] = {}
        for event in events:
            address = event[1][len(LIVE_PREFIX):]
            if event[0] == OP_HMSG:
                headers, origin, priority, expires = self._blocks.parse(event[4])[:4]
                body = event[5]
            else:
                headers, origin, priority, expires, body = None, "", 0, 0.0, event[4]
            if origin == "nats":
                origin = ORIGIN_REMOTE_NATS
            entry = (self.ids.next_id(), priority, 0, 0.0, expires, address, headers, body,
                     origin)
            by_address.setdefault(address, []).append(entry)
        for address, entries in by_address.items():
            try:
                route = self.route(address)
            except InvalidName:
                continue
            live, _ = self._live_targets(route)
            if live:
                self._deliver_live(route, live, address, entries)

    def _live_patterns(self) -> list[str]:
        """The patterns this node's clients subscribe to live."""
        return sorted({b.pattern for b in self._bindings.values()
                       if b.target is not None and b.target is not self.forwarder})

    def _live_patterns_changed(self) -> None:
        """Subscribe on the cluster to what local clients want; tell the other nodes."""
        wanted = {LIVE_PREFIX + f[3:] for f in _filters(self._live_patterns())} \
            if self._live_patterns() else set()
        for subject in list(self._live_subs):
            if subject not in wanted:
                self.conn.unsubscribe(self._live_subs.pop(subject))
        for subject in wanted - set(self._live_subs):
            self._live_subs[subject] = self.conn.subscribe(subject, self._live_in)
        self._announce()

    def _announce(self) -> None:
        """Tell the other nodes this node's live patterns and client endpoints."""
        if self._announcer is not None and self._announcer.active():
            self._announcer.cancel()
        body = json.dumps({"name": self.name, "patterns": self._live_patterns(),
                           "endpoints": self.endpoints}).encode()
        try:
            self.conn.publish([_pub(NODES_SUBJECT, body)])
        except ClusterUnavailable:
            pass
        if self.started:
            self._announcer = self.clock.callLater(ANNOUNCE_INTERVAL, self._announce)

    def _node_in(self, events: list[Event]) -> None:
        """Another node's announcement: its live patterns become forwarder bindings here."""
        changed = False
        now = self.clock.seconds()
        for event in events:
            try:
                info = json.loads(event[-1])
            except ValueError:
                continue
            name = info.get("name")
            if not name or name == self.name:
                continue
            if info.get("gone"):
                changed |= self._remote.pop(name, None) is not None
                continue
            old = self._remote.get(name)
            info["_seen"] = now
            self._remote[name] = info
            if old is None or old.get("patterns") != info.get("patterns") \
                    or old.get("endpoints") != info.get("endpoints"):
                changed = True
                if old is None:
                    self._announce()   # a new node learns about this one at once
        if changed:
            self._remote_patterns_changed()

    def _remote_patterns_changed(self) -> None:
        """Make the forwarder bindings match the remote nodes' patterns."""
        wanted: set[str] = set()
        for info in self._remote.values():
            wanted.update(p for p in info.get("patterns") or () if isinstance(p, str))
        current = self._remote_bindings
        for pattern in list(current):
            if pattern not in wanted:
                b = current.pop(pattern)
                self.router.trie.remove(pattern, b)
        for pattern in wanted - set(current):
            try:
                validate_pattern(pattern)
            except InvalidName:
                continue
            b = Binding(self._next_binding, pattern, None, self.forwarder, None, None, self)
            self._next_binding += 1
            current[pattern] = b
            self.router.trie.add(pattern, b)
        self.router.changed()

    def nodes(self) -> list[dict]:
        """Every live node: this one and those heard from (name, endpoints)."""
        out = [{"name": self.name, "endpoints": dict(self.endpoints)}]
        out += [{"name": n, "endpoints": dict(i.get("endpoints") or {})}
                for n, i in sorted(self._remote.items())]
        return out

    # -- counters (called by the queues) --------------------------------------------------------

    def counted_delivery(self, consumer: Any, n: int) -> None:
        """Count ``n`` deliveries to ``consumer``'s target."""
        self.counters.deliver(consumer.target, n)

    def counted_ack(self, consumer: Any, n: int) -> None:
        """Count ``n`` acks by ``consumer``'s target."""
        self.counters.ack(consumer.target, n)

    def conn_publish(self, frames: list[bytes]) -> None:
        """Fire-and-forget frames (acks, naks); while disconnected they are lost and
        JetStream redelivers those messages after their ack wait (at least once)."""
        try:
            self.conn.publish(frames)
        except ClusterUnavailable:
            self.counters.retry("ack_lost", len(frames))

    # -- dead letters ----------------------------------------------------------------------------

    def dead_letter(self, queue: ClusterQueue, dead: list[tuple[Entry, str]], reason: str,
                    error: str | None) -> None:
        """Store ``dead`` in ``MQHUB_DLQ`` with the reason; once stored, terminate the
        originals (``+TERM``); if the store fails, nak them so they come back later."""
        now = self.clock.seconds()
        bodies = []
        blocks = []
        for entry, _ in dead:
            items = [(H_REASON, reason), (H_QUEUE, queue.name), (H_TIME, repr(now)),
                     (H_PRIORITY, str(entry[PRIORITY])), ("Mqhub-Address", entry[ADDRESS]),
                     (H_MSG_ID, str(entry[MSG_ID])),
                     ("Mqhub-Attempts", str(entry[ATTEMPTS])),
                     ("Mqhub-Origin", entry[ORIGIN] or "")]
            if error:
                items.append((H_ERROR, str(error)[:1024].replace("\r", " ").replace("\n", " ")))
            items += [(k, v) for k, v in (entry[HEADERS] or {}).items()
                      if "\n" not in v and "\r" not in v and ":" not in k]
            blocks.append(build_headers(items))
            bodies.append(entry[BODY])
        replies = [r for _, r in dead]
        self.journal.dead_lettered(queue, [e for e, _ in dead], reason)
        queue.dead_letter_count += len(dead)
        self.counters.dead_lettered(reason, len(dead))
        subject = _dlq_subject(queue.name)
        d = self.conn.publish_acked(lambda reply: publish_frames(subject, reply, bodies, blocks),
                                    len(bodies))

        def stored(_: object) -> None:
            self.conn_publish(ack_frames(replies, TERM + b" " + reason.encode()))

        def failed(failure: Any) -> None:
            queue.dead_letter_count -= len(dead)
            self.conn_publish(nak_frames(replies, 1.0))
        d.addCallbacks(stored, failed)

    @defer.inlineCallbacks
    def _dead_messages(self, queue_name: str, limit: int, after: int | None) -> Any:
        """Stored dead letters of a queue as (seq, headers, body) (cold path)."""
        subject = _dlq_subject(queue_name)
        out: list[tuple[int, dict[str, str], bytes]] = []
        seq = (after or 0) + 1
        while len(out) < limit:
            try:
                reply = yield self.js.get_message(DLQ_STREAM, seq, next_by_subject=subject)
            except JetStreamError as exc:
                if exc.not_found:
                    break
                raise
            msg = reply["message"]
            hdrs = base64.b64decode(msg.get("hdrs") or "")
            headers = dict(parse_headers(hdrs)[2]) if hdrs else {}
            body = base64.b64decode(msg.get("data") or "")
            out.append((int(msg["seq"]), headers, body))
            seq = int(msg["seq"]) + 1
        return out

    @defer.inlineCallbacks
    def dead_letters(self, queue_name: str, *, limit: int = 100,
                     after: int | None = None) -> Any:
        """Dead letters of a queue (listing ``MQHUB_DLQ``)."""
        rows = yield self._dead_messages(queue_name, limit, after)
        out = []
        for seq, h, body in rows:
            user = {k: v for k, v in h.items() if not k.lower().startswith("mqhub-")}
            out.append(DeadLetter(
                _own_id(h, seq), h.get(H_QUEUE, queue_name), h.get("Mqhub-Address", ""), body,
                user or None, int(h.get(H_PRIORITY, "0") or 0),
                int(h.get("Mqhub-Attempts", "0") or 0), h.get(H_REASON, ""), h.get(H_ERROR),
                h.get("Mqhub-Origin", ""), float(h.get(H_TIME, "0") or 0.0)))
        return out

    @defer.inlineCallbacks
    def replay_dead_letters(self, queue_name: str,
                            msg_ids: Iterable[int] | None = None) -> Any:
        """Put dead letters back on their queue (its ``mqq.`` subject), then delete them."""
        wanted = None if msg_ids is None else set(msg_ids)
        rows = yield self._dead_messages(queue_name, 1_000_000, None)
        chosen = [r for r in rows if wanted is None or _own_id(r[1], r[0]) in wanted]
        if not chosen:
            return 0
        entries = []
        for seq, h, body in chosen:
            user = {k: v for k, v in h.items() if not k.lower().startswith("mqhub-")}
            entries.append((_own_id(h, seq), int(h.get(H_PRIORITY, "0") or 0), 0, 0.0, 0.0,
                            h.get("Mqhub-Address", ""), user or None, body,
                            h.get("Mqhub-Origin", "")))
        yield self.put_entries(queue_name, entries)
        for seq, _, _ in chosen:
            yield self.js.delete_message(DLQ_STREAM, seq)
        queue = self._queues.get(queue_name)
        if queue is not None:
            queue.dead_letter_count = max(0, queue.dead_letter_count - len(chosen))
        return len(chosen)

    @defer.inlineCallbacks
    def purge_dead_letters(self, queue_name: str,
                           msg_ids: Iterable[int] | None = None) -> Any:
        """Delete dead letters (all of a queue's, or those ids)."""
        if msg_ids is None:
            rows = yield self._dead_messages(queue_name, 1_000_000, None)
            yield self.js.purge(DLQ_STREAM, _dlq_subject(queue_name))
            n = len(rows)
        else:
            wanted = set(msg_ids)
            rows = yield self._dead_messages(queue_name, 1_000_000, None)
            n = 0
            for seq, h, _ in rows:
                if _own_id(h, seq) not in wanted:
                    continue
                try:
                    yield self.js.delete_message(DLQ_STREAM, seq)
                    n += 1
                except JetStreamError as exc:
                    if not exc.not_found:
                        raise
        queue = self._queues.get(queue_name)
        if queue is not None:
            queue.dead_letter_count = max(0, queue.dead_letter_count - n)
        return n

    # -- introspection ---------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters for the admin surfaces."""
        return {"queues": len(self._queues), "parked": len(self._parked),
                "bindings": len(self._bindings), "epoch": self.router.epoch,
                "routes_cached": len(self.router.cache), "last_id": self.ids.last,
                "pending_commits": len(self.conn.waiters),
                "refused_retried": dict(self.counters.retried),
                "cluster": self.health()}


def announced_endpoints(endpoints: dict[str, dict[str, str]]) -> dict[str, str]:
    """``plugin.role`` -> ``host:port`` of the TCP listeners (what other nodes tell their
    clients: NATS ``connect_urls``, NSQ ``/lookup``)."""
    out = {}
    for plugin, roles in endpoints.items():
        for role, endpoint in roles.items():
            text = str(endpoint)
            if text.startswith("tcp://"):          # a ZeroMQ address (eMQP)
                host, _, port = text[len("tcp://"):].rpartition(":")
                if port.isdigit():
                    out[f"{plugin}.{role}"] = f"{host if host != '*' else '127.0.0.1'}:{port}"
                continue
            parts = text.split(":")
            if parts[0] not in ("tcp", "ssl") or len(parts) < 2 or not parts[1].isdigit():
                continue
            host = "127.0.0.1"
            for part in parts[2:]:
                if part.startswith("interface="):
                    host = part[len("interface="):] or host
            out[f"{plugin}.{role}"] = f"{host}:{parts[1]}"
    return out


def _framer(subject: str, bodies: list[bytes],
            blocks: list[bytes]) -> Callable[[str], list[bytes]]:
    """The frames of one publish batch for a given reply subject."""
    return lambda reply: publish_frames(subject, reply, bodies, blocks)


def _pub(subject: str, body: bytes) -> bytes:
    """A PUB frame."""
    return b"PUB %s %d\r\n%s\r\n" % (subject.encode(), len(body), body)


def _own_id(headers: dict[str, str], seq: int) -> int:
    """A dead letter's message id (the one it had on its queue), else its DLQ sequence."""
    value = headers.get(H_MSG_ID, "")
    return int(value) if value.isdigit() else seq


def _dlq_subject(queue: str) -> str:
    """The dead-letter subject of ``queue``."""
    return "dlq." + consumer_name(queue)[1:]


def _park_name(address: str) -> str:
    """The consumer holding a parked address's messages."""
    return "park" + consumer_name(address)[1:]


def _filters(patterns: list[str]) -> list[str]:
    """Consumer filter subjects for ``patterns`` with none overlapping another (JetStream
    refuses overlaps): a pattern another one covers is left out; partial overlaps become
    one wider ``mq.>`` filter (the queue's masks then check every message)."""
    subjects = sorted({pattern_filter(p)[0] for p in patterns})
    kept: list[str] = []
    for s in subjects:
        if any(s != o and _covers(o, s) for o in subjects):
            continue
        kept.append(s)
    for i, a in enumerate(kept):
        for b in kept[i + 1:]:
            if _overlap(a, b):
                return ["mq.>"]
    return kept


def _covers(wide: str, narrow: str) -> bool:
    """Whether filter ``wide`` matches every subject ``narrow`` does."""
    w, n = wide.split("."), narrow.split(".")
    for i, tok in enumerate(w):
        if tok == ">":
            return len(n) > i
        if i >= len(n):
            return False
        if tok != "*" and (tok != n[i] or n[i] in ("*", ">")):
            return False
        if tok == "*" and n[i] == ">":
            return False
    return len(w) == len(n)


def _overlap(a: str, b: str) -> bool:
    """Whether some subject matches both filters."""
    x, y = a.split("."), b.split(".")
    for i in range(max(len(x), len(y))):
        if i < len(x) and x[i] == ">" or i < len(y) and y[i] == ">":
            return True
        if i >= len(x) or i >= len(y):
            return False
        if x[i] != y[i] and x[i] != "*" and y[i] != "*":
            return False
    return True


def _entries(first: int, bodies: list[bytes], address: str, headers: Any, priority: int,
             expires_at: float, origin: str) -> list[Entry]:
    """Entry tuples of a batch for live delivery."""
    if isinstance(headers, list):
        return [(first + i, priority, 0, 0.0, expires_at, address, h, b, origin)
                for i, (b, h) in enumerate(zip(bodies, headers, strict=False))]
    return [(first + i, priority, 0, 0.0, expires_at, address, headers, b, origin)
            for i, b in enumerate(bodies)]


def _all(ds: list[defer.Deferred[Any]]) -> defer.Deferred[Any]:
    """Fires when every Deferred did; fails with the first failure."""
    d = defer.gatherResults(ds, consumeErrors=True)
    d.addCallback(lambda _: None)

    def first_error(failure: Any) -> Any:
        return failure.value.subFailure
    d.addErrback(first_error)
    return d


def _ignore_not_found(failure: Any) -> None:
    """A missing consumer or message is fine when deleting."""
    failure.trap(JetStreamError)
    if not failure.value.not_found:
        failure.raiseException()


def _sleep(clock: IReactorTime, seconds: float) -> defer.Deferred[None]:
    """A Deferred firing after ``seconds``."""
    d: defer.Deferred[None] = defer.Deferred()
    clock.callLater(seconds, d.callback, None)
    return d

