"""Reliability fixtures: the crash-cycle count and the figures file.

``MQHUB_CRASH_CYCLES`` sets the cycles per target (default 5: the short run of ``make test``;
``make reliability`` sets 100). ``MQHUB_RELIABILITY_FIGURES`` names a JSON-lines file every
run appends its figures to (``make reliability`` and ``make fuzz`` print it as a table).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import pytest

DEFAULT_CYCLES = 5


@pytest.fixture
def cycles() -> int:
    """Crash cycles per target."""
    return int(os.environ.get("MQHUB_CRASH_CYCLES", DEFAULT_CYCLES))


@pytest.fixture
def record_figures() -> Callable[[str, dict[str, object]], None]:
    """``record(kind, row)``: append one figures row to MQHUB_RELIABILITY_FIGURES (if set)."""
    def record(kind: str, row: dict[str, object]) -> None:
        """Append ``row`` tagged with ``kind``; print it too (shown with -s or on failure)."""
        line = json.dumps({"kind": kind, **row}, default=str)
        print(line)
        path = os.environ.get("MQHUB_RELIABILITY_FIGURES")
        if path:
            with open(path, "a") as f:
                f.write(line + "\n")
    return record


from tests.interop.conftest import make_broker  # noqa: E402,F401 - real broker factory, shared
