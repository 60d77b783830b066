"""A memory hub with the VibeMQ factory, and loopback clients on it (unit tests)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mqhub.protocols.vibemq.auth import UserStore
from mqhub.protocols.vibemq.config import VibeMQConfig
from mqhub.protocols.vibemq.queues import QueueRegistry
from mqhub.protocols.vibemq.server import VibeMQFactory
from mqhub.store.memory import MemoryStore
from mqhub.testing import advance, memory_hub, result_of, settle, start_clock
from tests.interop.vibemq_client import LoopbackClient


class Harness:
    """One hub, one VibeMQ factory, any number of clients."""

    def __init__(self, users_file: Path | None = None, **config: Any) -> None:
        clock = start_clock()
        # grouped commits on the Clock, so a PublishAck visibly waits for its commit
        store = MemoryStore(clock)
        store.open()
        self.hub = memory_hub(clock, store=store)
        self.config = VibeMQConfig(**config)
        self.registry = QueueRegistry(self.hub.broker, self.hub.store, self.hub.clock,
                                      self.config.tier, self.config.ack_timeout)
        users = UserStore.load(str(users_file)) if users_file else None
        self.factory = VibeMQFactory(self.hub, self.config, self.registry, users)
        self._port = 40000

    def client(self, connect: bool = True, **kw: Any) -> LoopbackClient:
        """A new connection (Connected unless ``connect`` is False)."""
        self._port += 1
        cl = LoopbackClient(self.hub, self.factory, port=self._port)
        if connect:
            cl.connect(**kw)
        return cl

    def advance(self, seconds: float) -> None:
        """Move the Clock forward in small steps (timers run in order)."""
        advance(self.hub.clock, seconds, step=0.25)

    def result(self, d: Any) -> Any:
        """The result of a core Deferred once this turn's commits and reads landed."""
        settle(self.hub)
        return result_of(d)

    def queue(self, name: str) -> Any:
        """The core queue."""
        return self.hub.broker.queue(name)


def write_users(path: Path) -> Path:
    """A users file with a superuser ``admin/secret`` and ``app/pw`` allowed on ``orders*``."""
    path.write_text(json.dumps({"users": [
        {"username": "admin", "password": "secret", "superuser": True},
        {"username": "app", "password": "pw",
         "permissions": [{"queuePattern": "orders*", "operations": ["Publish", "Subscribe"]}]},
    ]}))
    return path
