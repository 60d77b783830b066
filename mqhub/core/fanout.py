"""Fan-out delivery for a Queue: one private memory sub-queue per consumer, refcounted copies.

The parent queue keeps the stored entry until every sub-queue that received a copy is done with
it (acked, expired or dead-lettered). Messages published while nobody is attached wait in the
parent and go to the next subscriber; the last subscriber leaving returns its unfinished copies
to the parent's backlog.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mqhub.core.deadletter import dlq_name, to_dead
from mqhub.core.message import TIER_MEMORY
from mqhub.store.batch import WriteBatch
from mqhub.store.records import Entry, entry_order

if TYPE_CHECKING:  # pragma: no cover
    from mqhub.core.consumer import Consumer
    from mqhub.core.queue import Queue


def attach(parent: Queue, target: Any, ready: int, credit: int, timeout: float | None,
           tag: Any) -> Consumer:
    """Fan-out attach: a private memory sub-queue for this consumer, then the consumer."""
    from mqhub.core.queue import Queue as make_queue  # queue.py imports this module
    parent._fan_seq += 1
    sub = make_queue(parent.broker, f"{parent.name}~fan{parent._fan_seq}", tier=TIER_MEMORY,
                     ttl=parent.ttl, max_attempts=parent.max_attempts,
                     msg_timeout=parent.msg_timeout,
                     expire_to_dead_letters=parent.expire_to_dead_letters)
    sub._parent = parent
    sub._open = set()
    if not parent._subs:
        parent._subs = []
        if not parent._claimed:
            parent._claimed = {}
            parent._refs = {}
    parent._subs.append(sub)
    c = sub.attach(target, ready=ready, credit=credit, timeout=timeout, tag=tag)
    parent.dispatch()
    return c


def dispatch(parent: Queue) -> None:
    """Hand every ready entry to every sub-queue (one copy each, refcounted here)."""
    entries = parent._pop_ready(parent._nready)
    if entries:
        now = parent.broker.clock.seconds()
        ttl_cut = parent._ttl_cut(now)
        if parent._may_expire or ttl_cut:
            entries = parent._drop_expired(entries, now, ttl_cut)
        subs = list(parent._subs)
        ids = [e[0] for e in entries]
        parent._claimed.update(zip(ids, entries, strict=False))
        parent._refs.update(dict.fromkeys(ids, len(subs)))
        for sub in subs:
            sub._open.update(ids)
            sub._put(list(entries), None, False, now)
    if parent._stored_only:
        parent._maybe_page()


def done(parent: Queue, sub: Queue, entries: list[Entry]) -> None:
    """``sub`` is finished with ``entries`` (acked, expired or dead): release the copies."""
    done: list[Entry] = []
    for e in entries:
        mid = e[0]
        if mid not in sub._open:
            continue
        sub._open.discard(mid)
        orig = _drop_copy(parent, mid)
        if orig is not None:
            done.append(orig)
    _delete_stored(parent, done)


def _drop_copy(parent: Queue, mid: int) -> Entry | None:
    """One copy of ``mid`` is finished: return the parent's entry when it was the last copy."""
    refs = parent._refs
    left = refs.get(mid, 1) - 1
    if left > 0:
        refs[mid] = left
        return None
    refs.pop(mid, None)
    return parent._claimed.pop(mid, None)


def _delete_stored(parent: Queue, entries: list[Entry]) -> None:
    """Delete the parent's stored copies of ``entries`` (every subscriber is done with them)."""
    if entries and parent.durable:
        b = WriteBatch()
        b.delete_entries(parent.name, [(e[1], e[0]) for e in entries])
        parent._write(b)


def dead(parent: Queue, sub: Queue, entries: list[Entry], reason: str, error: str | None,
         now: float) -> None:
    """A subscriber's copy died: record it in this queue's dead letters, release the copy."""
    parent.dead_letter_count += len(entries)
    dead = [to_dead(e, parent.name, reason, error, now) for e in entries]
    if parent.durable:
        b = WriteBatch()
        b.put_entries(dlq_name(parent.name), dead)
        parent.broker._commit(b)
    else:
        parent._keep_mem_dead(dead)
    done(parent, sub, entries)


def release(parent: Queue, sub: Queue) -> None:
    """A subscriber left: drop its copies; if it was the last, unfinished messages return."""
    if sub in parent._subs:
        parent._subs.remove(sub)
    back: list[Entry] = []
    done: list[Entry] = []
    for mid in sub._open:
        orig = _drop_copy(parent, mid)
        if orig is not None:
            (done if parent._subs else back).append(orig)
    _delete_stored(parent, done)
    sub._open = set()
    sub._close()
    if back:
        back.sort(key=entry_order)
        parent._insert_many(back)
    if parent.auto_delete and not parent._subs and not parent.deleted:
        parent.broker.delete_queue(parent.name)
