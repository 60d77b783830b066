"""The ``mqhub`` data source's reader, the Parquet export and the report, without a JVM:
partitions per journal file, batches cast to Spark's exact schema, Twisted never imported;
snapshot-or-export detection (``source_kind``) and an export reading its manifest once."""

from __future__ import annotations

import builtins
import datetime as dt
import json
import os
import subprocess
import sys
from typing import Any

import pytest

from mqhub.store.snapshot import MANIFEST, take_snapshot
from tests.unit.store.test_journal import Rig

pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


@pytest.fixture
def snap(tmp_path: Any) -> str:
    """A closed store with a little traffic (2 journal files), snapshotted."""
    rig = Rig(str(tmp_path / "s"), max_file=600)
    rig.broker.declare_queue("q")
    rig.broker.bind_queue("a.b", "q")
    for i in range(6):
        rig.broker.publish_batch("a.b", [b"x" * (10 + i)] * 3, origin="nsq")
        rig.settle()
    rig.close()
    out = str(tmp_path / "snap")
    take_snapshot(str(tmp_path / "s"), out)
    return out


def test_reader_partitions_and_exact_schema(snap: str) -> None:
    """One partition per journal file; every batch equals the Spark schema's Arrow form."""
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

    from mqhub.analytics.arrow import arrow_schema
    from mqhub.analytics.datasource import MqhubDataSource

    for table, rows in (("events", 18), ("messages", 18), ("counters", 0)):
        source = MqhubDataSource({"path": snap, "table": table})
        schema = from_arrow_schema(arrow_schema(table))
        reader = source.reader(schema)
        parts = reader.partitions()
        assert len(parts) == (1 if table == "messages" else 2)
        target = to_arrow_schema(schema, timezone="UTC")
        batches = [b for p in parts for b in reader.read(p)]
        assert all(b.schema.equals(target) for b in batches)
        assert sum(b.num_rows for b in batches) == rows
    with pytest.raises(ValueError):
        MqhubDataSource({"path": snap, "table": "nope"}).schema()


def test_export_partitions_by_day(snap: str, tmp_path: Any) -> None:
    """export writes events and messages under day=YYYY-MM-DD with the table schemas."""
    from mqhub.analytics.export import export_snapshot

    result = export_snapshot(snap, str(tmp_path / "exp"))
    assert result["rows"] == {"events": 18, "counters": 0, "messages": 18}
    days = sorted(p.name for p in (tmp_path / "exp" / "events").iterdir())
    assert days == ["day=2026-01-01"]
    table = pq.read_table(tmp_path / "exp" / "events" / days[0])
    assert table.column("ts")[0].as_py() == dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert set(table.column("event").to_pylist()) == {"published"}
    with pytest.raises(FileExistsError):
        export_snapshot(snap, str(tmp_path / "exp"))


def test_report_html_and_plots(tmp_path: Any) -> None:
    """write_report draws five PNGs and embeds them; empty tables give placeholder plots."""
    from mqhub.analytics.job import TABLE_NAMES
    from mqhub.analytics.report import write_report

    minute = dt.datetime(2026, 1, 1, 0, 1, tzinfo=dt.UTC)
    tables: dict[str, list[dict[str, Any]]] = {n: [] for n in TABLE_NAMES}
    tables["throughput"] = [{"address": "a", "origin": "nsq", "minute": minute, "published": 5,
                             "delivered": 5, "acked": 4}]
    tables["latency"] = [{"address": "a", "kind": "ack", "count": 4, "p50_ms": 1.0,
                          "p90_ms": 2.0, "p99_ms": 3.0, "max_ms": 3.5}]
    path = write_report(str(tmp_path), tables, {"messages": 5, "source": "x", "master": "m"})
    html = open(path).read()
    assert html.count("data:image/png;base64,") == 5 and "<td>a</td>" in html
    assert (tmp_path / "plots" / "throughput.png").read_bytes()[:4] == b"\x89PNG"


def test_readers_import_no_twisted() -> None:
    """The data source, the Arrow decoder and the export import neither Twisted nor zope."""
    code = ("import sys, mqhub.analytics.datasource, mqhub.analytics.export, "
            "mqhub.analytics.job, mqhub.analytics.report; "
            "print(json.dumps([m for m in sys.modules if m.split('.')[0] in "
            "('twisted', 'zope')]))")
    done = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_java_check_says_what_is_missing(tmp_path: Any) -> None:
    """mqhub analytics refuses a missing or too old Java with a message naming the fix."""
    from mqhub.analytics.runner import AnalyticsError, java_version

    with pytest.raises(AnalyticsError, match="needs Java 17 or newer.*JAVA_HOME"):
        java_version(str(tmp_path / "no-java"))
    old = tmp_path / "java"
    old.write_text('#!/bin/sh\necho \'openjdk version "11.0.2" 2019-01-15\' >&2\n')
    old.chmod(0o755)
    with pytest.raises(AnalyticsError, match="is Java 11"):
        java_version(str(old))
    old.write_text('#!/bin/sh\necho \'java version "1.8.0_301"\' >&2\n')
    with pytest.raises(AnalyticsError, match="is Java 8"):
        java_version(str(old))
    old.write_text('#!/bin/sh\necho \'openjdk version "17.0.15" 2025-04-15\' >&2\n')
    assert java_version(str(old)) == 17


def test_export_reads_the_manifest_once(snap: str, tmp_path: Any,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """export_snapshot opens manifest.json once and still writes every table."""
    from mqhub.analytics.export import export_snapshot

    opened: list[str] = []
    real_open = builtins.open

    def counting_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        if str(file).endswith(MANIFEST):
            opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    result = export_snapshot(snap, str(tmp_path / "exp"))
    assert opened == [os.path.join(snap, MANIFEST)]
    assert result["rows"]["events"] == 18 and result["rows"]["messages"] == 18


def test_source_kind(snap: str, tmp_path: Any) -> None:
    """manifest.json: a snapshot; export.json or events/: an export; else neither."""
    from mqhub.analytics.export import EXPORT, SNAPSHOT, export_snapshot, source_kind

    assert source_kind(snap) == SNAPSHOT
    export_snapshot(snap, str(tmp_path / "exp"))
    assert source_kind(str(tmp_path / "exp")) == EXPORT
    (tmp_path / "foreign" / "events").mkdir(parents=True)
    assert source_kind(str(tmp_path / "foreign")) == EXPORT
    (tmp_path / "empty").mkdir()
    assert source_kind(str(tmp_path / "empty")) is None


def test_export_of_an_idle_snapshot_is_an_export(tmp_path: Any) -> None:
    """A snapshot without traffic exports no events/ table; export.json still marks it."""
    from mqhub.analytics.export import EXPORT, export_snapshot, source_kind

    rig = Rig(str(tmp_path / "s"))
    rig.close()
    take_snapshot(str(tmp_path / "s"), str(tmp_path / "snap"))
    result = export_snapshot(str(tmp_path / "snap"), str(tmp_path / "exp"))
    assert result["rows"] == {"events": 0, "counters": 0, "messages": 0}
    assert not (tmp_path / "exp" / "events").exists()
    assert source_kind(str(tmp_path / "exp")) == EXPORT


def test_runner_and_data_source_refuse_other_directories(tmp_path: Any) -> None:
    """Neither a snapshot nor an export: the runner and the data source say so."""
    from mqhub.analytics.runner import AnalyticsError, run_analytics

    with pytest.raises(AnalyticsError, match="neither a snapshot"):
        run_analytics(str(tmp_path), str(tmp_path / "out"), spark=object())
    from mqhub.analytics.datasource import MqhubDataSource

    with pytest.raises(ValueError, match="is not a snapshot"):
        MqhubDataSource({"path": str(tmp_path), "table": "events"}).reader(None)
