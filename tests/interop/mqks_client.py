"""MQKS test clients written from the wire format (not from mqhub's codec).

- :class:`MqksSocket`: a raw blocking socket that sends request lines and collects reply lines,
  waiting on conditions with a deadline.
- :class:`MqksClient`: reproduces the wire behaviour of the original ``client/mqks.py`` (Python 2
  + gevent, which cannot run here): a receiver thread that parses ``{id} {ok|error} {data}``
  after ``rstrip('\\r\\n')``, detects a confirm by empty data, keeps each consumer's ``consume``
  string up to date from ``--update`` notices, and on disconnect reconnects after a pause and
  re-sends ``consume`` for every consumer under a *new* consumer id, calling
  ``on_reconnect(old_id, new_id)``.
"""

from __future__ import annotations

import itertools
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from tests.interop.broker import WAIT

HOST = "127.0.0.1"


def pump_until(socks: list[MqksSocket], cond: Callable[[], bool], what: str,
               timeout: float = WAIT) -> None:
    """Read from every socket in ``socks`` until ``cond()`` holds; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        for sock in socks:
            sock.pump(0.01)


class MqksSocket:
    """One raw MQKS connection: ``send`` lines, collect reply lines in ``lines``."""

    def __init__(self, port: int) -> None:
        """Connect to 127.0.0.1:``port``."""
        self.sock = socket.create_connection((HOST, port), timeout=WAIT)
        self.buf = b""
        self.lines: list[bytes] = []
        self.eof = False

    def send(self, *lines: bytes) -> None:
        """Send each line followed by ``\\n``."""
        self.sock.sendall(b"".join(line + b"\n" for line in lines))

    def send_raw(self, data: bytes) -> None:
        """Send ``data`` as it is."""
        self.sock.sendall(data)

    def pump(self, timeout: float = 0.05) -> None:
        """Read what arrives within ``timeout`` into :attr:`lines`."""
        if self.eof:
            return
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 20)
        except TimeoutError:
            return
        except OSError:
            self.eof = True
            return
        if not data:
            self.eof = True
            return
        self.buf += data
        *done, self.buf = self.buf.split(b"\n")
        self.lines.extend(done)

    def until(self, cond: Callable[[list[bytes]], bool], what: str,
              timeout: float = WAIT) -> list[bytes]:
        """Read until ``cond(lines)`` holds; return all lines read so far."""
        deadline = time.monotonic() + timeout
        while not cond(self.lines):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; got {self.lines[-20:]!r}")
            if self.eof:
                raise AssertionError(f"connection closed waiting for {what}; got {self.lines!r}")
            self.pump()
        return self.lines

    def wait_line(self, line: bytes, timeout: float = WAIT) -> None:
        """Wait until exactly ``line`` was received."""
        self.until(lambda ls: line in ls, repr(line), timeout)

    def confirm(self, rid: bytes, action: bytes, data: bytes) -> None:
        """Send ``{rid} {action} --confirm {data}`` and wait for ``{rid} ok `` (trailing space)."""
        self.send(rid + b" " + action + b" --confirm " + data)
        self.wait_line(rid + b" ok ")

    def messages(self, cid: bytes) -> list[dict[str, Any]]:
        """The messages delivered to ``cid`` so far, parsed as the original client does."""
        out = []
        for line in self.lines:
            rid, kind, data = line.split(b" ", 2)
            if rid != cid or kind != b"ok" or not data or data.startswith(b"--update "):
                continue
            mid, props, body = data.split(b" ", 2)
            msg: dict[str, Any] = {"id": mid, "data": body}
            for prop in props.split(b","):
                name, value = prop.split(b"=", 1)
                msg[name.decode()] = value
            out.append(msg)
        return out

    def wait_messages(self, cid: bytes, count: int, timeout: float = WAIT) -> list[dict[str, Any]]:
        """Wait until ``cid`` received at least ``count`` messages; return them."""
        self.until(lambda _: len(self.messages(cid)) >= count, f"{count} messages for {cid!r}",
                   timeout)
        return self.messages(cid)

    def quiet(self, seconds: float = 0.3) -> list[bytes]:
        """Read for ``seconds`` (to check that nothing more arrives); return all lines."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self.eof:
            self.pump(0.05)
        return self.lines

    def wait_closed(self, timeout: float = WAIT) -> None:
        """Wait until the server closed the connection."""
        deadline = time.monotonic() + timeout
        while not self.eof:
            if time.monotonic() > deadline:
                raise AssertionError("the server did not close the connection")
            self.pump()

    def close(self) -> None:
        """Close the socket."""
        try:
            self.sock.close()
        except OSError:
            pass


class MqksClient:
    """The original client's wire behaviour in a thread (see the module docstring)."""

    def __init__(self, port: int, reconnect_seconds: float = 0.2) -> None:
        """Connect at once and start the receiver thread."""
        self.port = port
        self.reconnect_seconds = reconnect_seconds
        self.consumers: dict[str, str] = {}  # consumer id -> consume data (kept up to date)
        self.on_msg: dict[str, Callable[[dict[str, str]], None]] = {}
        self.on_reconnect: dict[str, Callable[[str, str], None]] = {}
        self.confirms: dict[str, threading.Event] = {}
        self.errors: list[str] = []
        self.connects = 0
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._closing = False
        self.sock: socket.socket | None = None
        self._connect()
        self._thread = threading.Thread(target=self._receiver, daemon=True)
        self._thread.start()

    def _request_id(self) -> str:
        """A new request id (the original uses timestamp + random; any unique id works)."""
        return f"{time.strftime('%Y%m%d%H%M%S')}{next(self._ids):06d}c"

    def _connect(self) -> None:
        """Open the socket (retried by the receiver after a disconnect)."""
        self.sock = socket.create_connection((HOST, self.port), timeout=2)
        self.sock.settimeout(None)
        self.connects += 1

    def _send(self, rid: str, action: str, data: str, confirm: bool = False) -> None:
        """Send one request; with ``confirm`` block until ``{rid} ok ``."""
        event = threading.Event()
        if confirm:
            self.confirms[rid] = event
            data = "--confirm " + data
        line = f"{rid} {action} {data}\n".encode()
        with self._lock:
            assert self.sock is not None
            self.sock.sendall(line)
        if confirm and not event.wait(WAIT):
            raise AssertionError(f"no confirm for {rid}")

    def publish(self, event: str, data: str, confirm: bool = False) -> str:
        """Publish; return the message id (the request id)."""
        rid = self._request_id()
        self._send(rid, "publish", f"{event} {data}", confirm)
        return rid

    def consume(self, queue: str, events: list[str], on_msg: Callable[[dict[str, str]], None],
                on_reconnect: Callable[[str, str], None] | None = None,
                delete_queue_when_unused: bool | float = False, manual_ack: bool = False,
                confirm: bool = False) -> str:
        """Start a consumer; return its id."""
        cid = self._request_id()
        parts = [queue, *events]
        if delete_queue_when_unused is not False:
            parts.append("--delete-queue-when-unused" + (
                "" if delete_queue_when_unused is True else f"={delete_queue_when_unused}"))
        if manual_ack:
            parts.append("--manual-ack")
        data = " ".join(parts)
        self.consumers[cid] = data
        self.on_msg[cid] = on_msg
        if on_reconnect:
            self.on_reconnect[cid] = on_reconnect
        self._send(cid, "consume", data, confirm)
        return cid

    def ack(self, cid: str, msg_id: str, confirm: bool = False) -> None:
        """Ack one message."""
        self._send(self._request_id(), "ack", f"{cid} {msg_id}", confirm)

    def reject(self, cid: str, msg_id: str, confirm: bool = False) -> None:
        """Reject one message."""
        self._send(self._request_id(), "reject", f"{cid} {msg_id}", confirm)

    def _receiver(self) -> None:
        """Read lines; dispatch confirms, updates and messages; reconnect on EOF."""
        while not self._closing:
            sock = self.sock
            assert sock is not None
            f = sock.makefile("rb")
            try:
                for raw in f:
                    self._on_line(raw.decode().rstrip("\r\n"))
            except (OSError, ValueError):
                pass
            if self._closing:
                return
            while not self._closing:  # reconnect, then re-consume under new ids
                time.sleep(self.reconnect_seconds)
                try:
                    self._connect()
                    break
                except OSError:
                    continue
            self._reconsume()

    def _on_line(self, line: str) -> None:
        """Handle one reply line as client/mqks.py does."""
        rid, kind, data = line.split(" ", 2)
        if kind == "error":
            self.errors.append(line)
            return
        if data == "":
            event = self.confirms.pop(rid, None)
            if event is not None:
                event.set()
            return
        on_msg = self.on_msg.get(rid)
        if on_msg is None:
            return
        if data.startswith("--update "):
            self.consumers[rid] = data.split(" ", 1)[1]
            return
        msg_id, props, body = data.split(" ", 2)
        msg = {"id": msg_id, "data": body, "consumer": rid}
        for prop in props.split(","):
            name, value = prop.split("=", 1)
            msg[name] = value
        on_msg(msg)

    def _reconsume(self) -> None:
        """Re-send ``consume`` for every consumer with a new id (``on_reconnect(old, new)``)."""
        for old, data in list(self.consumers.items()):
            new = self._request_id()
            del self.consumers[old]
            self.consumers[new] = data
            self.on_msg[new] = self.on_msg.pop(old)
            callback = self.on_reconnect.pop(old, None)
            if callback is not None:
                self.on_reconnect[new] = callback
                callback(old, new)
            try:
                self._send(new, "consume", data)
            except OSError:
                return

    def close(self) -> None:
        """Stop reconnecting and close the socket."""
        self._closing = True
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()
        self._thread.join(5)
