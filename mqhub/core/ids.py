"""64-bit time-ordered message ids: milliseconds since 2020-01-01 in the high bits, a sequence below.

Layout: ``(ms since EPOCH) << 22 | sequence`` (22 bits = 4M ids per millisecond). Ids only ever
grow within a hub, even when the clock steps back: the generator then keeps counting from the
last id. This module imports neither Twisted nor zope.
"""

from __future__ import annotations

from typing import Any

from zope.interface import implementer

from mqhub.interfaces import IIdSource
from mqhub.records import EPOCH, MAX_ID, SEQ_BITS, first_id_at, format_id, id_time, parse_id

__all__ = ["EPOCH", "MAX_ID", "SEQ_BITS", "IdGenerator", "first_id_at", "format_id", "id_time",
           "parse_id"]


@implementer(IIdSource)
class IdGenerator:
    """Hands out strictly increasing, time-ordered 64-bit ids; time comes from an injected clock."""

    __slots__ = ("_clock", "_last")

    def __init__(self, clock: Any) -> None:
        """:param clock: anything with ``seconds()`` (an IReactorTime or task.Clock)."""
        self._clock = clock
        self._last = 0

    def next_id(self) -> int:
        """Return one new id."""
        return self.reserve(1)

    def reserve(self, n: int) -> int:
        """Reserve ``n`` consecutive ids and return the first (``range(first, first + n)``)."""
        base = first_id_at(self._clock.seconds())
        first = self._last + 1
        if base > first:
            first = base
        self._last = first + n - 1
        return first

    def observe(self, msg_id: int) -> None:
        """Never hand out an id at or below ``msg_id`` (used when recovering from the store)."""
        if msg_id > self._last:
            self._last = msg_id

    @property
    def last(self) -> int:
        """The last id handed out (0 before the first)."""
        return self._last

