"""The Consumer: one subscriber of a queue, with its credit, ready window and in-flight count."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from zope.interface import implementer

from mqhub.interfaces import IConsumer


class ConsumerQueue(Protocol):
    """The queue a consumer is attached to, as the consumer and adapters use it (a Protocol, so
    this module needs no import of :mod:`mqhub.core.queue`, which imports it)."""

    name: str

    def dispatch(self) -> None:
        """Deliver to consumers with room."""

    def ack(self, consumer: Consumer, msg_ids: Iterable[int]) -> list[int]:
        """Acknowledge in-flight messages."""

    def touch(self, consumer: Consumer, msg_ids: Iterable[int],
              extend: float | None = None) -> list[int]:
        """Reset in-flight deadlines."""

    def requeue(self, consumer: Consumer, msg_ids: Iterable[int], delay: float = 0.0,
                error: str | None = None) -> list[int]:
        """Return in-flight messages to ready (or deferred)."""

    def reject(self, consumer: Consumer, msg_ids: Iterable[int], reason: str = ...,
               error: str | None = None) -> list[int]:
        """Dead-letter in-flight messages."""

    def detach(self, consumer: Consumer, requeue: bool = True) -> None:
        """Detach ``consumer``."""

    def failure_reasons(self, consumer: Consumer,
                        msg_ids: Iterable[int]) -> list[tuple[int, str]]:
        """Why ``consumer`` cannot ack each id."""


@implementer(IConsumer)
class Consumer:
    """One consumer attached to a queue: its target, credit/ready limits and in-flight count.

    ``ready`` is the most messages it may hold in flight (NSQ RDY, prefetch; -1 = no limit) and
    ``credit`` the deliveries it may still receive (eMQP READY slots; -1 = no limit).
    """

    __slots__ = ("queue", "target", "ready", "credit", "in_flight", "timeout", "tag", "attached",
                 "_ready_set")

    def __init__(self, queue: ConsumerQueue, target: Any, ready: int, credit: int,
                 timeout: float, tag: Any) -> None:
        """Made by :meth:`Queue.attach` only."""
        self.queue = queue
        self.target = target
        self._ready_set = ready > 0
        self.ready = ready if ready > 0 else (-1 if credit > 0 else 0)
        self.credit = credit if credit > 0 else -1
        self.in_flight = 0
        self.timeout = timeout
        self.tag = tag
        self.attached = True

    def available(self) -> int:
        """How many messages may be delivered now."""
        r = self.ready
        c = self.credit
        a = (r - self.in_flight) if r >= 0 else 1 << 30
        if 0 <= c < a:
            a = c
        return a

    def set_ready(self, n: int) -> None:
        """Deliver while fewer than ``n`` messages are in flight (NSQ RDY); 0 pauses the consumer."""
        self._ready_set = True
        self.ready = max(0, int(n))
        self.queue.dispatch()

    def add_credit(self, n: int) -> None:
        """Allow ``n`` more deliveries (eMQP READY slots)."""
        if self.credit < 0:
            self.credit = 0
        self.credit += max(0, int(n))
        if not self._ready_set:
            self.ready = -1
        self.queue.dispatch()

    def set_credit(self, n: int) -> None:
        """Set the deliveries this consumer may still receive to ``n`` (not added; 0 withdraws).

        eMQP READY bookkeeping: an adapter that takes back slots it granted but that were not
        used yet sets the remaining count. In-flight messages are not affected.
        """
        self.credit = max(0, int(n))
        if not self._ready_set:
            self.ready = -1
        if self.credit:
            self.queue.dispatch()

    def __repr__(self) -> str:
        """Readable form."""
        return (f"<Consumer {self.queue.name} ready={self.ready} credit={self.credit} "
                f"in_flight={self.in_flight}>")
