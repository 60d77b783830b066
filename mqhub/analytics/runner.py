"""``mqhub analytics SRC --out REPORTDIR``: Java check, SparkSession, the job, the report.

Stages (each reported to a ``progress(stage)`` callback, which the CLI draws as a rich
progress bar): java, spark, load, one per report table, summary, report. The report tables are
small aggregates: each is computed by Spark, brought to the driver as Arrow
(``DataFrame.toArrow``) and written as ``REPORTDIR/<table>/part-0.parquet`` there, so the
report directory is complete on the driver's machine whatever the master.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from mqhub.analytics.export import SNAPSHOT, export_snapshot, source_kind
from mqhub.analytics.job import TABLE_NAMES, build_tables, load_tables, summary_rows
from mqhub.store.journal_format import EVENT_NAMES

STAGES = ("java", "input", "spark", "load", *TABLE_NAMES, "summary", "report")
READ_MODES = ("parquet", "datasource")
STAGED_INPUT = "_input"
MIN_JAVA = 17
#: short jobs: C1-only JIT and the serial GC start faster (measured in docs/analytics.md)
JVM_OPTIONS = os.environ.get("MQHUB_SPARK_JAVA_OPTIONS",
                             "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


class AnalyticsError(Exception):
    """The analytics run cannot start or failed (the message says why, for the operator)."""


def java_version(java: str | None = None) -> int:
    """Return the major version of the Java Spark will use.

    :raises AnalyticsError: when no Java is found or it is older than 17.
    """
    home = os.environ.get("JAVA_HOME")
    if java is None:
        java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        raise AnalyticsError(
            "mqhub analytics needs Java 17 or newer for Spark, and none was found "
            "(set JAVA_HOME or put `java` on PATH; e.g. apt-get install openjdk-17-jre-headless)")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise AnalyticsError(f"cannot run {java} -version: {e}") from e
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not m:
        raise AnalyticsError(f"cannot read the Java version from {java} -version")
    major = int(m.group(1))
    if major == 1 and m.group(2):  # "1.8.0" style
        major = int(m.group(2))
    if major < MIN_JAVA:
        raise AnalyticsError(f"mqhub analytics needs Java {MIN_JAVA}+ for Spark 4; "
                             f"{java} is Java {major} (set JAVA_HOME to a newer one)")
    return major


def spark_session(master: str, app: str = "mqhub-analytics") -> Any:
    """A SparkSession for ``master`` with the settings the analytics job wants."""
    try:
        from pyspark.sql import SparkSession
    except ImportError as e:
        raise AnalyticsError("mqhub analytics needs PySpark 4: pip install 'mqhub[spark]'") from e
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (SparkSession.builder.master(master).appName(app)
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
               .config("spark.pyspark.driver.python", sys.executable)
               .config("spark.driver.extraJavaOptions", JVM_OPTIONS))
    if master.startswith("local") or "127.0.0.1" in master or "localhost" in master:
        builder = (builder.config("spark.driver.host", "127.0.0.1")
                   .config("spark.driver.bindAddress", "127.0.0.1"))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _plain(value: Any) -> Any:
    """JSON-friendly form of a summary value."""
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def run_analytics(src: str, out: str, *, master: str = "local[2]", spark: Any = None,
                  read: str = "parquet",
                  progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Compute the report tables of ``src`` into ``out``; return the summary.

    :param read: for a snapshot ``src``: ``parquet`` (default) exports it first with pyarrow
        into ``out/_input`` and Spark reads that (about twice as fast: no Python workers);
        ``datasource`` reads the snapshot through the ``mqhub`` Python data source. Either
        way the path must be visible to every executor (docs/analytics.md).
    :param spark: an existing SparkSession to use (tests); else one is made for ``master``
        and stopped at the end.
    :raises AnalyticsError: Java or PySpark missing, or ``src`` is neither a snapshot nor an
        export.
    """
    started = time.perf_counter()
    step = progress or (lambda stage: None)
    src = origin = os.path.abspath(src)
    kind = source_kind(src)
    if kind is None:
        raise AnalyticsError(f"{src!r} is neither a snapshot (manifest.json) nor an export "
                             "(export.json or events/)")
    if read not in READ_MODES:
        raise AnalyticsError(f"read must be one of {READ_MODES}")
    own = spark is None
    if own:
        java_version()
    step("java")
    starting: dict[str, Any] = {}
    starter = None
    if own:
        # the JVM starts in its own process: let it boot while pyarrow stages the input
        def boot() -> None:
            try:
                starting["spark"] = spark_session(master)
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                starting["error"] = e

        starter = threading.Thread(target=boot, name="spark-session", daemon=True)
        starter.start()
    try:
        if read == "parquet" and kind == SNAPSHOT:
            staged = os.path.join(os.path.abspath(out), STAGED_INPUT)
            shutil.rmtree(staged, ignore_errors=True)
            export_snapshot(src, staged)
            src = staged
    except BaseException:
        if starter is not None:
            starter.join()
            if "spark" in starting:
                starting["spark"].stop()
        raise
    if starter is not None:
        starter.join()
    step("input")
    if own:
        if "error" in starting:
            raise starting["error"]
        spark = starting["spark"]
    else:
        master = spark.sparkContext.master
    step("spark")
    try:
        events, counters, messages = load_tables(spark, src)
        if src == origin and read == "datasource":
            # every table re-reads its input: keep the Python data source's rows in memory
            events = events.cache()
            counters = counters.cache()
        step("load")
        os.makedirs(out, exist_ok=True)
        tables: dict[str, list[dict[str, Any]]] = {}
        for name, df in build_tables(events, counters).items():
            tables[name] = _write_table(df, os.path.join(out, name))
            step(name)
        summary = _summary(*summary_rows(events, counters), tables)
        summary.update(source=origin, master=master, read=read, stored=messages.count(),
                       tables={k: len(v) for k, v in tables.items()},
                       seconds=round(time.perf_counter() - started, 3))
        with open(os.path.join(out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1, sort_keys=True, default=str)
        step("summary")
    finally:
        if own:
            spark.stop()
    from mqhub.analytics.report import write_report

    write_report(out, tables, summary)
    step("report")
    return summary


def _summary(ev: list[Any], ct: list[Any], tables: dict[str, list[dict[str, Any]]]
             ) -> dict[str, Any]:
    """Totals and the time span from the per-event rows and the report tables."""
    by = {r["event"]: r for r in ev}
    out: dict[str, Any] = {name: int(by[name]["n"]) if name in by else 0 for name in EVENT_NAMES}
    out["messages"] = sum(r["published"] for r in tables["throughput"]) - sum(
        int(r["n"] or 0) for r in ct if r["kind"] == "published")
    out["events"] = sum(out[name] for name in EVENT_NAMES)
    kinds = {r["kind"]: r for r in ct}
    out["memory_published"] = int(kinds["published"]["n"]) if "published" in kinds else 0
    out["memory_delivered"] = int(kinds["delivered"]["n"]) if "delivered" in kinds else 0
    firsts = [r["first"] for r in (*ev, *ct) if r["first"] is not None]
    lasts = [r["last"] for r in (*ev, *ct) if r["last"] is not None]
    out["first"] = _plain(min(firsts)) if firsts else None
    out["last"] = _plain(max(lasts)) if lasts else None
    out["addresses"] = len({r["address"] for r in tables["throughput"]})
    out["queues"] = len({r["queue"] for r in tables["redeliveries"]})
    out["bytes"] = sum(r["bytes"] or 0 for r in tables["protocols"])
    return out


def _write_table(df: Any, path: str) -> list[dict[str, Any]]:
    """Run ``df``, write it as ``path/part-0.parquet`` and return its rows."""
    import pyarrow.parquet as pq

    table = df.toArrow()
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(path)
    pq.write_table(table, os.path.join(path, "part-0.parquet"), compression="zstd")
    return table.to_pylist()
