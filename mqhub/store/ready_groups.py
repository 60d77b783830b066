"""Store format 3's ready order: ``ready`` group rows (layout in :mod:`mqhub.store.codec`).

A group row ``qid | 9-priority | first_id -> live:u32 | ids:u64...`` lists, in ascending order,
ids a commit added to one (queue, priority), and how many of them still have an ``entries``
row. Groups of one (queue, priority) never overlap, so walking them in key order and their ids
in list order is the queue's ready order. These functions work on an open py-lmdb transaction
and the ``ready`` database handle; they import neither Twisted nor zope (the snapshot reader
uses them too).
"""

from __future__ import annotations

import struct
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from typing import Any

from mqhub.store.codec import GROUP_MAX, READY_KEY, U32, U64

#: the live count at the head of a group row (codec's u32)
LIVE = U32
#: the largest key a group of one (queue, priority) can have, after its 5-byte head
_KEY_MAX_TAIL = b"\xff" * 8


def pack_ids(ids: list[int]) -> bytes:
    """Return ``ids`` as consecutive big-endian u64s."""
    return struct.pack(f">{len(ids)}Q", *ids)


def group_ids(value: bytes) -> tuple[int, ...]:
    """Return the ids a group row's value lists."""
    return struct.unpack_from(f">{(len(value) - 4) >> 3}Q", value, 4)


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


def add_ids(txn: Any, db: Any, head: bytes, ids: list[int]) -> None:
    """Record new entries ``ids`` (ascending, unique; their ``entries`` rows did not exist
    before this transaction) of the (queue, priority) ``head``: the 5 bytes ``qid | 9-priority``
    that start its group keys (and end its ``entries`` keys).

    Ids above the last group's last id (the common case: hub ids grow with time) extend that
    group up to GROUP_MAX and then start new groups; an older id (a re-put of a deleted entry,
    a migrated store) goes into the group whose range holds it (counted live again if it is
    listed there already as gone), else joins the group before it or starts a group of one.
    """
    cur = txn.cursor(db=db)
    last = _last_group(cur, head)
    if last is not None:
        last_id = U64.unpack_from(last[1], len(last[1]) - 8)[0]
        split = bisect_right(ids, last_id)
        if split:
            for msg_id in ids[:split]:
                _insert_one(txn, cur, db, head, msg_id)
            ids = ids[split:]
            if not ids:
                return
            last = _last_group(cur, head)
    start = 0
    if last is not None:
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


def _insert_one(txn: Any, cur: Any, db: Any, head: bytes, msg_id: int) -> None:
    """Record one new entry ``msg_id`` that is not above the last group's last id."""
    if seek_group(cur, head + U64.pack(msg_id)):
        key = bytes(cur.key())
        value = bytes(cur.value())
        ids = group_ids(value)
        live = LIVE.unpack_from(value)[0] + 1
        if msg_id <= ids[-1]:
            i = bisect_left(ids, msg_id)
            if ids[i] == msg_id:  # listed, its entry gone: live again
                txn.put(key, LIVE.pack(live) + value[4:], db=db)
            else:
                txn.put(key, LIVE.pack(live) + pack_ids([*ids[:i], msg_id, *ids[i:]]), db=db)
            return
        if len(ids) < GROUP_MAX:  # between this group and the next one: join this one
            txn.put(key, LIVE.pack(live) + value[4:] + U64.pack(msg_id), db=db)
            return
    txn.put(head + U64.pack(msg_id), group_row([msg_id]), db=db)


def remove_ids(txn: Any, db: Any, head: bytes, ids: list[int]) -> None:
    """Lower the live counts for deleted entries ``ids`` (ascending, unique, each of which had
    an ``entries`` row until now) of the (queue, priority) ``head`` (as in :func:`add_ids`):
    one lookup and one write per group touched; a group with nothing live left is deleted."""
    cur = txn.cursor(db=db)
    i = 0
    n = len(ids)
    while i < n:
        if not seek_group(cur, head + U64.pack(ids[i])):
            i += 1  # not listed anywhere (cannot happen in a consistent store): nothing to lower
            continue
        value = cur.value()
        j = bisect_right(ids, U64.unpack_from(value, len(value) - 8)[0], i)
        if j == i:
            i += 1
            continue
        live = LIVE.unpack_from(value)[0] - (j - i)
        if live > 0:
            txn.put(bytes(cur.key()), LIVE.pack(live) + bytes(value[4:]), db=db)
        else:
            cur.delete()
        i = j


def iter_ready(txn: Any, db: Any, qid: int, after: tuple[int, int] | None = None
               ) -> Iterator[tuple[int, tuple[int, ...]]]:
    """Yield ``(priority byte, ids)`` per group of queue ``qid`` in ready order, starting after
    ``after = (priority byte, msg_id)``. Ids may name entries that are gone: callers skip
    them (``getmulti`` leaves missing keys out)."""
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
        pbyte = k[4]
        ids = group_ids(cur.value())
        if after is not None and pbyte == after[0] and ids and ids[0] <= after[1]:
            ids = ids[bisect_right(ids, after[1]):]
        if ids:
            yield pbyte, ids
        found = cur.next()


def iter_queue_groups(txn: Any, db: Any, qid: int) -> Iterator[tuple[bytes, int, tuple[int, ...]]]:
    """Yield ``(group key, priority byte, ids)`` of every group of ``qid`` (for purges)."""
    cur = txn.cursor(db=db)
    prefix = U32.pack(qid)
    found = cur.set_range(prefix)
    while found:
        k = bytes(cur.key())
        if k[:4] != prefix:
            return
        yield k, k[4], group_ids(cur.value())
        found = cur.next()
