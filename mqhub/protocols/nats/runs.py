"""Runs of identical PUB frames: found with C-level strided compares, no bytecode per frame.

A publisher streaming one subject at one size sends the same control line over and over; the
codec's fused path (``PubRouter.route_pubs`` (router.py)) delivers such a run in one step per receiver.
``routable`` tells which lines that fused path can take at all. Sans-IO, no Twisted.
"""

from __future__ import annotations

__all__ = ["RUN_MIN", "RUN_MAX_FRAME", "run_length", "routable"]

#: consecutive identical PUB frames worth the run path of ``PubRouter.route_pubs`` (router.py)
RUN_MIN = 8
#: frames above this size are not run through ``bytes.replace`` (it scans them twice; measured
#: 10 % slower at 1 KiB) but appended as prefix/payload-slice pairs built by one comprehension
RUN_MAX_FRAME = 512


def run_length(buf: bytes, pos: int, hlen: int, step: int) -> int:
    """How many frames of ``step`` bytes from ``pos`` repeat the first one's header and CRLF.

    The first frame is ``header (hlen bytes, ending in LF) + payload + CRLF``; each header
    byte and both CRLF bytes are checked column-wise with strided slices (C-level work, no
    bytecode per frame).
    """
    k = (len(buf) - pos) // step
    for o in (*range(hlen), step - 2, step - 1):
        col = buf[pos + o:pos + k * step:step]
        c = buf[pos + o:pos + o + 1]
        lead = len(col) - len(col.lstrip(c))
        if lead < k:
            k = lead
            if k < RUN_MIN:
                return k
    return k


def routable(raw: bytes, stop: tuple[dict[bytes, tuple], dict[bytes, tuple]]) -> bool:
    """True when ``PubRouter.route_pubs`` (router.py) has a simple route for the raw line ``raw``."""
    r = stop[0].get(raw)
    if r is not None:
        return r[1] is None
    if not stop[1] or not raw.endswith(b"\r"):
        return False
    sp = raw.rfind(b" ")
    hr = stop[1].get(raw[:sp])
    return hr is not None and hr[1] is None
