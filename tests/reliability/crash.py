"""The crash-cycle runner: load a real broker, ``kill -9`` it at a random moment, restart, verify.

One cycle of :func:`run_crash_cycles`, for one :class:`CrashTarget`:

1. start ``twistd -n mqhub`` on the same data directory (recovery runs);
2. drain what the previous cycle's load left and check it against that cycle's ledger: every
   confirmed body delivered at least once, byte-identical, and every delivered body one that
   was sent (nothing invented, nothing corrupted);
3. start the target's load on a fresh address, wait until some bodies are confirmed, sometimes
   start ``mqhub snapshot`` on the live store, wait a random moment and ``kill -9`` the broker
   (and on some snapshot cycles the snapshot process too);
4. a finished snapshot must open and verify against its manifest.

The broker runs with a 1 MiB initial LMDB map, so map growth happens under load, and the data
directory starts afresh every ``epoch`` cycles so growth keeps recurring over a long run. Every
fourth cycle waits for the next growth in the broker's log and kills it the moment it appears
(``kills_at_map_growth``; if none comes in time the cycle kills at a random moment as usual);
``kills_after_map_growth`` counts the other killed runs whose map had grown.
"""

from __future__ import annotations

import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from mqhub.store.snapshot_reader import SnapshotReader
from tests.interop.broker import BrokerProcess
from tests.reliability.ledger import Ledger

#: Initial LMDB map (MiB) of the crash-cycle broker: small, so growth happens under load.
MAP_MIB = 1
#: The store's log line for a map growth.
GROWN = "store map grown"


class CrashTarget(Protocol):
    """One durable publish path of one protocol (an adapter in ``tests/reliability/targets``)."""

    #: Name used in test ids and figures.
    name: str
    #: ``--protocols`` of the broker.
    protocols: list[str]
    #: More ``twistd mqhub`` options.
    extra_args: list[str]

    def load(self, broker: BrokerProcess, cycle: int, ledger: Ledger, stop: threading.Event) -> None:
        """Publish ``cycle``'s bodies until ``stop`` or the connection dies (runs in a thread).

        Records every body in ``ledger`` when written (``on_sent``) and when the protocol's
        confirmation for it arrives (``on_confirmed``); must return soon after the broker dies.
        """

    def drain(self, broker: BrokerProcess, cycle: int, want: set[bytes], timeout: float) -> list[bytes]:
        """Deliver (and acknowledge) what ``cycle``'s load stored; return the delivered bodies.

        Returns once every body of ``want`` was delivered or ``timeout`` passed.
        """


@dataclass
class Figures:
    """What a run of crash cycles did and found."""

    target: str
    cycles: int = 0
    sent: int = 0
    confirmed: int = 0
    delivered: int = 0
    lost: int = 0
    corrupt: int = 0
    unconfirmed_delivered: int = 0
    snapshots_taken: int = 0
    snapshots_killed: int = 0
    kills_at_map_growth: int = 0
    kills_after_map_growth: int = 0
    seconds: float = 0.0
    losses: list[str] = field(default_factory=list)

    def as_row(self) -> dict[str, object]:
        """A JSON-friendly summary (no per-message detail)."""
        row = dict(self.__dict__)
        row["losses"] = self.losses[:5]
        return row


def _check(figures: Figures, ledger: Ledger, delivered: list[bytes]) -> None:
    """Add one cycle's verification to ``figures``."""
    got = set(delivered)
    lost = ledger.confirmed - got
    corrupt = got - ledger.sent
    figures.sent += len(ledger.sent)
    figures.confirmed += len(ledger.confirmed)
    figures.delivered += len(got)
    figures.lost += len(lost)
    figures.corrupt += len(corrupt)
    figures.unconfirmed_delivered += len(got & (ledger.sent - ledger.confirmed))
    figures.losses += [b[:40].decode("latin-1") for b in sorted(lost)[:3]]
    figures.losses += ["corrupt:" + b[:40].decode("latin-1") for b in sorted(corrupt)[:3]]


def _snapshot(data_dir: Path, out: Path) -> subprocess.Popen[bytes]:
    """Start ``mqhub snapshot`` of ``data_dir`` into ``out``."""
    cmd = [sys.executable, "-m", "mqhub.cli", "snapshot", "--data-dir", str(data_dir), "--out", str(out)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def run_crash_cycles(target: CrashTarget, work: Path, cycles: int, seed: int,
                     epoch: int = 10, max_wait: float = 1.0) -> Figures:
    """Run ``cycles`` crash cycles of ``target`` under ``work``; return the figures.

    :param epoch: start a fresh data directory after this many cycles (map growth recurs).
    :param max_wait: longest random wait between the first confirmations and the kill (s).
    """
    rng = random.Random(seed)
    figures = Figures(target.name)
    started = time.monotonic()
    broker = BrokerProcess(target.protocols, work / "data0", log_dir=work / "logs",
                           extra_args=[*target.extra_args, "--store-map-size", str(MAP_MIB)])
    previous: tuple[int, Ledger] | None = None
    try:
        for cycle in range(cycles + 1):
            broker.start(timeout=60)
            if previous is not None:
                done, ledger = previous
                _check(figures, ledger, target.drain(broker, done, ledger.confirmed, timeout=60))
                previous = None
            if cycle == cycles:
                break
            if cycle and cycle % epoch == 0:  # a fresh store: the map grows from 1 MiB again
                broker.stop()
                shutil.rmtree(broker.data_dir, ignore_errors=True)
                broker.data_dir = work / f"data{cycle}"
                broker.start(timeout=60)
            ledger = Ledger()
            stop = threading.Event()
            thread = threading.Thread(target=target.load, args=(broker, cycle, ledger, stop),
                                      daemon=True)
            thread.start()
            deadline = time.monotonic() + 30
            want = rng.choice((1, 20, 200, 2000))
            while ledger.confirmed_count < want and thread.is_alive():
                assert time.monotonic() < deadline, f"{target.name}: load did not get going"
                time.sleep(0.002)
            assert ledger.confirmed_count, f"{target.name}: the load ended before any confirmation"
            snap = None
            if cycle % 2 == 1:
                snap = _snapshot(broker.data_dir, work / f"snap{cycle}")
                figures.snapshots_taken += 1
            if cycle % 4 == 2 and _kill_at_next_growth(broker, rng.uniform(0.2, 2 * max_wait)):
                figures.kills_at_map_growth += 1
            else:
                time.sleep(rng.uniform(0, max_wait))
                log_before_kill = broker.output()
                broker.kill()
                if GROWN in log_before_kill:
                    figures.kills_after_map_growth += 1
            stop.set()
            thread.join(30)
            assert not thread.is_alive(), f"{target.name}: load thread did not stop"
            if snap is not None:
                _finish_snapshot(snap, work / f"snap{cycle}", rng, figures)
            previous = (cycle, ledger)
            figures.cycles += 1
    finally:
        broker.close()
    figures.seconds = round(time.monotonic() - started, 1)
    return figures


def _kill_at_next_growth(broker: BrokerProcess, within: float) -> bool:
    """SIGKILL the broker as soon as its log shows one more map growth (the retried group is
    then being committed into the grown map); False, with the broker alive, if none came."""
    seen = broker.output().count(GROWN)
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if broker.output().count(GROWN) > seen:
            broker.kill()
            return True
        time.sleep(0.001)
    return False


def _finish_snapshot(snap: subprocess.Popen[bytes], out: Path, rng: random.Random,
                     figures: Figures) -> None:
    """Kill the snapshot now and then; otherwise it must finish and verify against its manifest."""
    if rng.random() < 0.3 and snap.poll() is None:
        snap.send_signal(signal.SIGKILL)
        snap.wait(30)
        figures.snapshots_killed += 1
    else:
        _, err = snap.communicate(timeout=120)
        assert snap.returncode == 0, f"snapshot failed after the broker's kill: {err.decode()[-2000:]}"
        with SnapshotReader(str(out)) as reader:
            problems = reader.verify()
        assert not problems, f"snapshot taken during the load does not verify: {problems[:5]}"
    shutil.rmtree(out, ignore_errors=True)
