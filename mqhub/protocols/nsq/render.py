"""Core entries rendered as NSQ message frames (sans-IO: no Twisted import).

The NSQ server hands every delivered batch to :func:`render_messages`; the frame layout is the
codec's ``MSG_HEAD`` (size, frame type, timestamp in ns, attempts) followed by the 16-hex id and
the body. The timestamp is the message id's creation time.
"""

from __future__ import annotations

from mqhub.core.ids import EPOCH, SEQ_BITS
from mqhub.protocols.nsq import codec as wire
from mqhub.protocols.nsq.codec import MSG_HEAD
from mqhub.store.records import ATTEMPTS, BODY, MSG_ID

_EPOCH_MS = int(EPOCH * 1000)


def render_messages(messages: list[tuple]) -> bytes:
    """NSQ message frames for core entries (C-level work where the batch allows it).

    Ids are rendered in one go; when every message of the batch has the same body size,
    attempts and publish millisecond (a typical MPUB), all frames share one 18-byte head.
    """
    if not messages:
        return b""
    ids = [e[MSG_ID] for e in messages]
    hexes = wire.render_ids(ids)
    bodies = [e[BODY] for e in messages]
    pack = MSG_HEAD.pack  # frame type 2 (message) is written as a literal below
    lo = min(ids) >> SEQ_BITS
    if lo == max(ids) >> SEQ_BITS:
        ts = (_EPOCH_MS + lo) * 1_000_000
        sizes = set(map(len, bodies))
        if len(sizes) == 1:
            attempts = {e[ATTEMPTS] for e in messages}
            if len(attempts) == 1:
                head = pack(sizes.pop() + 30, 2, ts, attempts.pop())
                return head + head.join(map(bytes.__add__, hexes, bodies))
        return b"".join([pack(len(b) + 30, 2, ts, e[ATTEMPTS]) + h + b
                         for e, h, b in zip(messages, hexes, bodies, strict=True)])
    return b"".join([pack(len(b) + 30, 2, (_EPOCH_MS + (m >> SEQ_BITS)) * 1_000_000, e[ATTEMPTS])
                     + h + b for e, m, h, b in zip(messages, ids, hexes, bodies, strict=True)])
