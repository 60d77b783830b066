"""Hypothesis fuzzing of every codec through its fuzz target (tests/reliability/fuzz/targets.py).

Three shapes per codec: arbitrary bytes, seeds with random edits, and a state machine that
strings valid units and garbage together and checks that the codec never raises anything but
its protocol error and that a garbage-free stream gives the same events whatever the split.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tests.reliability.fuzz.mutate import INTERESTING
from tests.reliability.fuzz.targets import FuzzTarget, all_targets

TARGETS = all_targets()
NAMES = sorted(n for n, t in TARGETS.items() if t.units)


@pytest.mark.parametrize("name", NAMES)
def test_arbitrary_bytes(name: str) -> None:
    """Arbitrary bytes: events or the codec's own error, never a crash."""
    from hypothesis import given

    @settings(max_examples=300, deadline=None)
    @given(st.binary(max_size=2048))
    def check(data: bytes) -> None:
        TARGETS[name].run(data)

    check()


@pytest.mark.parametrize("name", NAMES)
def test_edited_seeds(name: str) -> None:
    """A valid stream with random bytes and edge tokens written over or into it."""
    from hypothesis import given

    target = TARGETS[name]
    seed = target.seeds[0]

    @settings(max_examples=300, deadline=None)
    @given(st.integers(0, 255), st.integers(0, len(seed)), st.integers(0, 16),
           st.one_of(st.binary(min_size=1, max_size=16), st.sampled_from(INTERESTING)))
    def check(split: int, at: int, cut: int, junk: bytes) -> None:
        target.run(bytes([split]) + seed[:at] + junk + seed[at + cut:])

    check()


class CodecStream(RuleBasedStateMachine):
    """Valid units and garbage strung into one stream; checked after every step."""

    target: FuzzTarget

    @initialize()
    def start(self) -> None:
        """An empty stream (the target's prefix only)."""
        self.parts: list[bytes] = []
        self.garbage = False

    @rule(i=st.integers(0, 1000))
    def add_unit(self, i: int) -> None:
        """Append one valid unit."""
        self.parts.append(self.target.units[i % len(self.target.units)])

    @rule(junk=st.one_of(st.binary(min_size=1, max_size=32), st.sampled_from(INTERESTING)))
    def add_garbage(self, junk: bytes) -> None:
        """Append bytes that may break the framing."""
        self.parts.append(junk)
        self.garbage = True

    @invariant()
    def splits_agree(self) -> None:
        """Every split runs without a crash; without garbage every split gives the same events."""
        stream = self.target.prefix + self.target.joiner.join(self.parts)
        counts = {self.target.run(bytes([k]) + stream) for k in range(7)}
        if not self.garbage:
            assert len(counts) == 1, counts


@pytest.mark.parametrize("name", NAMES)
def test_state_machine(name: str) -> None:
    """Run the stream state machine against one codec."""
    from hypothesis.stateful import run_state_machine_as_test

    machine = type(f"Stream_{name}", (CodecStream,), {"target": TARGETS[name]})
    run_state_machine_as_test(machine, settings=settings(
        max_examples=60, stateful_step_count=20, deadline=None,
        suppress_health_check=[HealthCheck.too_slow]))
