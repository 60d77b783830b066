"""Smoke tests of the MemoryStore reference (the full conformance suite lives beside it)."""

from twisted.internet.task import Clock
from zope.interface.verify import verifyObject

from mqhub.interfaces import IMessageStore
from mqhub.store.batch import WriteBatch
from mqhub.store.memory import MemoryStore
from mqhub.store.records import make_entry


def test_provides_interface() -> None:
    """MemoryStore provides IMessageStore."""
    assert verifyObject(IMessageStore, MemoryStore())


def test_grouped_commit_waits_for_the_turn() -> None:
    """With a clock, a commit is confirmed only when the turn's group is applied."""
    clock = Clock()
    store = MemoryStore(clock)
    store.open()
    batch = WriteBatch()
    batch.put_entries("q", [make_entry(1, b"a"), make_entry(2, b"b", priority=5)])
    fired: list[object] = []
    store.commit(batch).addCallback(fired.append)
    assert fired == []
    clock.advance(0)
    assert fired == [None]
    got: list[list] = []
    store.read_entries("q", None, 10).addCallback(got.append)
    assert [e[0] for e in got[0]] == [2, 1]
