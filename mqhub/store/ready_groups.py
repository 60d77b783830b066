"""The ready order: ``ready`` group rows, plain (format 3) or packed (format 4); layout in
:mod:`mqhub.store.codec`.

A group row ``qid | 9-priority | first_id -> live:u32 | ids:u64...`` lists, in ascending order,
ids a commit added to one (queue, priority), and how many of them still have an ``entries``
row. Groups of one (queue, priority) never overlap, so walking them in key order and their ids
in list order is the queue's ready order. These functions work on an open py-lmdb transaction
and the ``ready`` database handle; they import neither Twisted nor zope (the snapshot reader
uses them too). Writing and deleting packed groups is :mod:`mqhub.store.packed_groups`; this
module only keeps them intact and unpacks one when an id inside it needs an ``entries`` row.
"""

from __future__ import annotations

import struct
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from typing import Any

from mqhub.store.codec import (
    BITS_LEN,
    ENTRY_KEY,
    GROUP_MAX,
    PACKED,
    READY_KEY,
    U32,
    U64,
    decode_pack,
)

#: the live count at the head of a group row (codec's u32)
LIVE = U32
#: the largest key a group of one (queue, priority) can have, after its 5-byte head
_KEY_MAX_TAIL = b"\xff" * 8


def pack_ids(ids: list[int]) -> bytes:
    """Return ``ids`` as consecutive big-endian u64s."""
    return struct.pack(f">{len(ids)}Q", *ids)


def is_packed(value: bytes) -> bool:
    """Whether a group row's value is a packed group (format 4)."""
    return bool(value[0] & 0x80)


def ids_start(value: bytes) -> int:
    """Byte offset of the first id in a group row's value."""
    return 4 + BITS_LEN if value[0] & 0x80 else 4


def live_count(value: bytes) -> int:
    """Return the live count of a group row (plain or packed)."""
    return int(LIVE.unpack_from(value)[0] & ~PACKED)


def packed_bits(value: bytes) -> int:
    """Return a packed group's live bitmap as an int (bit ``i``: id ``i`` is live)."""
    return int.from_bytes(value[4:4 + BITS_LEN], "little")


def packed_row(bits: int, ids_bytes: bytes) -> bytes:
    """Return a packed group value with live bitmap ``bits`` and packed ids ``ids_bytes``."""
    return LIVE.pack(PACKED | bits.bit_count()) + bits.to_bytes(BITS_LEN, "little") + ids_bytes


def group_ids(value: bytes) -> tuple[int, ...]:
    """Return the ids a group row's value lists (plain or packed)."""
    start = ids_start(value)
    return struct.unpack_from(f">{(len(value) - start) >> 3}Q", value, start)


def last_id(value: bytes) -> int:
    """Return the last (highest) id a group row lists."""
    return int(U64.unpack_from(value, len(value) - 8)[0])


def unpack_group(txn: Any, db: Any, key: bytes, value: bytes, packs: Any, entries: Any
                 ) -> tuple[bytes, int]:
    """Turn the packed group ``key``/``value`` into a plain one: each live id gets its
    ``entries`` row (``prefix + body``; an ``entries`` row this transaction already wrote
    for that id is kept), the ``packs`` row is deleted. Return ``(new value, live bitmap)``.

    The rare path: an attempts update, a re-put, or an older id put into the group's range.
    """
    ids = group_ids(value)
    bits = packed_bits(value)
    pack = txn.get(key, db=packs)
    if pack is not None:
        prefix, offsets = decode_pack(pack)
        qid, pbyte = U32.unpack_from(key)[0], key[4]
        put = txn.put
        for i, msg_id in enumerate(ids):
            if bits >> i & 1:
                put(ENTRY_KEY.pack(msg_id, qid, pbyte),
                    prefix + pack[offsets[i]:offsets[i + 1]], db=entries, overwrite=False)
        txn.delete(key, db=packs)
    new = LIVE.pack(bits.bit_count()) + pack_ids(list(ids))
    txn.put(key, new, db=db)
    return new, bits


def group_row(ids: list[int]) -> bytes:
    """Return the value of a new group holding ``ids`` (all live)."""
    return LIVE.pack(len(ids)) + pack_ids(ids)


def seek_group(cur: Any, key: bytes) -> bool:
    """Put ``cur`` on the group with the greatest key ``<= key`` among groups sharing ``key``'s
    (queue, priority) head; return False (cursor anywhere) when there is none."""
    head = key[:5]
    if cur.set_range(key):
        if cur.key() == key:
            return True
        return bool(cur.prev() and cur.key()[:5] == head)
    return bool(cur.last() and cur.key()[:5] == head)


def _last_group(cur: Any, head: bytes) -> tuple[bytes, bytes] | None:
    """Return ``(key, value)`` of the last group of (queue, priority) ``head``, or None."""
    if seek_group(cur, head + _KEY_MAX_TAIL):
        return bytes(cur.key()), bytes(cur.value())
    return None


def add_ids(txn: Any, db: Any, head: bytes, ids: list[int], packs: Any = None,
            entries: Any = None) -> int:
    """Record new entries ``ids`` (ascending, unique; their ``entries`` rows did not exist
    before this transaction) of the (queue, priority) ``head``: the 5 bytes ``qid | 9-priority``
    that start its group keys (and end its ``entries`` keys).

    Ids above the last group's last id (the common case: hub ids grow with time) extend that
    group up to GROUP_MAX and then start new groups; an older id (a re-put of a deleted entry,
    a migrated store) goes into the group whose range holds it (counted live again if it is
    listed there already as gone), else joins the group before it or starts a group of one.
    A packed group is never extended; one whose range holds an id is unpacked first (``packs``
    and ``entries`` are then needed). Return how many ids were live already (listed in a
    packed group with their content there): their new ``entries`` row replaces that content,
    so the caller must not count them as new entries.
    """
    cur = txn.cursor(db=db)
    last = _last_group(cur, head)
    already = 0
    if last is not None:
        split = bisect_right(ids, last_id(last[1]))
        if split:
            unpacked: set[int] = set()
            for msg_id in ids[:split]:
                already += _insert_one(txn, cur, db, head, msg_id, packs, entries, unpacked)
            ids = ids[split:]
            if not ids:
                return already
            last = _last_group(cur, head)
    start = 0
    if last is not None and not is_packed(last[1]):
        key, value = last
        room = GROUP_MAX - ((len(value) - 4) >> 3)
        if room > 0:
            take = ids[:room]
            txn.put(key, LIVE.pack(LIVE.unpack_from(value)[0] + len(take)) + value[4:]
                    + pack_ids(take), db=db)
            start = len(take)
    for i in range(start, len(ids), GROUP_MAX):
        chunk = ids[i:i + GROUP_MAX]
        txn.put(head + U64.pack(chunk[0]), group_row(chunk), db=db)
    return already


def _insert_one(txn: Any, cur: Any, db: Any, head: bytes, msg_id: int, packs: Any,
                entries: Any, unpacked: set[int]) -> int:
    """Record one new entry ``msg_id`` that is not above the last group's last id; return 1
    when it was live already in a packed group (see :func:`add_ids`), else 0. ``unpacked``
    collects the live ids of groups this call unpacked (they are listed and counted live)."""
    if msg_id in unpacked:
        unpacked.discard(msg_id)
        return 1  # its content was in a pack: the new entries row replaced it
    seek_key = head + U64.pack(msg_id)
    if seek_group(cur, seek_key):
        key = bytes(cur.key())
        value = bytes(cur.value())
        if is_packed(value):
            if msg_id > last_id(value):  # after a packed group: never extended
                txn.put(seek_key, group_row([msg_id]), db=db)
                return 0
            if packs is None:
                raise ValueError("a packed group needs the packs and entries databases")
            value, bits = unpack_group(txn, db, key, value, packs, entries)
            ids = group_ids(value)
            unpacked.update(x for i, x in enumerate(ids) if bits >> i & 1)
            if msg_id in unpacked:
                unpacked.discard(msg_id)
                return 1
        ids = group_ids(value)
        live = LIVE.unpack_from(value)[0] + 1
        if msg_id <= ids[-1]:
            i = bisect_left(ids, msg_id)
            if ids[i] == msg_id:  # listed, its entry gone: live again
                txn.put(key, LIVE.pack(live) + value[4:], db=db)
            else:
                txn.put(key, LIVE.pack(live) + pack_ids([*ids[:i], msg_id, *ids[i:]]), db=db)
            return 0
        if len(ids) < GROUP_MAX:  # between this group and the next one: join this one
            txn.put(key, LIVE.pack(live) + value[4:] + U64.pack(msg_id), db=db)
            return 0
    txn.put(seek_key, group_row([msg_id]), db=db)
    return 0


def remove_ids(txn: Any, db: Any, head: bytes, ids: list[int]) -> None:
    """Lower the live counts for deleted entries ``ids`` (ascending, unique, each of which had
    an ``entries`` row until now) of the (queue, priority) ``head`` (as in :func:`add_ids`):
    one lookup and one write per group touched; a group with nothing live left is deleted.
    Packed groups are left alone (their ids never have ``entries`` rows)."""
    cur = txn.cursor(db=db)
    i = 0
    n = len(ids)
    while i < n:
        if not seek_group(cur, head + U64.pack(ids[i])):
            i += 1  # not listed anywhere (cannot happen in a consistent store): nothing to lower
            continue
        value = cur.value()
        j = bisect_right(ids, U64.unpack_from(value, len(value) - 8)[0], i)
        if j == i or value[0] & 0x80:
            i = max(j, i + 1)
            continue
        live = LIVE.unpack_from(value)[0] - (j - i)
        if live > 0:
            txn.put(bytes(cur.key()), LIVE.pack(live) + bytes(value[4:]), db=db)
        else:
            cur.delete()
        i = j


def iter_ready(txn: Any, db: Any, qid: int, after: tuple[int, int] | None = None
               ) -> Iterator[tuple[bytes, tuple[int, ...], int, int | None]]:
    """Yield ``(group key, ids, skipped, bits)`` per group of queue ``qid`` in ready order,
    starting after ``after = (priority byte, msg_id)``: ``ids`` leaves out the first
    ``skipped`` ids of the group (at or before ``after``); ``bits`` is a packed group's live
    bitmap over the whole group (None for a plain group, whose ids may name entries that are
    gone: callers skip them, ``getmulti`` leaves missing keys out)."""
    cur = txn.cursor(db=db)
    prefix = U32.pack(qid)
    if after is None:
        found = cur.set_range(prefix)
    else:
        key = READY_KEY.pack(qid, after[0], after[1])
        found = seek_group(cur, key) or cur.set_range(key)
    while found:
        k = cur.key()
        if k[:4] != prefix:
            return
        value = cur.value()
        ids = group_ids(value)
        skipped = 0
        if after is not None and k[4] == after[0] and ids and ids[0] <= after[1]:
            skipped = bisect_right(ids, after[1])
            ids = ids[skipped:]
        if ids:
            yield bytes(k), ids, skipped, packed_bits(value) if value[0] & 0x80 else None
        found = cur.next()


def iter_queue_groups(txn: Any, db: Any, qid: int
                      ) -> Iterator[tuple[bytes, int, tuple[int, ...], int | None]]:
    """Yield ``(group key, priority byte, ids, bits)`` of every group of ``qid`` (for purges;
    ``bits`` as in :func:`iter_ready`)."""
    cur = txn.cursor(db=db)
    prefix = U32.pack(qid)
    found = cur.set_range(prefix)
    while found:
        k = bytes(cur.key())
        if k[:4] != prefix:
            return
        value = cur.value()
        yield k, k[4], group_ids(value), packed_bits(value) if value[0] & 0x80 else None
        found = cur.next()
