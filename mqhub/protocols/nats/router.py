"""The NATS fast path: PUB frames delivered straight out of the parser's buffer.

:class:`PubRouter` sits beside the pure parser (:class:`mqhub.protocols.nats.codec.NatsParser`)
and reads the same buffer through the parser's cursor (``window``/``seek``/``next_read``). Each
distinct PUB control line has a *route* (built and cached by the server, see
``NatsServer.resolve``): the receivers' output lists and their ``MSG`` prefixes, so delivering a
frame is appending a prefix and one slice of the buffer (payload and CRLF) per receiver, with
no event tuple, no payload copy and no per-message object. Runs of one repeated line go per run
(``runs.py``), known subjects at new sizes per head (``heads.py``), and long stretches of mixed
traffic for one receiver a whole read at a time (``scan.py``). Whatever the router cannot take
(a new line, a queue group, mq9, a SUB, a PING...) it leaves to the parser's events
(:meth:`PubRouter.slow_run`), so the stream is processed in order. The result is the same as
parsing every event and delivering each PUB by its route: ``tests/unit/protocols/nats/
test_router.py`` checks that on random streams. Sans-IO, no Twisted.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from functools import partial
from typing import Any

from mqhub.protocols.nats.codec import Event, NatsParser
from mqhub.protocols.nats.heads import route_heads
from mqhub.protocols.nats.runs import RUN_MAX_FRAME, RUN_MIN, routable, run_length
from mqhub.protocols.nats.scan import HeadScanner

__all__ = ["PubRouter", "fold_counts"]


class PubRouter:
    """Routes one connection's PUB frames from its parser's buffer (see the module docstring).

    :ivar last_sent: MSG copies written by the last :meth:`route_pubs` call.
    :ivar last_bytes: payload bytes of the PUBs it delivered (nats-server's ``in_bytes``).

    Per-receiver counts (``out_msgs``/``out_bytes`` of ``/connz``) are not kept per message:
    each route carries a count cell that a run, a frame or a scanned stretch adds to, and the
    server folds the cells into its connections' counters when it reads or drops its routes
    (``NatsServer.fold_counts``).
    """

    def __init__(self, parser: NatsParser) -> None:
        """Route out of ``parser``'s buffer (a parser made with ``server=True``)."""
        self.parser = parser
        self.scanner = HeadScanner()
        self.last_sent = 0
        self.last_bytes = 0

    def route_pubs(self, routes: dict[bytes, tuple], dirty: list[Any],
                   head_routes: dict[bytes, tuple] | None = None) -> int:
        """Deliver consecutive PUBs whose raw control line has a simple route.

        ``routes`` maps a raw PUB line (``hit[0]``) to ``(targets, special, size, hits)``, usable
        when ``special`` is None (``hits``: a one-item list counting the frames delivered by it);
        a target ``(owner, out, prefix)`` gets prefix and one slice
        ``payload + CRLF`` appended to ``out`` (``owner`` goes to ``dirty`` when ``out`` was
        empty). ``head_routes`` maps a line's head (``PUB subject [reply]``) to ``(heads,
        special, one, table, counts)`` (``one``: the only target, or None; ``table``: that
        target's head -> MSG head table; ``counts``: ``[frames, payload bytes]`` delivered by
        it), so a new size on a known subject is delivered as ``head`` and
        one slice ``size CRLF payload CRLF`` without parsing. Stops at the first line that
        needs anything else (:meth:`slow_run` takes it); moves only the parser's offset.
        Returns the PUBs delivered; ``last_sent`` then holds the MSG copies written and
        ``last_bytes`` their payload bytes.
        """
        count = self._route(routes, dirty, head_routes)
        if self.parser.next_read():     # the next read, without copying it
            sent, nbytes = self.last_sent, self.last_bytes
            count += self._route(routes, dirty, head_routes)
            self.last_sent += sent
            self.last_bytes += nbytes
        return count

    def slow_run(self, routes: dict[bytes, tuple],
                 head_routes: dict[bytes, tuple]) -> list[Event]:
        """The parser's events up to the next line :meth:`route_pubs` can deliver (or the end);
        an empty list means the read is used up (the scanner lets go of its pieces)."""
        events = self.parser.events_until(partial(routable, stop=(routes, head_routes)))
        if not events:
            self.scanner.release()
        return events

    def _route(self, routes: dict[bytes, tuple], dirty: list[Any],
               head_routes: dict[bytes, tuple] | None) -> int:
        """The loop of :meth:`route_pubs` over the parser's current buffer."""
        parser = self.parser
        at = parser.window()
        if at is None:
            self.last_sent = self.last_bytes = 0
            return 0
        buf, pos = at
        n = len(buf)
        find = buf.find
        get = routes.get
        hget = head_routes.get if head_routes else None
        max_payload = parser.max_payload
        dappend = dirty.append
        count = 0
        extra = 0    # MSG copies beyond one per PUB (the one-target case costs nothing)
        nbytes = 0   # payload bytes of the PUBs delivered
        run_max = max_payload + 4096   # frames up to this size try a run; 0 once one failed
        scanner = self.scanner
        while True:
            i = find(b"\n", pos)
            if i < 0:
                break
            if (r := get(buf[pos:i])) is None:
                if hget is None:
                    break
                # mixed traffic: known subjects at new sizes, a whole stretch at once
                k, used, size = scanner.take(buf, pos, hget, dappend, max_payload)
                if k:
                    pos += used
                    count += k
                    nbytes += size
                    continue
                # what the scanner cannot take: one frame (it retries after), or a stretch
                pos, k, more, size = route_heads(
                    buf, pos, hget, dappend, max_payload,
                    1 if scanner.parts is not None else sys.maxsize)
                if not k:
                    break
                count += k
                extra += more
                nbytes += size
                continue
            if r[1] is not None:
                break
            stop = i + 1 + r[2]
            if stop + 2 > n or buf[stop] != 13 or buf[stop + 1] != 10:
                break
            targets = r[0]
            step = stop + 2 - pos
            if step <= run_max and n - pos >= step * RUN_MIN \
                    and buf[stop + 2:stop + 3 + i - pos] == buf[pos:i + 1] \
                    and buf[pos + step * (RUN_MIN - 1):i + 1 + step * (RUN_MIN - 1)] \
                    == buf[pos:i + 1]:
                k = run_length(buf, pos, i + 1 - pos, step)
                if k >= RUN_MIN:
                    hlen = i + 1 - pos
                    end = pos + k * step
                    if step <= RUN_MAX_FRAME:
                        head = buf[pos:i + 1]
                        seg = buf[pos:end]
                        # a header's only LF ends it, so copies cannot overlap: k of them
                        # means no payload holds one (the replace swaps exactly k headers)
                        if seg.count(head) == k:
                            for owner, out, prefix in targets:
                                if not out:
                                    dappend(owner)
                                out.append(seg.replace(head, prefix))
                            extra += (len(targets) - 1) * k
                            r[3][0] += k
                            nbytes += k * r[2]
                            pos = end
                            count += k
                            continue
                    # larger frames: k payload+CRLF slices in one comprehension, shared
                    pieces = [buf[at:at + step - hlen] for at in range(pos + hlen, end, step)]
                    for owner, out, prefix in targets:
                        if not out:
                            dappend(owner)
                        pairs = [prefix] * (2 * k)
                        pairs[1::2] = pieces
                        out.extend(pairs)
                    extra += (len(targets) - 1) * k
                    r[3][0] += k
                    nbytes += k * r[2]
                    pos = end
                    count += k
                    continue
                run_max = 0     # a failed attempt: no more this call (bounds the work)
            # payload and its CRLF in one slice
            payload = buf[i + 1:stop + 2]
            if len(targets) == 1:
                owner, out, prefix = targets[0]
                if not out:
                    dappend(owner)
                out.append(prefix)
                out.append(payload)
            else:
                extra += len(targets) - 1
                for owner, out, prefix in targets:
                    if not out:
                        dappend(owner)
                    out.append(prefix)
                    out.append(payload)
            r[3][0] += 1
            nbytes += r[2]
            pos = stop + 2
            count += 1
        parser.seek(pos)
        self.last_sent = count + extra
        self.last_bytes = nbytes
        return count


def fold_counts(routes: Iterable[tuple], stats: dict[str, int]) -> None:
    """Move the delivery counts of ``routes`` (line routes ``(targets, special, size, [n])``
    or head routes ``(heads, special, one, table, [n, nbytes])``) onto their receivers'
    ``out_msgs``/``out_bytes`` and ``stats["out_bytes"]``, and zero them."""
    for route in routes:
        cell = route[-1]
        n = cell[0]
        if not n:
            continue
        nbytes = cell[1] if len(cell) > 1 else n * route[2]
        for target in route[0]:
            conn = target[0]
            conn.out_msgs += n
            conn.out_bytes += nbytes
        stats["out_bytes"] += nbytes * len(route[0])
        cell[:] = [0] * len(cell)
