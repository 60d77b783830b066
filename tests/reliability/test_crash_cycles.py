"""Crash cycles against real ``twistd -n mqhub`` processes, one test per durable target.

Each cycle loads the broker through one protocol's durable path, ``kill -9``s it at a random
moment (sometimes while ``mqhub snapshot`` copies the store, with a 1 MiB initial LMDB map so
map growth happens under the load), restarts it and checks: every confirmed message is
delivered at least once and byte-identical, and every delivered message is one that was sent.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.reliability.crash import run_crash_cycles
from tests.reliability.targets import TARGETS

pytestmark = [pytest.mark.interop, pytest.mark.timeout(3600)]


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_no_confirmed_message_is_lost_over_crash_cycles(
        name: str, cycles: int, tmp_path: Path,
        record_figures: Callable[[str, dict[str, object]], None]) -> None:
    """``cycles`` kill -9 cycles: confirmed ⊆ delivered, delivered ⊆ sent, snapshots verify."""
    figures = run_crash_cycles(TARGETS[name](), tmp_path, cycles, seed=zlib.crc32(name.encode()))
    record_figures("crash", figures.as_row())
    assert figures.cycles == cycles
    assert figures.confirmed > 0
    assert figures.lost == 0, figures.losses
    assert figures.corrupt == 0, figures.losses
