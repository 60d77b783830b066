"""Shared NSQ helpers for the interop tests: a blocking client on the project's codec and the
HTTP API calls (nsqd's port 4151 role) against a real broker."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from mqhub.protocols.nsq import codec as wire
from tests.interop.broker import BrokerProcess


class NsqSocket:
    """A minimal blocking NSQ client built on the project's codec (for load and crash tests)."""

    def __init__(self, port: int) -> None:
        """Connect to 127.0.0.1:``port`` and send the V2 magic."""
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.sendall(wire.MAGIC_V2)
        self.codec = wire.ClientCodec()

    def send(self, data: bytes) -> None:
        """Send raw command bytes."""
        self.sock.sendall(data)

    def read(self, timeout: float = 0.5) -> list[Any]:
        """Frames that arrive within ``timeout`` (answers heartbeats with NOP); [] on silence."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 20)
        except TimeoutError:
            return []
        if not data:
            raise ConnectionError("closed by broker")
        self.codec.receive_data(data)
        frames = self.codec.frames()
        if any(f == wire.Response(wire.HEARTBEAT) for f in frames):
            self.send(b"NOP\n")
        return frames

    def read_until(self, done: Callable[[list[Any]], bool], what: str,
                   timeout: float = 10.0) -> list[Any]:
        """Frames read until ``done(frames)`` holds; fail naming ``what`` after ``timeout`` s."""
        frames: list[Any] = []
        deadline = time.monotonic() + timeout
        while not done(frames):
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {frames!r}"
            frames += self.read()
        return frames

    def messages_until(self, count: int, what: str, timeout: float = 10.0) -> list[wire.Message]:
        """The message frames of :meth:`read_until` at least ``count`` messages arrived."""
        frames = self.read_until(lambda fs: sum(isinstance(f, wire.Message) for f in fs) >= count,
                                 what, timeout)
        return [f for f in frames if isinstance(f, wire.Message)]

    def consume(self, topic: str, channel: str, want: Callable[[list[bytes]], bool],
                timeout: float = 20.0, fin: bool = True) -> list[wire.Message]:
        """SUB, RDY 2500 and collect (and FIN) messages until ``want(bodies)`` or the deadline."""
        self.send(wire.encode_sub(topic, channel) + wire.encode_rdy(2500))
        got: list[wire.Message] = []
        deadline = time.monotonic() + timeout
        while not want([m.body for m in got]):
            if time.monotonic() > deadline:
                raise AssertionError(f"only {len(got)} messages before the deadline")
            msgs = [f for f in self.read() if isinstance(f, wire.Message)]
            if fin and msgs:
                self.send(b"".join(wire.encode_fin(m.msg_id) for m in msgs))
            got.extend(msgs)
        return got

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()


def request(broker: BrokerProcess, path: str, body: bytes | None = None,
            method: str | None = None) -> tuple[int, Any, bytes]:
    """(status, headers, body) of one HTTP request to the NSQ HTTP port."""
    url = f"http://127.0.0.1:{broker.port('nsq', 'http')}{path}"
    req = urllib.request.Request(url, data=body, method=method or ("POST" if body is not None else "GET"))
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()


def ok(broker: BrokerProcess, path: str, body: bytes | None = b"") -> bytes:
    """POST ``body`` (GET when None) and require status 200; return the answer's body."""
    status, _, data = request(broker, path, body)
    assert status == 200, (path, status, data)
    return data


def stats(broker: BrokerProcess) -> dict[str, Any]:
    """/stats?format=json."""
    return json.loads(request(broker, "/stats?format=json")[2])


def channel_stats(broker: BrokerProcess, topic: str, channel: str) -> dict[str, Any]:
    """One channel's entry of /stats?format=json."""
    (t,) = [t for t in stats(broker)["topics"] if t["topic_name"] == topic]
    return next(c for c in t["channels"] if c["channel_name"] == channel)
