"""A minimal blocking NATS client on the project's codec (for crash and limit tests)."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

from mqhub.protocols.nats import codec

HOST = "127.0.0.1"


class NatsSocket:
    """One NATS connection: CONNECT sent, INFO read; raw ``send`` and parsed ``events``."""

    def __init__(self, port: int, connect: dict[str, Any] | None = None, timeout: float = 5.0) -> None:
        """Connect, read INFO and send CONNECT (verbose off, headers on) and a PING."""
        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        self.parser = codec.NatsParser(server=False, max_payload=64 << 20)
        opts = {"verbose": False, "pedantic": False, "headers": True, "protocol": 1}
        opts.update(connect or {})
        self.sock.sendall(codec.encode_connect(opts) + b"PING\r\n")
        self.pending: list[tuple] = []
        evs = self.until(lambda e: e[0] == codec.OP_PONG, timeout)
        self.info = next((e for e in evs if e[0] == codec.OP_INFO), None)

    def send(self, data: bytes) -> None:
        """Send raw protocol bytes."""
        self.sock.sendall(data)

    def events(self, timeout: float = 0.5) -> list[tuple]:
        """Events parsed from what arrives within ``timeout``; PINGs are answered."""
        out, self.pending = self.pending, []
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 20)
        except TimeoutError:
            return out
        if not data:
            raise ConnectionError("closed by broker")
        self.parser.receive_data(data)
        for ev in self.parser.events():
            if ev[0] == codec.OP_PING:
                self.send(b"PONG\r\n")
            out.append(ev)
        return out

    def until(self, done: Any, timeout: float = 10.0) -> list[tuple]:
        """Events read until one satisfies ``done``; the ones after it are kept for later."""
        seen: list[tuple] = []
        deadline = time.monotonic() + timeout
        while True:
            for i, ev in enumerate(got := self.events(0.2)):
                if done(ev):
                    seen += got[:i + 1]
                    self.pending = got[i + 1:] + self.pending
                    return seen
            seen += got
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; events {seen[-5:]!r}")

    def request(self, subject: str, payload: bytes, timeout: float = 10.0) -> bytes:
        """Publish with a reply inbox and return the first answer's payload."""
        inbox = f"_INBOX.r{time.monotonic_ns()}"
        self.send(codec.encode_sub(inbox, "999") + codec.encode_pub(subject, payload, reply=inbox))
        evs = self.until(lambda e: e[0] in (codec.OP_MSG, codec.OP_HMSG) and e[1] == inbox, timeout)
        self.send(codec.encode_unsub("999"))
        return bytes(evs[-1][-1])

    def request_json(self, subject: str, body: dict[str, Any]) -> dict[str, Any]:
        """:meth:`request` with JSON in and out."""
        return dict(json.loads(self.request(subject, json.dumps(body).encode())))

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()
