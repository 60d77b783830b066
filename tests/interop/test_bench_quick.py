"""Every ``mqhub bench NAME`` runs to completion in its ``--quick`` mode (so none can rot).

Each runs as a real ``mqhub bench NAME --quick`` process (servers, reference servers and Spark
included, as on a fresh clone); the figures of a quick run mean nothing and are not checked,
only that the benchmark finishes with status 0 and prints them.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from mqhub.cli import bench_names

pytestmark = pytest.mark.interop

MQHUB = Path(sys.executable).parent / "mqhub"
#: a figure line: ``<figure> <number> ...`` (slow_consumer prints a table whose rows match
#: too), ``<name words> median <number>`` (startup) or ``<name words> <number> <unit>``
#: (cluster)
FIGURE = re.compile(r"^[A-Za-z][\w.-]* +-?[\d.]+|^[A-Za-z][\w.() -]*? median +[\d.]+"
                    r"|^[A-Za-z][\w .>/()-]*? -?\d[\d.]* [\w/]+$", re.M)


def test_every_benchmark_is_found() -> None:
    """The benchmarks/ scripts are all listed (a renamed file would silently drop out)."""
    scripts = sorted(p.name for p in (Path(__file__).parents[2] / "benchmarks").glob("*_bench.py"))
    assert [f"{n}_bench.py" for n in bench_names()] == scripts
    assert {"core", "nsq", "nats", "store", "analytics"} <= set(bench_names())


@pytest.mark.parametrize("name", bench_names())
def test_quick_mode_runs_to_completion(name: str, tmp_path: Path) -> None:
    """``mqhub bench NAME --quick`` exits 0 and prints figures."""
    done = subprocess.run([str(MQHUB), "bench", name, "--quick"], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, f"{name}:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    assert FIGURE.search(done.stdout), f"{name} printed no figure:\n{done.stdout[-3000:]}"
