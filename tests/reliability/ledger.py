"""Ledger: what a load sent and what the broker confirmed, and the bodies it uses.

Bodies are made from ``(target, cycle, seq)`` with a size drawn from the sequence number, so
every body is unique, its bytes are known in full (byte-identity checks) and about one in a
hundred is longer than the store's 64 KiB segment threshold (bodies in segment files).
"""

from __future__ import annotations

import random
import threading
import zlib
from dataclasses import dataclass, field

#: Bodies above this go to the store's segment files (LmdbStore's segment_threshold).
SEGMENT_THRESHOLD = 64 << 10


def make_body(tag: str, cycle: int, seq: int, big_every: int = 97) -> bytes:
    """A unique body for ``seq`` of ``cycle``: a readable head and deterministic filler."""
    head = b"%s-c%d-%d|" % (tag.encode(), cycle, seq)
    rnd = random.Random(zlib.crc32(head))
    size = SEGMENT_THRESHOLD + rnd.randrange(4096) if seq % big_every == big_every - 1 \
        else rnd.randrange(0, 300)
    filler = bytes(rnd.getrandbits(8) for _ in range(min(size, 64))) * (size // 64 + 1)
    return head + filler[:size]


@dataclass
class Ledger:
    """Thread-safe record of one cycle's load: every body sent and every body confirmed."""

    sent: set[bytes] = field(default_factory=set)
    confirmed: set[bytes] = field(default_factory=set)
    refused: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_sent(self, bodies: list[bytes]) -> None:
        """Record bodies written to the socket (confirmation pending)."""
        with self.lock:
            self.sent.update(bodies)

    def on_confirmed(self, bodies: list[bytes]) -> None:
        """Record bodies the broker confirmed with its protocol's confirmation."""
        with self.lock:
            missing = [b for b in bodies if b not in self.sent]
            assert not missing, f"confirmation for bodies never sent: {missing[:3]!r}"
            self.confirmed.update(bodies)

    def on_refused(self, count: int) -> None:
        """Count bodies the broker answered with its protocol's error."""
        with self.lock:
            self.refused += count

    @property
    def confirmed_count(self) -> int:
        """How many bodies are confirmed so far."""
        with self.lock:
            return len(self.confirmed)
