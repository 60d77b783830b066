"""JetStream as cluster mode uses it: the subject and name mapping, the API calls, and a pull
consumer that keeps just enough requests open for what its node can take.

The layout (docs/cluster.md, "Mapping"):

* stream ``MQHUB`` (interest retention, R``replicas``, per-message TTL and schedules on)
  holds every durable message: ``mq.<address>`` for publishes, ``mqq.<queue token>`` for a
  message meant for one queue only (replays, re-queues at the tail), ``mqs.<id>`` for a
  schedule that publishes to a ``mq.`` subject when it is due, ``mqp.<address>`` for a
  publish held while its address is paused (:mod:`mqhub.cluster.hold`);
* a durable pull consumer per queue, named by :func:`consumer_name`, whose filter subjects
  are its bindings (:func:`pattern_filter`) plus its own ``mqq.`` subject; the queue's name
  and settings live in the consumer's metadata;
* consumer ``sched`` (never pulled) keeps the schedules alive (interest retention removes a
  message nobody is interested in at once, schedules included);
* stream ``MQHUB_DLQ`` (limits retention) holds dead letters as ``dlq.<queue token>``;
* KV bucket ``MQHUB_KV`` (a stream with per-message TTL) holds leases and the node list.

Sans-IO apart from :class:`JetStream` and :class:`Puller`, which take a
:class:`~mqhub.cluster.client.NatsConnection`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

from twisted.internet import defer

from mqhub.cluster.client import Event, NatsConnection, Waiter, parse_status
from mqhub.errors import ClusterUnavailable
from mqhub.protocols.nats.codec import OP_HMSG, ProtocolError, build_headers, parse_headers

__all__ = ["Stored", "DirectBatch", "STREAM", "DLQ_STREAM", "KV_STREAM", "SCHED_CONSUMER", "JetStreamError",
           "JetStream", "Puller", "address_subject", "queue_subject",
           "pattern_filter", "consumer_name", "parse_ack_reply", "stream_config", "ack_frames", "nak_frames",
           "ACK", "IN_PROGRESS", "NAK", "TERM",
           "NOT_FOUND_CODES"]

STREAM = "MQHUB"
DLQ_STREAM = "MQHUB_DLQ"
KV_STREAM = "KV_MQHUB"
SCHED_CONSUMER = "sched"
#: JetStream ``err_code`` values meaning "no such stream / consumer / message"
NOT_FOUND_CODES = frozenset({10059, 10014, 10037})
_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")
#: JetStream names are limited to 255 characters; escaped names past this are hashed
_NAME_MAX = 200


class JetStreamError(ClusterUnavailable):
    """An API call came back with an error (``code`` HTTP-like, ``err_code`` JetStream's)."""

    def __init__(self, code: int, err_code: int, description: str) -> None:
        super().__init__(f"{code} {description} ({err_code})")
        self.code = code
        self.err_code = err_code
        self.description = description

    @property
    def not_found(self) -> bool:
        """Whether the stream, consumer or message does not exist."""
        return self.code == 404 or self.err_code in NOT_FOUND_CODES


# names and subjects ----------------------------------------------------------------------

def address_subject(address: str) -> str:
    """The subject an address's durable messages are stored under (addresses are valid
    publish subjects: dotted tokens, no whitespace, no wildcard token)."""
    return "mq." + address


def _token(name: str) -> str:
    """``name`` as one subject token / JetStream name: [A-Za-z0-9-] kept, every other byte
    ``_xx``; hashed when long, so distinct names stay distinct."""
    out = []
    for byte in name.encode():
        out.append(chr(byte) if byte in _SAFE else f"_{byte:02x}")
    text = "".join(out)
    if len(text) > _NAME_MAX:
        text = text[:_NAME_MAX - 18] + "_h" + hashlib.sha1(name.encode()).hexdigest()[:16]
    return text


def queue_subject(queue: str) -> str:
    """The subject of messages meant for ``queue`` alone."""
    return "mqq." + _token(queue)


def consumer_name(queue: str) -> str:
    """The durable consumer name of ``queue``."""
    return "q" + _token(queue)


def pattern_filter(pattern: str) -> tuple[str, bool]:
    """A binding pattern as a consumer filter subject, and whether the filter is wider than
    the pattern (MQKS masks such as ``ab*c`` become ``*``: the node checks those itself).
    ``#`` (mq9) is ``>``."""
    tokens = pattern.split(".")
    wider = False
    for i, token in enumerate(tokens):
        if token == "#":
            tokens[i] = ">"
        elif "*" in token and token != "*":
            tokens[i] = "*"
            wider = True
    return "mq." + ".".join(tokens), wider


def parse_ack_reply(reply: str) -> tuple[int, int, int]:
    """``(delivered, stream_seq, published_ns)`` from a ``$JS.ACK`` reply subject (both the
    9-token form and the 12-token form with domain and account hash)."""
    tokens = reply.split(".")
    if len(tokens) >= 12:
        return int(tokens[6]), int(tokens[7]), int(tokens[9])
    return int(tokens[4]), int(tokens[5]), int(tokens[7])


def stream_config(replicas: int) -> list[dict]:
    """The configs of the streams cluster mode needs, for ``replicas`` replicas."""
    return [
        {"name": STREAM, "subjects": ["mq.>", "mqq.>", "mqs.>", "mqp.>"], "retention": "interest",
         "storage": "file", "num_replicas": replicas, "allow_msg_ttl": True,
         "allow_msg_schedules": True, "discard": "old", "duplicate_window": 120_000_000_000,
         "allow_direct": True},
        {"name": DLQ_STREAM, "subjects": ["dlq.>"], "retention": "limits",
         "storage": "file", "num_replicas": replicas, "allow_direct": True},
        {"name": KV_STREAM, "subjects": ["$KV.MQHUB.>"], "retention": "limits",
         "storage": "file", "num_replicas": replicas, "max_msgs_per_subject": 1,
         "allow_msg_ttl": True, "allow_direct": True, "allow_rollup_hdrs": True,
         "deny_delete": False},
    ]


# the API ---------------------------------------------------------------------------------

class JetStream:
    """The JetStream API calls cluster mode makes, over one connection."""

    def __init__(self, conn: NatsConnection) -> None:
        """Use ``conn`` (started by the caller)."""
        self.conn = conn

    @defer.inlineCallbacks
    def api(self, subject: str, payload: bytes | dict = b"",
            timeout: float | None = None) -> defer.Generator[defer.Deferred, object, dict]:
        """Call ``$JS.API.<subject>``; raise :class:`JetStreamError` on an error reply."""
        reply = yield self.conn.request("$JS.API." + subject, payload, timeout)
        assert isinstance(reply, dict)
        err = reply.get("error")
        if err:
            raise JetStreamError(int(err.get("code", 0)), int(err.get("err_code", 0)),
                                 str(err.get("description", "")))
        return reply

    @defer.inlineCallbacks
    def ensure_stream(self, config: dict) -> defer.Generator[defer.Deferred, object, dict]:
        """Create the stream, or update it when it exists with another config."""
        name = config["name"]
        try:
            reply = yield self.api(f"STREAM.CREATE.{name}", config)
        except JetStreamError as exc:
            if exc.err_code != 10058:   # stream name already in use with a different config
                raise
            reply = yield self.api(f"STREAM.UPDATE.{name}", config)
        assert isinstance(reply, dict)
        return reply

    def ensure_consumer(self, stream: str, config: dict) -> defer.Deferred[dict]:
        """Create or update a durable consumer (``CONSUMER.CREATE`` does both since 2.10
        when only mutable fields changed)."""
        name = config["durable_name"]
        return self.api(f"CONSUMER.CREATE.{stream}.{name}",
                        {"stream_name": stream, "config": config, "action": ""})

    def consumer_info(self, stream: str, name: str) -> defer.Deferred[dict]:
        """A consumer's config and state (``num_pending``, ``num_ack_pending``...)."""
        return self.api(f"CONSUMER.INFO.{stream}.{name}")

    def delete_consumer(self, stream: str, name: str) -> defer.Deferred[dict]:
        """Delete a consumer (with interest retention, messages only it held go too)."""
        return self.api(f"CONSUMER.DELETE.{stream}.{name}")

    @defer.inlineCallbacks
    def consumers(self, stream: str) -> defer.Generator[defer.Deferred, object, list[dict]]:
        """Every consumer of ``stream`` with its info (paged)."""
        out: list[dict] = []
        offset = 0
        while True:
            reply = yield self.api(f"CONSUMER.LIST.{stream}", {"offset": offset})
            assert isinstance(reply, dict)
            page = reply.get("consumers") or []
            out.extend(page)
            offset += len(page)
            if not page or offset >= int(reply.get("total", 0)):
                return out

    def stream_info(self, stream: str) -> defer.Deferred[dict]:
        """A stream's config, state and cluster (leader, replicas)."""
        return self.api(f"STREAM.INFO.{stream}")

    def get_message(self, stream: str, seq: int | None = None, next_by_subject: str = "",
                    last_by_subject: str = "") -> defer.Deferred[dict]:
        """``STREAM.MSG.GET``: a stored message by sequence, the next one at or after
        ``seq`` on a subject, or the last one of a subject."""
        request: dict[str, object] = {}
        if last_by_subject:
            request["last_by_subj"] = last_by_subject
        else:
            request["seq"] = seq or 1
            if next_by_subject:
                request["next_by_subj"] = next_by_subject
        return self.api(f"STREAM.MSG.GET.{stream}", request)

    def direct_batch(self, stream: str, seq: int, subject: str, count: int,
                     max_bytes: int = 1 << 20) -> defer.Deferred[list[Stored]]:
        """Up to ``count`` stored messages of ``subject`` (a filter) from sequence ``seq`` on,
        in stream order, in one batched direct get (any replica answers: stream
        ``allow_direct``), stopping past ``max_bytes``."""
        reply = self.conn.reply_subject()
        waiter = DirectBatch(reply, self.conn.clock.seconds() + self.conn.timeout, count)
        self.conn.wait(waiter)
        body = json.dumps({"seq": max(1, seq), "next_by_subj": subject, "batch": count,
                           "max_bytes": max_bytes}).encode()
        try:
            self.conn.publish([b"PUB $JS.API.DIRECT.GET.%s %s %d\r\n%s\r\n" % (
                stream.encode(), reply.encode(), len(body), body)])
        except ClusterUnavailable as exc:
            self.conn.forget(reply)
            return defer.fail(exc)
        return waiter.done

    def delete_message(self, stream: str, seq: int) -> defer.Deferred[dict]:
        """Remove one message from a stream."""
        return self.api(f"STREAM.MSG.DELETE.{stream}", {"seq": seq, "no_erase": True})

    def purge(self, stream: str, subject: str = "") -> defer.Deferred[dict]:
        """Purge a stream, or only one subject of it."""
        return self.api(f"STREAM.PURGE.{stream}", {"filter": subject} if subject else b"")


#: a stored message read back: (stream sequence, subject, its own header block or b"", body)
Stored = tuple[int, str, bytes, bytes]
#: headers a direct get adds to a stored message's own
_DIRECT_HEADERS = frozenset({"Nats-Stream", "Nats-Sequence", "Nats-Subject", "Nats-Time-Stamp",
                             "Nats-Num-Pending", "Nats-Last-Sequence"})


class DirectBatch(Waiter):
    """The replies of one batched direct get: stored messages until the ``204 EOB`` status
    (or ``404``: none), at most ``count``."""

    __slots__ = ("count", "messages", "done")

    def __init__(self, subject: str, deadline: float, count: int) -> None:
        super().__init__(subject, deadline)
        self.count = count
        self.messages: list[Stored] = []
        self.done: defer.Deferred[list[Stored]] = defer.Deferred()

    def receive(self, events: list[Event]) -> bool:
        """Collect messages; end at the terminating status or the count."""
        for event in events:
            if event[0] != OP_HMSG:
                continue            # a direct get reply always carries headers
            code, text = parse_status(event[4])
            if code:
                if code in (204, 404):
                    self.done.callback(self.messages)
                else:
                    self.done.errback(JetStreamError(code, 0, text))
                return True
            try:
                items = parse_headers(event[4])[2]
            except ProtocolError:
                continue
            seq = 0
            subject = ""
            own = []
            for name, value in items:
                if name == "Nats-Sequence":
                    seq = int(value) if value.isdigit() else 0
                elif name == "Nats-Subject":
                    subject = value
                elif name not in _DIRECT_HEADERS:
                    own.append((name, value))
            self.messages.append((seq, subject, build_headers(own) if own else b"", event[5]))
            if len(self.messages) >= self.count:
                self.done.callback(self.messages)
                return True
        return False

    def fail(self, reason: Exception) -> None:
        """No end came in time (or the connection dropped)."""
        self.done.errback(reason)


# acknowledgements -------------------------------------------------------------------------

ACK = b"+ACK"
IN_PROGRESS = b"+WPI"
NAK = b"-NAK"
TERM = b"+TERM"


def ack_frames(replies: list[str], body: bytes = ACK) -> list[bytes]:
    """One frame per pulled message answering its ``$JS.ACK`` reply with ``body``."""
    tail = b" %d\r\n%s\r\n" % (len(body), body)
    return [b"PUB " + reply.encode() + tail for reply in replies]


def nak_frames(replies: list[str], delay: float) -> list[bytes]:
    """``-NAK`` frames asking for redelivery after ``delay`` seconds (at once when 0)."""
    if delay <= 0:
        return ack_frames(replies, NAK)
    return ack_frames(replies, b'-NAK {"delay":%d}' % int(delay * 1e9))


# pulling ---------------------------------------------------------------------------------

#: seconds a puller waits after a pull request failed (no consumer yet, too many requests)
PULL_BACKOFF = 0.2


class Puller:
    """Keeps pull requests open on one durable consumer for ``want()`` messages.

    Pulled messages arrive on the puller's own inbox subscription with their stream subject
    and a ``$JS.ACK`` reply; a request's end (408 expired, 404, 409) arrives on the request's
    reply subject as a status. The server fills requests first come first served, so each
    message counts against the oldest open request.

    :param conn: the connection.
    :param stream: the stream.
    :param consumer: the durable consumer's name.
    :param want: how many more messages the node can take now (asked on every refill).
    :param handler: receives each read's pulled messages (parser events; ``event[3]`` is
        the ``$JS.ACK`` reply).
    :param expires: seconds a request stays open on the server.
    :param max_batch: the largest batch one request asks for.
    """

    def __init__(self, conn: NatsConnection, stream: str, consumer: str,
                 want: Callable[[], int], handler: Callable[[list[Event]], None],
                 expires: float = 5.0, max_batch: int = 1000) -> None:
        self.conn = conn
        self.subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}".encode()
        self.want = want
        self.handler = handler
        self.expires = expires
        self.max_batch = max_batch
        self.outstanding = 0
        #: open requests, oldest first: reply subject -> [messages still due, deadline]
        self.open: dict[str, list] = {}
        self.running = False
        self.last_error = ""
        self._prefix = ""
        self._sid: str | None = None
        self._serial = 0
        self._pause_until = 0.0

    def start(self) -> None:
        """Subscribe to the puller's inbox and begin pulling (again after reconnects)."""
        self.running = True
        if self._sid is None:
            # its own inbox, outside the connection's ``_INBOX.<id>.>``: the server sends a
            # no-responders status to one subscription only, and it must be this one
            self._prefix = "_PULL" + self.conn.reply_subject()[6:] + "."
            self._sid = self.conn.subscribe(self._prefix + "*", self._receive)
            self.conn.on_state.append(self._on_state)
        self.refill()

    def stop(self) -> None:
        """Stop asking (messages of requests still open on the server are redelivered after
        the consumer's ack wait)."""
        self.running = False
        if self._sid is not None:
            self.conn.unsubscribe(self._sid)
            self.conn.on_state.remove(self._on_state)
            self._sid = None
        self.open.clear()
        self.outstanding = 0

    def _on_state(self, up: bool) -> None:
        """Requests die with their connection; ask again once reconnected."""
        self.open.clear()
        self.outstanding = 0
        if up:
            self.refill()

    def _receive(self, events: list[Event]) -> None:
        """Count messages against the oldest requests, close requests on their status (or
        an error reply), and hand the messages on."""
        msgs = []
        for event in events:
            if event[3]:
                msgs.append(event)
                continue
            code = parse_status(event[4])[0] if event[0] == OP_HMSG else 0
            if code == 100:          # idle heartbeat
                continue
            entry = self.open.pop(event[1], None)
            if entry is not None:
                self.outstanding -= entry[0]
            if code != 408:          # not a plain expiry: the consumer is missing or busy
                self.last_error = f"pull: {code or event[-1][:120]!r}"
                self._pause_until = self.conn.clock.seconds() + PULL_BACKOFF
        if msgs:
            n = len(msgs)
            self.outstanding -= n
            open_ = self.open
            while n and open_:
                subject = next(iter(open_))
                entry = open_[subject]
                took = min(n, entry[0])
                entry[0] -= took
                n -= took
                if not entry[0]:
                    del open_[subject]
            self.handler(msgs)
        self.refill()

    def refill(self) -> None:
        """Open requests until ``outstanding`` covers what the node wants (not while at least
        half of it is still on its way: no stream of tiny requests)."""
        if not self.running or not self.conn.connected:
            return
        now = self.conn.clock.seconds()
        if now < self._pause_until:
            return
        if self.open:
            oldest = next(iter(self.open.values()))
            if oldest[1] < now:
                self._expire(now)
        want = self.want() - self.outstanding
        if want <= 0 or (self.outstanding and want < self.outstanding // 2):
            return
        frames = []
        deadline = now + self.expires + 2.0
        while want > 0:
            batch = min(want, self.max_batch)
            self._serial += 1
            reply = f"{self._prefix}{self._serial}"
            body = b'{"batch":%d,"expires":%d}' % (batch, int(self.expires * 1e9))
            frames.append(b"PUB %s %s %d\r\n%s\r\n" % (self.subject, reply.encode(),
                                                       len(body), body))
            self.open[reply] = [batch, deadline]
            self.outstanding += batch
            want -= batch
        try:
            self.conn.publish(frames)
        except ClusterUnavailable as exc:
            self.last_error = str(exc)

    def _expire(self, now: float) -> None:
        """Forget requests whose status never came (a leader change can drop them)."""
        for subject, entry in list(self.open.items()):
            if entry[1] < now:
                del self.open[subject]
                self.outstanding -= entry[0]

    def tick(self) -> None:
        """Called now and then by the owner: expire lost requests and refill."""
        self.refill()
