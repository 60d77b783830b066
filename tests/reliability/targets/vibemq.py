"""VibeMQ crash target: pipelined Publish frames on one connection, confirmed by ``PublishAck``.

Payloads are JSON (as the .NET client sends them): each body travels as a JSON string of its
hex, and the drain decodes it, so byte identity is still checked. Frames carry their own ids,
so a PublishAck (or Error) names its publish exactly. Odd cycles negotiate gzip, so frames of
1 KiB and more are compressed both ways. The queue is created unbounded (``maxQueueSize`` 0):
with VibeMQ's default 10,000 and DropOldest, a PublishAck'd message may be dropped by design.
"""

from __future__ import annotations

import json
import threading
import time

from mqhub.protocols.vibemq import codec as c
from mqhub.protocols.vibemq.options import QueueOptions
from tests.interop.broker import BrokerProcess
from tests.interop.vibemq_client import SocketClient, VibeError, new_id
from tests.reliability.ledger import Ledger, make_body

#: Publishes written ahead of their acknowledgements.
WINDOW = 64


def _connect(broker: BrokerProcess, cycle: int) -> SocketClient:
    """A connected client; gzip on odd cycles, no compression on even ones."""
    client = SocketClient(broker.port("vibemq", "tcp"))
    client.connect(compression="gzip" if cycle % 2 else None)
    return client


class VibeMqPublish:
    """Publish into durable unbounded queue ``rq{cycle}``, consumed and acked after the crash."""

    name = "vibemq"
    protocols = ["vibemq"]
    extra_args: list[str] = []

    @staticmethod
    def queue(cycle: int) -> str:
        """The queue of one cycle's load."""
        return f"rq{cycle}"

    def load(self, broker: BrokerProcess, cycle: int, ledger: Ledger, stop: threading.Event) -> None:
        """Pipeline Publish frames; confirm each body on its PublishAck."""
        queue = self.queue(cycle)
        try:
            client = _connect(broker, cycle)
        except (OSError, TimeoutError):
            return
        pending: dict[str, bytes] = {}
        seq = 0
        try:
            client.create_queue(queue, QueueOptions(max_queue_size=0))
            while not stop.is_set():
                out = []
                while len(pending) < WINDOW:
                    body = make_body("vibemq", cycle, seq)
                    seq += 1
                    msg_id = new_id()
                    pending[msg_id] = body
                    ledger.on_sent([body])
                    payload = json.dumps(body.hex()).encode()
                    out.append(c.encode(c.Frame(c.PUBLISH, msg_id, queue, payload),
                                        client.flag, client.threshold))
                client.send_raw(b"".join(out))
                client.pump(1.0)
                while client.frames:
                    frame = client.frames.popleft()
                    body = pending.pop(frame.id, None)
                    if body is None:
                        continue
                    if frame.type == c.PUBLISH_ACK:
                        ledger.on_confirmed([body])
                    else:
                        ledger.on_refused(1)
        except (ConnectionError, OSError, TimeoutError, VibeError):
            pass
        finally:
            client.close()

    def drain(self, broker: BrokerProcess, cycle: int, want: set[bytes], timeout: float) -> list[bytes]:
        """Subscribe to ``rq{cycle}`` and ack every delivery until ``want`` was delivered."""
        client = _connect(broker, cycle)
        got: list[bytes] = []
        deadline = time.monotonic() + timeout
        try:
            client.subscribe(self.queue(cycle))
            while not want <= set(got) and time.monotonic() < deadline:
                client.pump(0.2)
                if client.deliveries:
                    delivered = list(client.deliveries)
                    client.deliveries.clear()
                    client.ack_many(delivered)
                    got += [bytes.fromhex(json.loads(d.payload)) for d in delivered]
        finally:
            client.close()
        return got
