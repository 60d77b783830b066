"""Property test: random call_at / cancel / restarts fire every live key once, never early."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from mqhub.scheduler.service import SchedulerService
from mqhub.store.memory import MemoryStore
from mqhub.testing import property_examples, result_of, start_clock

op = st.one_of(
    st.tuples(st.just("at"), st.integers(0, 9), st.floats(0, 30)),
    st.tuples(st.just("cancel"), st.integers(0, 9), st.just(0.0)),
    st.tuples(st.just("advance"), st.just(0), st.floats(0, 10)),
    st.tuples(st.just("restart"), st.just(0), st.floats(0, 10)),
)


@settings(max_examples=property_examples(150), deadline=None)
@given(st.lists(op, max_size=30), st.booleans())
def test_keys_fire_once_never_early(ops: list[Any], grouped: bool) -> None:
    """Model: key -> due time; each fires once at or after it, cancel and replace win."""
    clock = start_clock()
    store = MemoryStore(clock=clock if grouped else None)
    store.open()
    fired: list[tuple[float, bytes, bytes]] = []

    def handler(rows: Any, batch: Any, now: float) -> None:
        fired.extend((now, k, p) for _, k, p in rows)

    def start() -> SchedulerService:
        s = SchedulerService(store, clock, slice_size=3)
        s.register(b"k", handler)
        s.startService()
        return s

    sched = start()
    model: dict[bytes, tuple[float, bytes]] = {}
    version = 0
    for kind, k, x in ops:
        key = b"k%d" % k
        if kind == "at":
            version += 1
            when = clock.seconds() + x
            d = sched.call_at(when, key, b"%d" % version)
            clock.advance(0)
            result_of(d)
            model[key] = (when, b"%d" % version)
        elif kind == "cancel":
            cancelled = sched.cancel(key)
            clock.advance(0)
            assert result_of(cancelled) == (key in model)
            model.pop(key, None)
        elif kind == "advance":
            clock.advance(x)
        else:
            sched.stopService()
            clock.advance(x)
            sched = start()
        clock.advance(0)
        for now, fkey, payload in fired:
            assert fkey in model and model[fkey][1] == payload, "fired a cancelled or replaced key"
            assert now >= model[fkey][0], "fired early"
            del model[fkey]
        fired.clear()
    for _ in range(20):
        clock.advance(5)
    for _, fkey, payload in fired:
        assert model.pop(fkey)[1] == payload
    assert model == {}
