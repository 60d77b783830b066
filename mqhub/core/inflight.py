"""In-flight tracking of a queue: what each consumer holds, until when, and one timer for all.

Every delivered entry sits in one dict keyed by msg_id; its owner record ``(consumer,
deadline)`` is one tuple shared by every message of a delivered batch. Deadlines are tracked
per delivered batch in a heap, so one clock timer per queue serves them all; when it fires, the
expired ids go back to the queue through the one callback it wired (to be requeued). Every
operation takes and returns lists (batch-oriented); nothing is made per message.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable

from twisted.internet.interfaces import IDelayedCall, IReactorTime

from mqhub.core.consumer import Consumer
from mqhub.interfaces import IConsumer
from mqhub.records import NOT_IN_FLIGHT, NOT_OWNER
from mqhub.store.records import Entry

INF = float("inf")

#: what expired on one timer run: consumer -> its ids in flight past their deadline
Expired = dict[IConsumer, list[int]]


class InFlight:
    """The in-flight entries of one queue, their owners and deadlines, and the queue's timer.

    :ivar entries: msg_id -> the entry as delivered (attempts counted).
    """

    __slots__ = ("entries", "_owner", "_deadlines", "_heap_ids", "_seq", "_timer", "_timer_at",
                 "_clock", "_expired")

    def __init__(self, clock: IReactorTime, expired: Callable[[Expired], None]) -> None:
        """Track deadlines on ``clock``; ``expired(by_consumer)`` is called with what timed out."""
        self.entries: dict[int, Entry] = {}
        # msg_id -> (consumer, deadline); one tuple shared by every message of a delivered batch
        self._owner: dict[int, tuple[IConsumer, float]] = {}
        self._deadlines: list[tuple[float, int, list[int]]] = []
        self._heap_ids = 0                    # ids in _deadlines (finished ones included)
        self._seq = 0
        self._timer: IDelayedCall | None = None
        self._timer_at = INF
        self._clock = clock
        self._expired = expired

    def __len__(self) -> int:
        """Messages in flight."""
        return len(self.entries)

    @property
    def heap_ids(self) -> int:
        """Ids the deadline heap holds (finished ones too, until it is compacted)."""
        return self._heap_ids

    # -- delivering ----------------------------------------------------------------------------

    def add(self, consumer: Consumer, ids: list[int], out: list[Entry],
            deadline: float) -> None:
        """``out`` (with ids ``ids``) was delivered to ``consumer`` and is due back by
        ``deadline``."""
        self.entries.update(zip(ids, out, strict=False))
        self._owner.update(dict.fromkeys(ids, (consumer, deadline)))
        n = len(out)
        consumer.in_flight += n
        if consumer.credit > 0:
            consumer.credit -= n
        self._push(deadline, ids)

    def _push(self, deadline: float, ids: list[int]) -> None:
        """Track ``ids`` expiring at ``deadline``; arm the timer if it is the earliest."""
        self._seq += 1
        heapq.heappush(self._deadlines, (deadline, self._seq, ids))
        self._heap_ids += len(ids)
        if self._heap_ids > 4 * len(self._owner) + 4096:
            self._compact()
        if deadline < self._timer_at:
            self._arm(deadline)

    def _compact(self) -> None:
        """Rebuild the deadline heap from what is still in flight (finished ids leave it here)."""
        groups: dict[tuple[IConsumer, float], list[int]] = {}
        for mid, rec in self._owner.items():
            groups.setdefault(rec, []).append(mid)
        heap = []
        for rec, ids in groups.items():
            self._seq += 1
            heap.append((rec[1], self._seq, ids))
        heapq.heapify(heap)
        self._deadlines = heap
        self._heap_ids = len(self._owner)

    def _arm(self, when: float) -> None:
        """Arm the one timer for ``when``."""
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        clock = self._clock
        self._timer_at = when
        self._timer = clock.callLater(max(0.0, when - clock.seconds()), self._on_timer)

    def _on_timer(self) -> None:
        """Hand every in-flight id past its deadline to the queue, then re-arm."""
        self._timer = None
        self._timer_at = INF
        now = self._clock.seconds()
        heap = self._deadlines
        expired: Expired = {}
        owner = self._owner
        while heap and heap[0][0] <= now:
            _, _, ids = heapq.heappop(heap)
            self._heap_ids -= len(ids)
            for mid in ids:
                rec = owner.get(mid)
                if rec is not None and rec[1] <= now:
                    expired.setdefault(rec[0], []).append(mid)
        if expired:
            self._expired(expired)
        if self._deadlines:
            self._arm(self._deadlines[0][0])

    def stop(self) -> None:
        """Cancel the timer (the broker is stopping, or the queue was emptied)."""
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def clear(self) -> None:
        """Forget every in-flight entry and deadline (the queue was emptied); the consumers'
        counts are the queue's to reset."""
        self.entries.clear()
        self._owner.clear()
        self._deadlines = []
        self._heap_ids = 0
        self.stop()
        self._timer_at = INF

    # -- finishing -----------------------------------------------------------------------------

    def take(self, consumer: IConsumer, msg_ids: Iterable[int]) -> tuple[list[Entry], list[int]]:
        """Pop the in-flight entries of ``msg_ids`` on ``consumer``; return (entries,
        the ids that were not in flight on it).

        Fast path (C-level passes only): the owner records are popped at once; when every id
        was in flight on ``consumer`` (one shared record per delivered batch), the entries are
        popped too. An unknown or repeated id, or one in flight on another consumer, puts the
        records back and takes the careful per-id path.
        """
        ids = msg_ids if isinstance(msg_ids, list) else list(msg_ids)
        owner = self._owner
        n = len(ids)
        if n:
            recs: list[tuple[IConsumer, float]] = []
            try:
                recs.extend(map(owner.pop, ids))
            except KeyError:
                mine = False
            else:
                first = recs[0]
                if recs.count(first) == n:  # identity compare: one shared record
                    mine = first[0] is consumer
                else:
                    mine = all(rec[0] is consumer for rec in set(recs))
            if mine:
                got = list(map(self.entries.pop, ids))
                consumer.in_flight -= n
                return got, []
            owner.update(zip(ids, recs, strict=False))  # as it was (``recs`` may be short)
        entries = self.entries
        got = []
        failed: list[int] = []
        for mid in ids:
            rec = owner.get(mid)
            if rec is None or rec[0] is not consumer:
                failed.append(mid)
                continue
            del owner[mid]
            got.append(entries.pop(mid))
        consumer.in_flight -= len(got)
        return got, failed

    def touch(self, consumer: IConsumer, msg_ids: Iterable[int], deadline: float) -> list[int]:
        """Move the deadline of ``consumer``'s ``msg_ids`` to ``deadline``; return the ids not
        in flight on it."""
        failed: list[int] = []
        touched: list[int] = []
        rec = (consumer, deadline)
        owner = self._owner
        for mid in msg_ids:
            old = owner.get(mid)
            if old is None or old[0] is not consumer:
                failed.append(mid)
            else:
                owner[mid] = rec
                touched.append(mid)
        if touched:
            self._push(deadline, touched)
        return failed

    # -- reading -------------------------------------------------------------------------------

    def owner(self, msg_id: int) -> IConsumer | None:
        """The consumer holding ``msg_id``, or None."""
        rec = self._owner.get(msg_id)
        return None if rec is None else rec[0]

    def held_by(self, consumer: IConsumer) -> list[int]:
        """The ids ``consumer`` holds."""
        return [mid for mid, rec in self._owner.items() if rec[0] is consumer]

    def reasons(self, consumer: IConsumer, msg_ids: Iterable[int]) -> list[tuple[int, str]]:
        """``(msg_id, NOT_IN_FLIGHT | NOT_OWNER | "ok")`` for ``consumer`` and each id."""
        owner = self._owner
        out: list[tuple[int, str]] = []
        for mid in msg_ids:
            rec = owner.get(mid)
            if rec is None:
                out.append((mid, NOT_IN_FLIGHT))
            elif rec[0] is consumer:
                out.append((mid, "ok"))
            else:
                out.append((mid, NOT_OWNER))
        return out
