"""MQKS crash target: pipelined ``publish --confirm`` on one connection, confirmed by ``{id} ok ``.

MQKS is a line protocol, so each body travels hex-encoded as the message data (the ledger keeps
the raw bodies; the drain decodes what it receives, so byte identity is still checked). Every
request carries its own id, so a confirmation names its publish exactly.
"""

from __future__ import annotations

import threading
import time

from tests.interop.broker import BrokerProcess
from tests.interop.mqks_client import MqksSocket
from tests.reliability.ledger import Ledger, make_body

#: Publishes written ahead of their confirmations.
WINDOW = 64


class MqksPublish:
    """``publish --confirm e{cycle}`` into queue ``rq{cycle}`` bound to it, consumed after the crash."""

    name = "mqks"
    protocols = ["mqks"]
    extra_args: list[str] = []

    @staticmethod
    def names(cycle: int) -> tuple[bytes, bytes]:
        """The queue and the event of one cycle's load."""
        return b"rq%d" % cycle, b"e%d" % cycle

    def load(self, broker: BrokerProcess, cycle: int, ledger: Ledger, stop: threading.Event) -> None:
        """Bind the queue, then pipeline ``publish --confirm``; confirm each body on its ``ok``."""
        queue, event = self.names(cycle)
        try:
            client = MqksSocket(broker.port("mqks", "tcp"))
        except OSError:
            return
        pending: dict[bytes, bytes] = {}
        seq = 0
        try:
            client.confirm(b"bind", b"rebind", queue + b" " + event)
            while not stop.is_set():
                out = []
                while len(pending) < WINDOW:
                    body = make_body("mqks", cycle, seq)
                    rid = b"p%d" % seq
                    seq += 1
                    pending[rid] = body
                    ledger.on_sent([body])
                    out.append(rid + b" publish --confirm " + event + b" " + body.hex().encode())
                client.send(*out)
                client.pump(1.0)
                for line in client.lines:
                    rid, _, rest = line.partition(b" ")
                    body = pending.pop(rid, None)
                    if body is None:
                        continue
                    if rest == b"ok ":
                        ledger.on_confirmed([body])
                    else:
                        ledger.on_refused(1)
                client.lines.clear()
                if client.eof:
                    return
        except (ConnectionError, OSError, AssertionError):
            pass
        finally:
            client.close()

    def drain(self, broker: BrokerProcess, cycle: int, want: set[bytes], timeout: float) -> list[bytes]:
        """Consume ``rq{cycle}`` (auto-ack) until ``want`` was delivered; decode the bodies."""
        queue, _ = self.names(cycle)
        consumer = MqksSocket(broker.port("mqks", "tcp"))
        consumer.send(b"c consume " + queue)
        got: list[bytes] = []
        deadline = time.monotonic() + timeout
        try:
            while not want <= set(got) and time.monotonic() < deadline and not consumer.eof:
                consumer.pump(0.2)
                for line in consumer.lines:
                    rid, kind, data = line.split(b" ", 2)
                    if rid != b"c" or kind != b"ok" or not data or data.startswith(b"--update "):
                        continue
                    got.append(bytes.fromhex(data.split(b" ", 2)[2].decode()))
                consumer.lines.clear()
        finally:
            consumer.close()
        return got
