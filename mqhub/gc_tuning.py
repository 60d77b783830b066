"""The cyclic garbage collector's settings for the broker process (set by the twistd tap only).

CPython starts a young-generation collection whenever the tracked containers allocated minus
those freed exceed ``threshold0`` (700 by default). The hot paths are batch-oriented: one read
builds a thousand entry tuples, delivery tuples, key tuples and lists at once, so the default
threshold is crossed by every batch's *transient* objects and the collector runs about once
per 600 messages, walking every young container each time (and the whole heap now and then).
Measured in the server under ``mqhub bench nsq`` (MPUB 16 B): 1,250 young and 4 full
collections in a 4 s run, about 0.5 µs of the 3.5 µs of server CPU per message; with
``threshold0`` at 50,000 one or none ran and the server spent 2.8–2.9 µs per message
(docs/benchmarks-nsq.md). Reference cycles are still collected, only later: the threshold
counts live growth, so the collector runs when 50,000 more containers stay alive than died.
"""

from __future__ import annotations

import gc

#: containers allocated (net of those freed) before a young-generation collection
GEN0_THRESHOLD = 50_000


def tune_gc() -> None:
    """Raise the young-generation threshold above what one batch allocates transiently."""
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
