"""The ``mqhub`` console command (click): help, bench and snapshot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from twisted.internet.task import Clock

from mqhub import cli
from mqhub.store.batch import WriteBatch
from mqhub.testing import result_of


def test_help_lists_subcommands() -> None:
    """``mqhub --help`` lists the commands that exist."""
    result = CliRunner().invoke(cli.main, ["--help"])
    assert result.exit_code == 0
    assert "bench" in result.output and "snapshot" in result.output


def test_bench_runs_main_with_arguments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``mqhub bench NAME ARGS`` runs benchmarks/NAME_bench.py's main(argv) with ARGS."""
    (tmp_path / "demo_bench.py").write_text(
        "import json, sys\n"
        "def main(argv):\n"
        "    print(json.dumps({'argv': argv}))\n"
        "    return 0\n"
    )
    monkeypatch.setattr(cli, "BENCH_DIR", tmp_path)
    runner = CliRunner()
    listing = runner.invoke(cli.main, ["bench"])
    assert listing.output.strip().splitlines()[-1] == "benchmarks: demo"
    assert "bench [OPTIONS] [NAME] [ARGS]" in runner.invoke(cli.main, ["bench", "--help"]).output
    result = runner.invoke(cli.main, ["bench", "demo", "--seconds", "3", "-x"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"argv": ["--seconds", "3", "-x"]}
    # --help after NAME belongs to the benchmark, not to mqhub
    passed = runner.invoke(cli.main, ["bench", "demo", "--help"])
    assert json.loads(passed.output) == {"argv": ["--help"]}


def test_bench_unknown_name_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An unknown benchmark fails and says which exist."""
    monkeypatch.setattr(cli, "BENCH_DIR", tmp_path)
    result = CliRunner().invoke(cli.main, ["bench", "nope"])
    assert result.exit_code == 2
    assert "no benchmark 'nope'" in result.output
    # a name is never a path: a script outside the benchmarks folder is not run
    (tmp_path / "sub").mkdir()
    (tmp_path / "outside_bench.py").write_text("def main(argv):\n    print('ran')\n")
    monkeypatch.setattr(cli, "BENCH_DIR", tmp_path / "sub")
    escaped = CliRunner().invoke(cli.main, ["bench", "../outside"])
    assert escaped.exit_code == 2 and "ran" not in escaped.output


def _store_with_one_meta(store_dir: Path) -> None:
    """Write one meta record into a fresh LMDB store at ``store_dir`` and close it."""
    from mqhub.store.lmdb import LmdbStore

    clock = Clock()
    store = LmdbStore(str(store_dir), clock=clock, durability="none")
    store.open()
    batch = WriteBatch()
    batch.put_meta("q/demo", b"{}")
    committed = store.commit(batch)
    clock.advance(0)  # the group commit of this turn
    result_of(committed)
    closed = store.close()
    clock.advance(0)
    result_of(closed)


def test_snapshot_of_a_broker_data_dir(tmp_path: Path) -> None:
    """``mqhub snapshot`` copies the store found in DATA_DIR/store and prints the manifest."""
    _store_with_one_meta(tmp_path / "data" / "store")
    out = tmp_path / "snap"
    result = CliRunner().invoke(cli.main, ["snapshot", "--data-dir", str(tmp_path / "data"),
                                           "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["snapshot"] == str(out)
    assert (out / "manifest.json").is_file()
    again = CliRunner().invoke(cli.main, ["snapshot", "--data-dir", str(tmp_path / "data"),
                                          "--out", str(out)])
    assert again.exit_code == 1
    assert "already holds a snapshot" in again.output
    direct = CliRunner().invoke(cli.main, ["snapshot", "--data-dir", str(tmp_path / "data" / "store"),
                                           "--out", str(tmp_path / "snap2")])
    assert direct.exit_code == 0, direct.output  # the store directory itself is accepted too
    assert json.loads(direct.output)["manifest"]["meta"] == 1


def test_snapshot_progress_bar_goes_to_stderr(tmp_path: Path) -> None:
    """``--progress`` draws a rich bar on stderr; stdout stays the JSON manifest."""
    _store_with_one_meta(tmp_path / "data" / "store")
    out = tmp_path / "snap"
    result = CliRunner().invoke(cli.main, ["snapshot", "--data-dir", str(tmp_path / "data"),
                                           "--out", str(out), "--progress"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["snapshot"] == str(out)
    assert "snapshot" in result.stderr and "━" in result.stderr
