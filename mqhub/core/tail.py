"""The remembered tail of a durable queue's stored backlog: its bound and the deque work on it.

A queue remembers the newest entries it put straight to its stored backlog (the *tail*, a deque
kept in ready order: entries that would break the order are not remembered); while the tail is
the whole backlog the window is refilled from it instead of reading the entries back from the
store (:mod:`mqhub.core.backlog`). These helpers
are pure: they take and return deques and entries, the queue keeps the state.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Iterable
from itertools import repeat

from mqhub.records import PRIORITY, Entry
from mqhub.records import entry_order as ready_key

#: memory an entry of the remembered tail costs beyond its body (the 9-tuple, its id, the body's
#: bytes object and the deque slot: 205 B measured with tracemalloc for a 16 B body); the tail
#: holds at most the byte budget's worth when each entry counts its body plus this
ENTRY_COST = 192

#: memory all remembered tails of one broker may hold together (the account ``broker.tails``;
#: each tail is also bounded by the queue's own ``window_bytes``): a queue whose tail would pass
#: it remembers no more, and its backlog is read back from the store as before the tail grew
#: (never lost)
TAILS_BYTES = 256 * 1024 * 1024

_popleft = deque.popleft

__all__ = ["ENTRY_COST", "TAILS_BYTES", "pop_head", "ready_key", "sized", "stays_sorted",
           "tail_limit", "trim"]


def tail_limit(budget: int, body_max: int) -> int:
    """The most entries a remembered tail may hold: ``budget`` bytes of memory when each entry
    counts ``body_max`` (the largest body seen) plus :data:`ENTRY_COST` (at least one)."""
    return max(1, budget // (body_max + ENTRY_COST))


def sized(tail: Iterable[Entry], limit: int) -> deque[Entry]:
    """``tail`` as a deque holding at most ``limit`` entries (itself when it already is one)."""
    if isinstance(tail, deque) and tail.maxlen == limit:
        return tail
    return deque(tail, maxlen=limit)


def stays_sorted(tail: deque[Entry], entries: list[Entry], uniform: bool) -> bool:
    """True when appending ``entries`` (in id order; ``uniform``: one priority) to a tail in
    ready order leaves it in ready order."""
    first = entries[0]
    if tail and ready_key(first) < ready_key(tail[-1]):
        return False
    return uniform or all(e[PRIORITY] == first[PRIORITY] for e in entries)


def pop_head(tail: deque[Entry], room: int, cap: tuple[int, int] | None) -> list[Entry]:
    """Pop up to ``room`` entries off the head of a tail in ready order, none at or after the
    ready-order key ``cap`` (those stay at its head). Touches only the entries taken."""
    take = list(map(_popleft, repeat(tail, min(room, len(tail)))))
    if cap is not None:
        ok = bisect_left(take, cap, key=ready_key)
        if ok < len(take):
            tail.extendleft(reversed(take[ok:]))
            del take[ok:]
    return take


def trim(tail: deque[Entry], upto: tuple[int, int]) -> None:
    """Drop the entries at the head of a tail in ready order up to the ready-order key ``upto``
    (a page read them)."""
    while tail and ready_key(tail[0]) <= upto:
        tail.popleft()
