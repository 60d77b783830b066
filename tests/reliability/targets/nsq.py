"""NSQ crash target: pipelined PUB, MPUB and DPUB on one connection, confirmed by ``OK``.

NSQ answers every publish command in order, so the n-th ``OK`` (or ``E_...`` error) belongs
to the n-th command sent; a command's bodies are confirmed by its ``OK``.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque

from mqhub.protocols.nsq import codec as wire
from tests.interop.broker import BrokerProcess
from tests.interop.nsq_client import NsqSocket, ok
from tests.reliability.ledger import Ledger, make_body

#: Commands written ahead of their answers.
WINDOW = 64


class NsqPublish:
    """PUB / MPUB / DPUB into topic ``rc{cycle}`` with channel ``c``, consumed after the crash."""

    name = "nsq"
    protocols = ["nsq"]
    extra_args: list[str] = []

    @staticmethod
    def topic(cycle: int) -> str:
        """The topic of one cycle's load."""
        return f"rc{cycle}"

    def load(self, broker: BrokerProcess, cycle: int, ledger: Ledger, stop: threading.Event) -> None:
        """Pipeline random PUB/MPUB/DPUB commands and confirm each command's bodies on its OK."""
        topic = self.topic(cycle)
        rng = random.Random(cycle)
        pending: deque[list[bytes]] = deque()
        seq = 0
        try:
            ok(broker, f"/topic/create?topic={topic}")
            ok(broker, f"/channel/create?topic={topic}&channel=c")
            client = NsqSocket(broker.port("nsq", "tcp"))
        except OSError:
            return
        try:
            while not stop.is_set():
                out = []
                while len(pending) < WINDOW:
                    kind = rng.random()
                    if kind < 0.5:
                        bodies = [make_body("nsq", cycle, seq)]
                        out.append(wire.encode_pub(topic, bodies[0]))
                    elif kind < 0.8:
                        bodies = [make_body("nsq", cycle, seq + i) for i in range(rng.randint(1, 50))]
                        out.append(wire.encode_mpub(topic, bodies))
                    else:
                        bodies = [make_body("nsq", cycle, seq)]
                        out.append(wire.encode_dpub(topic, rng.randint(1, 300), bodies[0]))
                    seq += len(bodies)
                    pending.append(bodies)
                    ledger.on_sent(bodies)
                client.send(b"".join(out))
                for frame in client.read(1.0):
                    if isinstance(frame, wire.Response) and frame == wire.Response(b"OK"):
                        ledger.on_confirmed(pending.popleft())
                    elif isinstance(frame, wire.ErrorFrame):
                        ledger.on_refused(len(pending.popleft()))
        except (ConnectionError, OSError, IndexError):
            pass
        finally:
            client.close()

    def drain(self, broker: BrokerProcess, cycle: int, want: set[bytes], timeout: float) -> list[bytes]:
        """SUB ``rc{cycle}/c`` with RDY 2500 and FIN everything until ``want`` was delivered."""
        consumer = NsqSocket(broker.port("nsq", "tcp"))
        consumer.send(wire.encode_sub(self.topic(cycle), "c") + wire.encode_rdy(2500))
        got: list[bytes] = []
        deadline = time.monotonic() + timeout
        try:
            while not want <= set(got) and time.monotonic() < deadline:
                msgs = [f for f in consumer.read() if isinstance(f, wire.Message)]
                if msgs:
                    consumer.send(b"".join(wire.encode_fin(m.msg_id) for m in msgs))
                got += [m.body for m in msgs]
        finally:
            consumer.close()
        return got
