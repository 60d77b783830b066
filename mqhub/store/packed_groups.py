"""Packed ``ready`` groups (store format 4): one ``ready`` row and one ``packs`` row per run.

A uniform publish run (inline bodies, no headers or expiry, one shared value prefix) of ids
above the last group of its (queue, priority) is written as packed groups: no ``entries`` row
per message. A FIN clears the ids' bits in the group row, once per group per batch. Layout and
invariants in :mod:`mqhub.store.codec`; plain groups and unpacking are
:mod:`mqhub.store.ready_groups`. No Twisted or zope import (the snapshot reader uses it).
"""

from __future__ import annotations

import struct
import sys
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from itertools import accumulate
from operator import lt
from typing import Any

from mqhub.store import codec, ready_groups
from mqhub.store.codec import GROUP_MAX, HEAD_SIZE, PACK_BYTES, U32, U64, VALUE_HEAD
from mqhub.store.ready_groups import last_id, packed_bits, packed_row, seek_group

#: a FIN that leaves at most 1/UNPACK_SHARE of a packed group's ids live (at most 7 of 240)
#: unpacks it: the few left get ``entries`` rows and the ``packs`` row is freed
UNPACK_SHARE = 32
#: the largest key a group of one (queue, priority) can have, after its 5-byte head
_KEY_MAX_TAIL = b"\xff" * 8
_PLUS_4 = (4).__add__
#: ``array`` holds native-order items; the rows hold big-endian ones
_SWAP = sys.byteorder == "little"


def add_run(txn: Any, ready: Any, packs: Any, head: bytes, ids: list[int], prefix: bytes,
            bodies: list[bytes]) -> bool:
    """Write new entries ``ids`` (with ``bodies``, sharing value ``prefix``) of the (queue,
    priority) ``head`` as packed groups; return False, writing nothing, unless the ids are
    ascending, unique and above every id listed for ``head`` (then none of them has an
    ``entries`` row or a place in a group: the caller writes them the plain way instead), or
    when ``prefix`` is too long for the ``packs`` row's u16 length (an address near 64 KiB).

    The id and body-length columns are packed once for the whole run and cut per group (one
    ``array`` or ``struct`` call each, no per-message Python step)."""
    n = len(ids)
    if len(prefix) > 0xFFFF or not n:
        return False
    column = array("Q", ids)  # ids are u64 (OverflowError otherwise, as struct would raise)
    if n > 1 and not (ids[-1] - ids[0] == n - 1
                      and column == array("Q", range(ids[0], ids[-1] + 1))
                      or all(map(lt, ids, ids[1:]))):  # consecutive (usual) or ascending
        return False
    cur = txn.cursor(db=ready)
    if seek_group(cur, head + _KEY_MAX_TAIL) and ids[0] <= last_id(cur.value()):
        return False
    if _SWAP:
        column.byteswap()
    packed_ids = column.tobytes()  # big-endian u64s, as pack_ids writes them
    sizes = list(map(len, bodies))
    if sizes.count(sizes[0]) == n:  # one body size (the usual run)
        lengths = U32.pack(sizes[0]) * n
    else:
        lengths = struct.pack(f">{n}I", *sizes)
    put = txn.put
    for start, end in group_spans(sizes):
        key = head + U64.pack(ids[start])
        put(key, packed_row((1 << (end - start)) - 1, packed_ids[8 * start:8 * end]), db=ready)
        put(key, codec.encode_pack(prefix, bodies[start:end], lengths[4 * start:4 * end]),
            db=packs)
    return True


def group_spans(sizes: list[int]) -> list[tuple[int, int]]:
    """Cut a run of bodies of ``sizes`` into packed groups: ``(start, end)`` spans in order,
    each the longest run from ``start`` of at most GROUP_MAX bodies whose bytes (with their
    4-byte length column) fit PACK_BYTES, and one body at least."""
    n = len(sizes)
    if n and sizes.count(sizes[0]) == n:  # one body size: every group but the last is full
        step = min(GROUP_MAX, max(1, PACK_BYTES // (sizes[0] + 4)))
        return [(start, min(n, start + step)) for start in range(0, n, step)]
    cut = list(accumulate(map(_PLUS_4, sizes), initial=0))  # bytes of the first i bodies
    spans = []
    start = 0
    while start < n:
        end = min(n, start + GROUP_MAX)
        if cut[end] - cut[start] > PACK_BYTES:
            end = max(start + 1, bisect_right(cut, cut[start] + PACK_BYTES, start, end) - 1)
        spans.append((start, end))
        start = end
    return spans


def take(txn: Any, ready: Any, packs: Any, entries: Any, head: bytes, ids: list[int]
         ) -> tuple[int, list[int]]:
    """Delete the ids of ``ids`` (ascending, unique) of (queue, priority) ``head`` that are
    live in packed groups: clear their bits, one write per group (a group left with no live
    id is deleted with its ``packs`` row; one left with at most 1/UNPACK_SHARE of its ids live
    is unpacked, so a few long-lived messages do not keep a whole run of bodies on disk).
    Return ``(how many were deleted, rest)``: ``rest`` are the ids not in a packed group, for
    the ``entries`` rows' way (ids of a packed group whose bit is already clear are gone: they
    have no ``entries`` row either)."""
    cur = txn.cursor(db=ready)
    rest: list[int] = []
    removed = 0
    i = 0
    n = len(ids)
    while i < n:
        if not seek_group(cur, head + U64.pack(ids[i])):
            rest.append(ids[i])
            i += 1
            continue
        value = cur.value()
        j = bisect_right(ids, last_id(value), i)
        if j == i:  # beyond this group: not listed in any group
            rest.append(ids[i])
            i += 1
            continue
        if not value[0] & 0x80:
            rest += ids[i:j]
            i = j
            continue
        gids = ready_groups.group_ids(value)
        run = ids[i:j]
        p0 = bisect_left(gids, run[0])
        m = len(run)
        if gids[p0:p0 + m] == tuple(run):  # a contiguous run of the group (the usual FIN)
            mask = ((1 << m) - 1) << p0
        else:
            mask = 0
            for x in run:
                p = bisect_left(gids, x)
                if p < len(gids) and gids[p] == x:
                    mask |= 1 << p
        bits = packed_bits(value)
        hit = bits & mask
        if hit:
            removed += hit.bit_count()
            left = bits & ~mask
            key = bytes(cur.key())
            if left:
                row = packed_row(left, bytes(value[ready_groups.ids_start(value):]))
                if left.bit_count() * UNPACK_SHARE <= len(gids):
                    ready_groups.unpack_group(txn, ready, key, row, packs, entries)
                else:
                    txn.put(key, row, db=ready)
            else:
                cur.delete()
                txn.delete(key, db=packs)
        i = j
    return removed, rest


def group_entries(txn: Any, packs: Any, key: bytes, ids: tuple[int, ...], skipped: int,
                  bits: int, limit: int) -> list[tuple]:
    """Return up to ``limit`` entry tuples of the packed group ``key`` (its ids from position
    ``skipped`` on are ``ids``; ``bits`` its live bitmap), in ready order."""
    pack = txn.get(key, db=packs)
    if pack is None:
        return []
    prefix, offsets = codec.decode_pack(pack)
    flags, att, d_at, e_at, ml = VALUE_HEAD.unpack_from(prefix)
    address, headers, origin = codec.decode_meta(prefix[HEAD_SIZE:HEAD_SIZE + ml])
    prio = 9 - key[4]
    n = len(ids)
    every = ((1 << n) - 1) << skipped
    if bits & every == every:  # every id from ``skipped`` on is live (the usual read)
        cut = min(n, limit)
        offs = offsets[skipped:skipped + cut + 1]
        return [(msg_id, prio, att, d_at, e_at, address, headers, pack[a:b], origin)
                for msg_id, a, b in zip(ids[:cut], offs, offs[1:], strict=False)]
    live = [i for i in range(skipped, skipped + n) if bits >> i & 1][:limit]
    return [(ids[i - skipped], prio, att, d_at, e_at, address, headers,
             pack[offsets[i]:offsets[i + 1]], origin) for i in live]


def address_counts(txn: Any, ready: Any, packs: Any, entries_values: Iterable[bytes]
                   ) -> dict[str, int]:
    """Return ``{address: number of entries}``: the ``entries`` rows' values plus every live
    id of every packed group (snapshot manifests and their verification)."""
    counts = codec.count_addresses(entries_values)
    for key, value in txn.cursor(db=ready):
        if not value[0] & 0x80:
            continue
        pack = txn.get(key, db=packs)
        if pack is None:
            continue
        address = codec.value_address(codec.decode_pack(pack)[0])
        counts[address] = counts.get(address, 0) + ready_groups.live_count(bytes(value))
    return counts
