"""A MemoryStore whose commits land one step late, like the LMDB writer thread's pipeline."""

from __future__ import annotations

from twisted.internet.defer import Deferred

from mqhub.store.batch import WriteBatch
from mqhub.store.memory import MemoryStore


class PipelinedStore(MemoryStore):
    """:meth:`step` applies the batches handed in before the previous step; the ones handed in
    since wait for the next step. With a publish every step, one is always uncommitted."""

    def __init__(self, visible_early: bool = False) -> None:
        """Empty pipeline. ``visible_early``: a batch is applied (readable) when handed in and
        only confirmed at its step, like a commit whose callback reaches the reactor a turn
        after the writer thread applied it."""
        super().__init__()
        self.visible_early = visible_early
        self.staged: list[tuple[WriteBatch, Deferred[None]]] = []
        self.incoming: list[tuple[WriteBatch, Deferred[None]]] = []

    def commit(self, batch: WriteBatch) -> Deferred[None]:
        """Queue ``batch`` for the step after next."""
        d: Deferred[None] = Deferred()
        if self.visible_early:
            self._apply(batch)
        self.incoming.append((batch, d))
        return d

    def step(self) -> None:
        """Commit the staged group and stage what came in since the last step."""
        staged, self.staged, self.incoming = self.staged, self.incoming, []
        if not self.visible_early:
            for batch, _ in staged:
                self._apply(batch)
        self.commits += 1
        for _, d in staged:
            d.callback(None)

    def drain(self) -> None:
        """Step until nothing is staged or incoming (every commit handed in so far is applied)."""
        while self.staged or self.incoming:
            self.step()
