"""IndexReader: the synchronous reads of an LMDB store index (format 4, see codec).

Each read runs in its own read-only transaction, in the reactor thread; LmdbStore wraps them
in Deferreds. This module imports neither Twisted nor zope.
"""

from __future__ import annotations

from typing import Any, Literal

from mqhub.store import codec, packed_groups, ready_groups
from mqhub.store.codec import ENTRY_KEY, F64, FLAG_SEGMENT, HEAD_SIZE, ORDER_KEY, VALUE_HEAD
from mqhub.store.index_state import IndexState
from mqhub.store.records import MAX_MSG_ID, MAX_PRIORITY, MIN_PRIORITY, Entry, EntryKey
from mqhub.store.segments import SegmentLog


def ready_start(after: EntryKey | None) -> tuple[int, int] | None | Literal[False]:
    """The ``(priority byte, msg_id)`` that :func:`ready_groups.iter_ready` starts after for
    the ready-order position ``after`` (IMessageStore: any ``(priority, msg_id)`` pair, stored
    or not); None to start at the first entry, False when no entry can follow ``after``.

    Out-of-range parts are moved to the equivalent position: a priority above MAX_PRIORITY
    precedes every entry, one below MIN_PRIORITY follows them all; an id below 0 precedes
    every id of its priority (so: after the end of the priority above), one above MAX_MSG_ID
    follows them all."""
    if after is None:
        return None
    priority, msg_id = after
    if priority > MAX_PRIORITY:
        return None
    if priority < MIN_PRIORITY:
        return False
    pbyte = MAX_PRIORITY - priority
    if msg_id < 0:
        return None if pbyte == 0 else (pbyte - 1, MAX_MSG_ID)
    return pbyte, min(msg_id, MAX_MSG_ID)


class IndexReader:
    """Reads entries, due rows, the expiry index and metadata of an open store index."""

    def __init__(self, env: Any, dbs: dict[bytes, Any], segments: SegmentLog,
                 state: IndexState) -> None:
        """Read from ``env``'s databases ``dbs``, segment bodies from ``segments``, queue
        names from ``state``."""
        self._env = env
        self._dbs = dbs
        self._segments = segments
        self._state = state

    def read_entries(self, qid: int, after: EntryKey | None, limit: int) -> list[Entry]:
        """Up to ``limit`` entries of queue ``qid`` after ``after`` in ready order: walk the
        ``ready`` groups; a plain group's rows are fetched with ``getmulti`` (which leaves out
        ids whose entry is gone), a packed group's live entries come from its ``packs`` row."""
        out: list[Entry] = []
        start = ready_start(after)
        if start is False:
            return out
        with self._env.begin() as txn:
            getmulti = txn.cursor(db=self._dbs[b"entries"]).getmulti
            packs = self._dbs[b"packs"]
            keys: list[bytes] = []
            groups = ready_groups.iter_ready(txn, self._dbs[b"ready"], qid, start)
            pack_key = ENTRY_KEY.pack
            while len(out) < limit:
                group = next(groups, None)
                if group is not None:
                    gkey, ids, skipped, bits = group
                    if bits is None:
                        pbyte = gkey[4]
                        keys += [pack_key(i, qid, pbyte) for i in ids]
                        if len(keys) < limit - len(out):
                            continue
                    else:
                        if keys:
                            self._fetch(txn, getmulti, keys, out)
                            keys = []
                            if len(out) >= limit:
                                break
                        out += packed_groups.group_entries(txn, packs, gkey, ids, skipped,
                                                           bits, limit - len(out))
                        continue
                if not keys:
                    break
                self._fetch(txn, getmulti, keys, out)
                keys = []
        del out[limit:]
        return out

    def _fetch(self, txn: Any, getmulti: Any, keys: list[bytes], out: list[Entry]) -> None:
        """Append to ``out`` the entries of the ``entries`` rows ``keys`` that exist."""
        append = out.append
        unpack_key = ENTRY_KEY.unpack
        unpack_head = VALUE_HEAD.unpack_from
        decode_meta = codec.decode_meta
        messages = self._dbs[b"messages"]
        h = HEAD_SIZE
        for k, v in getmulti(keys):
            mid, _, pb = unpack_key(k)
            flags, att, d_at, e_at, ml = unpack_head(v)
            address, headers, origin = decode_meta(v[h:h + ml])
            if flags & FLAG_SEGMENT:
                body = codec.segment_body(txn, messages, self._segments, mid)
            else:
                body = v[h + ml:]
            append((mid, 9 - pb, att, d_at, e_at, address, headers, body, origin))

    def read_due(self, until: float, limit: int) -> list[tuple[float, bytes, bytes]]:
        """Up to ``limit`` due rows ``(when, key, payload)`` with ``when <= until``, earliest first."""
        out: list[tuple[float, bytes, bytes]] = []
        with self._env.begin(db=self._dbs[b"due"]) as txn:
            for k, v in txn.cursor():
                when = F64.unpack_from(k)[0]
                if when > until or len(out) >= limit:
                    break
                out.append((when, bytes(k[8:]), bytes(v)))
        return out

    def next_due(self) -> float | None:
        """The earliest due time, or None."""
        with self._env.begin(db=self._dbs[b"due"]) as txn:
            cur = txn.cursor()
            if not cur.first():
                return None
            return float(F64.unpack_from(cur.key())[0])

    def read_expired(self, until: float, limit: int) -> list[tuple[str, EntryKey, float]]:
        """Up to ``limit`` ``(queue, (priority, msg_id), expires_at)`` expiring by ``until``."""
        names = self._state.names_by_qid()
        out: list[tuple[str, EntryKey, float]] = []
        with self._env.begin(db=self._dbs[b"expiry"]) as txn:
            for k in txn.cursor().iternext(values=False):
                when = F64.unpack_from(k)[0]
                if when > until or len(out) >= limit:
                    break
                qid, pb, mid = ORDER_KEY.unpack_from(k, 8)
                out.append((names.get(qid, ""), (9 - pb, mid), when))
        return out

    def get_meta(self, key: str) -> bytes | None:
        """The metadata value under ``key``, or None."""
        with self._env.begin(db=self._dbs[b"meta"]) as txn:
            value: bytes | None = txn.get(key.encode())
            return value

    def scan_meta(self, prefix: str) -> list[tuple[str, bytes]]:
        """Every metadata ``(key, value)`` whose key starts with ``prefix``, in key order."""
        p = prefix.encode()
        out = []
        with self._env.begin(db=self._dbs[b"meta"]) as txn:
            cur = txn.cursor()
            if cur.set_range(p):
                for k, v in cur:
                    if not k.startswith(p):
                        break
                    out.append((bytes(k).decode(), bytes(v)))
        return out
