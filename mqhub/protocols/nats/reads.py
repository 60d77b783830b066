"""Where a frame left incomplete at the end of one read ends in the next read.

The NATS parser keeps an immutable ``bytes`` buffer. When a read ends inside a frame, joining
that leftover with the whole next read copied up to 256 KiB per read just to complete one
frame. Instead the parser joins the leftover with only the bytes of the next read that
complete the frame (``frame_completion``), parses that small buffer, then goes on in the
next read itself, without copying it. Sans-IO, no Twisted.
"""

from __future__ import annotations

__all__ = ["frame_completion", "BRIDGE_MAX"]

#: a frame completed by more than this many bytes of the next read is joined the old way
BRIDGE_MAX = 65536

#: operations whose last field is the size of the payload that follows the line
_SIZED = (b"PUB", b"HPUB", b"MSG", b"HMSG")


def frame_completion(left: bytes, data: bytes) -> int:
    """How many bytes of ``data`` complete the one frame that ``left`` starts, or -1.

    ``left`` is what the parser left unparsed: the start of exactly one frame. The answer is
    only a hint for where to split the buffers: -1 (unknown, too far, or ``data`` would be
    used up) means join them whole, which is always correct; a wrong positive answer only
    costs a join later, since the parser checks every frame itself.
    """
    j = left.find(b"\n")
    if j >= 0:
        line = left[:j]
        start = j + 1 - len(left)           # the line is complete: the payload starts in left
    else:
        j = data.find(b"\n", 0, BRIDGE_MAX)
        if j < 0:
            return -1
        line = left + data[:j]
        start = j + 1
    fields = line.split()
    if not fields:
        return -1
    if fields[0].upper() in _SIZED:
        size = fields[-1]
        if len(fields) < 3 or not size.isdigit():
            return -1
        k = start + int(size) + 2
    else:
        k = start
    return k if 0 < k < len(data) and k <= BRIDGE_MAX else -1
