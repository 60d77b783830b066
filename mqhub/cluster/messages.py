"""How one mqhub message travels as a JetStream message: frames out, entries back.

Out: a publish batch becomes PUB/HPUB frames on ``mq.<address>`` whose header block (built
once per batch when every message shares it) carries what JetStream does not know:
``Mqhub-Origin`` (the publishing protocol), ``Mqhub-Priority`` (0-9, when not 0), ``Nats-TTL``
(per-message TTL, enforced by JetStream) and the message's own headers.

Back: a pulled message (a parser event) becomes an entry tuple
``(msg_id, priority, attempts, deliver_at, expires_at, address, headers, body, origin)``
whose ``msg_id`` is the **stream sequence** (unique in the stream, the same on every node and
across redeliveries) and ``attempts`` JetStream's delivery count. Header blocks are parsed once
and cached (a batch's messages share theirs). Sans-IO: no Twisted.
"""

from __future__ import annotations

from mqhub.protocols.nats.codec import OP_HMSG, ProtocolError, build_headers, parse_headers
from mqhub.records import Entry

__all__ = ["H_ORIGIN", "H_PRIORITY", "H_TTL", "H_DEADLINE", "H_ADDRESS", "H_MSG_ID", "H_SCHEDULER", "RESERVED", "header_block",
           "publish_frames", "BlockCache", "entry_of"]

H_ORIGIN = "Mqhub-Origin"
H_PRIORITY = "Mqhub-Priority"
#: JetStream's per-message TTL header (stream ``allow_msg_ttl``)
H_TTL = "Nats-TTL"
#: absolute expiry (POSIX seconds) when the publisher gave one
H_DEADLINE = "Mqhub-Expires"
#: the address of a message sent to one queue's ``mqq.`` subject (replays, re-queues)
H_ADDRESS = "Mqhub-Address"
#: a prebuilt entry's own id (prebuilt entries, replays): delivered under it, not under
#: its stream sequence
H_MSG_ID = "Mqhub-Msg-Id"
#: set by JetStream on a message a schedule produced
H_SCHEDULER = "Nats-Scheduler"
RESERVED = frozenset({H_ORIGIN, H_PRIORITY, H_TTL, H_DEADLINE, H_ADDRESS, H_MSG_ID,
                      "Nats-Msg-Id", H_SCHEDULER, "Nats-Schedule-Next", "Nats-Schedule",
                      "Nats-Schedule-Target"})
_CACHE_MAX = 4096


def header_block(origin: str, priority: int, ttl: float, expires_at: float,
                 headers: dict[str, str] | None, address: str = "", msg_id: int = 0) -> bytes:
    """The NATS header block of one message ("" when it needs none); ``address`` only for a
    message sent to one queue's subject, ``msg_id`` for a prebuilt entry's own id."""
    items: list[tuple[str, str]] = []
    if address:
        items.append((H_ADDRESS, address))
    if msg_id:
        items.append((H_MSG_ID, str(msg_id)))
    if origin:
        items.append((H_ORIGIN, origin))
    if priority:
        items.append((H_PRIORITY, str(priority)))
    if ttl > 0:
        items.append((H_TTL, f"{max(1, int(ttl + 0.999))}s"))
    if expires_at > 0:
        items.append((H_DEADLINE, repr(expires_at)))
    if headers:
        items.extend((k, v) for k, v in headers.items()
                     if k not in RESERVED and _header_ok(k, v))
    return build_headers(items) if items else b""


def _header_ok(name: str, value: str) -> bool:
    """Whether a header survives the NATS header grammar (no CR/LF, no colon in the name)."""
    return bool(name) and ":" not in name and "\r" not in name and "\n" not in name \
        and "\r" not in value and "\n" not in value


def publish_frames(subject: str, reply: str, bodies: list[bytes],
                   blocks: bytes | list[bytes]) -> list[bytes]:
    """PUB/HPUB frames for ``bodies`` on ``subject`` with ``reply``; ``blocks`` is one header
    block for all (b"" for none) or one per body."""
    subj = subject.encode()
    rep = reply.encode()
    if isinstance(blocks, bytes):
        if not blocks:
            head = b"PUB " + subj + b" " + rep + b" "
            return [head + b"%d\r\n" % len(b) + b + b"\r\n" for b in bodies]
        hlen = len(blocks)
        head = b"HPUB " + subj + b" " + rep + b" %d " % hlen
        return [head + b"%d\r\n" % (hlen + len(b)) + blocks + b + b"\r\n" for b in bodies]
    out = []
    for body, block in zip(bodies, blocks, strict=True):
        if block:
            out.append(b"HPUB %s %s %d %d\r\n%s%s\r\n" % (subj, rep, len(block),
                                                         len(block) + len(body), block, body))
        else:
            out.append(b"PUB %s %s %d\r\n%s\r\n" % (subj, rep, len(body), body))
    return out


#: what a header block says: headers, origin, priority, expires_at, address, msg id, scheduled
Parsed = tuple[dict[str, str] | None, str, int, float, str, int, bool]


class BlockCache:
    """Parsed header blocks: block bytes -> :data:`Parsed` (headers or None, origin, priority,
    expires_at, address or "", own msg id or 0, made by a schedule)."""

    def __init__(self) -> None:
        self._cache: dict[bytes, Parsed] = {}

    def parse(self, block: bytes) -> Parsed:
        """The mqhub view of a header block (cached)."""
        hit = self._cache.get(block)
        if hit is not None:
            return hit
        try:
            _, _, items = parse_headers(block)
        except ProtocolError:
            items = []
        headers: dict[str, str] = {}
        origin = ""
        priority = 0
        expires = 0.0
        address = ""
        msg_id = 0
        scheduled = False
        for name, value in items:
            if name == H_ADDRESS:
                address = value
            elif name == H_MSG_ID:
                msg_id = int(value) if value.isdigit() else 0
            elif name == H_SCHEDULER:
                scheduled = True
            elif name == H_ORIGIN:
                origin = value
            elif name == H_PRIORITY:
                priority = int(value) if value.isdigit() else 0
            elif name == H_DEADLINE:
                try:
                    expires = float(value)
                except ValueError:
                    expires = 0.0
            elif name not in RESERVED:
                headers[name] = value
        hit = (headers or None, origin, min(priority, 9), expires, address, msg_id, scheduled)
        if len(self._cache) >= _CACHE_MAX:
            self._cache.clear()
        self._cache[block] = hit
        return hit


def entry_of(event: tuple, seq: int, delivered: int, blocks: BlockCache) -> tuple[Entry, bool]:
    """The entry of one pulled message (``event`` a MSG/HMSG parser event), and whether a
    schedule produced it."""
    subject = event[1]
    address = subject[3:] if subject.startswith("mq.") else subject
    if event[0] == OP_HMSG:
        headers, origin, priority, expires, direct, own, scheduled = blocks.parse(event[4])
        return (own or seq, priority, delivered, 0.0, expires, direct or address, headers,
                event[5], origin), scheduled
    return (seq, 0, delivered, 0.0, 0.0, address, None, event[4], ""), False
