"""Snapshot or export? (one function, used by export, the data source, the job and the runner),
and an export that reads the snapshot's manifest exactly once."""

from __future__ import annotations

import builtins
import os
from typing import Any

import pytest

from mqhub.store.snapshot import MANIFEST, take_snapshot
from tests.unit.store.test_journal import Rig

pytest.importorskip("pyarrow")


@pytest.fixture
def snap(tmp_path: Any) -> str:
    """A closed store with a little traffic over two journal files, snapshotted."""
    rig = Rig(str(tmp_path / "s"), max_file=600)
    rig.broker.declare_queue("q")
    rig.broker.bind_queue("a.b", "q")
    for i in range(4):
        rig.broker.publish_batch("a.b", [b"x" * (10 + i)] * 3, origin="nsq")
        rig.settle()
    rig.close()
    out = str(tmp_path / "snap")
    take_snapshot(str(tmp_path / "s"), out)
    return out


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
    assert result["rows"]["events"] == 12 and result["rows"]["messages"] == 12


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
    pytest.importorskip("pyspark")
    from mqhub.analytics.datasource import MqhubDataSource

    with pytest.raises(ValueError, match="is not a snapshot"):
        MqhubDataSource({"path": str(tmp_path), "table": "events"}).reader(None)
