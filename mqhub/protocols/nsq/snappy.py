"""Snappy *framing format* streams for NSQ's ``snappy`` upgrade (optional: needs cramjam).

nsqd wraps the connection in golang/snappy's framed reader and writer after IDENTIFY
negotiated ``snappy``. Chunks are ``[type][3-byte little-endian length][data]``; type 0xff is the
stream identifier ``sNaPpY``, 0x00 compressed data and 0x01 uncompressed data (each with a
4-byte masked CRC-32C first), 0x80-0xfe skippable, 0x02-0x7f reserved and fatal. The encoder
emits one compressed framed block per write (cramjam computes the checksums); the decoder
parses chunks across reads. Incoming checksums are not verified (TCP's are; no CRC-32C is at
hand without another dependency). Without cramjam, ``available()`` is False and the server
declines snappy. Imports no Twisted.
"""

from __future__ import annotations

from typing import Any

from mqhub.protocols.nsq.codec import ProtocolError

_cramjam: Any
try:  # pragma: no cover - depends on the install
    import cramjam as _cramjam
except ImportError:  # pragma: no cover
    _cramjam = None

STREAM_IDENTIFIER = b"\xff\x06\x00\x00sNaPpY"
MAX_CHUNK = 65536 + 4  # the format's limit for a data chunk's payload plus checksum
MAX_PLAIN = 65536  # the format's limit for a chunk's uncompressed bytes (bounds a snappy bomb)


def available() -> bool:
    """True when a snappy implementation is installed."""
    return _cramjam is not None


class SnappyEncoder:
    """Compress each write into framed chunks; the stream identifier goes out once."""

    def __init__(self) -> None:
        """Start a stream (the identifier is sent with the first write)."""
        self._started = False
        self._snappy: Any = _cramjam.snappy if _cramjam is not None else None

    def encode(self, data: bytes) -> bytes:
        """Framed bytes for ``data``."""
        framed = bytes(self._snappy.compress(data))
        if self._started and framed.startswith(STREAM_IDENTIFIER):
            return framed[len(STREAM_IDENTIFIER):]
        self._started = True
        return framed


def _preamble(buf: bytes, start: int, end: int) -> int:
    """The uncompressed length a raw snappy block declares (its leading varint); -1 if cut."""
    value = shift = 0
    for i in range(start, min(end, start + 5)):
        value |= (buf[i] & 0x7F) << shift
        if buf[i] < 0x80:
            return value
        shift += 7
    return MAX_PLAIN + 1 if end - start >= 5 else -1


class SnappyDecoder:
    """Incremental framed-stream decoder (chunks may be split across reads)."""

    def __init__(self) -> None:
        """Start before the stream identifier."""
        self._pending = b""
        self._seen_identifier = False
        self._snappy: Any = _cramjam.snappy if _cramjam is not None else None

    def decode(self, data: bytes) -> bytes:
        """Return the plain bytes of every complete chunk received so far.

        :raises ProtocolError: ``E_BAD_BODY`` (fatal) on a malformed stream.
        """
        buf = self._pending + data if self._pending else data
        out: list[bytes] = []
        pos = 0
        n = len(buf)
        while n - pos >= 4:
            kind = buf[pos]
            length = int.from_bytes(buf[pos + 1:pos + 4], "little")
            end = pos + 4 + length
            if kind in (0x00, 0x01) and length > MAX_CHUNK:
                raise ProtocolError("E_BAD_BODY", "snappy chunk too large")
            if end > n:
                break
            if kind == 0xFF:
                if buf[pos:end] != STREAM_IDENTIFIER:
                    raise ProtocolError("E_BAD_BODY", "invalid snappy stream identifier")
                self._seen_identifier = True
            elif not self._seen_identifier:
                raise ProtocolError("E_BAD_BODY", "missing snappy stream identifier")
            elif kind == 0x00:
                if _preamble(buf, pos + 8, end) > MAX_PLAIN:
                    raise ProtocolError("E_BAD_BODY", "snappy chunk inflates past 65536 bytes")
                try:
                    out.append(bytes(self._snappy.decompress_raw(buf[pos + 8:end])))
                except Exception:
                    raise ProtocolError("E_BAD_BODY", "corrupt snappy chunk") from None
            elif kind == 0x01:
                out.append(buf[pos + 8:end])
            elif kind < 0x80:
                raise ProtocolError("E_BAD_BODY", f"reserved snappy chunk type {kind}")
            pos = end
        self._pending = buf[pos:]
        if len(self._pending) > MAX_CHUNK + 4:
            raise ProtocolError("E_BAD_BODY", "snappy chunk too large")
        return b"".join(out)
