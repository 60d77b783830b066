"""Rich progress bars on stderr for the ``mqhub`` commands.

:func:`progress_bar` serves ``export`` and ``analytics``, whose work reports its own steps;
:func:`copy_with_progress` serves ``snapshot``, whose copy shows only as bytes on disk.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

T = TypeVar("T")
#: Seconds between two looks at the copy's size.
POLL = 0.1


def progress_bar(description: str, total: int) -> tuple[Progress, TaskID]:
    """A percentage bar on stderr and its one task, for work that reports its own steps."""
    progress = Progress(TextColumn("{task.description}"), BarColumn(),
                        TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(),
                        console=Console(stderr=True))
    return progress, progress.add_task(description, total=total)


def tree_bytes(path: Path) -> int:
    """Bytes of every regular file under ``path`` (0 when it does not exist)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def copy_with_progress(copy: Callable[[], T], source: Path, dest: Path, show: bool) -> T:
    """Run ``copy()`` in a thread while a bar follows ``dest``'s size against ``source``'s.

    The source size is an upper bound (the copy is compacted); the bar completes when the
    copy returns. Exceptions of ``copy`` are re-raised here.
    """
    if not show:
        return copy()
    result: dict[str, Any] = {}

    def run() -> None:
        """The copy, its result or exception kept for the caller."""
        try:
            result["value"] = copy()
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller's thread
            result["error"] = exc

    total = max(1, tree_bytes(source))
    worker = threading.Thread(target=run, name="mqhub-snapshot", daemon=True)
    columns = (TextColumn("snapshot"), BarColumn(), DownloadColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task("copy", total=total)
        worker.start()
        while worker.is_alive():
            worker.join(POLL)
            bar.update(task, completed=min(total, tree_bytes(dest)))
        bar.update(task, completed=total)
    if "error" in result:
        raise result["error"]
    return result["value"]
