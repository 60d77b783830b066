"""Helpers for eMQP router tests: a router on a memory hub with list-backed sockets."""

from __future__ import annotations

import json
from typing import Any

from mqhub.protocols.emqp.router import EmqpRouter
from mqhub.testing import advance, memory_hub

V = b"eMQP/1.0"


def job(n: int = 1, path: str = "emqjobs", func: str = "work") -> bytes:
    """An eventmq job body as defer_job builds it."""
    return json.dumps(["run", {"callable": func, "path": path, "args": [n], "kwargs": {},
                               "class_args": [], "class_kwargs": {}}]).encode()


class Rig:
    """A started EmqpRouter with the frames it sent, per socket."""

    def __init__(self, hub: Any = None, **kw: Any) -> None:
        """Build a memory hub (or use ``hub``) and start a router on it."""
        self.hub = hub or memory_hub()
        self.clock = self.hub.clock
        self.front: list[list[bytes]] = []
        self.back: list[list[bytes]] = []
        self.pub: list[list[bytes]] = []
        self.router = EmqpRouter(self.hub, self.front.append, self.back.append, self.pub.append,
                                 **kw)
        self.router.start()

    # peers ---------------------------------------------------------------------------------

    def worker(self, peer: bytes, queues: list | None = None, ready: int = 0) -> None:
        """A jobmanager INFORMs (JSON queues) and sends ``ready`` READYs."""
        raw = json.dumps(queues).encode() if queues is not None else b""
        self.router.backend_received([[peer, b"", V, b"INFORM", b"inf-" + peer.hex().encode(), raw, b"worker"]])
        self.ready(peer, ready)

    def ready(self, peer: bytes, n: int = 1) -> None:
        """``n`` READYs from ``peer``."""
        if n:
            self.router.backend_received([[peer, b"", V, b"READY", b"r%d" % i]
                                          for i in range(n)])

    def request(self, client: bytes, msgid: bytes, queue: bytes = b"default",
                headers: bytes = b"", body: bytes | None = None) -> None:
        """A client REQUEST on the frontend."""
        self.router.frontend_received([[client, b"", V, b"REQUEST", msgid, queue, headers,
                                        body if body is not None else job()]])

    def reply(self, worker: bytes, req: bytes, result: bytes = b'{"value": 1}') -> None:
        """A worker's result REPLY followed by READY, as the jobmanager sends them."""
        self.router.backend_received([[worker, b"", V, b"REPLY", b"x-" + req, result, req],
                                      [worker, b"", V, b"READY", b"y-" + req]])

    # observations ------------------------------------------------------------------------

    def sent(self, where: list, command: bytes, peer: bytes | None = None) -> list:
        """Frames sent on a socket with ``command`` (and to ``peer``)."""
        return [f for f in where if f[3] == command and (peer is None or f[0] == peer)]

    def jobs_to(self, peer: bytes) -> list[bytes]:
        """msgids of the REQUESTs sent to worker ``peer``."""
        return [f[4] for f in self.sent(self.back, b"REQUEST", peer)]

    def queue(self, name: str = "default") -> Any:
        """The core queue behind eMQP queue ``name``."""
        return self.hub.broker.queue("emqp.jobs." + name)

    def tick(self, seconds: float, silent: tuple[bytes, ...] = ()) -> None:
        """Advance the clock; every known worker not in ``silent`` heartbeats each second."""
        end = self.clock.seconds() + seconds
        while self.clock.seconds() < end - 1e-9:
            step = min(1.0, end - self.clock.seconds())
            for peer in list(self.router.workers):
                if peer not in silent:
                    self.router.backend_received([[peer, b"", V, b"HEARTBEAT", b"hb", b"0"]])
            advance(self.clock, step)
