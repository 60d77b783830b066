"""Whole-read frame scanner of the NATS fast path: mixed PUB traffic without a loop per frame.

Mixed traffic (many subjects, many sizes, one subscriber taking them all, e.g. ``bench.>``)
misses the line cache on nearly every frame, and a Python loop over lines
(``heads.route_heads``) costs about a dozen bytecode steps per frame. Here one compiled
regular expression splits a whole read in C (``re.split``) at every frame's tail:

    <SP> (<size><CR><LF><exactly size bytes><CR><LF>)

The size is matched by a digit trie whose every leaf skips exactly that many bytes
(``.{n}`` with DOTALL is an O(1) jump in ``_sre``), so for canonical sizes up to
:data:`SCAN_LIMIT` (capped by ``max_payload``) a match *is* the end of a NATS frame. The
split yields, per frame, the text before the match and the captured tail ``size CRLF
payload CRLF`` that follows the ``MSG subject sid`` head on the way out. When a piece of
text starts at a frame boundary and is exactly a known head ``PUB subject [reply]`` (no
LF, so no other operation hides in it), that piece, a space and the tail after it are one
whole frame, and its end is again a frame boundary. Stretches of such frames are checked
and delivered with C-level passes over lists: one ``map`` of the receiver's head table
(head -> MSG head, kept by the server per connection) both checks each frame's head and
route and gives its MSG head, and one slice assignment swaps the heads for MSG heads.
Anything else (other operations, bare-LF lines, zero-padded or larger sizes, a payload
holding text that looks like a frame's end) leaves a piece that is no known head, and the
frame there goes the per-line way.

Where the optional C loop (``_scan.c``, built by setup.py) is there, a stretch is framed by it
instead of the split: one call per stretch from the parser's offset, returning that receiver's
MSG frames as one bytes object (no per-frame pieces, no join) and their payload bytes. The
split stays as the fallback (no C compiler at install time), and both give the receiver the
same bytes. Sans-IO, no Twisted.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

#: the optional C loop (setup.py), or None: without it the regular expression frames
scan_run: Callable[[bytes, int, dict[bytes, bytes], int], tuple[bytes, int, int, int]] | None
try:
    from mqhub.protocols.nats._scan import scan_run
except ImportError:  # pragma: no cover - no C compiler where it was installed
    scan_run = None

__all__ = ["HeadScanner", "frame_pattern", "scan_frames", "SCAN_LIMIT", "SCAN_CHUNK",
           "SCAN_MIN", "SCAN_BYTES", "STRETCH_MIN", "BACKOFF_MAX", "HEAD_MAX", "TAIL_PAYLOAD"]

#: largest payload the scanner's pattern frames (larger ones go the per-line way)
SCAN_LIMIT = 4095
#: frames checked by the first pass of a stretch (doubled after each full pass): bounds the
#: work wasted when a stretch ends early
SCAN_CHUNK = 64
#: an attempt delivering fewer frames turns the scanner off for the rest of the buffer
SCAN_MIN = 4
#: buffers with fewer bytes left are not split (the per-line loop is as cheap there)
SCAN_BYTES = 8192
#: a buffer whose stretches averaged fewer frames did not pay for its split (the split
#: costs about a third of what the scanner saves per frame, and each stretch has a fixed
#: cost): the next buffers are skipped
STRETCH_MIN = 32
#: most buffers skipped after such a buffer (0, 1, 3, … doubling, back to 0 after a good one)
BACKOFF_MAX = 64
#: a piece of text longer than this where a frame starts is not looked up as a head (heads
#: are control lines: nats-server's default max_control_line), so no read hashes a long one
HEAD_MAX = 4096

_patterns: dict[int, re.Pattern[bytes]] = {}

#: ``HeadScanner.parts`` while the C loop takes the buffer (no split is made)
NATIVE: list[bytes] = []


def _tail_payloads(limit: int) -> list[int]:
    """Index ``len(tail)`` -> payload bytes of a canonical tail ``size CRLF payload CRLF``
    (``len(tail) = size + len(str(size)) + 4``, which is increasing in ``size``)."""
    table = [0] * (limit + len(str(limit)) + 5)
    for size in range(limit + 1):
        table[size + len(str(size)) + 4] = size
    return table


#: a scanned tail's payload size by the tail's length: a stretch's payload bytes are one
#: C-level ``sum(map(...))`` over its tails, not a count per frame in Python
TAIL_PAYLOAD = _tail_payloads(SCAN_LIMIT)


def _sizes(limit: int, prefix: bytes = b"") -> bytes:
    """Regex source matching ``<n> CRLF <n bytes> CRLF`` for every canonical ``n`` ≤ limit
    whose decimal form starts with ``prefix`` (a digit trie: at most 11 branches a level)."""
    alts = []
    if prefix:
        n = int(prefix)
        alts.append(b"\r\n.{%d}\r\n" % n if n else b"\r\n\r\n")
    if prefix != b"0":
        for d in b"0123456789":
            p = prefix + bytes((d,))
            if int(p) <= limit:
                alts.append(p[-1:] + _sizes(limit, p))
    return alts[0] if len(alts) == 1 else b"(?:" + b"|".join(alts) + b")"


def frame_pattern(limit: int) -> re.Pattern[bytes]:
    """The compiled frame pattern for payloads up to ``limit`` bytes (cached per limit; a
    process has one ``max_payload`` or a few, compiling one takes up to ~0.1 s: ``NatsServer``
    compiles its own when it is built, not in its first large read)."""
    limit = max(0, min(limit, SCAN_LIMIT))
    pat = _patterns.get(limit)
    if pat is None:
        if len(_patterns) >= 8:
            _patterns.clear()
        pat = re.compile(rb" (" + _sizes(limit) + rb")", re.S)
        _patterns[limit] = pat
    return pat


def scan_frames(parts: list[bytes], i: int, r: tuple,
                dappend: Callable[[Any], None]) -> tuple[int, int, int]:
    """Deliver the frames of ``parts`` (a frame-pattern split) from ``parts[i]`` on.

    ``parts[i]`` must start at a frame boundary; frame ``k`` is ``parts[i + 2k]`` (its
    head), a space and ``parts[i + 2k + 1]`` (its tail). The first head's route ``r``
    (``(heads, special, one, table, counts)`` from the head routes) names the receiver:
    ``one`` is its only target ``(owner, out, msg_head)`` and ``table`` maps every head whose
    only target is that connection to its MSG head (the server keeps one such table per
    connection). Frames are taken while ``table`` has their head, so one lookup per frame
    checks that the piece is exactly a head, that it goes to that receiver alone, and gives
    its MSG head. Every frame goes to that one receiver, so the first head's ``counts`` take
    the whole stretch. Returns ``(frames, j, nbytes)``: ``parts[j]`` is the piece after the
    last frame taken, ``nbytes`` the frames' payload bytes.
    """
    if r[1] is not None or r[3] is None:
        return 0, i, 0
    owner, out = r[2][0], r[2][1]
    tget = r[3].get
    last = len(parts) - 1           # parts[last] is the text after the last match
    done = 0
    nbytes = 0
    j = i
    chunk = SCAN_CHUNK
    payload = TAIL_PAYLOAD.__getitem__
    while True:
        m = min((last - j) // 2, chunk)
        if m <= 0:
            break
        msgs = list(map(tget, parts[j:j + 2 * m:2]))
        good = m
        if not all(msgs):       # MSG heads are never empty; ``None in`` compares each
            good = msgs.index(None)
            if not good:
                break
            del msgs[good:]
        block = parts[j:j + 2 * good]          # head, tail, head, tail...
        block[0::2] = msgs                     # ...with each head swapped for its MSG head
        if not out:
            dappend(owner)
        out += block
        nbytes += sum(map(payload, map(len, block[1::2])))
        done += good
        j += 2 * good
        if good < m:
            break
        chunk *= 2
    if done:
        counts = r[4]
        counts[0] += done
        counts[1] += nbytes
    return done, j, nbytes


class HeadScanner:
    """The frame split of the parser's current buffer, kept while parsing moves through it.

    One per parser. The buffer is split once; a later call at another offset walks the
    pieces up to it (frames the per-line paths took in between; when the offset falls inside
    a piece, the rest of that piece is the candidate head); the frame a stretch stopped at
    is left to them without a second attempt. Frames are only delivered
    from a piece that starts exactly at the parser's offset and is a known head, so a
    split that a payload threw out of step costs speed, never correctness. A stretch shorter than
    :data:`SCAN_MIN` turns the scanner off for the rest of the buffer; a buffer whose
    stretches averaged under :data:`STRETCH_MIN` frames makes it skip the next buffers (0, 1,
    3, … up to :data:`BACKOFF_MAX`, back to 0 after a good buffer), so traffic it cannot take
    in long stretches (several receivers) costs almost no split. With the C loop
    (:func:`scan_run`) there is no split: each stretch is framed from the offset by one call,
    under the same rules.
    """

    def __init__(self) -> None:
        """Start without a buffer."""
        self.buf: bytes | None = None
        self.parts: list[bytes] | None = None
        self.index = 0          # parts[index] is a piece before a match, at offset ``at``
        self.at = 0
        self.skip = 0           # buffers still to skip
        self.backoff = 0        # buffers to skip after the next buffer that did not pay
        self.attempts = 0       # stretches tried on this buffer
        self.taken = 0          # frames they delivered
        self.stop = -1          # where the last stretch stopped: a frame it did not take

    def release(self) -> None:
        """Drop the buffer and its pieces (the read is finished); judge how it paid off."""
        self.buf = None
        self.parts = None
        if self.attempts:
            if self.taken < STRETCH_MIN * self.attempts:
                self.skip = self.backoff
                self.backoff = min(2 * self.backoff + 1, BACKOFF_MAX)
            else:
                self.backoff = 0
            self.attempts = self.taken = 0

    def take(self, buf: bytes, pos: int, hget: Callable[[bytes], Any],
             dappend: Callable[[Any], None], max_payload: int) -> tuple[int, int, int]:
        """Deliver frames of ``buf`` from the frame boundary ``pos`` (see :func:`scan_frames`).

        Returns ``(frames, consumed, payload bytes)``; ``(0, 0, 0)`` when nothing can be taken
        at ``pos``.
        """
        if buf is not self.buf:
            self.release()
            self.buf = buf
            if self.skip:
                self.skip -= 1
                return 0, 0, 0
            if len(buf) - pos < SCAN_BYTES:
                return 0, 0, 0
            if scan_run is not None:
                self.parts = NATIVE
                self.stop = -1
                return self._take_native(buf, pos, hget, dappend, max_payload)
            self.parts = frame_pattern(max_payload).split(buf)
            self.index = 0
            self.at = 0
            self.stop = -1
        parts = self.parts
        if parts is None or pos == self.stop:   # that frame goes the per-line way
            return 0, 0, 0
        if parts is NATIVE:
            return self._take_native(buf, pos, hget, dappend, max_payload)
        i = self.index
        at = self.at
        last = len(parts) - 1
        while i < last:                     # frames taken by the per-line paths
            nxt = at + len(parts[i]) + 1 + len(parts[i + 1])
            if nxt > pos:
                break
            at = nxt
            i += 2
        if i >= last or pos - at >= len(parts[i]) or len(parts[i]) - (pos - at) > HEAD_MAX:
            self.index = i
            self.at = at
            return 0, 0, 0  # pos is in a match (out of step), or no head is that long: per line
        if at < pos:
            # the piece holds what the per-line paths took (the end of a frame completed
            # across reads, a PING...) and then, maybe, the head of the frame at pos
            parts[i] = parts[i][pos - at:]
            at = pos
        self.index = i
        self.at = at
        r = hget(parts[i])
        if r is None:
            return 0, 0, 0                  # no PUB head here (a PING...): per line
        k, j, nbytes = scan_frames(parts, i, r, dappend)
        self.attempts += 1
        self.taken += k
        used = 0
        if k:
            if j == last:           # up to the last match: the rest of the buffer follows
                used = len(buf) - len(parts[last]) - pos
            else:                   # heads and tails, and the space between them
                used = sum(map(len, parts[i:j])) + k
            self.index = j
            self.at = self.stop = pos + used
        if k < SCAN_MIN:
            self.parts = None
        return k, used, nbytes

    def _take_native(self, buf: bytes, pos: int, hget: Callable[[bytes], Any],
                     dappend: Callable[[Any], None], max_payload: int) -> tuple[int, int, int]:
        """:meth:`take` by the C loop: the first frame's head names the receiver (as in
        :func:`scan_frames`), whose head table the loop frames the stretch against."""
        i = buf.find(b"\n", pos, pos + HEAD_MAX)
        sp = buf.rfind(b" ", pos, i) if i > 0 else -1
        r = hget(buf[pos:sp]) if sp > pos else None
        if r is None or scan_run is None:
            return 0, 0, 0                  # no PUB head here (a PING...): per line
        if r[1] is None and r[3] is not None:
            data, used, k, nbytes = scan_run(buf, pos, r[3], max_payload)
        else:                               # several receivers: not a scanner's stretch
            data, used, k, nbytes = b"", 0, 0, 0
        self.attempts += 1
        self.taken += k
        if k:
            owner, out = r[2][0], r[2][1]
            if not out:
                dappend(owner)
            out.append(data)
            counts = r[4]
            counts[0] += k
            counts[1] += nbytes
            self.stop = pos + used
        if k < SCAN_MIN:
            self.parts = None
        return k, used, nbytes
