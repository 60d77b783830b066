"""A bounded random mutation loop: the fuzz engine when atheris is not installed."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from tests.reliability.fuzz.targets import FuzzTarget, seed_inputs

#: Tokens that tend to reach limits and edge cases in text and length-prefixed protocols.
INTERESTING = [b"\r\n", b"\n", b"\x00\x00\x00\x00", b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff",
               b"4294967296", b"-1", b"99999999999999999999", b" ", b"*", b">", b"$-1", b"{", b"}",
               b"\"", b"PUB ", b"MPUB ", b"HPUB ", b"SUB ", b"|", b"\xff\x06\x00\x00sNaPpY"]


def mutate(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    """One to four random edits of ``data`` (flips, inserts, deletes, copies, splices)."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        at = rng.randint(0, len(buf))
        if op == 0 and buf:
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            buf[at:at] = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 8)))
        elif op == 2 and buf:
            del buf[at:at + rng.randint(1, 16)]
        elif op == 3 and buf:
            start = rng.randrange(len(buf))
            buf[at:at] = buf[start:start + rng.randint(1, 64)]
        elif op == 4:
            buf[at:at] = rng.choice(INTERESTING)
        elif op == 5:
            other = rng.choice(pool)
            start = rng.randrange(len(other) or 1)
            buf[at:] = other[start:start + rng.randint(1, 256)]
        else:
            del buf[at:]
    return bytes(buf[:8192])


@dataclass
class LoopResult:
    """What a bounded loop did."""

    inputs: int = 0
    crashes: list[tuple[bytes, str]] = field(default_factory=list)


def fuzz_loop(target: FuzzTarget, seconds: float, seed: int = 0, max_inputs: int | None = None) -> LoopResult:
    """Run mutated inputs through ``target`` for ``seconds`` (or ``max_inputs``); collect crashes."""
    rng = random.Random(seed)
    pool = seed_inputs(target) or [b"\x00"]
    result = LoopResult()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and (max_inputs is None or result.inputs < max_inputs):
        for _ in range(256):
            data = mutate(rng, rng.choice(pool), pool)
            result.inputs += 1
            try:
                target.run(data)
            except Exception as exc:  # noqa: BLE001 - a crash is what we are looking for
                result.crashes.append((data, repr(exc)))
                if len(result.crashes) >= 20:
                    return result
            else:
                if len(pool) < 512 and rng.random() < 0.01:
                    pool.append(data)
    return result
