"""Core entries rendered as NSQ message frames (sans-IO: no Twisted import).

The NSQ server hands every delivered batch to :func:`render_messages`; the frame layout is the
codec's ``MSG_HEAD`` (size, frame type, timestamp in ns, attempts) followed by the 16-hex id and
the body. The timestamp is the message id's creation time.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import chain, repeat
from operator import lt

from mqhub.core.ids import EPOCH, SEQ_BITS
from mqhub.protocols.nsq import codec as wire
from mqhub.protocols.nsq.codec import MSG_HEAD
from mqhub.store.records import ATTEMPTS, BODY, MSG_ID

_EPOCH_MS = int(EPOCH * 1000)


def render_messages(messages: list[tuple]) -> bytes:
    """NSQ message frames for core entries (C-level work where the batch allows it).

    Ids are rendered in one go; when every message of the batch has the same body size and
    attempts, frames share one 18-byte head per publish millisecond: one head for a typical
    MPUB, one per millisecond run of ascending ids for pipelined PUBs (see :func:`_ms_runs`).
    """
    if not messages:
        return b""
    ids = [e[MSG_ID] for e in messages]
    hexes = wire.render_ids(ids)
    bodies = [e[BODY] for e in messages]
    pack = MSG_HEAD.pack  # frame type 2 (message) is written as a literal below
    lo = min(ids) >> SEQ_BITS
    hi = max(ids) >> SEQ_BITS
    sizes = set(map(len, bodies))
    if len(sizes) == 1:
        attempts = {e[ATTEMPTS] for e in messages}
        if len(attempts) == 1:
            size, att = sizes.pop() + 30, attempts.pop()
            if lo == hi:
                return _run(pack(size, 2, (_EPOCH_MS + lo) * 1_000_000, att), hexes, bodies)
            if all(map(lt, ids, ids[1:])):
                return b"".join([_run(pack(size, 2, (_EPOCH_MS + ms) * 1_000_000, att),
                                      hexes[i:j], bodies[i:j])
                                 for ms, i, j in _ms_runs(ids, hi)])
    if lo == hi:
        ts = (_EPOCH_MS + lo) * 1_000_000
        return b"".join([pack(len(b) + 30, 2, ts, e[ATTEMPTS]) + h + b
                         for e, h, b in zip(messages, hexes, bodies, strict=True)])
    return b"".join([pack(len(b) + 30, 2, (_EPOCH_MS + (m >> SEQ_BITS)) * 1_000_000, e[ATTEMPTS])
                     + h + b for e, m, h, b in zip(messages, ids, hexes, bodies, strict=True)])


def _run(head: bytes, hexes: tuple[bytes, ...] | list[bytes], bodies: list[bytes]) -> bytes:
    """Frames sharing ``head``: head, hex id, body for each message, in one join (C-level
    interleaving: about 25 ns per message less than concatenating id and body first)."""
    return b"".join(chain.from_iterable(zip(repeat(head), hexes, bodies)))


def _ms_runs(ids: list[int], hi: int) -> list[tuple[int, int, int]]:
    """``(millisecond, start, end)`` of each run of strictly ascending ``ids`` that share a
    publish millisecond (``hi`` is the last one): one bisect per run, so the cost is per
    millisecond, not per message."""
    runs: list[tuple[int, int, int]] = []
    start = 0
    n = len(ids)
    while start < n:
        ms = ids[start] >> SEQ_BITS
        end = n if ms == hi else bisect_left(ids, (ms + 1) << SEQ_BITS, start)
        runs.append((ms, start, end))
        start = end
    return runs
