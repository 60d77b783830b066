"""kill -9 a process that appends with confirmations; no confirmed write may be lost, 20 rounds."""

from __future__ import annotations

import random
from typing import Any

from twisted.internet.task import Clock

from mqhub.store.lmdb import LmdbStore
from mqhub.store.records import BODY, MSG_ID
from mqhub.testing import result_of
from tests.unit.store.child import StoreChild
from tests.unit.store.crash_child import body_for

MODES = [("sync", "inline"), ("sync", "thread"), ("batch", "inline"), ("sync", "auto"),
         ("none", "inline")]


def read_all(store: LmdbStore, clock: Clock, queue: str) -> dict[int, bytes]:
    """Return ``{msg_id: body}`` of every entry of ``queue``."""
    d = store.read_entries(queue, None, 10_000_000)
    clock.advance(0)
    return {e[MSG_ID]: e[BODY] for e in result_of(d)}


def test_sigkill_loses_no_confirmed_write(tmp_path: Any) -> None:
    """20 rounds: start, append/delete with confirmations, SIGKILL at a random moment, recover.

    Every confirmed put is present with its body unless a delete of it was at least attempted;
    every confirmed delete stays deleted; counts agree with the entries; the store reopens.
    """
    data = str(tmp_path / "data")
    rng = random.Random(1234)
    must: dict[str, set[int]] = {"a": set(), "b": set()}
    gone: dict[str, set[int]] = {"a": set(), "b": set()}
    for rnd in range(20):
        durability, writer = MODES[rnd % len(MODES)]
        child = StoreChild(data, (rnd + 1) * 10_000_000, durability, writer)
        child.wait_for(lambda lines: any(x.startswith("P ") for x in lines))
        child.wait_for_lines(len(child.lines) + rng.randrange(1, 200))
        for line in child.kill():
            kind, *rest = line.split()
            if kind == "READY":
                continue
            q, lo, hi = rest[0], int(rest[1]), int(rest[2])
            ids = set(range(lo, hi))
            if kind == "P":
                must[q] |= ids
            elif kind == "d":
                must[q] -= ids
            elif kind == "D":
                gone[q] |= ids
        clock = Clock()
        store = LmdbStore(data, clock=clock, durability="sync", segment_threshold=1024,
                          segment_size=256 << 10)
        store.open()
        for q in ("a", "b"):
            stored = read_all(store, clock, q)
            missing = must[q] - stored.keys()
            assert not missing, f"round {rnd} ({durability}/{writer}): lost {len(missing)} on {q}"
            assert all(stored[i] == body_for(i) for i in must[q])
            assert not gone[q] & stored.keys(), f"round {rnd}: a confirmed delete came back"
            assert result_of(store.count_entries(q)) == len(stored)
        store.close()
    assert sum(map(len, must.values())) > 1000
