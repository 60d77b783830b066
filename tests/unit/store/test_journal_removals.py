"""Nothing leaves silently (issue 27 item 5): a queue that expires (an mq9 mailbox's TTL), is
deleted or purged with messages inside journals an event per message with its reason and counts
them for ``/api/stats`` — stored backlog beyond the window included.

``expired`` events carry reason ``queue_expired`` for a queue's own expiry (``ttl`` for a
message's own TTL); ``purged`` events carry ``queue_deleted`` or ``purged``; the store gathers
the ids while it purges (packed groups and plain rows alike) and journals them in the purge's
own transaction. ``/api/stats`` has ``expired`` and ``purged`` totals per reason beside
``dead_lettered``; memory-tier queues are counted there, not journaled per message."""

from __future__ import annotations

from typing import Any

import pytest

from mqhub.hub import Hub, build_hub
from mqhub.introspect import Inspector
from mqhub.store.journal import journal_files
from mqhub.testing import CollectingTarget, result_of, start_clock

pa = pytest.importorskip("pyarrow")
from mqhub.analytics.arrow import journal_file_batches  # noqa: E402


def started_hub(path: str) -> Hub:
    """An LMDB hub with the journal, started the way HubService starts it (Clock only)."""
    hub = build_hub({"data-dir": path, "durability": "none", "window": 2}, start_clock())
    hub.store.open()
    hub.journal.open()
    hub.store.journal = hub.journal
    hub.journal.recorder.start(hub.store)
    result_of(hub.broker.start())
    hub.scheduler.startService()
    return hub


def settle(hub: Hub) -> None:
    """Run this turn's commits and force the journal's waiting records into a chunk."""
    for _ in range(3):
        hub.clock.advance(0)
    hub.journal.recorder.stop()
    for _ in range(3):
        hub.clock.advance(0)


def removals(hub: Hub) -> list[tuple[str, str, str]]:
    """(event, queue, reason) of every journal event that is not published/delivered/acked."""
    out = []
    for path, length in journal_files(hub.journal.directory):
        for name, batch in journal_file_batches(path, length):
            if name == "events":
                out += [(r["event"], r["queue"], r["reason"] or "") for r in batch.to_pylist()
                        if r["event"] not in ("published", "delivered", "acked")]
    return sorted(out)


def fill(hub: Hub, name: str, n: int, **kw: Any) -> Any:
    """A durable queue ``name`` bound to itself holding ``n`` messages (window 2: the rest
    only in the store)."""
    q = hub.broker.declare_queue(name, **kw)
    hub.broker.bind_queue(name, name)
    hub.broker.publish_batch(name, [b"m%d" % i for i in range(n)], origin="nats")
    for _ in range(3):
        hub.clock.advance(0)
    return q


def test_an_expiring_queue_journals_each_message_as_expired(tmp_path: Any) -> None:
    """An mq9 mailbox's TTL: its queue expires with 5 messages (3 only in the store)."""
    hub = started_hub(str(tmp_path))
    fill(hub, "mb", 5, expires_at=hub.clock.seconds() + 10)
    hub.clock.advance(11)
    settle(hub)
    assert hub.broker.queue("mb") is None
    assert removals(hub) == [("expired", "mb", "queue_expired")] * 5
    assert Inspector(hub).stats()["expired"] == {"queue_expired": 5}


def test_deleting_and_purging_queues_journal_each_message_as_purged(tmp_path: Any) -> None:
    """A deleted queue (two of its messages in flight) and a purged one: an event each."""
    hub = started_hub(str(tmp_path))
    deleted = fill(hub, "gone", 5)
    deleted.attach(CollectingTarget(), ready=2)
    fill(hub, "emptied", 3).empty()
    hub.broker.delete_queue("gone")
    settle(hub)
    assert removals(hub) == sorted([("purged", "gone", "queue_deleted")] * 5
                                   + [("purged", "emptied", "purged")] * 3)
    assert Inspector(hub).stats()["purged"] == {"queue_deleted": 5, "purged": 3}


def test_plain_rows_memory_queues_and_message_ttls(tmp_path: Any) -> None:
    """Entries stored as plain rows (per-message headers) are reported as packed ones are; a
    memory-tier queue's messages are counted, not journaled; a message's own TTL is an
    ``expired`` event with reason ``ttl``."""
    hub = started_hub(str(tmp_path))
    q = hub.broker.declare_queue("plain")
    hub.broker.bind_queue("plain", "plain")
    hub.broker.publish_batch("plain", [b"a", b"b", b"c"], headers=[{"k": str(i)} for i in range(3)])
    mem = hub.broker.declare_queue("mem", tier="memory")
    hub.broker.bind_queue("mem", "mem")
    hub.broker.publish_batch("mem", [b"x", b"y"])
    hub.broker.declare_queue("short")
    hub.broker.bind_queue("short", "short")
    hub.broker.publish_batch("short", [b"t"], ttl=1)
    for _ in range(3):
        hub.clock.advance(0)
    q.empty()
    mem.empty()
    hub.clock.advance(2)
    hub.broker.sweep_ttl(hub.clock.seconds(), 100)
    settle(hub)
    assert removals(hub) == [("expired", "short", "ttl"), ("purged", "plain", "purged"),
                             ("purged", "plain", "purged"), ("purged", "plain", "purged")]
    stats = Inspector(hub).stats()
    assert stats["purged"] == {"purged": 5} and stats["expired"] == {"ttl": 1}
