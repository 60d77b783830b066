"""atheris entry point: ``python -m tests.reliability.fuzz.atheris_main TARGET [libFuzzer flags]``.

The codec modules are imported under ``atheris.instrument_imports()`` so the fuzzing is
coverage-guided; libFuzzer prints ``Done N runs in S second(s)`` at the end (``make fuzz``
reads it) and writes a ``crash-*`` file for any input that raised.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports(include=["mqhub"]):
    from tests.reliability.fuzz.targets import all_targets, seed_inputs


def main() -> None:
    """Fuzz the target named by the first argument until libFuzzer's limits stop it."""
    name = sys.argv.pop(1)
    target = all_targets()[name]

    def one(data: bytes) -> None:
        """One input (atheris reports any exception as a crash)."""
        target.run(data)

    corpus = [a for a in sys.argv[1:] if not a.startswith("-")]
    if corpus:
        for i, seed in enumerate(seed_inputs(target)):
            with open(f"{corpus[0]}/seed-{i}", "wb") as f:
                f.write(seed)
    atheris.Setup(sys.argv, one)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
