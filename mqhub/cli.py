"""The ``mqhub`` command: operational subcommands beside ``twistd mqhub`` (which runs the broker).

Commands: ``snapshot`` (online copy of a store), ``export`` (snapshot to Parquet), ``analytics``
(the Spark report), ``bench``, ``config`` (``example`` and ``check`` of config files) and
``users`` (:mod:`mqhub.identity.cli`); the admin commands (``stats``, ``queues``, ``dlq``) live in
:mod:`mqhub.cli_admin`. The analytics commands import pyarrow and pyspark lazily (extras
``mqhub[export]`` and ``mqhub[spark]``).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import click

from mqhub import __version__
from mqhub.cli_admin import register as register_admin_commands
from mqhub.cluster.coverage import copy_marker, coverage_note
from mqhub.identity.cli import register as register_users_commands

SOURCE_ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = SOURCE_ROOT / "benchmarks"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mqhub")
def main() -> None:
    """mqhub: operate a multi-protocol message hub (run the broker with `twistd -n mqhub`)."""


def bench_names() -> list[str]:
    """Names of the benchmarks/NAME_bench.py scripts in the source tree."""
    return sorted(p.name[: -len("_bench.py")] for p in BENCH_DIR.glob("*_bench.py"))


@main.command(
    add_help_option=False,  # `mqhub bench NAME --help` is the benchmark's own help
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
)
@click.argument("name", required=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def bench(ctx: click.Context, name: str | None, args: tuple[str, ...]) -> None:
    """Run benchmarks/NAME_bench.py with ARGS (no NAME: list the benchmarks)."""
    names = bench_names()
    if name is None or name in ("-h", "--help"):
        click.echo(ctx.get_help())
        click.echo("\nbenchmarks: " + (", ".join(names) or "none yet"))
        return
    if name not in names:  # only listed names: NAME never becomes a path of its own
        raise click.UsageError(f"no benchmark {name!r}; available: {', '.join(names) or 'none'}")
    path = BENCH_DIR / f"{name}_bench.py"
    spec = importlib.util.spec_from_file_location(f"mqhub_bench_{name}", path)
    assert spec is not None and spec.loader is not None
    module: Any = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(SOURCE_ROOT))
    try:
        spec.loader.exec_module(module)
        result = module.main(list(args))
    finally:
        sys.path.remove(str(SOURCE_ROOT))
    if isinstance(result, int) and result:
        raise SystemExit(result)


@main.command()
@click.option("--data-dir", required=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="The broker's data directory (--data-dir of twistd mqhub).")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory to write the snapshot into (must not hold one already).")
@click.option("--progress/--no-progress", default=None,
              help="Show a progress bar on stderr (default: when stderr is a terminal).")
def snapshot(data_dir: Path, out_dir: Path, progress: bool | None) -> None:
    """Take a consistent snapshot of a store (safe while the broker runs).

    --data-dir may name the broker's data directory or the store directory inside it.
    """
    from mqhub.cli_progress import copy_with_progress
    from mqhub.errors import StoreError
    from mqhub.store.snapshot import take_snapshot

    show = sys.stderr.isatty() if progress is None else progress
    try:
        manifest = copy_with_progress(lambda: take_snapshot(str(data_dir), str(out_dir)),
                                      data_dir, out_dir, show)
    except StoreError as exc:
        raise click.ClickException(str(exc)) from exc
    out = {"snapshot": str(out_dir), "manifest": manifest}
    copy_marker(str(data_dir), str(out_dir))
    note = coverage_note(str(out_dir))
    if note:   # a cluster node's data directory: say what the snapshot holds
        click.echo(note, err=True)
        out["covers"] = note
    click.echo(json.dumps(out, default=str))


@main.command()
@click.argument("snapdir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory to write the Parquet tables into (events/, counters/, messages/).")
def export(snapdir: Path, out_dir: Path) -> None:
    """Export a snapshot's journal and stored messages as Parquet, partitioned by day."""
    try:
        from mqhub.analytics.export import SNAPSHOT, export_snapshot, source_kind
    except ImportError as exc:
        raise click.ClickException("mqhub export needs: pip install 'mqhub[export]'") from exc
    from mqhub.cli_progress import progress_bar
    from mqhub.errors import StoreError
    from mqhub.store.snapshot import MANIFEST

    if source_kind(str(snapdir)) != SNAPSHOT:
        raise click.ClickException(f"{snapdir} is not a snapshot (no {MANIFEST})")
    progress, task = progress_bar("export", 1)
    with progress:
        def step(stage: str, done: int, total: int) -> None:
            progress.update(task, description=f"export: {stage}", completed=done, total=total)

        try:
            result = export_snapshot(str(snapdir), str(out_dir), step)
        except (FileExistsError, OSError, ValueError, StoreError) as exc:
            raise click.ClickException(str(exc)) from exc
    copy_marker(str(snapdir), str(out_dir))
    note = coverage_note(str(snapdir))
    if note:
        click.echo(note, err=True)
        result["covers"] = note
    click.echo(json.dumps(result))


@main.command()
@click.argument("src", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Report directory: one Parquet table per report table, summary.json, "
                   "report.html.")
@click.option("--master", default="local[2]", show_default=True,
              help="Spark master: local[N] or spark://HOST:PORT.")
@click.option("--read", "read", type=click.Choice(["parquet", "datasource"]), default="parquet",
              show_default=True,
              help="How Spark reads a snapshot: staged as Parquet (pyarrow) or through the "
                   "'mqhub' Python data source.")
def analytics(src: Path, out_dir: Path, master: str, read: str) -> None:
    """Run the Spark analytics job over a snapshot or an export and write the report."""
    from mqhub.analytics.runner import STAGES, AnalyticsError, run_analytics
    from mqhub.cli_progress import progress_bar

    progress, task = progress_bar("analytics", len(STAGES))
    with progress:
        def step(stage: str) -> None:
            progress.update(task, advance=1, description=f"analytics: {stage}")

        try:
            summary = run_analytics(str(src), str(out_dir), master=master, read=read,
                                    progress=step)
        except AnalyticsError as exc:
            raise click.ClickException(str(exc)) from exc
    out = {"report": str(out_dir / "report.html"), "summary": summary}
    note = coverage_note(str(src))
    if note:
        click.echo(note, err=True)
        out["covers"] = note
    click.echo(json.dumps(out))


@main.group(name="config")
def config_group() -> None:
    """Write and check configuration files (twistd -n mqhub --config FILE)."""


_TWISTD_ARGS = {"ignore_unknown_options": True, "allow_extra_args": True}


@config_group.command(context_settings=_TWISTD_ARGS)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def example(args: tuple[str, ...]) -> None:
    """Print a complete, commented config file with every option at its default.

    ARGS are twistd mqhub options to apply first (e.g. --plugin-path DIR to include the
    settings of drop-in protocols).
    """
    from mqhub import config

    click.echo(config.effective(_parsed(list(args))), nl=False)


@config_group.command(context_settings=_TWISTD_ARGS)
@click.argument("file", type=click.Path(dir_okay=False))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def check(file: str, args: tuple[str, ...]) -> None:
    """Check FILE as `twistd -n mqhub --config FILE ARGS` would read it (protocols' settings,
    certificates and files included, nothing opened or bound) and print the effective
    configuration; on an error print it (with the file's line) and exit 1."""
    from mqhub import config
    from mqhub.errors import PluginError

    options = _parsed(["--config", file, *args])
    try:
        config.check_plugins(options)
    except PluginError as exc:
        raise click.ClickException(f"{file}: {exc}") from exc
    click.echo(config.effective(options, f"effective configuration of {file}"), nl=False)


def _parsed(args: list[str]) -> Any:
    """``twistd mqhub`` options parsed from ``args`` (a usage error becomes a click error)."""
    from twisted.python import usage

    from mqhub.tap import Options

    options = Options()
    try:
        options.parseOptions(args)
    except usage.UsageError as exc:
        raise click.ClickException(str(exc)) from exc
    return options


register_admin_commands(main)
register_users_commands(main)


if __name__ == "__main__":  # pragma: no cover
    main()
