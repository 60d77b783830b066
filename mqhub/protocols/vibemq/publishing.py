"""Publishing for the VibeMQ protocol: validation, one core call per run, overflow handling.

Consecutive Publishes of a read to one queue are ONE ``publish_batch`` (``publish_entries`` for
PriorityBased queues, which carry a priority per message); their PublishAcks are written in
that Deferred's callback. A full DropNewest queue drops (and counts) what does not fit; a full
BlockPublisher queue withholds it, retried on the clock, without blocking anything else.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import msgspec
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqhub.errors import InvalidName, QueueFull, Unauthorized
from mqhub.protocols.vibemq import codec as c
from mqhub.protocols.vibemq.config import VibeMQConfig
from mqhub.protocols.vibemq.options import BLOCK_PUBLISHER, DROP_NEWEST, parse_priority
from mqhub.protocols.vibemq.queues import QueueRegistry, VibeQueue
from mqhub.protocols.vibemq.render import publish_acks

log = Logger(namespace="mqhub.vibemq")

MAX_HEADERS = 50
#: publishes per connection handed to the core and not yet stored, above which reading pauses
#: until commits catch up (NSQ and MQKS use the same bound)
MAX_UNCONFIRMED = 50_000
MAX_HEADER_VALUE = 4096


_RAW = msgspec.json.Decoder(msgspec.Raw).decode


def _validate(payload: bytes) -> None:
    """Check that ``payload`` is UTF-8 JSON, without building it.

    msgspec parses the syntax into a ``Raw`` span (no objects made: about 10x the stdlib's
    ``json.loads`` on 1 KiB documents) but does not check the UTF-8 inside strings, so non-ASCII
    payloads are also decoded.

    :raises ValueError: (or msgspec.DecodeError, RecursionError) when it is not.
    """
    _RAW(payload)
    if not payload.isascii():
        payload.decode("utf-8")


class PublishingMixin:
    """The publish half of :class:`~mqhub.protocols.vibemq.server.VibeMQProtocol`."""

    config: VibeMQConfig
    registry: QueueRegistry
    broker: Any
    clock: Any
    factory: Any
    transport: Any
    closed: bool
    blocked: deque[tuple[VibeQueue, c.Frame]]
    _retry: Any
    _paused: bool
    _unconfirmed: int
    _backlog: bool

    def error(self, msg_id: str | None, code: str, text: str) -> None:
        """Send an Error frame (the protocol's)."""
        raise NotImplementedError

    def write(self, data: bytes) -> None:
        """Write unless the connection is gone (the protocol's)."""
        raise NotImplementedError

    def _queue_ok(self, f: c.Frame, operation: str, what: str) -> bool:
        """Name and ACL check (the protocol's)."""
        raise NotImplementedError

    def _sync_reading(self) -> None:
        """Pause or resume reads (the protocol's)."""
        raise NotImplementedError

    def _valid_publish(self, f: c.Frame) -> bool:
        """Check one Publish (queue, ACL, headers, JSON); answer and refuse it when bad."""
        if not self._queue_ok(f, "Publish", "publish"):
            return False
        h = f.headers
        if h and (len(h) > MAX_HEADERS or any(len(v) > MAX_HEADER_VALUE for v in h.values())):
            self.error(f.id, "INVALID_MESSAGE", "Too many headers or a header value too long.")
            return False
        if f.payload is not None and len(f.payload) > self.config.max_frame_size - 1024:
            # it arrived compressed; uncompressed it could not be delivered to a .NET client
            self.error(f.id, "INVALID_MESSAGE", "Message too large.")
            return False
        if f.payload is not None and self.config.validate_json:
            try:
                _validate(f.payload)
            except (ValueError, msgspec.DecodeError, RecursionError):
                self.error(f.id, "INVALID_MESSAGE", "Payload is not valid UTF-8 JSON.")
                return False
        return True

    def _target(self, f: c.Frame) -> VibeQueue | None:
        """The queue a publish goes to (auto-created), or None after answering an error."""
        vq = self.registry.get(f.queue)  # type: ignore[arg-type]
        if vq is not None:
            return vq
        if not self.config.auto_create:
            self.error(f.id, "QUEUE_NOT_FOUND", f"Queue '{f.queue}' does not exist.")
            return None
        try:
            return self.registry.create(f.queue)  # type: ignore[arg-type]
        except InvalidName as exc:
            self.error(f.id, "INVALID_QUEUE", str(exc))
            return None

    def _publish(self, run: list[c.Frame]) -> None:
        """Publish a run of frames to one queue with one core call."""
        vq = self._target(run[0])
        if vq is None:
            for f in run[1:]:
                self.error(f.id, "QUEUE_NOT_FOUND", f"Queue '{f.queue}' does not exist.")
            return
        if self.blocked:
            self._block(vq, run)
            return
        try:
            self._put(vq, run)
        except QueueFull:
            self._overflow(vq, run)
        except InvalidName as exc:
            for f in run:
                self.error(f.id, "INVALID_QUEUE", str(exc))
        except Unauthorized:  # the seam's refusal (each frame was checked before)
            for f in run:
                self.error(f.id, "NOT_AUTHORIZED", "Access denied.")

    def _put(self, vq: VibeQueue, run: list[c.Frame]) -> None:
        """The core call; PublishAcks go out once the batch is stored."""
        bodies = [f.payload or b"" for f in run]
        headers: list[dict[str, str] | None] | None = [f.headers for f in run]
        if not any(headers):  # type: ignore[arg-type]
            headers = None
        if vq.priority:
            first = self.broker.ids.reserve(len(run))
            name = vq.name
            entries = [(first + i, parse_priority((f.headers or {}).get("priority")), 0, 0.0,
                        0.0, name, f.headers, bodies[i], "vibemq") for i, f in enumerate(run)]
            d = self.broker.publish_entries(name, entries)
        else:
            d = self.broker.publish_batch(vq.name, bodies, origin="vibemq", headers=headers)
        ids = [f.id for f in run]
        self._unconfirmed += len(ids)
        if self._unconfirmed > MAX_UNCONFIRMED and not self._backlog:
            self._backlog = True
            self._sync_reading()
        d.addCallbacks(self._stored, self._store_failed, callbackArgs=(ids, vq.name),
                       errbackArgs=(ids,))

    def _stored(self, _: Any, ids: list[str], queue: str) -> None:
        """Send the PublishAcks of a stored batch."""
        self._settled(len(ids))
        self.write(publish_acks(ids, queue))

    def _store_failed(self, failure: Failure, ids: list[str]) -> None:
        """The store refused the batch: every publisher of it gets an error."""
        self._settled(len(ids))
        log.failure("vibemq: publish batch not stored", failure)
        for i in ids:
            self.error(i, "SERVER_ERROR", "The message could not be stored.")

    def _settled(self, n: int) -> None:
        """Count settled publishes; read again once commits caught up."""
        self._unconfirmed -= n
        if self._backlog and self._unconfirmed <= MAX_UNCONFIRMED // 2:
            self._backlog = False
            self._sync_reading()

    def _overflow(self, vq: VibeQueue, run: list[c.Frame]) -> None:
        """A full DropNewest or BlockPublisher queue: put what fits, drop or withhold the rest."""
        room = max(0, vq.core.room())
        fits, rest = run[:room], run[room:]
        if fits:
            self._put(vq, fits)
        if vq.options.overflow_strategy == BLOCK_PUBLISHER:
            self._block(vq, rest)
            return
        if vq.options.overflow_strategy == DROP_NEWEST:
            self.factory.counters["dropped_newest"] += len(rest)
            log.debug("vibemq: {n} messages dropped (DropNewest) on {q}", n=len(rest), q=vq.name)
            self.write(b"".join(c.frame(c.encode_body(c.PUBLISH_ACK, f.id, vq.name, None,
                                                      {"overflow": "dropped"})) for f in rest))
            return
        for f in rest:
            self.error(f.id, "QUEUE_FULL", f"Queue '{vq.name}' is full.")

    def _block(self, vq: VibeQueue, run: list[c.Frame]) -> None:
        """Withhold these publishes until their queue has room (other connections go on)."""
        self.factory.counters["blocked"] += len(run)
        self.blocked.extend((vq, f) for f in run)
        if len(self.blocked) >= self.config.max_blocked and not self._paused:
            self._paused = True
            self._sync_reading()
        if self._retry is None or not self._retry.active():
            self._retry = self.clock.callLater(0.05, self._unblock)

    def _unblock(self) -> None:
        """Publish withheld messages while their queues have room (in arrival order)."""
        self._retry = None
        while self.blocked and not self.closed:
            vq = self.blocked[0][0]
            if self.registry.get(vq.name) is not vq:
                vq = self.registry.create(vq.name)
            room = vq.core.room()
            if room <= 0:
                break
            run: list[c.Frame] = []
            while self.blocked and self.blocked[0][0].name == vq.name and len(run) < room:
                run.append(self.blocked.popleft()[1])
            try:
                self._put(vq, run)
            except QueueFull:
                self.blocked.extendleft((vq, f) for f in reversed(run))
                break
        if self._paused and len(self.blocked) < self.config.max_blocked // 2:
            self._paused = False
            self._sync_reading()
        if self.blocked and not self.closed:
            self._retry = self.clock.callLater(0.05, self._unblock)
