"""Every zope Interface of mqhub, in one place (so type checking and verifyObject see them all).

Interfaces are declared only at substitution seams: protocol plugins (third parties add their
own), the message store (MemoryStore and LmdbStore), the scheduler, and the hook through which
the core hands messages to a live subscriber of any protocol.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.plugin import IPlugin
from zope.interface import Attribute, Interface

if TYPE_CHECKING:  # pragma: no cover
    from twisted.application.service import IService
    from twisted.internet.defer import Deferred


class IProtocolPlugin(IPlugin):
    """A wire protocol mqhub can serve; found with ``getPlugins(IProtocolPlugin, mqhub.plugins)``.

    Providers are tiny descriptors: importing one must not import the protocol's server code.
    A provider may also have ``settings``: ``"module:Class"`` of a dataclass whose fields are its
    ``--option NAME.KEY=VALUE`` keys (and its ``[NAME]`` section in the config file; see
    :mod:`mqhub.plugin_settings`). Without it, any key is passed to the plugin unchecked.
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
