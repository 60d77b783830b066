"""Writing a NATS connection's output straight to its socket (no Twisted send buffer).

Twisted's ``FileDescriptor.write`` appends to a list, asks the reactor for writability, and
on ``doWrite`` joins what is left of the previous buffer with the list: every byte a slow
reader leaves behind is copied again (20 % of the server's CPU at 1 KiB in the profile of
issue 11). While Twisted holds nothing of a connection's output, the server sends the one
joined block of each read with one ``send``/``sendmsg`` here; only what the socket refuses
goes through Twisted. These helpers are the socket side of that; the connection keeps the
order (``mqhub.protocols.nats.connection.NatsConnection._send_direct``).
"""

from __future__ import annotations

import socket
from typing import Any

from twisted.internet import tcp

#: sendmsg takes at most this many buffers (IOV_MAX on Linux)
MAX_IOV = 1024


def direct_socket(transport: Any) -> socket.socket | None:
    """The socket of a plain TCP transport, or None (TLS, test transports, wrappers)."""
    if isinstance(transport, tcp.Connection) and not getattr(transport, "TLS", False):
        return transport.getHandle()
    return None


def send_chunks(sock: socket.socket, chunks: list[bytes]) -> int | None:
    """Send as much of ``chunks`` as the socket takes now; bytes sent, or None on an error.

    One ``send`` for one chunk, ``sendmsg`` (gather, no join) for several, at most
    :data:`MAX_IOV` buffers per call. A full socket buffer is 0 bytes sent, not an error.
    A full socket buffer or an error after an earlier part went out reports the bytes that
    went out (the caller hands on only what follows them, never a byte twice); an error before
    anything went out is None. (EINTR is retried by Python itself, PEP 475.)
    """
    total = 0
    try:
        if len(chunks) == 1:
            return sock.send(chunks[0])
        for i in range(0, len(chunks), MAX_IOV):
            part = chunks[i:i + MAX_IOV]
            n = sock.sendmsg(part)
            total += n
            if n < sum(map(len, part)):
                break
        return total
    except BlockingIOError:
        return total
    except OSError:
        return total or None


def remainder(chunks: list[bytes], sent: int) -> bytes:
    """What is left of ``chunks`` after the first ``sent`` bytes, as one bytes object."""
    if len(chunks) == 1:
        data = chunks[0]
        return data[sent:] if sent else data
    for i, chunk in enumerate(chunks):
        if sent < len(chunk):
            rest = chunks[i + 1:]
            if sent:
                rest.insert(0, chunk[sent:])
            else:
                rest.insert(0, chunk)
            return b"".join(rest)
        sent -= len(chunk)
    return b""
