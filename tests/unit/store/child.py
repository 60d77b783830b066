"""Starting and reading the store child process (shared by the crash and snapshot tests)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


class StoreChild:
    """A running ``tests.unit.store.crash_child`` with its output lines collected by a thread."""

    def __init__(self, data_dir: str, first_id: int, durability: str = "sync",
                 writer: str = "inline") -> None:
        """Start the child."""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.unit.store.crash_child", data_dir, str(first_id),
             durability, writer],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        """Collect stdout lines until EOF."""
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.append(raw.decode().rstrip("\n"))

    def wait_for(self, cond: Callable[[list[str]], bool], timeout: float = 15.0) -> None:
        """Poll until ``cond(lines)`` holds, failing after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not cond(self.lines):
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise AssertionError(f"child exited early ({self.proc.returncode}): {err[-2000:]}")
            if time.monotonic() > deadline:
                raise AssertionError("child did not reach the expected state in time")
            time.sleep(0.01)

    def wait_for_lines(self, count: int) -> None:
        """Poll until the child has printed at least ``count`` lines."""
        self.wait_for(lambda lines: len(lines) >= count)

    def kill(self) -> list[str]:
        """SIGKILL the child and return every line it printed before dying."""
        self.proc.kill()
        self.proc.wait()
        self._reader.join(5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return list(self.lines)
