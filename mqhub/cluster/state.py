"""Adapters' records in cluster mode (``ICore.state``): one JetStream KV bucket every node sees.

NSQ topics, MQKS and VibeMQ queue settings and mq9 mailboxes are records an adapter writes on
one node and every node must know (a mailbox made on A is written to on B). They live in the
KV stream ``KV_MQHUB`` under ``$KV.MQHUB.st.<key>``: one subject per record, the stream keeps
the last value of each (``max_msgs_per_subject`` 1), a delete is a ``KV-Operation: DEL``
marker. A commit is one pipelined batch of KV puts; it fires once the stream's quorum stored
every one (as a publish does) and fails with :class:`~mqhub.errors.ClusterUnavailable`.

Each node keeps a **mirror** of the records (key -> value and the stream sequence that wrote
it), read whole when the node sets up and again after each reconnect; ``scan_meta`` answers
from it. After a commit is stored the node tells the others on core subject ``mqhub.state``
what it wrote and at which sequence; they update their mirrors, call their watchers
(``IAdapterState.watch``; never for a node's own commits) and answer. A record is written
only once this node's queue changes issued before it are in the cluster (a mailbox's record
never names queues that do not exist yet), and the commit fires once
every live node answered (at most :data:`NOTICE_WAIT` later): a client told "created" on one
node finds the record on every other node at once (an mq9 mailbox made on A takes a write on
B the next moment). A notice lost while a node was
disconnected is made up by the re-read after the reconnect, which calls the watchers for every
record that differs. Sequences order the changes: an older notice never undoes a newer value.

Entry lists (mq9's persisted broadcasts) stay in the node's local store, like the receiver sets
that refer to them (docs/cluster.md, "Limits").
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any, cast

from twisted.internet import defer
from twisted.logger import Logger
from zope.interface import implementer

from mqhub.cluster.client import Event, NatsConnection, Waiter
from mqhub.cluster.jetstream import KV_STREAM, JetStream, JetStreamError
from mqhub.core.state import StoreState
from mqhub.errors import ClusterUnavailable
from mqhub.interfaces import IAdapterState, IStateBatch
from mqhub.protocols.nats.codec import build_headers, parse_headers
from mqhub.records import Entry
from mqhub.store.batch import WriteBatch

__all__ = ["ClusterState", "STATE_SUBJECT", "decode_key", "encode_key"]

log = Logger()

#: where records live in the KV stream, and where nodes tell each other what they wrote
KEY_PREFIX = "$KV.MQHUB.st."
STATE_SUBJECT = "mqhub.state"
#: seconds a commit waits for the other nodes to confirm its notice (a node that does not
#: answer in time is gone or cut off: it re-reads the bucket when it is back)
NOTICE_WAIT = 1.0


class NoticeAcks(Waiter):
    """The other nodes' answers to one notice: ``done`` fires once ``expected`` answered,
    or at the deadline (never fails: the records are stored either way)."""

    __slots__ = ("expected", "done")

    def __init__(self, subject: str, deadline: float, expected: int) -> None:
        super().__init__(subject, deadline)
        self.expected = expected
        self.done: defer.Deferred[None] = defer.Deferred()

    def receive(self, events: list[Event]) -> bool:
        """Count answers."""
        self.expected -= len(events)
        if self.expected <= 0:
            self.done.callback(None)
            return True
        return False

    def fail(self, reason: Exception) -> None:
        """Not every node answered in time (or the connection dropped): go on."""
        self.done.callback(None)
_KEEP = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_/")
_DELETE = build_headers([("KV-Operation", "DEL")])


def encode_key(key: str) -> str:
    """A record key as one KV subject token: letters, digits, ``-_/`` kept, every other byte
    ``=XX`` (so a key's prefix encodes to a prefix of its token)."""
    return "".join(chr(b) if b in _KEEP else f"={b:02X}" for b in key.encode())


def decode_key(token: str) -> str:
    """The record key of a subject token (inverse of :func:`encode_key`)."""
    out = bytearray()
    i = 0
    raw = token.encode()
    while i < len(raw):
        if raw[i] == 0x3D:   # "="
            out.append(int(raw[i + 1:i + 3], 16))
            i += 3
        else:
            out.append(raw[i])
            i += 1
    return out.decode()


@implementer(IAdapterState)
class ClusterState:
    """:class:`~mqhub.interfaces.IAdapterState` over the cluster's KV bucket (see the module
    docstring).

    :param conn: the node's cluster connection; :param js: its JetStream API.
    :param node: this node's name (notices it sent come back to it: ignored).
    :param store: the node's local store (entry lists), or None.
    """

    def __init__(self, conn: NatsConnection, js: JetStream, node: str, store: Any,
                 peer_count: Callable[[], int] = lambda: 0,
                 directory: Callable[[], defer.Deferred[Any]] = lambda: defer.succeed(None)
                 ) -> None:
        self.conn = conn
        self.peer_count = peer_count
        self.directory = directory
        self.js = js
        self.node = node
        self.local = StoreState(store) if store is not None else None
        #: key -> (value or None for a delete marker, stream sequence of that write)
        self.mirror: dict[str, tuple[bytes | None, int]] = {}
        self.loaded = False
        self._watchers: list[tuple[str, Callable[[str, bytes | None], None]]] = []
        self._last: defer.Deferred[Any] = defer.succeed(None)
        self._sid: str | None = None

    # -- IAdapterState ---------------------------------------------------------------------

    def watch(self, prefix: str, changed: Callable[[str, bytes | None], None]) -> None:
        """Call ``changed(key, value)`` for records under ``prefix`` other nodes write."""
        self._watchers.append((prefix, changed))

    def batch(self) -> IStateBatch:
        """A new, empty batch of writes."""
        return cast(IStateBatch, WriteBatch())

    def commit(self, batch: IStateBatch) -> defer.Deferred[None]:
        """Records to the KV bucket (one pipelined batch), entry lists to the local store;
        fires when both are durable, in issue order with earlier commits."""
        assert isinstance(batch, WriteBatch)
        changes: list[tuple[str, bytes | None]] = list(batch.meta_puts)
        changes += [(key, None) for key in batch.meta_deletes]
        local = WriteBatch()
        for name, entries in batch.puts.items():
            local.put_entries(name, entries)
        for name, runs in batch.deletes.items():
            local.delete_runs(name, runs)
        waits: list[defer.Deferred[Any]] = []
        if changes:
            # the queues a record describes exist cluster-wide before any node reads it
            put = self.directory()
            put.addCallback(lambda _: self._put(changes))
            waits.append(put)
        if local:
            if self.local is None:
                return defer.fail(ClusterUnavailable("no local store for entry lists"))
            waits.append(self.local.commit(cast(IStateBatch, local)))
        if not waits:
            return defer.succeed(None)
        d: defer.Deferred[Any] = defer.gatherResults(waits, consumeErrors=True)
        d.addCallbacks(lambda _: None, _first_error)
        self._last = d
        return d

    def scan_meta(self, prefix: str) -> defer.Deferred[list[tuple[str, bytes]]]:
        """Every record under ``prefix`` in key order (from the mirror, after this node's
        commits issued so far)."""
        def read(_: object) -> list[tuple[str, bytes]]:
            return sorted((k, v) for k, (v, _seq) in self.mirror.items()
                          if v is not None and k.startswith(prefix))
        d: defer.Deferred[Any] = defer.Deferred()

        def after(result: object) -> object:
            d.callback(None)
            return result
        self._last.addBoth(after)
        d.addCallback(read)
        return d

    def read_entries(self, name: str, after: tuple[int, int] | None,
                     limit: int) -> defer.Deferred[list[Entry]]:
        """Entries of the node-local list ``name``."""
        if self.local is None:
            return defer.succeed([])
        return self.local.read_entries(name, after, limit)

    # -- writing -----------------------------------------------------------------------------

    def _put(self, changes: list[tuple[str, bytes | None]]) -> defer.Deferred[None]:
        """One batch of KV puts/deletes; then the mirror and the notice to the other nodes."""
        subjects = [KEY_PREFIX + encode_key(key) for key, _ in changes]

        def frames(reply: str) -> list[bytes]:
            out = []
            for subject, (_, value) in zip(subjects, changes, strict=True):
                subj = subject.encode()
                rep = reply.encode()
                if value is None:
                    out.append(b"HPUB %s %s %d %d\r\n%s\r\n" % (
                        subj, rep, len(_DELETE), len(_DELETE), _DELETE))
                else:
                    out.append(b"PUB %s %s %d\r\n%s\r\n" % (subj, rep, len(value), value))
            return out
        d = self.conn.publish_acked(frames, len(changes))

        def stored(seq: int) -> defer.Deferred[None] | None:
            for key, value in changes:
                self.mirror[key] = (value, seq)
            notice = json.dumps({"node": self.node, "seq": seq, "changes": [
                [k, None if v is None else base64.b64encode(v).decode()]
                for k, v in changes]}).encode()
            expected = self.peer_count()
            reply = self.conn.reply_subject()
            try:
                self.conn.publish([b"PUB %s %s %d\r\n%s\r\n" % (
                    STATE_SUBJECT.encode(), reply.encode(), len(notice), notice)])
            except ClusterUnavailable:
                return None   # the others re-read the bucket when they reconnect
            if expected <= 0:
                return None
            acks = NoticeAcks(reply, self.conn.clock.seconds() + NOTICE_WAIT, expected)
            self.conn.wait(acks)
            return acks.done
        return d.addCallback(stored)

    # -- keeping in step ---------------------------------------------------------------------

    def subscribe(self) -> None:
        """Listen for the other nodes' notices (once; renewed by the connection)."""
        if self._sid is None:
            self._sid = self.conn.subscribe(STATE_SUBJECT, self._notice)

    def _notice(self, events: list[Event]) -> None:
        """Other nodes' commits: into the mirror, then to the watchers."""
        answers = []
        for event in events:
            try:
                notice = json.loads(event[-1])
                if notice.get("node") == self.node:
                    continue
                seq = int(notice["seq"])
                for key, value in notice["changes"]:
                    self._apply(str(key), None if value is None else base64.b64decode(value),
                                seq)
            except (ValueError, KeyError, TypeError) as exc:
                log.warn("cluster state: bad notice ignored ({err})", err=exc)
                continue
            if event[3]:
                answers.append(b"PUB %s 0\r\n\r\n" % event[3].encode())
        if answers:
            try:
                self.conn.publish(answers)
            except ClusterUnavailable:
                pass

    def _apply(self, key: str, value: bytes | None, seq: int) -> None:
        """Take one record written elsewhere if it is newer than the mirror's."""
        old = self.mirror.get(key)
        if old is not None and old[1] >= seq:
            return
        self.mirror[key] = (value, seq)
        if old is None and value is None or old is not None and old[0] == value:
            return
        for prefix, changed in list(self._watchers):
            if key.startswith(prefix):
                try:
                    changed(key, value)
                except Exception:
                    log.failure("cluster state: a watcher of {key} failed", key=key)

    @defer.inlineCallbacks
    def load(self) -> Any:
        """Read every record of the bucket into the mirror (at setup and after reconnects);
        what differs from the mirror goes to the watchers."""
        seq = 1
        seen: dict[str, tuple[bytes | None, int]] = {}
        while True:
            try:
                reply = yield self.js.get_message(KV_STREAM, seq,
                                                  next_by_subject=KEY_PREFIX + ">")
            except JetStreamError as exc:
                if exc.not_found:
                    break
                raise
            msg = reply["message"]
            seq = int(msg["seq"])
            key = decode_key(str(msg["subject"])[len(KEY_PREFIX):])
            hdrs = base64.b64decode(msg.get("hdrs") or "")
            deleted = bool(hdrs) and any(
                k.lower() == "kv-operation" and v.upper() in ("DEL", "PURGE")
                for k, v in parse_headers(hdrs)[2])
            seen[key] = (None if deleted else base64.b64decode(msg.get("data") or ""), seq)
            seq += 1
        for key, (value, at) in seen.items():
            self._apply(key, value, at)
        for key, (value, at) in list(self.mirror.items()):
            if key not in seen and value is not None:
                # purged from the bucket (an operator, or a test's cleanup)
                self._apply(key, None, at + 1)
        self.loaded = True


def _first_error(failure: Any) -> Any:
    """The first failure of a gatherResults."""
    if isinstance(failure.value, defer.FirstError):
        return failure.value.subFailure
    return failure

