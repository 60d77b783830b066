"""eMQP crash target: ``guarantee`` jobs, confirmed by the dispatch acknowledgement.

A client's REQUEST is acknowledged (``REPLY, id, <request msgid>``) when the job is handed to
a worker, and only after the write that stored it is durable. The load runs a worker that
takes every job and never answers, so each acknowledged job is in flight at the kill; after
the restart a new worker must receive every one of them again.
"""

from __future__ import annotations

import json
import threading
import time

import zmq

from tests.interop.broker import BrokerProcess
from tests.reliability.ledger import Ledger, make_body

V = b"eMQP/1.0"
#: Requests written ahead of their acknowledgements.
WINDOW = 200


def job(body: bytes) -> bytes:
    """An eventmq job whose only argument carries ``body`` (latin-1, so any bytes survive)."""
    return json.dumps(["run", {"callable": "work", "path": "jobs", "args": [body.decode("latin-1")],
                               "kwargs": {}, "class_args": [], "class_kwargs": {}}]).encode()


def body_of(job_bytes: bytes) -> bytes:
    """The body :func:`job` wrapped."""
    return str(json.loads(job_bytes)[1]["args"][0]).encode("latin-1")


class Worker:
    """A raw eMQP worker (DEALER on the backend) serving one queue."""

    def __init__(self, broker: BrokerProcess, queue: str, slots: int) -> None:
        """INFORM, wait for the broker's ACK, then offer ``slots`` READYs."""
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(broker.url("emqp", "backend"))
        self.sock.send_multipart([b"", V, b"INFORM", b"inf-1", json.dumps([[10, queue]]).encode(),
                                  b"worker"])
        if not self.sock.poll(20000):
            raise ConnectionError("no ACK for the worker's INFORM")
        self.ready(slots)

    def ready(self, count: int) -> None:
        """Offer ``count`` more slots."""
        for i in range(count):
            self.sock.send_multipart([b"", V, b"READY", b"rdy-%d" % i])

    def jobs(self, timeout_ms: int) -> list[tuple[bytes, bytes]]:
        """``(request msgid, job body)`` of the REQUESTs that arrive within ``timeout_ms``."""
        out = []
        while self.sock.poll(timeout_ms):
            timeout_ms = 0
            frames = self.sock.recv_multipart()
            if len(frames) >= 7 and frames[2] == b"REQUEST":
                out.append((frames[3], frames[6]))
        return out

    def finish(self, msgids: list[bytes]) -> None:
        """REPLY to jobs so the broker finishes them."""
        for i, msgid in enumerate(msgids):
            self.sock.send_multipart([b"", V, b"REPLY", b"rep-%d" % i, b'{"ok": 1}', msgid])

    def close(self) -> None:
        """Close the socket."""
        self.sock.close(linger=0)


class EmqpGuaranteedJobs:
    """``guarantee`` REQUESTs to queue ``rc{cycle}``; a worker holds them in flight."""

    name = "emqp"
    protocols = ["emqp"]
    extra_args: list[str] = []

    def load(self, broker: BrokerProcess, cycle: int, ledger: Ledger, stop: threading.Event) -> None:
        """Send guaranteed REQUESTs with a window; confirm each on its dispatch acknowledgement."""
        try:
            worker = Worker(broker, f"rc{cycle}", WINDOW)
        except ConnectionError:
            return
        client = zmq.Context.instance().socket(zmq.DEALER)
        client.setsockopt(zmq.LINGER, 0)
        client.connect(broker.url("emqp", "frontend"))
        by_id: dict[bytes, bytes] = {}
        seq = 0
        try:
            while not stop.is_set():
                while len(by_id) < WINDOW:
                    body = make_body("emqp", cycle, seq, big_every=499)
                    msgid = b"c%d-%d" % (cycle, seq)
                    seq += 1
                    by_id[msgid] = body
                    ledger.on_sent([body])
                    client.send_multipart([b"", V, b"REQUEST", msgid, b"rc%d" % cycle, b"guarantee", job(body)])
                got = worker.jobs(10)
                if got:
                    worker.ready(len(got))  # take every job, never answer: all stay in flight
                while client.poll(50):
                    frames = client.recv_multipart()
                    if len(frames) == 5 and frames[2] == b"REPLY" and frames[4] in by_id:
                        ledger.on_confirmed([by_id.pop(frames[4])])
        finally:
            client.close(linger=0)
            worker.close()

    def drain(self, broker: BrokerProcess, cycle: int, want: set[bytes], timeout: float) -> list[bytes]:
        """A new worker takes (and finishes) every recovered job until ``want`` arrived."""
        worker = Worker(broker, f"rc{cycle}", 5000)
        got: list[bytes] = []
        deadline = time.monotonic() + timeout
        try:
            while not want <= set(got) and time.monotonic() < deadline:
                jobs = worker.jobs(200)
                worker.finish([msgid for msgid, _ in jobs])
                worker.ready(len(jobs))
                got += [body_of(j) for _, j in jobs]
        finally:
            worker.close()
        return got
