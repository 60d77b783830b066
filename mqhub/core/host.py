"""What a queue needs from the broker that owns it (a Protocol: queue modules never import it).

:class:`mqhub.core.broker.Broker` is the one implementation; keeping this interface here lets
the queue modules (window, delivery, fan-out, queue) name their host without importing the
broker module, so the core's import graph has no circle.
"""

from __future__ import annotations

from typing import Any, Protocol

from mqhub.core.account import MemoryAccount
from mqhub.core.commits import Commits
from mqhub.core.counters import Counters
from mqhub.core.ids import IdGenerator
from mqhub.store.batch import WriteBatch
from mqhub.store.records import Entry


class QueueHost(Protocol):
    """The broker as a queue sees it."""

    store: Any
    clock: Any
    ids: IdGenerator
    window: int
    window_bytes: int
    tails: MemoryAccount
    windows: MemoryAccount
    commits: Commits
    counters: Counters
    journal: Any  # mqhub.store.journal_recorder (flow journal, batch-level calls)

    def defer(self, queue: Any, entries: list[Entry], when: float, batch: WriteBatch,
              persist: bool = True) -> None:
        """Hold ``entries`` for ``queue`` until ``when``."""

    def persist_settings(self, queue: Any, batch: WriteBatch | None = None) -> None:
        """Persist a durable queue's settings."""

    def schedule_expiry(self, queue: Any) -> None:
        """(Re)arm the deletion of ``queue`` at its ``expires_at``."""

    def delete_queue(self, name: str) -> Any:
        """Delete the queue called ``name``."""
