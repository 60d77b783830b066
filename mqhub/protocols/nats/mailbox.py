"""mq9 mailboxes as core queues: names, the mailbox record, the push target and item rendering.

A mailbox ``{id}`` is three core queues, one per priority, each bound to its INBOX address:

| priority | queue | bound address | tier |
|---|---|---|---|
| urgent | ``mq9/box/{id}/urgent`` | ``$mq9.AI.INBOX.{id}.urgent`` | durable |
| normal | ``mq9/box/{id}/normal`` | ``$mq9.AI.INBOX.{id}.normal`` | durable |
| notify | ``mq9/box/{id}/notify`` | ``$mq9.AI.INBOX.{id}.notify`` | memory (durable in ``latest``) |

Every queue has ``expires_at`` = the mailbox's TTL and ``ttl`` = its priority's message TTL
(urgent 86400 s, normal 3600 s, notify none: the core drops entries older than that by their id
time, so the store needs no expiry row per message); a shorter ``mq9-ttl`` header becomes the
entry's own expiry. A ``latest`` mailbox's queues have ``max_size=1`` with ``drop_oldest``. The backlog lives in the core (a bounded window in
memory, the rest in the store), so any protocol publishing to the address reaches the mailbox.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Protocol

from zope.interface import implementer

from mqhub.interfaces import IDeliveryTarget
from mqhub.protocols.nats import codec
from mqhub.records import ADDRESS, BODY, HEADERS, MSG_ID, id_time


class MailboxHost(Protocol):
    """What a mailbox's push target needs from the mq9 handler (mqhub.protocols.nats.mq9.Mq9)."""

    def push(self, pusher: MailboxPusher, consumer: Any, entries: list[tuple]) -> None:
        """Render ``entries`` for the mailbox's subscribers and ack what was pushed."""


INBOX = "$mq9.AI.INBOX."
RESERVED_REPLY = "mqhub-reply"
QUEUE_PREFIX = "mq9/box/"

#: priority name -> (core priority, default TTL seconds or 0, durable in a standard mailbox)
PRIORITIES: dict[str, tuple[int, float, bool]] = {
    "urgent": (2, 86400.0, True),
    "normal": (1, 3600.0, True),
    "notify": (0, 0.0, False),
}
PRIORITY_NAMES = {2: "urgent", 1: "normal", 0: "notify"}
ORDER = (2, 1, 0)


def mailbox_queue(mail_id: str, priority: str) -> str:
    """Core queue name of one priority of a mailbox."""
    return f"{QUEUE_PREFIX}{mail_id}/{priority}"


def mailbox_queues(mail_id: str) -> list[str]:
    """The three core queue names of a mailbox, urgent first."""
    return [mailbox_queue(mail_id, PRIORITY_NAMES[p]) for p in ORDER]


def inbox_address(mail_id: str, priority: str) -> str:
    """The address a mailbox priority queue is bound to."""
    return f"{INBOX}{mail_id}.{priority}"


class Mailbox:
    """One mailbox: its settings and its three core queues (core priority -> Queue)."""

    __slots__ = ("mail_id", "token", "kind", "ttl", "created", "expires_at", "queues", "qlist",
                 "pending", "room")

    def __init__(self, mail_id: str, token: str, kind: str, ttl: int, created: float) -> None:
        """Record the settings; ``ttl`` 0 means the mailbox never expires."""
        self.mail_id = mail_id
        self.token = token
        self.kind = kind
        self.ttl = ttl
        self.created = created
        self.expires_at = created + ttl if ttl else 0.0
        self.queues: dict[int, Any] = {}
        self.qlist: tuple[Any, ...] = ()
        self.pending = 0          # messages accepted in this read, not yet handed to the core
        self.room = 0             # how many ``pending`` may reach (refreshed when reached)

    def record(self) -> bytes:
        """The metadata value persisted for this mailbox."""
        return json.dumps({"token": self.token, "type": self.kind, "ttl": self.ttl,
                           "created": self.created}).encode()

    @classmethod
    def from_record(cls, mail_id: str, data: bytes) -> Mailbox:
        """Rebuild a mailbox from its metadata value."""
        d = json.loads(data)
        return cls(mail_id, d["token"], d["type"], int(d["ttl"]), float(d["created"]))

    def declare(self, broker: Any) -> None:
        """Declare (or find again after a restart) the three queues and bind their addresses."""
        latest = self.kind == "latest"
        for name, (prio, ttl, durable) in PRIORITIES.items():
            qname = mailbox_queue(self.mail_id, name)
            q = broker.declare_queue(qname, tier="durable" if durable or latest else "memory",
                                     max_size=1 if latest else 0, overflow="drop_oldest",
                                     ttl=ttl, expires_at=self.expires_at)
            broker.bind_queue(inbox_address(self.mail_id, name), qname)
            self.queues[prio] = q
        self.qlist = tuple(self.queues[p] for p in ORDER)

    def count(self) -> int:
        """Unread messages (in the core queues, plus those accepted in the current read)."""
        n = self.pending
        for q in self.qlist:
            n += q.depth
        return n


@implementer(IDeliveryTarget)
class MailboxPusher:
    """The core consumer target of one mailbox priority: pushes to the mailbox's NATS SUBs."""

    protocol_name = "nats"

    def __init__(self, mq9: MailboxHost, mail_id: str, priority: int) -> None:
        """Push for ``mail_id``'s ``priority`` queue through ``mq9``."""
        self.mq9 = mq9
        self.mail_id = mail_id
        self.priority = priority

    def deliver_batch(self, binding: Any, address: str, messages: list[tuple]) -> None:
        """Render the batch for the subscribers, then ack what was pushed."""
        self.mq9.push(self, binding, messages)


def rendered(headers: dict[str, str] | None) -> tuple[str | None, bytes | None]:
    """The reply subject and NATS header block a stored message is delivered with."""
    if not headers:
        return None, None
    reply = None
    if RESERVED_REPLY in headers:
        headers = dict(headers)
        reply = headers.pop(RESERVED_REPLY)
    return reply, (codec.build_headers(headers) if headers else None)


def query_item(entry: tuple, priority: int) -> dict[str, Any]:
    """A QUERY message item: payload as UTF-8 text, or base64 with ``encoding: base64``."""
    headers = dict(entry[HEADERS] or {})
    reply = headers.pop(RESERVED_REPLY, None)
    body = entry[BODY]
    try:
        payload, encoding = body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        payload, encoding = base64.b64encode(body).decode(), "base64"
    item: dict[str, Any] = {
        "msg_id": str(entry[MSG_ID]), "subject": entry[ADDRESS],
        "priority": PRIORITY_NAMES[priority], "payload": payload,
        "encoding": encoding, "headers": headers, "ts": round(id_time(entry[MSG_ID]) * 1000),
    }
    if reply:
        item["reply_to"] = reply
    return item
