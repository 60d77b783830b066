"""RowWriter: how a WriteBatch becomes rows of the store index (format 4, see codec).

A uniform publish run of new ids (small bodies, no headers or expiry, one value prefix) is
written as packed ``ready`` groups (:mod:`mqhub.store.packed_groups`): one ``ready`` and one
``packs`` row per group, no ``entries`` row per message; deleting such entries clears bits in
their group rows. Other entries of a batch that are small, have no expiry and are not archive
tier are gathered and
written sorted, with MDB_APPEND for the ones above the table's last key (new messages); the
rest are written one by one. Every new entry is noted for its queue's ``ready`` group
(:mod:`mqhub.store.ready_groups`), written once per batch; a delete pops the ``entries`` row
and lowers its group's live count once per group. Segment bodies are reference-counted per
message in ``messages``. Runs in whichever thread commits (reactor or writer thread).
"""

from __future__ import annotations

import bisect
import logging
import struct
from operator import itemgetter, lt
from typing import Any

from mqhub.store import codec, packed_groups, ready_groups
from mqhub.store.batch import DeleteRun, WriteBatch
from mqhub.store.codec import (
    ENTRY_KEY,
    F64,
    FLAG_EXPIRES,
    FLAG_SEGMENT,
    MSG_REF,
    QUEUE_ROW,
    U32,
    U64,
    VALUE_HEAD,
)
from mqhub.store.index_state import IndexState, TxnChanges
from mqhub.store.records import (
    ADDRESS,
    ATTEMPTS,
    BODY,
    DELIVER_AT,
    EXPIRES_AT,
    HEADERS,
    MAX_PRIORITY,
    MIN_PRIORITY,
    MSG_ID,
    ORIGIN,
    PRIORITY,
    Entry,
)
from mqhub.store.segments import SegmentLog

log = logging.getLogger("mqhub.store.lmdb")

_KEY0 = itemgetter(0)
_BODIES = itemgetter(BODY)


def append_tail(txn: Any, db: Any, rows: list[tuple[bytes, bytes]]
                 ) -> tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]]]:
    """Write the rows of sorted ``rows`` that sort after ``db``'s last key with MDB_APPEND.

    Return ``(appended, rest)``: ``rest`` (keys not above the last key, or every row when the
    tail repeats a key) is left for the caller to write normally. py-lmdb's append mode skips a
    key that is out of order and only reports a lower count, so the count is checked and a row
    that did not land is handed back in ``rest``: none is ever lost.
    """
    cur = txn.cursor(db=db)
    i = bisect.bisect_right(rows, cur.key(), key=_KEY0) if cur.last() else 0
    tail = rows[i:] if i else rows
    if not tail:
        return [], rows
    keys = list(map(_KEY0, tail))
    if not all(map(lt, keys, keys[1:])):  # a repeated key: MDB_APPEND would skip it
        return [], rows
    added = cur.putmulti(tail, append=True)[1]
    if added == len(tail):
        return tail, rows[:i]
    landed: list[tuple[bytes, bytes]] = []
    missing: list[tuple[bytes, bytes]] = []
    for r in tail:
        (missing if txn.get(r[0], db=db) is None else landed).append(r)
    log.warning("MDB_APPEND stored %d of %d rows; writing the rest normally", added, len(tail))
    return landed, rows[:i] + missing


def ids_by_head(keys: list[bytes]) -> dict[bytes, list[int]]:
    """Group 13-byte ``entries`` keys by ``qid | 9-priority``: ``{head: msg_ids in key order}``.

    One ``struct.unpack`` reads every id, and strided byte counts tell whether all keys share
    one head (the usual case: one queue, one priority), so no per-key slice is built then.
    """
    n = len(keys)
    joined = b"".join(keys)
    ids = list(struct.unpack(">" + "Q5x" * n, joined))
    first = joined[8:13]
    if all(joined[i::13].count(first[i - 8]) == n for i in range(8, 13)):
        return {first: ids}
    groups: dict[bytes, list[int]] = {}
    for k, msg_id in zip(keys, ids, strict=True):
        groups.setdefault(k[8:13], []).append(msg_id)
    return groups


def ascending_unique(ids: list[int]) -> list[int]:
    """Return ``ids`` sorted without repeats (as they are, when they already are)."""
    if all(map(lt, ids, ids[1:])):
        return ids
    return sorted(set(ids))


def _note_new(t: TxnChanges, keys: list[bytes]) -> None:
    """Note new ``entries`` keys for :meth:`RowWriter._flush_ready`."""
    new = t.ready_new
    for head, ids in ids_by_head(keys).items():
        got = new.get(head)
        if got is None:
            new[head] = ids
        else:
            got += ids


def _shared_prefix(first: Entry) -> bytes:
    """The value prefix (head and meta) that every entry of a uniform batch shares with
    ``first`` (no expiry, no headers); raises ValueError for a priority outside the range."""
    if not MIN_PRIORITY <= first[PRIORITY] <= MAX_PRIORITY:
        raise ValueError(f"priority is outside {MIN_PRIORITY}..{MAX_PRIORITY}")
    meta = codec.encode_meta(first[ADDRESS], None, first[ORIGIN])
    return VALUE_HEAD.pack(0, first[ATTEMPTS], first[DELIVER_AT], 0.0, len(meta)) + meta


class RowWriter:
    """Applies WriteBatches to the index rows inside one write transaction (a TxnChanges)."""

    def __init__(self, dbs: dict[bytes, Any], segments: SegmentLog, state: IndexState,
                 segment_threshold: int) -> None:
        """Write into ``dbs`` (the open sub-databases), ``segments`` (big bodies), reading
        committed counters from ``state``; bodies above ``segment_threshold`` go to segments."""
        self._dbs = dbs
        self._segments = segments
        self._state = state
        self._threshold = segment_threshold

    def _qid(self, t: TxnChanges, queue: str, create: bool) -> int | None:
        """Return the id of ``queue``, allocating one inside ``t`` when ``create``."""
        qid = t.qids.get(queue)
        if qid is None:
            qid = self._state.qids.get(queue)
        if qid is None and create:
            if len(queue.encode()) > 500:
                raise ValueError("queue name too long")
            qid = t.next_qid
            t.next_qid += 1
            t.qids[queue] = qid
            t.counts.setdefault(queue, 0)
        return qid

    def _count(self, t: TxnChanges, queue: str) -> int:
        """Current entry count of ``queue`` as seen inside ``t``."""
        c = t.counts.get(queue)
        return self._state.counts.get(queue, 0) if c is None else c

    def apply(self, t: TxnChanges, batch: WriteBatch) -> None:
        """Apply one batch's operations in WriteBatch's documented order."""
        txn = t.txn
        entries = self._dbs[b"entries"]
        reports = batch.purge_reports
        for queue in batch.purges:
            self._purge(t, queue, reports.get(queue))
        archive = batch.archive
        publish_runs = batch.publish_runs
        for queue, items in batch.puts.items():
            self._put(t, queue, items, queue in archive, queue in publish_runs)
        self._flush_plain(t)
        self._flush_ready(t)
        for queue, updates in batch.attempts.items():
            qid = self._qid(t, queue, False)
            if qid is None:
                continue
            for priority, msg_id, attempts in updates:
                k = ENTRY_KEY.pack(msg_id, qid, 9 - priority)
                v = txn.get(k, db=entries)
                if v is None and self._unpack_holder(t, k):
                    v = txn.get(k, db=entries)
                if v is not None:
                    txn.put(k, codec.with_attempts(v, attempts), db=entries)
        for queue, runs in batch.deletes.items():
            qid = self._qid(t, queue, False)
            if qid is None:
                continue
            self._delete(t, queue, qid, runs)
        due, due_keys = self._dbs[b"due"], self._dbs[b"due_keys"]
        for when, key, payload in batch.due_puts:
            old = txn.get(key, db=due_keys)
            if old is not None:
                txn.delete(old + key, db=due)
            tk = codec.time_key(when)
            txn.put(tk + key, payload, db=due)
            txn.put(key, tk, db=due_keys)
        for key in batch.due_deletes:
            old = txn.pop(key, db=due_keys)
            if old is not None:
                txn.delete(old + key, db=due)
        meta = self._dbs[b"meta"]
        for mkey, value in batch.meta_puts:
            txn.put(mkey.encode(), value, db=meta)
        for mkey in batch.meta_deletes:
            txn.delete(mkey.encode(), db=meta)

    def _delete(self, t: TxnChanges, queue: str, qid: int, runs: list[DeleteRun]) -> None:
        """Delete the entries of the ``(priority, ids)`` ``runs`` of ``queue``: those live in
        packed groups by clearing their bits, the rest by popping their ``entries`` rows.

        One run (the usual FIN batch) is used as it is; runs of one priority are joined.
        """
        txn = t.txn
        ready = self._dbs[b"ready"]
        if len(runs) == 1:
            by_prio = dict(runs)
        else:
            by_prio = {}
            for priority, ids in runs:
                got = by_prio.get(priority)
                by_prio[priority] = ids if got is None else got + ids  # never extend a run
        removed = 0
        popped = 0
        for priority, ids in by_prio.items():
            if not MIN_PRIORITY <= priority <= MAX_PRIORITY or not ids:
                continue
            head = U32.pack(qid) + bytes((MAX_PRIORITY - priority,))
            n, left = packed_groups.take(txn, ready, self._dbs[b"packs"], self._dbs[b"entries"],
                                         head, ascending_unique(ids))
            removed += n
            if left:
                gone = self._pop_rows(t, qid, MAX_PRIORITY - priority, left)
                if gone:
                    popped += len(gone)
                    ready_groups.remove_ids(txn, ready, head, ascending_unique(gone))
        if removed or popped:
            t.counts[queue] = self._count(t, queue) - removed - popped

    def _unpack_holder(self, t: TxnChanges, k: bytes) -> bool:
        """If the ``entries`` key ``k`` names a live id of a packed group, unpack that group
        (every live id of it gets its ``entries`` row) and return True."""
        ready = self._dbs[b"ready"]
        cur = t.txn.cursor(db=ready)
        msg_id = codec.U64.unpack_from(k)[0]
        if not ready_groups.seek_group(cur, codec.to_order_key(k)):
            return False
        value = bytes(cur.value())
        if not ready_groups.is_packed(value) or msg_id > ready_groups.last_id(value):
            return False
        ids = ready_groups.group_ids(value)
        i = bisect.bisect_left(ids, msg_id)
        if ids[i] != msg_id or not ready_groups.packed_bits(value) >> i & 1:
            return False
        ready_groups.unpack_group(t.txn, ready, bytes(cur.key()), value, self._dbs[b"packs"],
                                  self._dbs[b"entries"])
        return True

    def _pop_rows(self, t: TxnChanges, qid: int, pb: int, ids: list[int]) -> list[int]:
        """Pop the ``entries`` rows of ``ids`` of queue ``qid`` at priority byte ``pb`` (in list
        order: a repeated id is popped once); release what they referenced; return the ids
        that were there.

        Keys are built in one comprehension and popped with one ``map`` (no Python loop body per
        row; the common FIN batch has every row present and none referencing a segment or an
        expiry row, checked with C-level passes): 15–20 % less CPU per row than the loop.
        """
        pack = ENTRY_KEY.pack
        ks = [pack(msg_id, qid, pb) for msg_id in ids]
        vals = list(map(t.txn.cursor(db=self._dbs[b"entries"]).pop, ks))
        if None in vals:
            found = [(k, v, i) for k, v, i in zip(ks, vals, ids, strict=True) if v is not None]
            ks = [k for k, _, _ in found]
            vals = [v for _, v, _ in found]
            ids = [i for _, _, i in found]
        if any(map(_KEY0, vals)):  # a flags byte: expiry row or segment body to release
            for k, v in zip(ks, vals, strict=True):
                if v[0]:
                    self._release(t, k, v)
        return ids

    def _put(self, t: TxnChanges, queue: str, items: list[Entry], archive: bool,
             run: bool = False) -> None:
        """Store entries of one queue: plain ones are gathered for :meth:`_flush_plain`
        (``run``: the items are one publish run, see ``WriteBatch.put_entries``)."""
        qid = self._qid(t, queue, True)
        assert qid is not None
        t.plain_q[U32.pack(qid)] = queue
        pack_key = ENTRY_KEY.pack
        pack_head = VALUE_HEAD.pack
        encode_meta = codec.encode_meta
        threshold = self._threshold
        if not archive and items:
            fast = self._run_values(items) if run else self._uniform_values(qid, items)
            if fast is not None:
                if fast[1] and self._pack(t, queue, qid, items, fast[0]):
                    return
                shared = fast[0]
                t.plain.extend([(pack_key(e[MSG_ID], qid, MAX_PRIORITY - e[PRIORITY]),
                                 shared + e[BODY]) for e in items])
                return
        plain = t.plain
        prefixes: dict[tuple[int, float, str, str], bytes] = {}
        added = 0
        for e in items:
            msg_id, priority, attempts, d_at, e_at, address, headers, body, origin = e
            if not 0 <= priority <= 9:
                raise ValueError(f"priority {priority!r} is outside 0..9")
            k = pack_key(msg_id, qid, 9 - priority)
            if e_at or archive or len(body) > threshold:
                if plain:  # keep list order: a later put of the same key must win
                    self._flush_plain(t)
                    t.plain_q[U32.pack(qid)] = queue
                    plain = t.plain
                added += self._put_special(t, k, e, archive)
                continue
            if headers is None:
                # value prefix shared by a publish batch: same attempts/deliver_at/address/origin
                ck = (attempts, d_at, address, origin)
                pre = prefixes.get(ck)
                if pre is None:
                    meta = encode_meta(address, None, origin)
                    pre = prefixes[ck] = pack_head(0, attempts, d_at, 0.0, len(meta)) + meta
            else:
                meta = encode_meta(address, headers, origin)
                pre = pack_head(0, attempts, d_at, 0.0, len(meta)) + meta
            plain.append((k, pre + body))
        if added:
            t.counts[queue] = self._count(t, queue) + added

    def _run_values(self, items: list[Entry]) -> tuple[bytes, bool] | None:
        """:meth:`_uniform_values` for one publish run, whose entries share every field but
        the id and body by the batch's promise: only the first entry and the bodies' sizes
        (one C-level pass) are checked."""
        first = items[0]
        if (first[EXPIRES_AT] or first[HEADERS] is not None
                or max(map(len, map(_BODIES, items))) > self._threshold):
            return None
        return _shared_prefix(first), True

    def _uniform_values(self, qid: int, items: list[Entry]) -> tuple[bytes, bool] | None:
        """Check for a typical publish batch: every entry small, without expiry or headers,
        sharing attempts, deliver_at, address and origin. Return ``(shared value prefix, one
        priority?)``, or None (the general loop handles the batch).
        """
        first = items[0]
        _, p0, a0, d0, _, ad0, _, _, o0 = first
        threshold = self._threshold
        one_prio = True
        # one loop with tuple unpacking and plain comparisons: about half the time of three
        # generator passes, and 15 % less than comparing a tuple of the shared fields
        for _, prio, att, d_at, e_at, address, headers, body, origin in items:
            if (e_at or headers is not None or len(body) > threshold or att != a0
                    or d_at != d0 or address != ad0 or origin != o0):
                return None
            if prio != p0:
                one_prio = False
                if not MIN_PRIORITY <= prio <= MAX_PRIORITY:
                    raise ValueError(f"priority is outside {MIN_PRIORITY}..{MAX_PRIORITY}")
        return _shared_prefix(first), one_prio

    def _pack(self, t: TxnChanges, queue: str, qid: int, items: list[Entry], prefix: bytes
              ) -> bool:
        """Write uniform ``items`` (one priority) of ``queue`` as packed groups when their ids
        are new and above the queue's listed ids; return False (nothing written) otherwise."""
        prio = items[0][PRIORITY]
        if t.plain or t.ready_new:  # earlier rows of this batch first: they may be older ids
            self._flush_plain(t)
            self._flush_ready(t)
            t.plain_q[U32.pack(qid)] = queue
        head = U32.pack(qid) + bytes((MAX_PRIORITY - prio,))
        if not packed_groups.add_run(t.txn, self._dbs[b"ready"], self._dbs[b"packs"], head,
                                     list(map(_KEY0, items)), prefix,
                                     list(map(_BODIES, items))):
            return False
        t.counts[queue] = self._count(t, queue) + len(items)
        return True

    def _flush_plain(self, t: TxnChanges) -> None:
        """Write the gathered plain rows (inline bodies, no expiry); note the new ones for
        their ``ready`` groups (:meth:`_flush_ready`).

        The rows are sorted by key; those above the table's last key (new messages: hub ids
        are time-ordered) go in with MDB_APPEND, which fills leaf pages; the rest (re-puts,
        old ids) are written one by one, releasing what a replaced value referenced.
        """
        rows = t.plain
        if not rows:
            t.plain_q.clear()
            return
        names = t.plain_q
        t.plain = []
        t.plain_q = {}
        txn = t.txn
        entries = self._dbs[b"entries"]
        rows.sort(key=_KEY0)
        appended, rest = append_tail(txn, entries, rows)
        new: dict[bytes, int] = {}
        if appended:
            keys = list(map(_KEY0, appended))
            if len(names) == 1:
                new[next(iter(names))] = len(appended)
            else:
                for k in keys:
                    q = k[8:12]
                    new[q] = new.get(q, 0) + 1
            _note_new(t, keys)
        replace = txn.replace
        fresh: list[bytes] = []
        for k, v in rest:
            old = replace(k, v, db=entries)
            if old is None:
                q = k[8:12]
                new[q] = new.get(q, 0) + 1
                fresh.append(k)
            elif old[0]:
                self._release(t, k, old)
        if fresh:
            _note_new(t, fresh)
        for q, n in new.items():
            queue = names[q]
            t.counts[queue] = self._count(t, queue) + n

    def _flush_ready(self, t: TxnChanges) -> None:
        """Write the ``ready`` groups of the new entries noted so far in ``t``."""
        if not t.ready_new:
            return
        heads, t.ready_new = t.ready_new, {}
        ready, packs, entries = self._dbs[b"ready"], self._dbs[b"packs"], self._dbs[b"entries"]
        for head, ids in heads.items():
            already = ready_groups.add_ids(t.txn, ready, head, ascending_unique(ids), packs,
                                           entries)
            if already:  # re-puts of ids whose content was packed: not new entries
                qid = U32.unpack_from(head)[0]
                names = {**{q: n for n, q in self._state.qids.items()},
                         **{q: n for n, q in t.qids.items()}}
                queue = names[qid]
                t.counts[queue] = self._count(t, queue) - already

    def _put_special(self, t: TxnChanges, k: bytes, e: Entry, archive: bool) -> int:
        """Store one entry with an expiry and/or a segment body; return 1 if it is new."""
        txn = t.txn
        msg_id, priority, attempts, d_at, e_at, address, headers, body, origin = e
        flags = 0
        if e_at:
            flags |= FLAG_EXPIRES
        if archive or len(body) > self._threshold:
            flags |= FLAG_SEGMENT
            self._ref_body(t, msg_id, body)
            body = b""
        v = codec.encode_value(flags, attempts, d_at, e_at,
                               codec.encode_meta(address, headers, origin), body)
        entries = self._dbs[b"entries"]
        old = txn.replace(k, v, db=entries)
        if old is not None and old[0]:
            self._release(t, k, old)
        if e_at:
            txn.put(codec.time_key(e_at) + k[8:] + k[:8], b"", db=self._dbs[b"expiry"])
        if old is not None:
            return 0
        _note_new(t, [k])
        return 1

    def _ref_body(self, t: TxnChanges, msg_id: int, body: bytes) -> None:
        """Add a reference to ``msg_id``'s segment body, appending the body the first time."""
        txn = t.txn
        messages = self._dbs[b"messages"]
        mk = U64.pack(msg_id)
        row = txn.get(mk, db=messages)
        if row is not None:
            seg, off, size, refs = MSG_REF.unpack(row)
            txn.put(mk, MSG_REF.pack(seg, off, size, refs + 1), db=messages)
        else:
            seg, off, size = self._segments.append(bytes(body))
            txn.put(mk, MSG_REF.pack(seg, off, size, 1), db=messages)
            t.seg_end[seg] = off + size
        self._seg_change(t, seg, 1 if row is None else 0)

    def _seg_change(self, t: TxnChanges, seg: int, delta: int) -> None:
        """Record a change of ``seg``'s live-message count and write its row."""
        if delta:
            t.seg_delta[seg] = t.seg_delta.get(seg, 0) + delta
        live = self._state.seg_live.get(seg, 0) + t.seg_delta.get(seg, 0)
        end = t.seg_end.get(seg, self._state.seg_end.get(seg, 0))
        t.txn.put(U32.pack(seg), codec.SEG_ROW.pack(max(live, 0), end), db=self._dbs[b"segments"])

    def _release(self, t: TxnChanges, k: bytes, v: bytes) -> None:
        """Drop what a removed ``entries`` row ``k`` referenced: its expiry row, segment body."""
        txn = t.txn
        flags = v[0]
        if flags & FLAG_EXPIRES:
            e_at = F64.unpack_from(v, codec.EXPIRES_OFFSET)[0]
            txn.delete(codec.time_key(e_at) + codec.to_order_key(bytes(k)), db=self._dbs[b"expiry"])
        if flags & FLAG_SEGMENT:
            messages = self._dbs[b"messages"]
            mk = bytes(k[codec.KEY_MSG_ID])
            row = txn.get(mk, db=messages)
            if row is None:
                return
            seg, off, size, refs = MSG_REF.unpack(row)
            if refs > 1:
                txn.put(mk, MSG_REF.pack(seg, off, size, refs - 1), db=messages)
                return
            txn.delete(mk, db=messages)
            self._seg_change(t, seg, -1)
            if self._state.seg_live.get(seg, 0) + t.seg_delta.get(seg, 0) <= 0 \
                    and seg != self._segments.active:
                txn.delete(U32.pack(seg), db=self._dbs[b"segments"])

    def _purge(self, t: TxnChanges, queue: str, report: tuple[int, str] | None = None) -> None:
        """Remove every entry of ``queue``; with ``report`` (``(event, reason)``) gather the
        removed ids in ``t.removed`` for the flow journal."""
        qid = self._qid(t, queue, False)
        if qid is None:
            return
        gone: list[int] | None = [] if report is not None else None
        self._flush_ready(t)
        txn = t.txn
        entries = self._dbs[b"entries"]
        ready = self._dbs[b"ready"]
        removed = 0
        pack = ENTRY_KEY.pack
        packs = self._dbs[b"packs"]
        for gkey, pbyte, ids, bits in list(ready_groups.iter_queue_groups(txn, ready, qid)):
            if bits is not None:  # packed: no entries rows, its live ids are in the pack
                removed += bits.bit_count()
                if gone is not None:
                    gone += [i for n, i in enumerate(ids) if bits >> n & 1]
                txn.delete(gkey, db=packs)
                txn.delete(gkey, db=ready)
                continue
            for msg_id in ids:
                k = pack(msg_id, qid, pbyte)
                v = txn.pop(k, db=entries)
                if v is not None:
                    if v[0]:
                        self._release(t, k, v)
                    removed += 1
                    if gone is not None:
                        gone.append(msg_id)
            txn.delete(gkey, db=ready)
        if removed:
            t.counts[queue] = self._count(t, queue) - removed
        if gone and report is not None:
            t.removed.append((queue, report[0], report[1], gone))

    def finish(self, t: TxnChanges) -> None:
        """Write the queue rows and the id counter the transaction changed."""
        txn = t.txn
        queues = self._dbs[b"queues"]
        for name, count in t.counts.items():
            qid = t.qids.get(name) or self._state.qids.get(name)
            if count:
                txn.put(name.encode(), QUEUE_ROW.pack(qid, count), db=queues)
            else:
                txn.delete(name.encode(), db=queues)
        if t.next_qid != self._state.next_qid:
            txn.put(b"next_qid", U32.pack(t.next_qid), db=self._dbs[b"sys"])
