"""Every zope Interface of mqhub, in one place (so type checking and verifyObject see them all).

Interfaces are declared only at substitution seams: protocol plugins (third parties add their
own), the message store (MemoryStore and LmdbStore), the scheduler, the hook through which
the core hands messages to a live subscriber of any protocol, and the core seam itself
(``ICore`` and the handles it returns), which protocol adapters call and a second backend
implements.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.plugin import IPlugin
from zope.interface import Attribute, Interface

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable, Iterable

    from twisted.application.service import IService
    from twisted.internet.defer import Deferred

    from mqhub.records import DeadLetter, Entry, Peer


class IProtocolPlugin(IPlugin):
    """A wire protocol mqhub can serve; found with ``getPlugins(IProtocolPlugin, mqhub.plugins)``.

    Providers are tiny descriptors: importing one must not import the protocol's server code.
    """

    name = Attribute("Lowercase word used in --protocols and --listen NAME.ROLE=ENDPOINT.")
    aliases = Attribute("Tuple of other names accepted for this plugin in --protocols.")
    description = Attribute("One line shown by --help.")
    default_endpoints = Attribute(
        "Dict role -> endpoint string (Twisted endpoint, or a ZeroMQ address for eMQP); "
        "the first role is the plugin's main one."
    )

    def make_service(hub: Any, endpoints: dict[str, str], options: dict[str, Any]) -> IService:
        """Build, but do not start, the service that serves this protocol.

        :param hub: the :class:`mqhub.hub.Hub` (store, scheduler, broker core, clock, config).
        :param endpoints: role -> endpoint, defaults already merged with --listen overrides.
        :param options: the parsed twistd options (plugin-specific keys included).
        :raises mqhub.errors.PluginError: when the protocol cannot start (one-line message).
        """


class IMessageStore(Interface):
    """Durable storage of queue entries, scheduler entries and metadata.

    Data model (protocol-neutral, no queue policy):

    - an *entry* is one message waiting on one queue. It is a plain tuple, the
      :data:`mqhub.store.records.Entry` layout::

          (msg_id, priority, attempts, deliver_at, expires_at, address, headers, body, origin)

      ``msg_id`` is the hub's 64-bit time-ordered id, ``priority`` 0..9 (higher first),
      ``deliver_at``/``expires_at`` are POSIX seconds (0.0 = none), ``headers`` a dict of
      str -> str or None, ``body`` bytes, ``origin`` the publishing protocol's name.
      A message delivered to N queues is N entries.
    - ready order within a queue is (priority desc, msg_id asc); ``read_entries`` returns that order.
    - *due* rows: (when, key, payload) for the scheduler, ordered by ``when``.
    - *meta*: str key -> bytes value (queues, bindings, mailboxes, schedules...).

    Writes are grouped: callers build a :class:`mqhub.store.batch.WriteBatch` and call
    ``commit``. Every batch committed in one reactor turn goes into one transaction, and each
    caller's Deferred fires once that transaction is durable in the configured mode.
    Every method returning a Deferred fails only with :class:`mqhub.errors.StoreError`.
    """

    durability = Attribute("'sync', 'batch' or 'none'.")

    def open() -> None:
        """Open synchronously and recover (fast; called before any listener accepts)."""

    def close() -> Deferred[None]:
        """Flush pending groups, sync, and close. Fires when closed."""

    def commit(batch: Any) -> Deferred[None]:
        """Queue ``batch`` for the next group commit; fire when it is durable.

        A batch is applied whole or not at all. Nothing is confirmed before it is stored.
        """

    def read_entries(queue: str, after: tuple[int, int] | None, limit: int) -> Deferred[list[tuple]]:
        """Fire with up to ``limit`` entries of ``queue`` in ready order.

        :param after: ``(priority, msg_id)`` of the last entry already read, or None to start:
            a position in the ready order, stored or not, of any integers (a priority above 9
            precedes every entry, one below 0 follows them all; ids likewise).
        """

    def count_entries(queue: str) -> Deferred[int]:
        """Fire with the number of stored entries of ``queue``."""

    def queue_names() -> Deferred[list[str]]:
        """Fire with the names of every queue that has stored entries, sorted."""

    def read_due(until: float, limit: int) -> Deferred[list[tuple[float, bytes, bytes]]]:
        """Fire with up to ``limit`` due rows ``(when, key, payload)`` with ``when <= until``, in time order."""

    def next_due() -> Deferred[float | None]:
        """Fire with the earliest due time, or None when there is none."""

    def read_expired(until: float, limit: int) -> Deferred[list[tuple[str, tuple[int, int], float]]]:
        """Fire with up to ``limit`` ``(queue, (priority, msg_id), expires_at)`` of entries whose
        ``expires_at`` (non-zero) is ``<= until``, earliest first (ties in any order)."""

    def get_meta(key: str) -> Deferred[bytes | None]:
        """Fire with the metadata value stored under ``key``, or None."""

    def scan_meta(prefix: str) -> Deferred[list[tuple[str, bytes]]]:
        """Fire with every ``(key, value)`` whose key starts with ``prefix``, in key order."""

    def stats() -> dict[str, Any]:
        """Return counters for introspection (entries, bytes, commits, segments...)."""


class IScheduler(Interface):
    """Durable timers: one-shot due entries and repeating schedules, driven by an injected clock."""

    clock = Attribute("The IReactorTime the scheduler reads ``now`` from and arms timers on.")

    def call_at(when: float, key: bytes, payload: bytes) -> Deferred[None]:
        """Durably arrange for ``payload`` to be handed to its handler at ``when``; replaces ``key``."""

    def cancel(key: bytes) -> Deferred[bool]:
        """Remove the entry or schedule ``key``; fire with whether it existed."""

    def schedule(spec: Any, key: bytes, payload: bytes) -> Deferred[None]:
        """Durably install a repeating schedule (interval or cron, with nohaste and run_count)."""


class IDeliveryTarget(Interface):
    """What a live subscriber (a connection of any protocol) gives the core to receive messages.

    The core calls ``deliver_batch`` once per publish batch with every message for this target;
    the adapter renders them in its own protocol (the cross-protocol rendering rule).
    """

    protocol_name = Attribute("Name of the adapter's protocol, e.g. 'nats'.")

    def deliver_batch(binding: Any, address: str, messages: list[tuple]) -> None:
        """Render and write ``messages`` (entry tuples) received on ``address`` through ``binding``."""


# -- the core seam ------------------------------------------------------------------------------
# What protocol adapters (mqhub/protocols/*, plugins, the admin surfaces) call on the broker core,
# and nothing more: the embedded core (mqhub.core.broker.Broker over the store) is its first
# implementation, cluster mode over NATS JetStream its second. docs/core-api.md is the contract;
# tests/unit/core/test_seam_conformance.py the suite every implementation passes.
#
# Synchronous calls are answered from local state (the embedded core's memory, another backend's
# local view or cache): handles (queues, consumers, bindings), counts, routes, the ids of in-flight
# messages. Anything that must reach durable or remote state returns a Deferred, or is issued in
# the background in order with everything else and awaited with ``ICore.barrier()``.


class IIdSource(Interface):
    """The hub's 64-bit time-ordered message ids (:mod:`mqhub.records` renders them)."""

    last = Attribute("The last id handed out (0 before the first).")

    def next_id() -> int:
        """Return one new id."""

    def reserve(n: int) -> int:
        """Reserve ``n`` consecutive ids and return the first (``range(first, first + n)``)."""

    def observe(msg_id: int) -> None:
        """Never hand out an id at or below ``msg_id`` (an adapter recovering its own records)."""


class ICounters(Interface):
    """Monotonic message totals at batch granularity (admin API, /metrics)."""

    dead = Attribute("Dict reason -> messages dead-lettered for it.")
    retried = Attribute("Dict kind -> messages the store refused that the core tries again.")

    def register_source(protocol: str, report: Callable[[], dict[str, int]]) -> None:
        """Add ``report()``'s published/delivered figures to ``protocol``'s totals (traffic the
        adapter moves without the core, e.g. NATS core PUB/MSG)."""

    def snapshot() -> dict[str, dict[str, int]]:
        """``{protocol: {"published", "delivered", "acked"}}`` with every source added in."""


class IStateBatch(Interface):
    """Writes an adapter makes to its own durable state, applied whole by ``IAdapterState.commit``."""

    def put_meta(key: str, value: bytes) -> None:
        """Store ``value`` under ``key`` (an adapter's record: a topic, a mailbox, options)."""

    def delete_meta(key: str) -> None:
        """Remove the record ``key``."""

    def put_entries(name: str, entries: Iterable[Entry]) -> None:
        """Keep ``entries`` in the adapter's own entry list ``name`` (never a queue of the core:
        those take messages through ``ICore`` only)."""

    def delete_entries(name: str, keys: Iterable[tuple[int, int]]) -> None:
        """Remove the entries with these ``(priority, msg_id)`` keys from the list ``name``."""

    def __bool__() -> bool:
        """True when the batch holds a write."""


class IAdapterState(Interface):
    """An adapter's own durable state beside the messages: its records and entry lists.

    NSQ topics, MQKS and VibeMQ queue settings, mq9 mailboxes and persisted broadcasts live
    here. Every commit is applied whole, in issue order, and fails only with
    :class:`mqhub.errors.StoreError`; a backend keeps this state where every node sees it.
    """

    def batch() -> IStateBatch:
        """A new, empty batch of writes."""

    def commit(batch: IStateBatch) -> Deferred[None]:
        """Apply ``batch``; fire when it is durable (in issue order with earlier commits)."""

    def scan_meta(prefix: str) -> Deferred[list[tuple[str, bytes]]]:
        """Fire with every ``(key, value)`` record whose key starts with ``prefix``, in key order."""

    def read_entries(name: str, after: tuple[int, int] | None,
                     limit: int) -> Deferred[list[Entry]]:
        """Fire with up to ``limit`` entries of the list ``name`` in ready order after ``after``."""

    def watch(prefix: str, changed: Callable[[str, bytes | None], None]) -> None:
        """Call ``changed(key, value)`` for every record under ``prefix`` that another node of
        the hub puts (``value``) or deletes (None), once it is durable; a registry that keeps
        such records in memory stays in step this way. Never called for this node's own commits
        (the embedded core has no other node: it never calls it)."""


class IRoute(Interface):
    """Everything a publish to one address reaches now (cached until ``ICore.epoch`` changes)."""

    epoch = Attribute("The binding epoch the route was resolved in.")
    address = Attribute("The address ('' for the shared route of addresses nothing matches).")
    queues = Attribute("Tuple of IQueue: each gets a copy.")
    targets = Attribute("Tuple of IBinding: live subscribers without a group, each gets a copy.")
    groups = Attribute("Tuple of tuples of IBinding: one member of each queue group gets a batch.")
    park = Attribute("The IQueue holding the address's publishes while it is parked or paused, "
                     "or None.")
    empty = Attribute("True when the route reaches nothing.")


class IBinding(Interface):
    """One subscription: an address pattern to a queue, or to a live IDeliveryTarget."""

    id = Attribute("Int, unique per core.")
    pattern = Attribute("The address pattern (mqhub.records.validate_pattern).")
    queue = Attribute("The IQueue bound, or None for a live subscription.")
    target = Attribute("The IDeliveryTarget of a live subscription, or None.")
    group = Attribute("Queue-group name (one member of a group gets each batch), or None.")
    tag = Attribute("Whatever the adapter passed to ``subscribe`` (e.g. its subscription).")


class IConsumer(Interface):
    """One consumer attached to a queue (``ICore.attach``): its credit and in-flight count."""

    queue = Attribute("The IQueue it takes messages from (ack/requeue/touch/reject there).")
    target = Attribute("The IDeliveryTarget receiving its batches.")
    tag = Attribute("Whatever the adapter passed to ``attach``.")
    ready = Attribute("Most messages it may hold in flight (NSQ RDY, prefetch; -1: no limit).")
    credit = Attribute("Deliveries it may still receive (eMQP READY slots; -1: no limit).")
    in_flight = Attribute("Messages delivered to it and not yet finished.")
    timeout = Attribute("Seconds a delivery to it stays in flight before it is requeued.")
    attached = Attribute("False once detached (or its queue deleted).")

    def set_ready(n: int) -> None:
        """Deliver while fewer than ``n`` messages are in flight (NSQ RDY); 0 pauses it."""

    def add_credit(n: int) -> None:
        """Allow ``n`` more deliveries (eMQP READY slots)."""

    def set_credit(n: int) -> None:
        """Set the deliveries it may still receive to ``n`` (0 withdraws them)."""


class IQueue(Interface):
    """The one work-queue primitive (NSQ channel, MQKS/VibeMQ queue, mq9 mailbox, eMQP jobs).

    Settings and counts are read from local state (another backend caches its remote figures).
    ``ack``/``touch``/``requeue``/``reject`` return at once the ids that were not in flight on
    that consumer (in-flight ownership is local state) and issue their writes in the background.
    ``peek``/``take``/``remove`` work on the ready messages held locally (the embedded core: its
    in-memory window, paged from the store).
    """

    name = Attribute("The queue's name.")
    tier = Attribute("'durable' or 'memory' (mqhub.records.TIERS).")
    durable = Attribute("True for the durable tier.")
    mode = Attribute("'competing' or 'fanout' (mqhub.records.MODES).")
    max_size = Attribute("Most ready messages (0: unbounded).")
    overflow = Attribute("'drop_oldest', 'reject' or 'dead_letter'.")
    ttl = Attribute("Message TTL in seconds (0: none).")
    max_attempts = Attribute("Deliveries before a message is dead-lettered (0: no limit).")
    msg_timeout = Attribute("Default in-flight timeout of its consumers, seconds.")
    expires_at = Attribute("POSIX time the queue itself is deleted (0: never).")
    auto_delete = Attribute("Deleted when its last consumer detaches.")
    expire_to_dead_letters = Attribute("Expired messages go to its dead letters.")
    window = Attribute("Ready messages it keeps in memory (the setting in effect).")
    window_setting = Attribute("Its own window setting (0: the core's default).")
    paused = Attribute("True while delivery to consumers is paused.")
    deleted = Attribute("True once the queue was deleted.")
    consumers = Attribute("Sequence of the IConsumers attached here.")
    depth = Attribute("Ready messages (not in flight, not deferred).")
    deliverable = Attribute("Ready messages a consumer's credit can be spent on now.")
    in_flight = Attribute("Messages delivered and not yet finished.")
    deferred = Attribute("Messages waiting for a delay (requeue with delay, delayed publish).")
    message_count = Attribute("Messages ever put into the queue.")
    requeue_count = Attribute("Messages requeued by consumers.")
    timeout_count = Attribute("In-flight messages that timed out.")
    expired_count = Attribute("Messages dropped (or dead-lettered) by TTL.")
    dropped_count = Attribute("Messages dropped by the overflow policy.")
    dead_letter_count = Attribute("Dead letters the queue holds.")

    def configure(**settings: Any) -> None:
        """Change settings (not the tier); persisted for durable queues."""

    def room() -> int:
        """How many more messages fit before ``max_size`` (a large number when unbounded)."""

    def stats() -> dict[str, Any]:
        """Counters in the shape the admin surfaces and NSQ /stats use."""

    def pause() -> None:
        """Stop delivering to consumers (messages keep arriving)."""

    def unpause() -> None:
        """Resume delivering."""

    def empty() -> Deferred[None]:
        """Drop every ready, stored, in-flight and deferred message; fire when durable."""

    def detach(consumer: IConsumer, requeue: bool = True) -> None:
        """Detach ``consumer``; its in-flight messages return to ready (attempts kept)."""

    def ack(consumer: IConsumer, msg_ids: Iterable[int]) -> list[int]:
        """Finish in-flight messages (NSQ FIN); return the ids not in flight on ``consumer``."""

    def touch(consumer: IConsumer, msg_ids: Iterable[int],
              extend: float | None = None) -> list[int]:
        """Reset in-flight deadlines to now + ``extend`` (default: the consumer's timeout)."""

    def requeue(consumer: IConsumer, msg_ids: Iterable[int], delay: float = 0.0,
                error: str | None = None) -> list[int]:
        """Return in-flight messages to ready, or defer them ``delay`` seconds; at max attempts
        they are dead-lettered instead."""

    def reject(consumer: IConsumer, msg_ids: Iterable[int], reason: str = "rejected",
               error: str | None = None) -> list[int]:
        """Dead-letter in-flight messages now with ``reason``."""

    def failure_reasons(consumer: IConsumer, msg_ids: Iterable[int]) -> list[tuple[int, str]]:
        """Why ``consumer`` cannot finish each id: ``(msg_id, NOT_OWNER | NOT_IN_FLIGHT | "ok")``."""

    def peek(limit: int) -> list[Entry]:
        """Up to ``limit`` ready entries held locally, in ready order, without taking them."""

    def take(limit: int) -> list[Entry]:
        """Remove and return up to ``limit`` ready entries held locally (mq9 QUERY)."""

    def remove(msg_ids: Iterable[int]) -> list[int]:
        """Remove ready entries held locally by id; return the ids not removed."""


class ICore(Interface):
    """The broker core as protocol adapters see it (docs/core-api.md: the contract).

    Adapters obtain the handle they act through once per connection with :meth:`session`; the
    core itself is the handle of the hub's own work (recovery, registries, admin).
    """

    clock = Attribute("The IReactorTime every timer and ``now`` come from.")
    ids = Attribute("The IIdSource of message ids.")
    counters = Attribute("The ICounters of message totals.")
    journal = Attribute("The flow journal's recorder: ``journal.traffic(address, origin, "
                        "messages, nbytes)`` for traffic an adapter moves itself.")
    epoch = Attribute("Int that changes whenever bindings, parking or pauses change.")
    state = Attribute("The IAdapterState where adapters keep their own durable records.")

    # lifecycle (the hub's calls)
    def start() -> Deferred[None]:
        """Recover queues, bindings and parked addresses; fire when ready for adapters."""

    def stop() -> Deferred[None]:
        """Stop timers; fire once every write issued so far has settled."""

    def barrier() -> Deferred[None]:
        """Fire once every write issued through the core so far is durable (acks, settings,
        bindings, declarations included); errback with the store's error if one failed."""

    def settled(handle: Any) -> Deferred[None]:
        """Fire once the declaration, binding or attachment behind ``handle`` (an IQueue,
        IBinding or IConsumer this core returned) is in effect everywhere it must be, so an
        adapter can confirm a SUB or a consume (the embedded core: at once, the handle is in
        effect when returned; its durability is ``barrier()``'s)."""

    def peers(protocol: str) -> list[Peer]:
        """The other nodes of the hub that serve ``protocol``, with their client endpoints (for
        NATS INFO ``connect_urls``, NSQ ``/lookup``); empty for the embedded core."""

    def session(principal: object) -> ICore:
        """The handle one connection acts through, for ``principal`` (its authenticated user,
        None before authentication). It provides ICore; where no rights are configured it is
        the core itself, so the handle costs nothing."""

    # routing
    def route(address: str) -> IRoute:
        """The route of ``address``, from the local route cache; raises InvalidName."""

    # publishing: one call per read, never one per message
    def publish_batch(address: str, bodies: list[bytes], *, origin: str = "",
                      headers: Any = None, priority: int = 0, ttl: float = 0.0,
                      expires_at: float = 0.0, deliver_at: float = 0.0,
                      persist: bool = True) -> Deferred[None]:
        """Publish ``bodies`` to ``address``; fire when every store write is durable (confirm
        then). Raises QueueFull or InvalidName synchronously, before anything is written."""

    def publish_entries(address: str, entries: list[Entry], *,
                        persist: bool = True) -> Deferred[None]:
        """Publish prebuilt entries (replays, moves) to ``address``."""

    def put_entries(queue_name: str, entries: list[Entry]) -> Deferred[None]:
        """Put prebuilt entries into that one queue (no routing, attempts kept)."""

    def entry_fits(address: str, headers: dict[str, str] | None, origin: str) -> bool:
        """True when an entry with these fields fits the backend's limits (the embedded store:
        64 KiB of address, headers and origin); an adapter leaves one that does not out of its
        batch rather than have the whole batch refused."""

    # queues
    def declare_queue(name: str, *, tier: str = "durable", max_size: int = 0,
                      overflow: str = "drop_oldest", ttl: float = 0.0, max_attempts: int = 0,
                      msg_timeout: float = 60.0, expires_at: float = 0.0,
                      auto_delete: bool = False, expire_to_dead_letters: bool = False,
                      mode: str = "competing", window: int = 0) -> IQueue:
        """Create the queue (or return the existing one, settings kept): a local handle at once,
        made durable in the background (``barrier`` waits for it). Settings: docs/core-api.md."""

    def queue(name: str) -> IQueue | None:
        """The queue called ``name``, or None."""

    def queues() -> list[IQueue]:
        """Every queue an adapter declared."""

    def delete_queue(name: str) -> Deferred[None]:
        """Unbind and forget the queue with its messages and dead letters."""

    def attach(queue: IQueue, target: Any, *, ready: int = 0, credit: int = 0,
               timeout: float | None = None, tag: Any = None) -> IConsumer:
        """Attach a consumer to ``queue``; ``target.deliver_batch(consumer, queue.name,
        entries)`` receives. Raises NoSuchQueue for a deleted queue."""

    # bindings
    def bind_queue(pattern: str, queue_name: str) -> IBinding:
        """Bind ``pattern`` to the queue (idempotent; durable if the queue is)."""

    def subscribe(pattern: str, target: Any, *, group: str | None = None,
                  tag: Any = None) -> IBinding:
        """Bind ``pattern`` to a live IDeliveryTarget (never persisted)."""

    def unbind(binding: IBinding) -> None:
        """Remove ``binding``."""

    def bindings(queue_name: str | None = None) -> list[IBinding]:
        """Every binding, or those of one queue."""

    # parked and paused addresses (NSQ topics)
    def park(address: str) -> Deferred[None]:
        """Keep publishes to ``address`` while no queue is bound to it."""

    def unpark(address: str) -> Deferred[None]:
        """Stop parking; parked messages go to the bound queues."""

    def pause_address(address: str) -> Deferred[None]:
        """Hold every publish to ``address`` until resumed."""

    def resume_address(address: str) -> Deferred[None]:
        """Release a paused address: held messages go to the bound queues."""

    def parked_depth(address: str) -> int:
        """Messages held for ``address`` (parked or paused)."""

    def empty_parked(address: str) -> Deferred[None]:
        """Drop every message held for ``address``."""

    # dead letters
    def dead_letters(queue_name: str, *, limit: int = 100,
                     after: int | None = None) -> Deferred[list[DeadLetter]]:
        """Up to ``limit`` dead letters of the queue, oldest first, after msg id ``after``."""

    def replay_dead_letters(queue_name: str,
                            msg_ids: Iterable[int] | None = None) -> Deferred[int]:
        """Put dead letters back on their queue (attempts reset); fire with how many."""

    def purge_dead_letters(queue_name: str,
                           msg_ids: Iterable[int] | None = None) -> Deferred[int]:
        """Delete dead letters (all, or the given ids); fire with how many."""

    def stats() -> dict[str, Any]:
        """Counters for the admin surfaces."""
