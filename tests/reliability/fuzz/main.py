"""``make fuzz``: fuzz every codec for a bounded time and print inputs per codec.

``python -m tests.reliability.fuzz.main [--seconds S] [--inputs N] [--engine auto|atheris|random]
[--codec NAME ...]``

For each target: atheris (coverage-guided, when installed) runs for ``--seconds`` in its own
process, then the random mutation loop runs ``--inputs`` inputs (bounded by ``--seconds`` × 10
as a safety stop). Crashing inputs are written to ``var/fuzz-crashes/`` and make the command
fail; each one belongs in a regression test. Figures are printed as a table and appended to
``MQHUB_RELIABILITY_FIGURES`` when set.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

from tests.reliability.fuzz.mutate import fuzz_loop
from tests.reliability.fuzz.targets import all_targets, dump

ROOT = Path(__file__).resolve().parents[3]
CRASH_DIR = ROOT / "var" / "fuzz-crashes"


def have_atheris() -> bool:
    """Whether atheris can be imported here."""
    try:
        import atheris  # noqa: F401
    except ImportError:
        return False
    return True


def run_atheris(name: str, seconds: int) -> tuple[int, list[str]]:
    """Fuzz ``name`` with atheris for ``seconds``; return (runs, crash files)."""
    CRASH_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as corpus:
        cmd = [sys.executable, "-m", "tests.reliability.fuzz.atheris_main", name,
               f"-max_total_time={seconds}", "-max_len=4096", "-rss_limit_mb=2048", "-timeout=10",
               f"-artifact_prefix={CRASH_DIR}/{name}-", corpus]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=seconds + 120)
    runs = re.findall(r"Done (\d+) runs", proc.stderr)
    crashes = re.findall(r"Test unit written to (\S+)", proc.stderr)
    if proc.returncode and not crashes:
        crashes = [f"atheris exited {proc.returncode}: {proc.stderr[-500:]}"]
    return (int(runs[-1]) if runs else 0), crashes


@click.command()
@click.option("--seconds", default=30, show_default=True, help="atheris time per codec.")
@click.option("--inputs", default=1_000_000, show_default=True, help="Random-loop inputs per codec.")
@click.option("--engine", type=click.Choice(["auto", "atheris", "random"]), default="auto")
@click.option("--codec", "codecs", multiple=True, help="Only these codecs (repeatable; default all).")
def main(seconds: int, inputs: int, engine: str, codecs: tuple[str, ...]) -> None:
    """Fuzz every codec; print inputs per codec; exit 1 on any crash."""
    use_atheris = engine == "atheris" or (engine == "auto" and have_atheris())
    rows = []
    failed = False
    targets = all_targets()
    unknown = set(codecs) - set(targets)
    if unknown:
        raise click.BadParameter(f"unknown codec(s) {sorted(unknown)}; known: {sorted(targets)}")
    for name, target in targets.items():
        if codecs and name not in codecs:
            continue
        started = time.monotonic()
        ath_runs, crashes = run_atheris(name, seconds) if use_atheris and engine != "random" else (0, [])
        loop = fuzz_loop(target, seconds * 10, seed=1, max_inputs=inputs) if inputs else None
        loop_runs = loop.inputs if loop else 0
        for data, error in (loop.crashes if loop else []):
            CRASH_DIR.mkdir(parents=True, exist_ok=True)
            path = CRASH_DIR / f"{name}-loop-{len(crashes)}.json"
            path.write_text(json.dumps({"input": dump(data), "error": error}))
            crashes.append(str(path))
        failed |= bool(crashes)
        row = {"codec": name, "atheris_runs": ath_runs, "loop_inputs": loop_runs,
               "inputs": ath_runs + loop_runs, "crashes": len(crashes),
               "seconds": round(time.monotonic() - started, 1)}
        rows.append(row)
        click.echo(f"{name:12} atheris {ath_runs:>10,}  loop {loop_runs:>10,}  total {row['inputs']:>10,}"
                   f"  crashes {len(crashes)}  ({row['seconds']} s)")
        for crash in crashes[:5]:
            click.echo(f"    crash: {crash}")
    figures = os.environ.get("MQHUB_RELIABILITY_FIGURES")
    if figures:
        with open(figures, "a") as f:
            for row in rows:
                f.write(json.dumps({"kind": "fuzz", **row}) + "\n")
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
