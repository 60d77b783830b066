"""The eMQP peers the router knows, as connection rows for the admin API.

ZeroMQ hides connections: a ROUTER socket only shows the identity a message came from. Workers
and emq-schedulers announce themselves (INFORM) and heartbeat, so they are known until they say
goodbye or fall silent. Clients and publishers do neither; a :class:`PeerTable` remembers each
identity's first and last message and its message count, forgets one silent for ``idle``
seconds or saying DISCONNECT/KBYE, and holds at most ``max_peers`` (the earliest seen go first).
The router marks a whole read at once (:meth:`PeerTable.seen_all`), not each message.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from mqhub.protocols.emqp import frames as F

#: Identities one PeerTable remembers at most.
MAX_PEERS = 10_000
#: Seconds after its last message a client or publisher is no longer listed.
PEER_IDLE = 300.0


class PeerTable:
    """Identities seen on one ROUTER socket: ``peer -> [since, last seen, messages]``."""

    def __init__(self, max_peers: int = MAX_PEERS, idle: float = PEER_IDLE) -> None:
        """Remember at most ``max_peers``; forget a peer silent for ``idle`` seconds."""
        self.max_peers = max_peers
        self.idle = idle
        self.peers: dict[bytes, list[Any]] = {}

    def seen(self, peer: bytes, now: float) -> None:
        """One message from ``peer`` at ``now``."""
        row = self.peers.get(peer)
        if row is None:
            if len(self.peers) >= self.max_peers:
                del self.peers[next(iter(self.peers))]
            self.peers[peer] = [now, now, 1]
        else:
            row[1] = now
            row[2] += 1

    def seen_all(self, peers: list[bytes], now: float) -> None:
        """One message from each item of ``peers`` (arrival order, repeats counted) at ``now``:
        the end of one read, instead of a :meth:`seen` per message. The rows are the same as
        those calls would leave; when the read brings more new peers than the table has room
        for (eviction inside the read), it makes exactly those calls."""
        if not peers:
            return
        table = self.peers
        counts = Counter(peers)
        if len(table) + len(counts) > self.max_peers and \
                len(table) + sum(1 for p in counts if p not in table) > self.max_peers:
            for peer in peers:
                self.seen(peer, now)
            return
        for peer, n in counts.items():
            row = table.get(peer)
            if row is None:
                table[peer] = [now, now, n]
            else:
                row[1] = now
                row[2] += n

    def forget(self, peer: bytes) -> None:
        """``peer`` said goodbye."""
        self.peers.pop(peer, None)

    def expire(self, now: float) -> None:
        """Forget the peers silent for longer than ``idle``."""
        limit = now - self.idle
        for peer in [p for p, row in self.peers.items() if row[1] < limit]:
            del self.peers[peer]


def connection_rows(workers: dict[bytes, Any], schedulers: dict[bytes, float],
                    clients: PeerTable, publishers: PeerTable) -> list[dict[str, Any]]:
    """One row per known peer: socket, identity, kind, since, last seen and what else is known.

    Workers (backend) add their queues, free slots and jobs in flight; schedulers and clients
    (frontend) and publishers (pub-in) their message count.
    """
    rows: list[dict[str, Any]] = []
    for worker in list(workers.values()):
        rows.append({"listener": "emqp-backend", "peer": F.peer_label(worker.peer),
                     "kind": "worker", "since": worker.since, "last_seen": worker.last_seen,
                     "queues": [name for _, name in worker.queues], "slots": worker.slots,
                     "in_flight": len(worker.inflight), "leaving": worker.leaving})
    for socket, table in (("emqp-frontend", clients), ("emqp-pub-in", publishers)):
        for peer, (since, last, count) in list(table.peers.items()):
            if table is publishers:
                kind = "publisher"
            else:
                kind = "scheduler" if peer in schedulers else "client"
            rows.append({"listener": socket, "peer": F.peer_label(peer), "kind": kind,
                         "since": since, "last_seen": last, "messages": count})
    return rows


def row_count(workers: dict[bytes, Any], clients: PeerTable, publishers: PeerTable) -> int:
    """How many rows :func:`connection_rows` returns for these, without building them."""
    return len(workers) + len(clients.peers) + len(publishers.peers)
