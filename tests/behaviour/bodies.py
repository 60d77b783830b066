"""Message bodies the behaviour suite sends through every protocol."""

from __future__ import annotations

#: Plain text, a newline (MQKS-style line protocols cannot carry it raw), CRLF inside the body
#: (the NATS and Redis framing terminator), non-UTF-8 bytes with NUL, and 64 KiB of every byte.
BINARY_BODIES = [
    b"plain text",
    b"two\nlines\r\nand CRLF\r\n",
    b"\x00\xff\xfe\x80 not utf-8 \xc3(",
    bytes(range(256)) * 256,
]
#: What eMQP can carry: UTF-8 only (newlines and CRLF included).
UTF8_BODIES = [b"plain text", b"two\nlines\r\nand CRLF\r\n", "caf\u00e9 \u2713 \U0001f680".encode()]
#: What an MQKS request line can carry: no LF, CR or TAB, no trailing whitespace, not empty
#: (the server right-strips each line). Any other bytes, non-UTF-8 included, pass unchanged.
MQKS_BODIES = [b"plain text", b"  leading spaces and \x00 NUL", b"\xff\xfe\x80 not utf-8 \xc3("]
