"""``mqhub stats --watch`` against a running broker: refreshed figures, then a clean stop on
Ctrl-C (SIGINT), as JSON lines and as tables appended to a pipe."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from tests.interop.admin_client import admin_url
from tests.interop.nsq_client import ok

pytestmark = pytest.mark.interop

DEADLINE = 15.0


class Watcher:
    """``mqhub stats --watch`` in its own process, its stdout lines gathered by a thread."""

    def __init__(self, url: str, *extra: str) -> None:
        """Start ``mqhub stats --url URL --watch 0.2 EXTRA``."""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mqhub.cli", "stats", "--url", url, "--watch", "0.2", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "COLUMNS": "200"},
            # a test run in the background may inherit an ignored SIGINT: Ctrl-C must reach it
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        """Move stdout lines into the queue until the process closes it."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def until(self, check: Any, what: str) -> Any:
        """Read lines until ``check(line)`` is truthy (its value returned), within the deadline."""
        deadline = time.monotonic() + DEADLINE
        while True:
            left = deadline - time.monotonic()
            assert left > 0 and self.proc.poll() is None, f"no {what}; got {self.seen[-5:]}"
            try:
                line = self.lines.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            self.seen.append(line)
            result = check(line)
            if result:
                return result

    def interrupt(self) -> tuple[int, str]:
        """Ctrl-C; the exit status and stderr once it ended (bounded)."""
        self.proc.send_signal(signal.SIGINT)
        try:
            status = self.proc.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("mqhub stats --watch did not stop on SIGINT") from None
        assert self.proc.stderr is not None
        return status, self.proc.stderr.read()


def published(line: str) -> int | None:
    """The NSQ published total in one JSON line (None for other lines)."""
    try:
        data = json.loads(line)
    except ValueError:
        return None
    return data["protocols"].get("nsq", {}).get("published")


def test_stats_watch_json_lines_refresh_and_stop_on_interrupt(make_broker: Any) -> None:
    """One JSON document per refresh; a publish shows up in a later one; SIGINT ends it (0)."""
    broker = make_broker(["nsq"], extra_args=["--durability", "none"])
    watcher = Watcher(admin_url(broker), "--json")
    first = watcher.until(lambda line: (n := published(line)) is not None and (n, line), "JSON")
    assert first[0] == 0
    ok(broker, "/mpub?topic=watched", b"a\nb\nc")
    later = watcher.until(lambda line: published(line) == 3 and json.loads(line), "3 published")
    assert later["uptime"] > json.loads(first[1])["uptime"]
    status, err = watcher.interrupt()
    assert status == 0 and "Traceback" not in err, err


def test_stats_watch_tables_to_a_pipe_are_appended(make_broker: Any) -> None:
    """Piped, every refresh appends the tables (a later one shows the new total)."""
    broker = make_broker(["nsq"], extra_args=["--durability", "none"])
    watcher = Watcher(admin_url(broker))
    watcher.until(lambda line: line.split()[:3] == ["│", "nsq", "│"], "the nsq row")
    ok(broker, "/mpub?topic=watched", b"a\nb")
    row = watcher.until(lambda line: line.split()[:3] == ["│", "nsq", "│"]
                        and line.split()[5] == "2" and line, "2 published in a later table")
    titles = [line for line in watcher.seen if "mqhub — up" in line]
    assert len(titles) >= 2 and row
    status, err = watcher.interrupt()
    assert status == 0 and "Traceback" not in err, err
