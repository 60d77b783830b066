"""Convert a store index of format 2 to format 3 rows, in place (run by LmdbStore.open); mark
a format-3 store as format 4.

Format 4 only adds packed groups and their ``packs`` database (:mod:`mqhub.store.codec`), so
a format-3 store's rows are valid format-4 rows: :func:`relabel_format3` just sets the format
(the format-3 code then refuses the store, as it could not read packed groups). A format-2
store is converted below and labelled format 4 directly (2 -> 4 in one pass).

Format 2 and 3 share every sub-database except the ready order: format 2 kept one empty
``order`` row ``qid | 9-priority | msg_id`` per entry, format 3 keeps ``ready`` group rows
(:mod:`mqhub.store.codec`). The conversion walks ``order`` from its start in transactions of at
most CHUNK rows; each one writes the groups of the rows it read (ids whose ``entries`` row is
missing are left out) and deletes those rows, so a transaction is the unit of progress.

Crash safety: the first transaction writes format 3 and the marker ``sys/converting`` (so the
previous version, which would see only the ``order`` rows not yet converted, refuses the store
instead of serving part of it); the transaction that deletes the last ``order`` row also drops
that database and the marker. A kill in between leaves ``ready`` groups for a prefix of the
order and ``order`` rows for the rest; the next open sees the marker and resumes with the rest. Groups written by a later transaction start above the ids of earlier ones of the same
(queue, priority), because ``order`` is walked in key order, so groups never overlap.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from mqhub.store import codec, ready_groups

log = logging.getLogger("mqhub.store.migrate")

#: ``order`` rows converted per transaction (bounds the size of each write transaction)
CHUNK = 20_000
#: ``sys`` key present while a conversion is under way (value: the format converted from)
CONVERTING = b"converting"


def relabel_format3(env: Any, dbs: dict[bytes, Any]) -> dict[str, int]:
    """Mark the format-3 store open in ``env`` as format 4 (``dbs`` holds format 4's
    databases, ``packs`` created empty by the open); return the counts :func:`migrate`
    returns (all 0 but one transaction: nothing is rewritten)."""
    with env.begin(write=True) as txn:
        txn.put(b"format", codec.U32.pack(codec.FORMAT_VERSION), db=dbs[b"sys"])
    log.info("store index has format 3: marked as format %d (no rows rewritten)",
             codec.FORMAT_VERSION)
    return {"rows": 0, "groups": 0, "dropped": 0, "transactions": 1}


def converting(txn: Any, sysdb: Any) -> bool:
    """Whether a conversion was started and not finished in this store (``sys`` database)."""
    return txn.get(CONVERTING, db=sysdb) is not None


def migrate(env: Any, dbs: dict[bytes, Any], chunk: int = CHUNK,
            stop_after: int | None = None,
            progress: Callable[[dict[str, int]], None] | None = None) -> dict[str, int]:
    """Convert the format-2 store open in ``env`` (``dbs``: format 3's databases) to format 3.

    :param stop_after: tests only: return after this many transactions, as a kill would.
    :param progress: called with the running counts after each committed transaction.
    :returns: counts of what was converted (``rows``, ``groups``, ``dropped``, ``transactions``).
    """
    started = time.monotonic()
    done = {"rows": 0, "groups": 0, "dropped": 0, "transactions": 0}
    with env.begin(write=True) as txn:
        order = env.open_db(codec.V2_ORDER_DB, txn=txn)
        txn.put(b"format", codec.U32.pack(codec.FORMAT_VERSION), db=dbs[b"sys"])
        txn.put(CONVERTING, codec.U32.pack(2), db=dbs[b"sys"])
    log.info("store index has format 2: converting its ready order to format 3 in place")
    while True:
        with env.begin(write=True) as txn:
            finished = _convert_chunk(txn, dbs, order, chunk, done)
            if finished:
                txn.drop(order, delete=True)
                txn.delete(CONVERTING, db=dbs[b"sys"])
        done["transactions"] += 1
        if progress is not None:
            progress(done)
        if finished:
            break
        if stop_after is not None and done["transactions"] >= stop_after:
            return done
    log.info("store index converted to format %d: %d order rows became %d ready groups "
             "(%d rows without an entry dropped) in %d transactions, %.2f s",
             codec.FORMAT_VERSION, done["rows"], done["groups"], done["dropped"],
             done["transactions"], time.monotonic() - started)
    return done


def _convert_chunk(txn: Any, dbs: dict[bytes, Any], order: Any, chunk: int,
                   done: dict[str, int]) -> bool:
    """Convert up to ``chunk`` rows from the start of ``order``; True once it is empty."""
    cur = txn.cursor(db=order)
    if not cur.first():
        return True
    rows: list[bytes] = []
    for k in cur.iternext(values=False):
        rows.append(bytes(k))
        if len(rows) >= chunk:
            break
    keys = [codec.to_entry_key(k) for k in rows]
    present = {bytes(k) for k, _ in txn.cursor(db=dbs[b"entries"]).getmulti(keys)}
    runs: dict[bytes, list[int]] = {}
    for k, entry_key in zip(rows, keys, strict=True):
        if entry_key in present:
            runs.setdefault(k[:5], []).append(codec.U64.unpack_from(k, 5)[0])
        else:
            done["dropped"] += 1
    ready = dbs[b"ready"]
    for head, ids in runs.items():
        before = txn.stat(ready)["entries"]
        ready_groups.add_ids(txn, ready, head, ids)
        done["groups"] += txn.stat(ready)["entries"] - before
    for k in rows:
        txn.delete(k, db=order)
    done["rows"] += len(rows)
    return not txn.cursor(db=order).first()
