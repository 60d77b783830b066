"""Fixtures shared by the store tests: every IMessageStore provider, opened on a task.Clock."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from mqhub.store.lmdb import LmdbStore
from mqhub.store.memory import MemoryStore
from mqhub.testing import result_of

#: bodies longer than this go to segment files in the LMDB variant (exercises both paths)
SMALL_THRESHOLD = 64


@dataclass
class Harness:
    """A store plus the clock that drives its group commits."""

    store: Any
    clock: Clock

    def result(self, d: Deferred[Any]) -> Any:
        """Let the turn end, then return what ``d`` fired with (raise if it failed or is pending)."""
        self.clock.advance(0)
        return result_of(d)

    def failure(self, d: Deferred[Any]) -> Failure:
        """Let the turn end and return the Failure ``d`` fired with."""
        self.clock.advance(0)
        got: list[Any] = []
        d.addBoth(got.append)
        assert got and isinstance(got[0], Failure), f"expected a failure, got {got!r}"
        return got[0]


def make_lmdb(path: str, clock: Clock, **kw: Any) -> LmdbStore:
    """Open an LmdbStore in ``path`` with test-friendly defaults."""
    kw.setdefault("durability", "sync")
    kw.setdefault("segment_threshold", SMALL_THRESHOLD)
    store = LmdbStore(path, clock=clock, **kw)
    store.open()
    return store


def open_lmdb(path: str, **kw: Any) -> Harness:
    """A Harness over :func:`make_lmdb` on a fresh Clock."""
    clock = Clock()
    return Harness(make_lmdb(path, clock, **kw), clock)


def open_memory() -> Harness:
    """A Harness over an opened MemoryStore on a fresh Clock (the model the LMDB runs are
    compared with)."""
    clock = Clock()
    store = MemoryStore(clock)
    store.open()
    return Harness(store, clock)


def run_handed_back(handed: queue.SimpleQueue[Any] | queue.Queue[Any], until: Callable[[], bool],
                    seconds: float, after: Callable[[], None] = lambda: None) -> None:
    """Run the ``(f, args)`` calls a writer thread handed back (its ``call_from_thread``
    puts them on ``handed``), each followed by ``after()``, until ``until()`` holds; fail if
    that takes longer than ``seconds``."""
    deadline = time.monotonic() + seconds
    while not until():
        assert time.monotonic() < deadline, "the writer thread did not report back"
        try:
            f, args = handed.get(timeout=0.05)
        except queue.Empty:
            continue
        f(*args)
        after()


@pytest.fixture(params=["memory", "lmdb"])
def harness(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Harness]:
    """One opened store of each kind, closed afterwards."""
    clock = Clock()
    if request.param == "memory":
        store: Any = MemoryStore(clock)
        store.open()
    else:
        store = make_lmdb(str(tmp_path / "data"), clock)
    h = Harness(store, clock)
    yield h
    store.close()
