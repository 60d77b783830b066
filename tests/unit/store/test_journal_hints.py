"""The journal recorder's column hints from the core (uniform publishes, ids the core already
holds: columns packed at the call) give exactly the chunk the plain per-entry path gives
(columns built at the commit); the core passes them."""

from __future__ import annotations

from typing import Any

from mqhub.store.journal_format import decode_chunk
from mqhub.store.journal_recorder import JournalRecorder
from mqhub.testing import CollectingTarget, memory_hub, settle, start_clock


class _Queue:
    """The two attributes the recorder reads from a queue."""

    durable = True
    name = "nsq.t/c"


class _Route:
    """A route without live targets."""

    targets: tuple[Any, ...] = ()
    groups: tuple[Any, ...] = ()


def _entries(first: int, n: int, priority: int, attempts: int) -> list[tuple]:
    """Entries of one publish batch (one origin and priority, varied body sizes)."""
    return [(first + i, priority, attempts, 0.0, 0.0, "nsq.t", None, b"x" * (i % 7), "nsq")
            for i in range(n)]


def test_hinted_calls_give_the_same_chunk_as_plain_ones() -> None:
    """A uniform publish, a delivery with its ids and an ack with its ids record the same
    runs and rows as the same calls without hints (every column read from the entries)."""
    chunks = []
    for hinted in (False, True):
        rec = JournalRecorder(start_clock())
        for first, prio in ((1000, 0), (5000, 7)):
            pub = _entries(first, 40, prio, 0)
            out = [(e[0], e[1], 1, *e[3:]) for e in pub]
            ids = [e[0] for e in out]
            if hinted:
                rec.published("nsq.t", pub, (_Queue,), True, _Route, True)
                rec.delivered(_Queue, out, ids)
                rec.acked(_Queue, out[:10], ids[:10])
            else:
                rec.published("nsq.t", pub, (_Queue,), True, _Route)
                rec.delivered(_Queue, out)
                rec.acked(_Queue, out[:10])
        chunk = rec.take_chunk()
        assert chunk is not None
        chunks.append(decode_chunk(chunk))
    plain, hinted_chunk = chunks
    assert plain == hinted_chunk
    rows = plain["rows"]
    assert list(rows["priority"][:40]) == [0] * 40 and list(rows["priority"][90:130]) == [7] * 40
    assert list(rows["msg_id"][80:90]) == list(range(1000, 1010))


def test_the_core_passes_uniform_publishes_and_ids() -> None:
    """publish_batch, a delivery round and an ack of the delivered ids reach the recorder with
    their hints, and the chunk holds the right columns (priority from the publish)."""
    hub = memory_hub()
    rec = JournalRecorder(hub.clock)
    hub.broker.journal = rec
    q = hub.broker.declare_queue("q")
    hub.broker.bind_queue("a", "q")
    hub.broker.publish_batch("a", [b"1", b"22", b"333"], origin="test", priority=5)
    settle(hub)
    target = CollectingTarget()
    c = q.attach(target, ready=10)
    ids = target.ids()
    caller_list = list(ids)
    assert q.ack(c, caller_list) == []
    caller_list.append(12345)   # the caller reusing its list changes nothing recorded
    pending = rec._pending  # noqa: SLF001 - the hints themselves are what this test checks
    # each of the three batches came packed (no entry list kept for the commit)
    assert [(p[0], p[3], list(p[5][0])) for p in pending] == [
        (0, None, ids), (1, None, ids), (2, None, ids)]
    chunk = decode_chunk(rec.take_chunk() or b"")
    assert list(chunk["rows"]["msg_id"]) == ids * 3
    assert list(chunk["rows"]["priority"][:3]) == [5, 5, 5]
    assert list(chunk["rows"]["size"][:3]) == [1, 2, 3]
    assert list(chunk["rows"]["attempt"][3:6]) == [1, 1, 1]


def test_attempt_columns_one_value_or_mixed() -> None:
    """A delivery round whose entries share one attempt count (packed at once) and one with
    mixed counts record each entry's attempt."""
    rec = JournalRecorder(start_clock())
    same = _entries(10, 5, 0, 3)
    mixed = [(e[0] + 100, 0, a, *e[3:]) for e, a in zip(_entries(10, 4, 0, 0), (1, 2, 1, 65535),
                                                         strict=True)]
    rec.delivered(_Queue, same)
    rec.requeued(_Queue, mixed, "timeout")
    chunk = decode_chunk(rec.take_chunk() or b"")
    assert list(chunk["rows"]["attempt"]) == [3] * 5 + [1, 2, 1, 65535]
    assert list(chunk["rows"]["msg_id"]) == [10, 11, 12, 13, 14, 110, 111, 112, 113]
