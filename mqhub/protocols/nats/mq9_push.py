"""mq9 pushes to mailbox subscribers: the pushing consumer's limit and the plain rendering.

The pushes themselves are :class:`mqhub.protocols.nats.mq9.Mq9`'s; header-less pushes to
plain subscribers are rendered as one bytes per subscriber per push (:func:`render_plain`).
"""

from __future__ import annotations

from mqhub.protocols.nats.encoders import msg_prefix
from mqhub.records import ADDRESS, BODY

#: in-flight limit of a mailbox's pushing consumer. Entries are in flight only from the core's
#: dispatch until the push after their commit (then acked), so this bounds nothing a read did
#: not already hold; a small limit (it was 65,536) let a fast publisher's backlog spill out of
#: the queue's window into the store, to be read back page by page (the before profile in
#: benchmarks/results/nats.md: a quarter of the server's time)
PUSH_BATCH = 1 << 20


def render_plain(entries: list[tuple], sid: str) -> bytes:
    """``MSG subject sid size\\r\\n body\\r\\n`` for each header-less entry, as one bytes."""
    lines: dict[tuple[str, int], bytes] = {}
    parts: list[bytes] = []
    add = parts.append
    for e in entries:
        body = e[BODY]
        key = (e[ADDRESS], len(body))
        line = lines.get(key)
        if line is None:
            line = lines[key] = msg_prefix(key[0], sid, None, key[1])
        add(line)
        add(body)
        add(b"\r\n")
    return b"".join(parts)
