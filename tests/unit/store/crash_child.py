"""Child process for the crash and snapshot tests: appends and deletes as fast as it can.

Usage: ``python -m tests.unit.store.crash_child DATA_DIR FIRST_ID DURABILITY WRITER``.
Every turn it commits a few batches (like several connections in one read). It prints
``P queue lo hi`` once puts of ids ``lo..hi-1`` are confirmed, ``d queue lo hi`` before it
commits a delete of that range, and ``D queue lo hi`` once the delete is confirmed.
Bodies are derived from the id (see :func:`body_for`) so the parent can check them.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def body_for(msg_id: int) -> bytes:
    """Return the body the child stores for ``msg_id`` (every 7th is a segment-sized one)."""
    size = 2000 if msg_id % 7 == 0 else 40
    return (b"%d:" % msg_id) * (size // 8)


def main(argv: list[str]) -> None:
    """Run the append loop until killed."""
    from twisted.internet import reactor

    from mqhub.store.batch import WriteBatch
    from mqhub.store.lmdb import LmdbStore

    data_dir, first, durability, writer = argv[0], int(argv[1]), argv[2], argv[3]
    store = LmdbStore(data_dir, clock=reactor, durability=durability, writer=writer,
                      segment_threshold=1024, segment_size=256 << 10, batch_interval=0.01)
    store.open()
    state: dict[str, Any] = {"next": first, "confirmed": [], "inflight": 0}

    def say(line: str) -> None:
        """Write one line to stdout at once (no buffering to lose on SIGKILL)."""
        os.write(1, (line + "\n").encode())

    def on_put(_: object, queues: tuple[str, ...], lo: int, hi: int) -> None:
        """Report confirmed puts."""
        state["inflight"] -= 1
        for q in queues:
            say(f"P {q} {lo} {hi}")
        state["confirmed"].append((queues, lo, hi))

    def on_delete(_: object, q: str, lo: int, hi: int) -> None:
        """Report a confirmed delete."""
        state["inflight"] -= 1
        say(f"D {q} {lo} {hi}")

    def turn() -> None:
        """Commit a few put batches (and sometimes a delete), then come back next turn."""
        if state["inflight"] < 12:
            for _ in range(3):
                lo = state["next"]
                hi = lo + 50
                state["next"] = hi
                queues = ("a", "b") if lo % 3 == 0 else ("a",)
                b = WriteBatch()
                for q in queues:
                    b.put_entries(q, [(i, i % 3, 0, 0.0, 0.0, "crash.test", None, body_for(i), "t")
                                      for i in range(lo, hi)])
                state["inflight"] += 1
                store.commit(b).addCallback(on_put, queues, lo, hi)
            if len(state["confirmed"]) > 4:
                queues, lo, hi = state["confirmed"].pop(0)
                if lo % 2 == 0:
                    q = queues[-1]
                    say(f"d {q} {lo} {hi}")
                    b = WriteBatch()
                    b.delete_entries(q, [(i % 3, i) for i in range(lo, hi)])
                    state["inflight"] += 1
                    store.commit(b).addCallback(on_delete, q, lo, hi)
        reactor.callLater(0.0005, turn)

    say("READY")
    reactor.callLater(0, turn)
    reactor.run()


if __name__ == "__main__":
    main(sys.argv[1:])
