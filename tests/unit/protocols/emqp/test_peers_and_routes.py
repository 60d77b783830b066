"""The router's bookkeeping off the per-message path: the peer table is marked once per read
(the admin list is what marking each message left), the worker order is kept without
re-sorting (eventmq's choice unchanged) and peers are counted without building their rows."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from mqhub.protocols.emqp.peers import PeerTable
from mqhub.protocols.emqp.workers import Routes, Worker
from mqhub.testing import property_examples
from tests.unit.protocols.emqp.helpers import Rig, V

PEERS = [b"a", b"b", b"c", b"d"]
#: one frontend message: a valid HEARTBEAT, REQUEST, DISCONNECT or KBYE, or a malformed one
message = st.tuples(st.sampled_from(PEERS),
                    st.sampled_from(["hb", "hb", "req", "bye", "kbye", "bad", "empty"]))


def frames(peer: bytes, kind: str) -> list[bytes]:
    """The frames of one drawn message."""
    if kind == "req":
        return [peer, b"", V, b"REQUEST", b"m", b"default", b"", b"not a job"]
    if kind == "bye":
        return [peer, b"", V, b"DISCONNECT", b"d"]
    if kind == "kbye":
        return [peer, b"", V, b"KBYE", b"k"]
    if kind == "bad":
        return [peer, b"", b"eMQP/9", b"HEARTBEAT", b"h"]
    if kind == "empty":
        return []
    return [peer, b"", V, b"HEARTBEAT", b"h"]


def reference(table: PeerTable, read: list[tuple[bytes, str]], now: float) -> None:
    """What the router did before: ``seen`` per valid message, ``forget`` on a goodbye."""
    for peer, kind in read:
        if kind in ("bad", "empty"):
            continue
        table.seen(peer, now)
        if kind in ("bye", "kbye"):
            table.forget(peer)


class CountingTable(PeerTable):
    """A PeerTable that counts the calls marking it."""

    def __init__(self, **kw: Any) -> None:
        """As PeerTable, no calls yet."""
        super().__init__(**kw)
        self.calls = 0

    def seen(self, peer: bytes, now: float) -> None:
        """Count, then mark."""
        self.calls += 1
        super().seen(peer, now)

    def seen_all(self, peers: list[bytes], now: float) -> None:
        """Count, then mark."""
        self.calls += 1
        super().seen_all(peers, now)


@settings(max_examples=property_examples(80), deadline=None)
@given(reads=st.lists(st.lists(message, max_size=12), min_size=1, max_size=6),
       max_peers=st.sampled_from([1, 2, 3, 10_000]))
def test_marking_a_read_at_once_lists_what_marking_each_message_did(
        reads: list[list[tuple[bytes, str]]], max_peers: int) -> None:
    """Whatever the reads hold (repeats, goodbyes mid-read, malformed messages, a table too
    small for them), the frontend table's rows (since, last seen, messages, order) are the
    ones a ``seen`` per message left, and so are the admin rows."""
    rig = Rig()
    rig.router.clients = PeerTable(max_peers=max_peers)
    model = PeerTable(max_peers=max_peers)
    for read in reads:
        rig.clock.advance(1)
        rig.router.frontend_received([frames(p, k) for p, k in read])
        reference(model, read, rig.clock.seconds())
        assert list(rig.router.clients.peers.items()) == list(model.peers.items())
    rows = [r for r in rig.router.peers() if r["listener"] == "emqp-frontend"]
    assert [(r["peer"], r["since"], r["last_seen"], r["messages"]) for r in rows] == [
        (p.decode(), since, last, n) for p, (since, last, n) in model.peers.items()]


def test_one_mark_per_read_on_the_frontend_and_pub_in() -> None:
    """A read of 50 messages from 3 peers marks the table once (it used to be 50 times)."""
    rig = Rig()
    rig.router.clients = clients = CountingTable()
    rig.router.pubsub.publishers = publishers = CountingTable()
    rig.router.frontend_received([frames(PEERS[i % 3], "hb") for i in range(50)])
    rig.router.pubin_received([[PEERS[i % 3], b"", V, b"PUBLISH", b"x", b"news", b"hi"]
                               for i in range(50)])
    assert (clients.calls, publishers.calls) == (1, 1)
    assert [row[2] for row in clients.peers.values()] == [17, 17, 16]
    assert [row[2] for row in publishers.peers.values()] == [17, 17, 16]


def old_pick(lst: list[tuple[int, bytes]], workers: dict[bytes, Worker]) -> Worker | None:
    """The choice as it was written before (rotate, then re-sort by weight): the model."""
    for i, (_, peer) in enumerate(lst):
        worker = workers.get(peer)
        if worker is not None and worker.slots > 0:
            if len(lst) > 1:
                moved = lst[:i + 1]
                del lst[:i + 1]
                lst.extend(moved)
                lst.sort(key=lambda item: -item[0])
            worker.slots -= 1
            return worker
    return None


class NoSortList(list):  # type: ignore[type-arg]
    """A worker list that fails the test if it is ever re-sorted."""

    def sort(self, *args: Any, **kw: Any) -> None:
        """Refuse."""
        raise AssertionError("the worker list was re-sorted")


op = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 5), st.integers(0, 3), st.integers(0, 3)),
    st.tuples(st.just("remove"), st.integers(0, 5)),
    st.tuples(st.just("slot"), st.integers(0, 5)),
    st.tuples(st.just("pick"), st.just(0)),
    st.tuples(st.just("pick"), st.just(0)),
)


@settings(max_examples=property_examples(150), deadline=None)
@given(ops=st.lists(op, max_size=60))
def test_pick_chooses_as_the_resorting_rule_did_without_sorting(ops: list[tuple]) -> None:
    """Random adds (weights 0-3, some tied), removals, READY slots and picks: every pick
    names the worker the old rotate-and-sort rule named, the lists stay equal, and the
    worker list is never re-sorted."""
    routes = Routes()
    routes.by_queue["q"] = NoSortList()
    model: list[tuple[int, bytes]] = []
    workers: dict[bytes, Worker] = {}
    model_workers: dict[bytes, Worker] = {}
    for kind, n, *rest in ops:
        peer = b"w%d" % n
        if kind == "add" and peer not in workers:
            queues = [(rest[0], "q")] + ([(rest[1], "q")] if rest[1] == 3 else [])
            w, m = Worker(peer, queues, 0.0), Worker(peer, queues, 0.0)
            workers[peer], model_workers[peer] = w, m
            routes.add(w)
            for weight, _ in queues:  # the old add: append, then a stable sort
                model.append((weight, peer))
                model.sort(key=lambda item: -item[0])
        elif kind == "remove" and peer in workers:
            routes.remove(workers.pop(peer))
            del model_workers[peer]
            model[:] = [item for item in model if item[1] != peer]
        elif kind == "slot" and peer in workers:
            workers[peer].slots += 1
            model_workers[peer].slots += 1
        elif kind == "pick":
            got = routes.pick("q", workers)
            want = old_pick(model, model_workers)
            assert (got and got.peer) == (want and want.peer)
        assert routes.by_queue["q"] == model


def test_peer_counts_do_not_build_the_rows() -> None:
    """The admin connection counts (/metrics, /api/stats) ask the eMQP service how many peers
    it knows instead of building up to 20,000 rows (about 11 ms) to count them."""
    from twisted.application.service import MultiService

    from mqhub.introspect import Inspector
    from mqhub.protocols.emqp.service import EmqpService

    root = MultiService()
    emqp = EmqpService(Rig().hub, {}, {})  # not started: the router is driven directly
    emqp.setServiceParent(root)
    router = emqp.router
    router.backend_received([[b"w1", b"", V, b"INFORM", b"i", b"", b"worker"]])
    router.frontend_received([frames(p, "hb") for p in PEERS])
    router.pubin_received([[b"p1", b"", V, b"PUBLISH", b"x", b"news", b"hi"]])
    ins = Inspector(emqp.hub, root)
    assert emqp.peer_count() == len(emqp.peers()) == 6

    def no_rows() -> list[dict[str, Any]]:
        raise AssertionError("rows built only to be counted")
    router.peers = no_rows  # type: ignore[method-assign]
    assert ins.connection_counts() == {"emqp": 6}
