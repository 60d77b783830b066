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
