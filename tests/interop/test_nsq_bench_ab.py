"""The NSQ benchmark's same-run A/B mode (``--base-tree``) against real ``twistd`` servers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import nsq_bench

pytestmark = pytest.mark.interop

ROOT = Path(__file__).resolve().parents[2]


def test_base_tree_runs_both_servers_alternating(capsys: pytest.CaptureFixture[str]) -> None:
    """Each scenario runs on this tree's server and on the base tree's, with figures for both."""
    assert nsq_bench.main(["--base-tree", str(ROOT), "--duration", "0.3", "--modes", "mpub",
                           "--sizes", "16", "--rounds", "2"]) == 0
    out = capsys.readouterr().out
    this = re.findall(r"^mpub_16B_e2e (\d+) msg/s$", out, re.M)
    base = re.findall(r"^mpub_16B_e2e_base (\d+) msg/s$", out, re.M)
    assert len(this) == 2 and len(base) == 2
    assert all(int(v) > 0 for v in this + base)
    # the second round starts with the base tree: the order alternates
    labels = re.findall(r"^# (this|base):", out, re.M)
    assert labels == ["this", "base", "base", "this"]
    assert len(re.findall(r"server \d+\.\d+", out)) == 4


def test_base_tree_refuses_an_address() -> None:
    """``--base-tree`` starts its own servers, so an ``--address`` is a usage error."""
    with pytest.raises(SystemExit):
        nsq_bench.main(["--base-tree", str(ROOT), "--address", "127.0.0.1:1"])
