"""The broker process's collector threshold (set by the twistd tap)."""

from __future__ import annotations

import gc

from mqhub.gc_tuning import GEN0_THRESHOLD, tune_gc


def test_tune_gc_raises_only_the_young_threshold() -> None:
    """tune_gc sets threshold0 above one batch's transient objects and keeps the others;
    the collector stays enabled (cycles are still collected)."""
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        tune_gc()
        assert gc.get_threshold() == (GEN0_THRESHOLD, 10, 10)
        assert GEN0_THRESHOLD >= 20_000 and gc.isenabled()
    finally:
        gc.set_threshold(*before)


def test_young_sweeps_collect_the_young_generation_on_the_clock() -> None:
    """The sweep service runs a generation-0 collection every SWEEP_INTERVAL of its clock,
    however balanced allocations and frees keep the collector's own count, and stops with
    the service."""
    from twisted.internet.task import Clock

    from mqhub.gc_tuning import SWEEP_INTERVAL, young_sweeps

    seen: list[int] = []

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 0:
            seen.append(0)

    clock = Clock()
    service = young_sweeps(clock)
    before = gc.get_threshold()
    gc.set_threshold(10**9, 10, 10)  # no collection other than the sweeps'
    gc.callbacks.append(on_gc)
    try:
        service.startService()  # TimerService runs its call once at start
        clock.pump([SWEEP_INTERVAL] * 10)
        assert len(seen) == 11
        service.stopService()
        clock.pump([SWEEP_INTERVAL] * 10)
        assert len(seen) == 11
    finally:
        gc.callbacks.remove(on_gc)
        gc.set_threshold(*before)
