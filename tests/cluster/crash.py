"""Helpers of the cluster crash tests: a pipelined NSQ producer that keeps going across
refusals and dead nodes, and a consumer that collects what a channel delivers."""

from __future__ import annotations

import time
from collections.abc import Callable

from mqhub.protocols.nsq import codec as wire
from tests.interop.nsq_client import NsqSocket


class Producer:
    """Publishes numbered bodies in pipelined windows; ``confirmed`` holds those OK'd,
    ``refused`` counts the windows answered with an error (or a dead connection)."""

    def __init__(self, port: Callable[[], int], topic: str, window: int = 50) -> None:
        self.port = port
        self.topic = topic
        self.window = window
        self.next = 0
        self.confirmed: list[bytes] = []
        self.refused = 0
        self.sock: NsqSocket | None = None
        self.last_ok = 0.0

    def _connect(self) -> NsqSocket | None:
        try:
            return NsqSocket(self.port())
        except OSError:
            return None

    def step(self) -> bool:
        """Send one window and wait for its answers; True when every one was OK."""
        if self.sock is None:
            self.sock = self._connect()
            if self.sock is None:
                self.refused += 1
                return False
        bodies = [b"p%06d" % (self.next + i) for i in range(self.window)]
        self.next += self.window
        sock = self.sock
        try:
            sock.send(b"".join(wire.encode_pub(self.topic, b) for b in bodies))
            frames = sock.read_until(
                lambda fs: len(fs) >= len(bodies) or any(
                    isinstance(f, wire.ErrorFrame) for f in fs), "answers", timeout=20)
        except (OSError, ConnectionError, AssertionError):
            frames = []
        oks = 0
        for frame in frames:
            if isinstance(frame, wire.Response) and frame.data == b"OK":
                oks += 1
            else:
                break
        self.confirmed.extend(bodies[:oks])   # NSQ answers in command order
        if oks == len(bodies):
            self.last_ok = time.monotonic()
            return True
        self.refused += 1
        sock.close()
        self.sock = None
        return False

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()


class Collector:
    """SUB topic/channel on a node with a large RDY, FIN everything, remember bodies."""

    def __init__(self, port: int, topic: str, channel: str) -> None:
        self.sock = NsqSocket(port)
        self.sock.send(wire.encode_sub(topic, channel) + wire.encode_rdy(2500))
        self.got: list[bytes] = []

    def pump(self, seconds: float = 0.2) -> None:
        msgs = [f for f in self.sock.read(seconds) if isinstance(f, wire.Message)]
        if msgs:
            self.sock.send(b"".join(wire.encode_fin(m.msg_id) for m in msgs))
            self.got.extend(m.body for m in msgs)

    def until_has(self, wanted: list[bytes], timeout: float = 60.0) -> None:
        missing = set(wanted)
        stop = time.monotonic() + timeout
        while True:
            missing -= set(self.got)
            if not missing:
                return
            assert time.monotonic() < stop, \
                f"{len(missing)} confirmed messages never delivered, e.g. {sorted(missing)[:5]}"
            self.pump()
