"""The head-route loop of the NATS fast path: PUB lines whose subject is known, any size.

Mixed traffic (many subjects, many sizes) rarely repeats a whole control line, so the codec's
``PubRouter.route_pubs`` (router.py) hands such stretches to :func:`route_heads`: one tight loop with
every name local, per frame one LF search, one space search, two dict lookups (size field
with its CR, see ``sizes.py``; line head ``PUB subject [reply]``) and one slice
``size CRLF payload CRLF`` shared by every target. Sans-IO, no Twisted.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from mqhub.protocols.nats.sizes import SIZES, size_of

__all__ = ["route_heads"]


def route_heads(buf: bytes, pos: int, hget: Callable[[bytes], Any],
                dappend: Callable[[Any], None], max_payload: int,
                limit: int = sys.maxsize) -> tuple[int, int, int, int]:
    """Deliver consecutive complete PUB frames from ``pos`` whose head has a simple route.

    ``hget`` looks a head up as ``(heads, special, one, table, counts)`` (usable when
    ``special`` is None; ``one`` is the only ``(owner, out, head)`` target, or None;
    ``counts`` the route's ``[frames, payload bytes]``, added to per frame); each target gets
    its MSG head and the shared tail appended to ``out`` (``owner`` goes to ``dappend`` when
    ``out`` was empty). Stops before the first line that is incomplete, over ``max_payload``,
    badly framed or without such a route, or after ``limit`` frames. Returns
    ``(pos, delivered, extra, nbytes)``, ``extra`` being the MSG copies beyond one per PUB and
    ``nbytes`` the payload bytes delivered.
    """
    find = buf.find
    rfind = buf.rfind
    sget = SIZES.get
    extra = 0
    done = 0
    nbytes = 0
    for done in range(limit):  # noqa: B007  (read after the loop: the loop index is the count)
        i = find(b"\n", pos)
        if i < 0:
            break
        sp = rfind(b" ", pos, i)
        if sp <= pos:
            break
        size = sget(buf[sp + 1:i])      # b"123\r": digits and CR at once
        if size is None:
            size = size_of(buf[sp + 1:i])
            if size < 0:
                break
        hr = hget(buf[pos:sp])
        if hr is None or hr[1] is not None:
            break
        stop = i + 1 + size
        # a short slice (frame not all here yet) compares unequal too
        if size > max_payload or buf[stop:stop + 2] != b"\r\n":
            break
        counts = hr[4]
        counts[0] += 1
        counts[1] += size
        nbytes += size
        one = hr[2]
        if one is not None:             # one receiver: no loop
            owner, out, head = one
            if not out:
                dappend(owner)
            out.append(head)
            out.append(buf[sp + 1:stop + 2])
        else:
            tail = buf[sp + 1:stop + 2]
            for owner, out, head in hr[0]:
                if not out:
                    dappend(owner)
                out.append(head)
                out.append(tail)
            extra += len(hr[0]) - 1
        pos = stop + 2
    else:
        done = limit
    return pos, done, extra, nbytes
