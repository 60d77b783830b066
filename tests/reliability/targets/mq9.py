"""mq9 crash target: INBOX publishes to a standard mailbox, confirmed by the PING barrier.

A PONG follows the commit of every mq9 write read before its PING, so every INBOX publish
sent before a PING is confirmed when that PING's PONG arrives (docs/protocols/nats.md).
"""

from __future__ import annotations

import random
import threading
import time

from mqhub.protocols.nats import codec
from tests.interop.broker import BrokerProcess
from tests.reliability.ledger import Ledger, make_body
from tests.reliability.targets.natsock import NatsSocket

#: Publishes between two PINGs, and PINGs written ahead of their PONGs.
PER_PING, PINGS_AHEAD = 40, 4


class Mq9Inbox:
    """``$mq9.AI.INBOX.{id}.normal|urgent`` of one mailbox per cycle, read back by SUB push."""

    name = "mq9"
    protocols = ["mq9"]
    extra_args: list[str] = []

    def __init__(self) -> None:
        """No mailboxes yet (one is created per cycle, by its load)."""
        self.mailboxes: dict[int, str] = {}

    def load(self, broker: BrokerProcess, cycle: int, ledger: Ledger, stop: threading.Event) -> None:
        """Create the cycle's mailbox, then publish batches each followed by a PING."""
        rng = random.Random(cycle)
        try:
            client = NatsSocket(broker.port("mq9"))
        except OSError:
            return
        try:
            box = client.request_json("$mq9.AI.MAILBOX.CREATE", {"type": "standard", "ttl": 86400})
            self.mailboxes[cycle] = box["mail_id"]
            seq = 0
            batches: list[list[bytes]] = []
            while not stop.is_set():
                while len(batches) < PINGS_AHEAD:
                    bodies = [make_body("mq9", cycle, seq + i) for i in range(PER_PING)]
                    seq += PER_PING
                    out = [codec.encode_pub(f"$mq9.AI.INBOX.{box['mail_id']}."
                                            f"{rng.choice(('normal', 'urgent'))}", b) for b in bodies]
                    ledger.on_sent(bodies)
                    client.send(b"".join(out) + b"PING\r\n")
                    batches.append(bodies)
                for ev in client.events(1.0):
                    if ev[0] == codec.OP_PONG:
                        ledger.on_confirmed(batches.pop(0))
                    elif ev[0] == codec.OP_ERR:
                        return
        except (ConnectionError, OSError, AssertionError, KeyError):
            pass
        finally:
            client.close()

    def drain(self, broker: BrokerProcess, cycle: int, want: set[bytes], timeout: float) -> list[bytes]:
        """SUB the mailbox's ``*`` priorities and collect the stored backlog it pushes."""
        mail_id = self.mailboxes.get(cycle)
        if mail_id is None:
            return []
        client = NatsSocket(broker.port("mq9"))
        client.send(codec.encode_sub(f"$mq9.AI.INBOX.{mail_id}.*", "1"))
        got: list[bytes] = []
        deadline = time.monotonic() + timeout
        try:
            while not want <= set(got) and time.monotonic() < deadline:
                got += [bytes(ev[-1]) for ev in client.events(0.2)
                        if ev[0] in (codec.OP_MSG, codec.OP_HMSG)]
        finally:
            client.close()
        return got
