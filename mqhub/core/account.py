"""A broker-wide account of memory that some part of every durable queue takes up.

The broker keeps two: ``broker.tails`` (the remembered tails of the stored backlogs,
:mod:`mqhub.core.tail`) and ``broker.windows`` (the body bytes of the ready windows,
:mod:`mqhub.core.window`). Each queue charges what it takes per batch-level change, so the
account's ``used`` is the sum of the queues' charges; a queue asks :meth:`MemoryAccount.room`
how far its charge may grow.
"""

from __future__ import annotations


class MemoryAccount:
    """Bytes the queues of one broker take up together in one kind of memory, and their limit."""

    __slots__ = ("limit", "used", "floor")

    def __init__(self, limit: int, floor: int = 0) -> None:
        """Allow ``limit`` bytes across all queues (nothing charged yet); ``floor``: the least a
        queue's share is cut to when the account is full (0: none; the windows keep one)."""
        self.limit = limit
        self.used = 0
        self.floor = floor

    def room(self, charged: int) -> int:
        """Bytes a queue now charged ``charged`` may grow to (its own charge included)."""
        return self.limit - self.used + charged
