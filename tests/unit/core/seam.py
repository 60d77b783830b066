"""Backends of the core seam for the conformance suite (tests/unit/core/test_seam_conformance.py).

A backend is a :class:`SeamHarness`: a started ``ICore`` plus the few things a test needs that
the seam does not say (how to wait for a Deferred, how to let time pass, how to restart over
the same durable state). :data:`BACKENDS` names a factory per backend; another implementation
of the seam (cluster mode) adds its own factory here and the whole suite runs against it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from mqhub.hub import Hub
from mqhub.interfaces import ICore
from mqhub.store.lmdb import LmdbStore
from mqhub.store.memory import MemoryStore
from mqhub.testing import advance, memory_hub, restart_hub, result_of, settle, start_clock


class SeamHarness(Protocol):
    """What a backend gives the conformance suite."""

    core: ICore

    def wait(self, d: Deferred[Any]) -> Any:
        """Let the backend work until ``d`` fired; return its result (raise its failure)."""

    def settle(self) -> None:
        """Let writes and deliveries issued so far land."""

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass (timers, delays, in-flight timeouts, TTLs run)."""

    def restart(self) -> None:
        """Stop the core and start a new one over the same durable state (``core`` is new)."""

    def close(self) -> None:
        """Release what the backend holds."""


class EmbeddedHarness:
    """The embedded core (Broker, scheduler) over a store on a task.Clock."""

    def __init__(self, store: Any, clock: Clock) -> None:
        """Start a memory hub over the opened ``store`` driven by ``clock``."""
        self.hub: Hub = memory_hub(clock, store=store)
        self.core: ICore = self.hub.broker

    def wait(self, d: Deferred[Any]) -> Any:
        """Run the clock's pending turns, then return what ``d`` fired with."""
        settle(self.hub, 4)
        return result_of(d)

    def settle(self) -> None:
        """Run the clock's pending turns."""
        settle(self.hub, 4)

    def advance(self, seconds: float) -> None:
        """Advance the clock in small steps."""
        advance(self.hub.clock, seconds)

    def restart(self) -> None:
        """Restart broker and scheduler over the same store."""
        self.settle()
        self.hub = restart_hub(self.hub)
        self.core = self.hub.broker

    def close(self) -> None:
        """Stop the core and close the store."""
        self.settle()
        self.hub.scheduler.stopService()
        self.hub.broker.stop()
        self.hub.store.close()
        self.hub.clock.advance(0)


def _memory(tmp: Path) -> SeamHarness:
    """The embedded core over a MemoryStore."""
    clock = start_clock()
    store = MemoryStore(clock=clock)
    store.open()
    return EmbeddedHarness(store, clock)


def _lmdb(tmp: Path) -> SeamHarness:
    """The embedded core over an LmdbStore in ``tmp`` (small bodies inline, big in segments)."""
    clock = start_clock()
    store = LmdbStore(str(tmp / "store"), clock=clock, durability="none", segment_threshold=64)
    store.open()
    return EmbeddedHarness(store, clock)


#: backend name -> factory(tmp_path) of a started harness
BACKENDS: dict[str, Callable[[Path], SeamHarness]] = {
    "embedded-memory": _memory,
    "embedded-lmdb": _lmdb,
}
