"""Commits: the one owner of the core's write batches and their store commits.

Everything the core writes goes through :class:`Commits`: background commits (acks, settings,
bindings), the batch *being filled* while its entries are delivered (a publish, a due slice:
commits issued from inside that delivery join it or follow it, never precede it), the barriers
waiting for all of them, and the settle callbacks that tell a queue its batch reached the
store. Nothing here knows what a queue is: a watcher is any object with
``batch_settled(batch, ok)`` and ``batch_merged(batch, into)`` (see :class:`BatchWatcher`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from twisted.internet.defer import Deferred, succeed
from twisted.python.failure import Failure

from mqhub.store.batch import WriteBatch

log = logging.getLogger(__name__)

__all__ = ["BatchWatcher", "Commits", "SettledCall"]


class BatchWatcher(Protocol):
    """What :meth:`Commits.watch` calls back (a durable queue tracking its uncommitted batches)."""

    def batch_settled(self, batch: WriteBatch, ok: bool) -> None:
        """``batch`` was committed (``ok``) or its commit failed (``ok`` False)."""

    def batch_merged(self, batch: WriteBatch, into: WriteBatch) -> None:
        """``batch`` was merged into ``into`` (it settles with ``into`` now)."""


class SettledCall:
    """A :class:`BatchWatcher` that calls ``settled(ok)`` once its batch's commit settled (see
    :meth:`Commits.on_settled`)."""

    __slots__ = ("settled",)

    def __init__(self, settled: Callable[[bool], object]) -> None:
        """:param settled: called once with True (committed) or False (the commit failed)."""
        self.settled = settled

    def batch_settled(self, batch: WriteBatch, ok: bool) -> None:
        """Call :attr:`settled` (an exception is logged: the other watchers still run)."""
        try:
            self.settled(ok)
        except Exception:
            log.exception("a settle callback failed")

    def batch_merged(self, batch: WriteBatch, into: WriteBatch) -> None:
        """Nothing to do: the watcher moved to ``into`` with the batch."""


class _Barrier:
    """One :meth:`Commits.barrier` call: counts the commits it still waits for."""

    __slots__ = ("left", "failure", "deferred")

    def __init__(self, left: int) -> None:
        """Wait for ``left`` commits."""
        self.left = left
        self.failure: Any = None
        self.deferred: Deferred[None] = Deferred()

    def one_done(self, result: Any) -> None:
        """One awaited commit fired with ``result`` (None or a Failure)."""
        if isinstance(result, Failure) and self.failure is None:
            self.failure = result
        self.left -= 1
        if not self.left:
            if self.failure is not None:
                self.deferred.errback(self.failure)
            else:
                self.deferred.callback(None)


class Commits:
    """Write batches, group commit, joined publishes and settle callbacks over one store.

    :ivar pending: uncommitted store commits -> the barriers waiting for them.
    :ivar filling: the put batch being filled while its entries are delivered, or None.
    """

    def __init__(self, store: Any, clock: Any) -> None:
        """:param store: an opened IMessageStore. :param clock: IReactorTime."""
        self.store = store
        self.clock = clock
        self.pending: dict[Deferred[Any], list[_Barrier]] = {}
        self.filling: WriteBatch | None = None
        self._watchers: dict[int, list[BatchWatcher]] = {}
        #: commits merged into the batch being filled (their Deferreds) and the ones committed
        #: after it
        self._joined: list[Deferred[None]] = []
        self._after: list[tuple[WriteBatch, Deferred[None]]] = []

    # -- settle callbacks ----------------------------------------------------------------------

    def watch(self, batch: WriteBatch, watcher: BatchWatcher) -> None:
        """Call ``watcher.batch_settled(batch, ok)`` once ``batch`` is committed or failed (once
        per call)."""
        self._watchers.setdefault(id(batch), []).append(watcher)

    def on_settled(self, batch: WriteBatch, settled: Callable[[bool], object]) -> None:
        """Call ``settled(ok)`` once the commit of ``batch`` settled, after the watchers
        registered before (the queues its puts went to), before any barrier fires. Register
        only a non-empty batch that is not committed yet."""
        self.watch(batch, SettledCall(settled))

    def _settle(self, result: Any, batch: WriteBatch) -> Any:
        """``batch`` was committed (or failed): tell its watchers."""
        ok = not isinstance(result, Failure)
        for w in self._watchers.pop(id(batch), ()):
            w.batch_settled(batch, ok)
        return result

    # -- commits -------------------------------------------------------------------------------

    def commit(self, batch: WriteBatch) -> Deferred[None]:
        """Commit ``batch`` (background write: failures are logged).

        While a put batch is being filled (its entries are being delivered) the commit joins it
        instead, so it can never reach the store before the puts it settles (see :meth:`_join`).
        """
        if not batch:
            return succeed(None)
        if self.filling is not None:
            return self._join(batch)
        return self._commit_now(batch)

    def _track(self, d: Deferred[None]) -> None:
        """Count ``d`` as pending until it fires (barriers wait for it)."""
        self.pending[d] = []
        d.addBoth(self._done, d)

    def _commit_now(self, batch: WriteBatch, joined: list[Deferred[None]] | None = None,
                    background: bool = True) -> Deferred[None]:
        """Hand ``batch`` to the store now; ``joined`` Deferreds fire with its result.

        ``background``: a failure is logged and the returned Deferred fires with None; else
        (a publish's own commit) the failure is the caller's.
        """
        d = self.store.commit(batch)
        if id(batch) in self._watchers:
            d.addBoth(self._settle, batch)
        if joined:
            d.addBoth(_fire_joined, joined)
        if not d.called:
            self._track(d)
        if background:
            d.addErrback(_log_failure)
        return d

    def _join(self, batch: WriteBatch) -> Deferred[None]:
        """A commit issued while :attr:`filling` is being filled and delivered (an adapter acking,
        rejecting or requeueing inside ``deliver_batch``, or publishing again from there).

        Attempt updates and entry deletes only (acks) are merged into the batch being filled: the
        store applies a batch's puts before its attempts and deletes, so the result is the same
        as committing them after it, in one commit. Anything else is committed right after that
        batch, in issue order. Returns a Deferred that fires when it is stored.
        """
        d: Deferred[None] = Deferred()
        self._track(d)
        d.addErrback(_log_failure)
        if (batch.purges or batch.puts or batch.due_puts or batch.due_deletes
                or batch.meta_puts or batch.meta_deletes):
            self._after.append((batch, d))
            return d
        into = self.filling
        assert into is not None
        for name, items in batch.attempts.items():
            into.set_attempts(name, items)
        for name, runs in batch.deletes.items():
            into.delete_runs(name, runs)
        watchers = self._watchers.pop(id(batch), None)
        if watchers:
            self._watchers.setdefault(id(into), []).extend(watchers)
            for w in set(watchers):
                w.batch_merged(batch, into)
        self._joined.append(d)
        return d

    def _commit_after(self) -> None:
        """Commit the batches issued while a batch was being filled, in issue order."""
        if self._after:
            after, self._after = self._after, []
            for b, proxy in after:
                self._commit_now(b, [proxy])

    # -- the batch being filled ------------------------------------------------------------------------

    def begin(self) -> tuple[WriteBatch, WriteBatch | None]:
        """A publish to queues starts: fill a batch with its puts (or the one being filled, when
        published from inside a delivery). Returns ``(batch, outer)`` for :meth:`finish`
        or :meth:`abort`."""
        outer = self.filling
        batch = self.filling = outer if outer is not None else WriteBatch()
        return batch, outer

    def abort(self, batch: WriteBatch, outer: WriteBatch | None) -> None:
        """The publish begun with :meth:`begin` raised: close (and commit) the batch it filled."""
        self.filling = outer
        if outer is None:
            self.close_batch(batch, None)

    def finish(self, batch: WriteBatch, outer: WriteBatch | None) -> Deferred[None]:
        """The publish begun with :meth:`begin` is delivered: commit its batch (with every commit
        that joined it), then the ones issued after it. Fires when its writes are durable."""
        if outer is not None:
            # published from inside another delivery: stored with the outer batch
            d: Deferred[None] = Deferred()
            self._track(d)
            self._joined.append(d)
            return d
        return self._close(batch, background=False)

    def open_batch(self, batch: WriteBatch) -> WriteBatch | None:
        """Start filling ``batch`` with puts whose entries may be delivered at once; returns the
        batch that was being filled before (give it to :meth:`close_batch`)."""
        prev = self.filling
        self.filling = batch
        return prev

    def close_batch(self, batch: WriteBatch, prev: WriteBatch | None) -> Deferred[None]:
        """Stop filling ``batch`` and commit it, then the batches issued meanwhile."""
        if prev is not None:
            self.filling = prev
            return self.commit(batch)
        return self._close(batch, background=True)

    def _close(self, batch: WriteBatch, background: bool) -> Deferred[None]:
        """Stop filling ``batch`` (no outer one): commit it with every commit that joined it
        (those fire with it; with nothing to store they fire now), then the batches issued
        meanwhile."""
        self.filling = None
        joined, self._joined = self._joined, []
        if batch:
            d = self._commit_now(batch, joined, background)
        else:
            # nothing to store (memory queues); publishes nested in the delivery fire too
            d = succeed(None)
            _fire_joined(None, joined)
        self._commit_after()
        return d

    def fill(self, batch: WriteBatch, fill: Callable[[], object],
                  refused: Callable[[], object] | None = None) -> Deferred[None]:
        """Run ``fill`` (puts into ``batch``) while ``batch`` is being filled; commit it.

        ``refused``: called if the commit fails, after the queues dropped its puts (see
        :meth:`on_settled`); the returned Deferred fires with None either way (a failure is
        logged).
        """
        prev = self.open_batch(batch)
        try:
            fill()
        finally:
            if refused is not None and batch:
                self.on_settled(batch, lambda ok: ok or refused())
            d = self.close_batch(batch, prev)
        return d

    def close_due_batch(self, batch: WriteBatch, prev: WriteBatch | None) -> Any:
        """A scheduler handler filled ``batch``, which the scheduler commits after it returns.

        Returns the after-commit hook (or None), which the scheduler calls with the commit's
        result (None, or the Failure): it settles the watchers and fires the merged commits.
        Until then the scheduler's commit counts as pending (a :meth:`barrier` waits for it).
        Batches issued meanwhile are committed on the next turn, after the scheduler's commit.
        """
        self.filling = prev
        if prev is not None:
            return None
        joined, self._joined = self._joined, []
        if self._after:
            self.clock.callLater(0, self._commit_after)
        if not joined and id(batch) not in self._watchers:
            return None
        stored: Deferred[None] = Deferred()
        self._track(stored)
        stored.addErrback(lambda _: None)    # the scheduler logs its commit's failure
        joined.append(stored)

        def committed(result: Any = None) -> None:
            self._settle(result, batch)
            _fire_joined(result, joined)
        return committed

    # -- barriers ------------------------------------------------------------------------------

    def _done(self, result: Any, d: Deferred[Any]) -> Any:
        """A tracked commit fired: release the barriers that waited for it."""
        for barrier in self.pending.pop(d, ()):
            barrier.one_done(result)
        return result

    def barrier(self) -> Deferred[None]:
        """Fire once every commit issued so far is durable (errback with a store error)."""
        pending = list(self.pending)
        if not pending:
            return succeed(None)
        b = _Barrier(len(pending))
        for d in pending:
            self.pending[d].append(b)
        return b.deferred


def _fire_joined(result: Any, joined: list[Deferred[None]]) -> Any:
    """The batch ``joined`` were merged into was committed: fire them with its result."""
    for d in joined:
        if isinstance(result, Failure):
            d.errback(result)
        else:
            d.callback(None)
    return result


def _log_failure(failure: Any) -> None:
    """Log a background store failure."""
    log.error("store commit failed: %s", failure.getErrorMessage())
