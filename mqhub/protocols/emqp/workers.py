"""eMQP workers (jobmanagers on the backend) and eventmq's rule for choosing one.

:class:`Routes` keeps, per eMQP queue, the workers that serve it sorted by weight; a job goes
to the highest weight with a free slot, and workers of equal weight take turns. The order is
kept in place (an insert per worker added, a rotation of one weight's run per pick), never
re-sorted.
"""

from __future__ import annotations

from bisect import bisect_right


def _descending(item: tuple[int, bytes]) -> int:
    """Sort key of a worker-list item: its weight, negated (highest weight first)."""
    return -item[0]


class Worker:
    """A jobmanager connected to the backend (one ZeroMQ identity)."""

    __slots__ = ("peer", "queues", "slots", "since", "last_seen", "inflight", "leaving")

    def __init__(self, peer: bytes, queues: list[tuple[int, str]], now: float) -> None:
        """Register ``peer`` serving ``queues`` (``(weight, name)`` in INFORM order), no slots."""
        self.peer = peer
        self.queues = queues
        self.slots = 0
        self.since = now
        self.last_seen = now
        #: msgid sent to the worker -> (queue name, core msg id, client peer or b"",
        #: wants reply, retryable, the client's msgid, last allowed attempt)
        self.inflight: dict[bytes, tuple[str, int, bytes, bool, bool, bytes, bool]] = {}
        self.leaving = False


class Routes:
    """Per eMQP queue, ``[(weight, worker peer), ...]`` sorted by weight, highest first."""

    def __init__(self) -> None:
        """No queue served yet."""
        self.by_queue: dict[str, list[tuple[int, bytes]]] = {}

    def __contains__(self, qname: object) -> bool:
        """True when a worker has INFORMed queue ``qname`` (even one gone since)."""
        return qname in self.by_queue

    def add(self, worker: Worker) -> None:
        """Route every queue of ``worker`` to it too."""
        for weight, qname in worker.queues:
            lst = self.by_queue.setdefault(qname, [])
            # at the end of its weight's run (the list stays sorted, highest weight first)
            lst.insert(bisect_right(lst, -weight, key=_descending), (weight, worker.peer))

    def remove(self, worker: Worker) -> None:
        """Remove ``worker`` from every queue's worker list."""
        for _, qname in worker.queues:
            lst = self.by_queue.get(qname)
            if lst:
                lst[:] = [item for item in lst if item[1] != worker.peer]

    def pick(self, qname: str, workers: dict[bytes, Worker]) -> Worker | None:
        """eventmq's choice: highest weight with a free slot (taken); equal weights rotate."""
        lst = self.by_queue.get(qname)
        if not lst:
            return None
        start = 0  # where the run of ``lst[i]``'s weight begins
        for i, (weight, peer) in enumerate(lst):
            if weight != lst[start][0]:
                start = i
            worker = workers.get(peer)
            if worker is not None and worker.slots > 0:
                # its weight's run rotates: the ones passed over and it go to the run's end
                end = i + 1
                n = len(lst)
                while end < n and lst[end][0] == weight:
                    end += 1
                if end - start > 1:
                    lst[start:end] = lst[i + 1:end] + lst[start:i + 1]
                worker.slots -= 1
                return worker
        return None
