"""Support for the eMQP interop tests: real eventmq jobmanagers, clients and job modules.

Every process started here runs in its own session and is killed by its process group id at
teardown (the jobmanager forks worker processes and a multiprocessing manager).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

BIN = Path(sys.executable).parent

JOBS_MODULE = '''
import json, os, time

def _out():
    return os.environ["EMQ_OUT"]

def work(n):
    """Append n to the output file and return a small result."""
    with open(_out(), "a") as f:
        f.write(json.dumps(n) + "\\n")
    return {"i": n, "double": n * 2}

def slow(seconds):
    """Record the start, then sleep (a job meant to time out)."""
    work("slow-start")
    time.sleep(seconds)
    return "slept"
'''


def wait_until(predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05,
               what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns a truthy value or ``timeout`` passes."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


class JobEnv:
    """A directory with the job module, the output file and the eventmq environment."""

    def __init__(self, root: Path) -> None:
        """Write the job module under ``root``."""
        self.root = root
        (root / "jobs").mkdir(parents=True, exist_ok=True)
        (root / "jobs" / "emqjobs.py").write_text(JOBS_MODULE)
        self.out = root / "out.txt"
        self.out.touch()
        self.procs: list[subprocess.Popen[bytes]] = []

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for eventmq processes: pure defaults, a writable WAL, the job module."""
        env = dict(os.environ)
        env.update({"EVENTMQ_CONFIG_FILE": str(self.root / "no-such.conf"),
                    "EVENTMQ_WAL": str(self.root / "wal.log"),
                    "PYTHONPATH": str(self.root / "jobs"), "EMQ_OUT": str(self.out),
                    "PYTHONUNBUFFERED": "1"})
        env.update(extra)
        return env

    def results(self) -> list[Any]:
        """Values the jobs wrote, in order."""
        return [json.loads(line) for line in self.out.read_text().splitlines() if line]

    def jobmanager(self, backend: str, jobs: int = 2, queues: str | None = None,
                   name: str = "jm") -> subprocess.Popen[bytes]:
        """Start a real ``emq-jobmanager`` connected to ``backend``."""
        extra = {"EVENTMQ_QUEUES": queues} if queues else {}
        log = open(self.root / f"{name}-{len(self.procs)}.log", "wb")
        proc = subprocess.Popen([str(BIN / "emq-jobmanager"), "-B", backend, "-J", str(jobs)],
                                env=self.env(**extra), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        log.close()
        self.procs.append(proc)
        return proc

    def scheduler(self, frontend: str) -> subprocess.Popen[bytes]:
        """Start a real ``emq-scheduler`` on ``frontend`` (no Redis persistence)."""
        log = open(self.root / f"scheduler-{len(self.procs)}.log", "wb")
        proc = subprocess.Popen([str(BIN / "emq-scheduler")],
                                env=self.env(EVENTMQ_SCHEDULER_ADDR=frontend,
                                             EVENTMQ_REDIS_STARTUP_ERROR_HARD_KILL="false",
                                             EVENTMQ_RQ_HOST="127.0.0.1", EVENTMQ_RQ_PORT="1"),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        """Kill ``proc`` and everything in its process group."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)

    def close(self) -> None:
        """Kill every process this environment started."""
        for proc in self.procs:
            self.kill(proc)
        self.procs.clear()


class Client:
    """eventmq's own client (Sender + client.messages) with a deadline-bounded receive."""

    def __init__(self, frontend: str) -> None:
        """Connect a Sender to ``frontend``."""
        from eventmq.sender import Sender

        self.sender = Sender()
        self.sender.connect(frontend)
        self.poller = zmq.Poller()
        self.poller.register(self.sender.zsocket, zmq.POLLIN)
        self.received: list[list[str]] = []

    def pump(self, timeout: float = 0.1) -> None:
        """Receive whatever arrives within ``timeout`` seconds."""
        while self.poller.poll(int(timeout * 1000)):
            self.received.append(self.sender.recv_multipart())
            timeout = 0

    def result_for(self, msgid: str, timeout: float = 20.0) -> Any:
        """Wait for the forwarded result REPLY of request ``msgid`` and return its value."""
        def found() -> Any:
            self.pump()
            for msg in self.received:
                if msg[2] == "REPLY" and len(msg) == 6 and msg[5] == msgid:
                    return json.loads(msg[4])
            return None
        return wait_until(found, timeout, what=f"result of {msgid}")["value"]

    def close(self) -> None:
        """Close the socket."""
        self.sender.zsocket.close(linger=0)


def raw_dealer(address: str, identity: bytes | None = None) -> zmq.Socket:
    """A plain DEALER (libzmq's binary identity unless ``identity`` is given)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    sock.connect(address)
    return sock


def job_body(path: str, n: Any) -> bytes:
    """A job body as eventmq's defer_job builds it."""
    module, _, func = path.rpartition(".")
    return json.dumps(["run", {"callable": func, "path": module, "args": [n], "kwargs": {},
                               "class_args": [], "class_kwargs": {}}]).encode()
