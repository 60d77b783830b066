"""A standalone Spark master and one worker on 127.0.0.1, started from the pyspark install.

Usage::

    with SparkCluster(tmp_path) as cluster:
        run(["mqhub", "analytics", SRC, "--out", OUT, "--master", cluster.url])

Both JVMs run ``bin/spark-class`` of the installed pyspark with SPARK_HOME pointing there; the
master's JSON status page is polled (with a deadline) until the worker is registered. Leaving
the block kills both process groups.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.interop.broker import HOST, free_port


class SparkCluster:
    """One master and one worker (2 cores, 1 GiB), bounded start, torn down on exit."""

    def __init__(self, root: Path, cores: int = 2, memory: str = "1g",
                 start_timeout: float = 120.0) -> None:
        """Choose ports and directories (nothing starts until :meth:`start`)."""
        import pyspark

        self.home = os.path.dirname(pyspark.__file__)
        self.root = Path(root)
        self.port = free_port()
        self.ui_port = free_port()
        self.worker_ui_port = free_port()
        self.cores = cores
        self.memory = memory
        self.start_timeout = start_timeout
        self.procs: list[subprocess.Popen[bytes]] = []
        self.url = f"spark://{HOST}:{self.port}"

    def _spawn(self, name: str, args: list[str]) -> None:
        """Start ``spark-class args`` in its own process group, logging to a file."""
        env = {**os.environ, "SPARK_HOME": self.home, "SPARK_LOCAL_IP": HOST,
               "SPARK_LOG_DIR": str(self.root), "SPARK_WORKER_DIR": str(self.root / "work")}
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        self.procs.append(subprocess.Popen(
            [os.path.join(self.home, "bin", "spark-class"), *args], stdout=log,
            stderr=subprocess.STDOUT, env=env, start_new_session=True))

    def status(self) -> dict[str, Any] | None:
        """The master's JSON status, or None while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.ui_port}/json/", timeout=2) as r:
                return json.loads(r.read())
        except (OSError, ValueError):
            return None

    def start(self) -> SparkCluster:
        """Start the master, then the worker; return once the worker is alive."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", HOST,
                               "--port", str(self.port), "--webui-port", str(self.ui_port)])
        self._spawn("worker", ["org.apache.spark.deploy.worker.Worker", self.url,
                               "--host", HOST, "--cores", str(self.cores),
                               "--memory", self.memory, "--webui-port",
                               str(self.worker_ui_port), "--work-dir",
                               str(self.root / "work")])
        deadline = time.monotonic() + self.start_timeout
        while True:
            status = self.status()
            if status and status.get("aliveworkers", 0) >= 1:
                return self
            for p in self.procs:
                if p.poll() is not None:
                    raise AssertionError(f"a Spark process exited early: {self.logs()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"the Spark worker did not register in time: {self.logs()}")
            time.sleep(0.2)

    def logs(self) -> str:
        """The tails of the master and worker logs."""
        out = []
        for name in ("master", "worker"):
            p = self.root / f"{name}.log"
            if p.exists():
                out.append(f"--- {name} ---\n{p.read_text(errors='replace')[-3000:]}")
        return "\n".join(out)

    def stop(self) -> None:
        """Kill the worker and the master (their process groups) and reap them."""
        for p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in reversed(self.procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=5)
        self.procs.clear()

    def __enter__(self) -> SparkCluster:
        """Start on entering the block."""
        return self.start()

    def __exit__(self, *exc: object) -> None:
        """Stop on leaving it."""
        self.stop()
