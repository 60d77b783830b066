"""VibeMQ queues as core queues: option mapping, persistence of the options, dead-letter names.

A VibeMQ queue ``orders`` is the core queue ``orders`` bound to the hub address ``orders``
(so every protocol's publishes to ``orders`` reach it). Its VibeMQ options are kept in store
metadata ``vibemq/q/<name>`` (JSON) so they survive restarts. Mapping:

- RoundRobin and PriorityBased → ``mode="competing"`` (PriorityBased passes the ``priority``
  header as the core priority; the other modes publish everything at one priority);
- FanOutWithAck and FanOutWithoutAck → ``mode="fanout"`` (each subscriber its own copy);
- maxQueueSize → ``max_size`` (0 = unbounded); messageTtl → ``ttl``;
- maxRetryAttempts: deliveries before dead-lettering (at least 1). The core queue has no
  ``max_attempts`` (that would write the attempt count on every delivery); the adapter
  dead-letters (core ``reject``, reason ``max_attempts``) a message dispatched once more than
  that, and the core writes attempts whenever a message returns to ready (timeout, requeue);
- DropOldest → ``drop_oldest``; DropNewest and BlockPublisher → ``reject`` (the adapter drops
  or withholds); RedirectToDlq → ``dead_letter``.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger

from mqhub.interfaces import IAdapterState, ICore
from mqhub.protocols.vibemq.options import (
    BLOCK_PUBLISHER,
    DROP_NEWEST,
    MODE_FANOUT_ACK,
    MODE_FANOUT_NO_ACK,
    REDIRECT_TO_DLQ,
    QueueOptions,
)
from mqhub.records import validate_address

log = Logger(namespace="mqhub.vibemq")

META_PREFIX = "vibemq/q/"
_OVERFLOW = {DROP_NEWEST: "reject", BLOCK_PUBLISHER: "reject", REDIRECT_TO_DLQ: "dead_letter"}


_VALID: dict[str, bool] = {}


def valid_queue_name(name: str | None) -> bool:
    """VibeMQ's rule (letters, digits, ``-_.``), at most 255 characters for the core.

    Answers are cached (a bounded cache: the hot path checks the same few names over and over).
    """
    if not name:
        return False
    ok = _VALID.get(name)
    if ok is None:
        ok = len(name) <= 255 and all(ch.isalnum() or ch in "-_." for ch in name)
        if len(_VALID) < 10_000:
            _VALID[name] = ok
    return ok


class VibeQueue:
    """One VibeMQ queue: its options, creation time and core queue."""

    __slots__ = ("name", "options", "created_at", "core", "fanout", "no_ack", "priority",
                 "dlq_name", "max_deliveries", "saved")

    def __init__(self, name: str, options: QueueOptions, created_at: float, core: Any) -> None:
        """:param core: the core ``Queue``."""
        self.name = name
        self.options = options
        self.created_at = created_at
        self.core = core
        self.fanout = options.mode in (MODE_FANOUT_ACK, MODE_FANOUT_NO_ACK)
        self.no_ack = options.mode == MODE_FANOUT_NO_ACK
        self.priority = options.mode == 3
        self.dlq_name = options.dead_letter_queue_name or f"{name}.dlq"
        self.max_deliveries = max(1, options.max_retry_attempts)
        #: fires once the options record is stored (at once for recovered queues)
        self.saved: Deferred[None] = succeed(None)


class QueueRegistry:
    """Every VibeMQ queue of the hub, and the dead-letter names that point at them."""

    def __init__(self, broker: ICore, state: Any, clock: Any, tier: str = "durable",
                 ack_timeout: float = 30.0, window: int = 0) -> None:
        """:param broker: the core (ICore); :param state: where queue records are kept (the
        core's IAdapterState, or anything that adapts to it).
        :param tier: core tier of the queues made here; ``window`` their in-memory window."""
        self.broker = broker
        self.state: IAdapterState = IAdapterState(state)
        self.clock = clock
        self.tier = tier
        self.ack_timeout = ack_timeout
        self.window = window
        self.queues: dict[str, VibeQueue] = {}
        self.dlqs: dict[str, VibeQueue] = {}

    def load(self) -> Deferred[None]:
        """Recover the VibeMQ queues from store metadata."""
        d = self.state.scan_meta(META_PREFIX)

        def got(rows: list[tuple[str, bytes]]) -> None:
            """Re-declare each recorded queue (the core already recovered its entries)."""
            for key, value in rows:
                self._from_record(key, value)
            self.state.watch(META_PREFIX, self.record_changed)

        return d.addCallback(got)

    def _from_record(self, key: str, value: bytes) -> None:
        """Declare the queue a metadata row records (logged and skipped when unreadable)."""
        try:
            rec = json.loads(value)
            opts = QueueOptions.from_record(rec["options"])
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warn("vibemq queue {key!r}: unreadable metadata row {value!r} skipped",
                     key=key, value=value[:80])
            return
        self._make(key[len(META_PREFIX):], opts, float(rec.get("created_at", 0.0)),
                   persist=False)

    def record_changed(self, key: str, value: bytes | None) -> None:
        """Another node of the hub created or deleted queue ``key`` (``IAdapterState.watch``):
        know it, or forget it."""
        name = key[len(META_PREFIX):]
        q = self.queues.get(name)
        if value is None:
            if q is not None:
                self._forget(q)
        elif q is None:
            self._from_record(key, value)

    def get(self, name: str) -> VibeQueue | None:
        """The queue named ``name`` (None when there is none)."""
        q = self.queues.get(name)
        if q is not None and self.broker.queue(name) is not q.core:
            self._forget(q)
            return None
        return q

    def dead_letter_source(self, name: str) -> VibeQueue | None:
        """The queue whose dead-letter queue is called ``name`` (None when none is)."""
        q = self.dlqs.get(name)
        if q is not None and self.queues.get(q.name) is not q:
            return None
        return q

    def create(self, name: str, options: QueueOptions | None = None) -> VibeQueue:
        """Return the queue, creating it with ``options`` (defaults) when missing."""
        q = self.get(name)
        if q is not None:
            return q
        return self._make(name, options or QueueOptions(), self.clock.seconds(), persist=True)

    def _make(self, name: str, opts: QueueOptions, created_at: float, persist: bool) -> VibeQueue:
        """Declare the core queue, bind it to its address and record the options.

        :raises InvalidName: when ``name`` is not a valid hub address (checked before anything
            is declared).
        """
        validate_address(name)
        core = self.broker.declare_queue(
            name, tier=self.tier, max_size=max(0, opts.max_queue_size),
            overflow=_OVERFLOW.get(opts.overflow_strategy, "drop_oldest"),
            ttl=opts.message_ttl or 0.0,
            msg_timeout=self.ack_timeout, window=self.window,
            mode="fanout" if opts.mode in (MODE_FANOUT_ACK, MODE_FANOUT_NO_ACK) else "competing")
        if not self.broker.bindings(name):
            self.broker.bind_queue(name, name)
        q = VibeQueue(name, opts, created_at, core)
        self.queues[name] = q
        self.dlqs[q.dlq_name] = q
        if persist:
            b = self.state.batch()
            b.put_meta(META_PREFIX + name, json.dumps(
                {"options": opts.to_record(), "created_at": created_at}).encode())
            q.saved = self.state.commit(b)
            q.saved.addErrback(lambda f: None)  # a failed write is retried by the next create
        return q

    def delete(self, name: str) -> Deferred[None]:
        """Delete the queue, its entries, dead letters and options."""
        q = self.queues.get(name)
        if q is not None:
            self._forget(q)
        b = self.state.batch()
        b.delete_meta(META_PREFIX + name)
        self.state.commit(b)
        if self.broker.queue(name) is None:
            return succeed(None)
        return self.broker.delete_queue(name)

    def _forget(self, q: VibeQueue) -> None:
        """Drop ``q`` from the indexes."""
        self.queues.pop(q.name, None)
        if self.dlqs.get(q.dlq_name) is q:
            del self.dlqs[q.dlq_name]

    def names(self) -> list[str]:
        """Every queue name, plus the dead-letter names of queues that enable them."""
        out = []
        for name in list(self.queues):
            q = self.get(name)
            if q is None:
                continue
            out.append(name)
            if q.options.enable_dead_letter_queue:
                out.append(q.dlq_name)
        return out
