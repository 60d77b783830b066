"""Byte layout of the LMDB store: keys and values of every sub-database.

Shared by the live store (:mod:`mqhub.store.lmdb`) and the snapshot reader, so it imports
neither Twisted nor zope. Every integer is big-endian so LMDB's byte order is time order.

Sub-databases (names are the LMDB database names):

``entries``  ``msg_id:u64 | qid:u32 | 9-priority:u8`` -> entry value (below). Hub msg_ids are
             time-ordered, so new entries land at the end of the tree and are written with
             MDB_APPEND: leaf pages fill up instead of being split in half (format 1 keyed this
             table by queue first, which left every page half full: 2 KiB of disk per 1 KiB
             message).
``ready``    ``qid:u32 | 9-priority:u8 | first_msg_id:u64`` -> ``live:u32 | msg_id:u64 ...``: each
             queue's ready order (priority descending, then msg_id ascending) as *groups*: one
             row per (queue, priority, run of up to GROUP_MAX ids a commit added), holding the
             ids in ascending order and how many of them still have an ``entries`` row.
             Groups of one (queue, priority) never overlap: every id of a group lies between
             its first id and the first id of the next group. Deleting an entry pops only its
             ``entries`` row and lowers its group's ``live`` count once per group touched by the
             batch; a group whose count reaches 0 is deleted. Readers skip ids whose entry is
             gone (:mod:`mqhub.store.ready_groups`). Format 2 kept an empty ``order`` row
             ``qid | 9-priority | msg_id`` per entry instead: two rows written and two deleted
             per message (:mod:`mqhub.store.migrate_v2` converts such a store on open).
             Format 4 adds *packed* groups (below): the top bit of ``live`` (PACKED) marks one,
             and its value is ``PACKED|live:u32 | bits:30 B | msg_id:u64 ...``: bit ``i``
             (little-endian over the 30 bytes) set means id ``i`` is live with its content in
             the group's ``packs`` row; ``live`` is the number of set bits.
``packs``    (format 4) ``qid:u32 | 9-priority:u8 | first_msg_id:u64`` (the key of its packed
             ``ready`` group) -> ``plen:u16 | prefix | n:u16 | len:u32 * n | bodies``: the
             entries of one publish run that share everything but their body (no headers, no
             expiry, inline body, same attempts/deliver_at/address/origin, a prefix under
             64 KiB). Entry ``i``'s
             ``entries``-style value is ``prefix + body_i``. Written once and never rewritten:
             a FIN clears bits in the small group row (one write per group per batch, no
             per-entry delete); the row goes with the group when its last bit is cleared.
             An id of a packed group never has an ``entries`` row: anything that needs one
             (an attempts update, a re-put of the id, an older id put inside the group's range)
             first *unpacks* the group (its live ids become ``entries`` rows, the group a
             format-3 group, the ``packs`` row is deleted; :func:`mqhub.store.ready_groups.
             unpack_group`). Only ids above the last group of their (queue, priority) are
             packed, so packed groups never need an insert.
``messages`` ``msg_id:u64`` -> segment reference of a body kept in a segment file
             (``seg:u32 | offset:u64 | size:u32 | refs:u32``); one row per message, however
             many queues hold it.
``due``      ``when:f64 | key`` -> payload (scheduler rows; positive doubles sort as bytes).
``due_keys`` ``key`` -> ``when:f64`` (so a due row can be replaced by its key).
``expiry``   ``expires_at:f64 | qid:u32 | 9-priority:u8 | msg_id:u64`` -> empty (TTL index).
``meta``     utf-8 key -> value.
``queues``   utf-8 queue name -> ``qid:u32 | count:u64``.
``segments`` ``seg:u32`` -> ``live:u64 | end:u64`` (references into it; committed length).
``sys``      ``b"format"``, ``b"next_qid"``, and ``b"converting"`` while a format-2 store is
             being converted (:mod:`mqhub.store.migrate_v2`).

Format 4 only adds a row kind, so a format-3 store is opened as it is (its rows are valid
format-4 rows) and its ``format`` is set to 4, which the format-3 code refuses; a format-2
store is converted as before (2 -> 4 in one pass: the converted rows are format-3 rows).

Entry value: ``flags:u8 | attempts:u32 | deliver_at:f64 | expires_at:f64 | metalen:u16``,
then the *meta* blob (``alen:u16 | olen:u8 | address | origin | headers-json``) and the body
(empty when ``flags & FLAG_SEGMENT``: the body is then found through ``messages``).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from itertools import accumulate
from json.encoder import encode_basestring_ascii as _json_str
from typing import Any

from mqhub.errors import StoreError

FORMAT_VERSION = 4
#: formats :class:`mqhub.store.lmdb.LmdbStore` converts on open (and snapshots it can read);
#: 2 is rewritten (:mod:`mqhub.store.migrate_v2`), 3 is only relabelled (see above)
MIGRATES_FROM = (2, 3)

#: File (in the store directory) a snapshot holds shared while it copies segments; the live
#: store deletes unreferenced segments only while it can take it exclusively.
SEGMENT_LOCK = "segments.lock"

DB_NAMES = (b"entries", b"ready", b"messages", b"due", b"due_keys", b"expiry", b"meta", b"queues",
            b"segments", b"sys", b"packs")
#: the sub-databases of a format-3 store (format 4 added ``packs``)
DB_NAMES_V3 = DB_NAMES[:-1]
#: ``max_dbs`` for every ``lmdb.open`` of a store index (its sub-databases plus headroom, which
#: also holds format 2's ``order`` database while it is migrated)
MAX_DBS = len(DB_NAMES) + 2
#: the sub-database format 2 kept its per-entry ready order in
V2_ORDER_DB = b"order"

FLAG_SEGMENT = 1
FLAG_EXPIRES = 2

ENTRY_KEY = struct.Struct(">QIB")
ORDER_KEY = struct.Struct(">IBQ")
#: a ``ready`` group key: same layout as ORDER_KEY (its msg_id is the group's first id)
READY_KEY = ORDER_KEY
#: most ids a commit puts in one ``ready`` group (the row then stays under LMDB's ~2 KiB
#: inline value limit of a 4 KiB page, so it never needs overflow pages)
GROUP_MAX = 240
VALUE_HEAD = struct.Struct(">BIddH")
HEAD_SIZE = VALUE_HEAD.size
META_HEAD = struct.Struct(">HB")
#: the most bytes an entry's meta blob holds (``metalen`` is a u16): address, origin and
#: headers together. Addresses are refused long before, where they are accepted
#: (:func:`mqhub.core.address.validate_address`: at most MAX_ADDRESS characters, so 4 KiB of
#: UTF-8); this is the backstop for what is left (headers)
MAX_META = 0xFFFF
MSG_REF = struct.Struct(">IQII")
QUEUE_ROW = struct.Struct(">IQ")
SEG_ROW = struct.Struct(">QQ")
U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")
F64 = struct.Struct(">d")

_ATTEMPTS = struct.Struct(">I")
U16 = struct.Struct(">H")

#: top bit of a ``ready`` group's ``live`` word: the group is packed (format 4)
PACKED = 0x80000000
#: bytes of a packed group's live bitmap (one bit per id, GROUP_MAX ids)
BITS_LEN = GROUP_MAX // 8
#: a run is cut into packed groups of at most this many bytes of bodies and length column: a
#: ``packs`` row then fits in 8 overflow pages of 4 KiB (with a prefix under 100 B), which a
#: deleted group gives back as one run (an inline ``entries`` body under the segment threshold
#: already takes up to 16). A 2-page cap was measured too: 1 KiB put + FIN cost 1.89 instead of
#: 1.11-1.16 us per message (a group per 7 messages), so the longer runs stay
PACK_BYTES = 8 * 4096 - 128

#: where the big-endian msg_id (the ``messages`` key) sits inside an ``entries`` key
KEY_MSG_ID = slice(0, 8)
#: where the big-endian qid sits inside an ``entries`` key
KEY_QID = slice(8, 12)
#: byte offset of expires_at inside an ``entries`` value
EXPIRES_OFFSET = 13

#: decoded meta blobs, shared by every entry with the same address/origin/headers
_meta_decode_cache: dict[bytes, tuple[str, dict[str, str] | None, str]] = {}
_meta_encode_cache: dict[tuple[str, str], bytes] = {}
_CACHE_LIMIT = 4096


def headers_json(headers: dict[str, str]) -> str:
    """``json.dumps(headers, separators=(",", ":"))``, built directly when keys and values are
    strings (about 4x faster; it runs once per message that has its own headers, e.g. MQKS ids).
    """
    try:
        return "{" + ",".join([_json_str(k) + ":" + _json_str(v) for k, v in headers.items()]) + "}"
    except TypeError:  # a value or key that is not a str: the general encoder
        return json.dumps(headers, separators=(",", ":"))


def encode_meta(address: str, headers: dict[str, str] | None, origin: str) -> bytes:
    """Return the meta blob for ``address``, ``headers`` and ``origin``.

    :raises ValueError: when the blob would be over MAX_META bytes or the origin over 255.
    """
    if headers is None:
        cached = _meta_encode_cache.get((address, origin))
        if cached is not None:
            return cached
    a = address.encode()
    o = origin.encode()
    if len(o) > 0xFF:
        raise ValueError(f"origin of {len(o)} bytes is over the 255 an entry holds")
    h = b"" if headers is None else headers_json(headers).encode()
    if len(a) + len(o) + len(h) > MAX_META - META_HEAD.size:
        raise ValueError(f"entry meta (address of {len(a)} bytes, origin, headers of {len(h)}) "
                         f"is over the {MAX_META} bytes an entry holds")
    blob = META_HEAD.pack(len(a), len(o)) + a + o + h
    if headers is None:
        if len(_meta_encode_cache) >= _CACHE_LIMIT:
            _meta_encode_cache.clear()
        _meta_encode_cache[(address, origin)] = blob
    return blob


def decode_meta(blob: bytes) -> tuple[str, dict[str, str] | None, str]:
    """Return ``(address, headers, origin)`` of a meta blob (cached; headers are copied)."""
    got = _meta_decode_cache.get(blob)
    if got is None:
        alen, olen = META_HEAD.unpack_from(blob)
        p = META_HEAD.size
        address = blob[p:p + alen].decode()
        origin = blob[p + alen:p + alen + olen].decode()
        rest = blob[p + alen + olen:]
        headers = json.loads(rest) if rest else None
        got = (address, headers, origin)
        if len(_meta_decode_cache) >= _CACHE_LIMIT:
            _meta_decode_cache.clear()
        _meta_decode_cache[blob] = got
    if got[1] is not None:
        return (got[0], dict(got[1]), got[2])
    return got


def entry_key(qid: int, priority: int, msg_id: int) -> bytes:
    """Return the ``entries`` key of one entry."""
    return ENTRY_KEY.pack(msg_id, qid, 9 - priority)


def order_key(qid: int, priority: int, msg_id: int) -> bytes:
    """Return ``qid | 9-priority | msg_id``: an entry's place in its queue's ready order (the
    tail of its ``expiry`` key; the key of a ``ready`` group starting at ``msg_id``)."""
    return ORDER_KEY.pack(qid, 9 - priority, msg_id)


def to_order_key(key: bytes) -> bytes:
    """Return the :func:`order_key` of an ``entries`` key."""
    return key[8:] + key[:8]


def to_entry_key(key: bytes) -> bytes:
    """Return the ``entries`` key of an :func:`order_key`."""
    return key[5:] + key[:5]


def encode_value(flags: int, attempts: int, deliver_at: float, expires_at: float,
                 meta: bytes, body: bytes) -> bytes:
    """Return an ``entries`` value."""
    return VALUE_HEAD.pack(flags, attempts, deliver_at, expires_at, len(meta)) + meta + body


def with_attempts(value: bytes, attempts: int) -> bytes:
    """Return ``value`` with its attempts counter replaced."""
    return value[:1] + _ATTEMPTS.pack(attempts) + value[5:]


def decode_entry(key: bytes, value: bytes, body: bytes | None = None) -> tuple:
    """Decode one ``entries`` row into an entry tuple (``body`` overrides a segment body)."""
    msg_id, _, pbyte = ENTRY_KEY.unpack(key)
    flags, attempts, deliver_at, expires_at, mlen = VALUE_HEAD.unpack_from(value)
    address, headers, origin = decode_meta(value[HEAD_SIZE:HEAD_SIZE + mlen])
    if body is None:
        body = value[HEAD_SIZE + mlen:]
    return (msg_id, 9 - pbyte, attempts, deliver_at, expires_at, address, headers, body, origin)


def value_address(value: bytes) -> str:
    """Return just the address stored in an ``entries`` value."""
    mlen = VALUE_HEAD.unpack_from(value)[4]
    return decode_meta(value[HEAD_SIZE:HEAD_SIZE + mlen])[0]


def segment_body(txn: Any, messages_db: Any, segments: Any, msg_id: int) -> bytes:
    """Read the body of ``msg_id`` kept in a segment file, through its ``messages`` row.

    :param segments: the :class:`mqhub.store.segments.SegmentLog` the row points into.
    :raises StoreError: when the row is missing or the record is damaged (CorruptRecord).
    """
    row = txn.get(U64.pack(msg_id), db=messages_db)
    if row is None:
        raise StoreError(f"message {msg_id} has no stored body")
    seg, off, size, _ = MSG_REF.unpack_from(row)
    body: bytes = segments.read(seg, off, size)
    return body


def count_addresses(values: Iterable[bytes]) -> dict[str, int]:
    """Return ``{address: number of entries}`` over values of the ``entries`` database."""
    counts: dict[str, int] = {}
    for value in values:
        address = value_address(value)
        counts[address] = counts.get(address, 0) + 1
    return counts


def encode_pack(prefix: bytes, bodies: list[bytes], lengths: bytes | None = None) -> bytes:
    """Return a ``packs`` value: the shared value ``prefix`` and the ``bodies`` of one run
    (``lengths``: their big-endian u32 length column, when the caller has packed it already)."""
    n = len(bodies)
    if lengths is None:
        lengths = struct.pack(f">{n}I", *map(len, bodies))
    return U16.pack(len(prefix)) + prefix + U16.pack(n) + lengths + b"".join(bodies)


def decode_pack(value: bytes) -> tuple[bytes, list[int]]:
    """Return ``(prefix, offsets)`` of a ``packs`` value: body ``i`` is
    ``value[offsets[i]:offsets[i + 1]]`` (``offsets`` has one more item than there are bodies).
    """
    plen = U16.unpack_from(value)[0]
    prefix = value[2:2 + plen]
    p = 2 + plen
    n = U16.unpack_from(value, p)[0]
    p += 2
    return prefix, list(accumulate(struct.unpack_from(f">{n}I", value, p), initial=p + 4 * n))


def time_key(when: float) -> bytes:
    """Return the 8 sortable bytes of a non-negative time (negative times sort as 0)."""
    return F64.pack(when if when > 0.0 else 0.0)
