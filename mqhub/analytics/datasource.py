"""The PySpark Python Data Source ``mqhub`` (Spark >= 4): read a snapshot's tables as Arrow batches.

::

    from mqhub.analytics.datasource import MqhubDataSource
    spark.dataSource.register(MqhubDataSource)
    events = spark.read.format("mqhub").option("table", "events").load("/abs/snapshot")

Tables: ``events`` and ``counters`` (the flow journal; one partition per journal file) and
``messages`` (the entries stored in the snapshot's index; one partition). ``read()`` yields
``pyarrow.RecordBatch``es cast to the exact Spark schema. Imports no Twisted; pyspark is only
needed when this module is imported, pyarrow/numpy only inside ``read()``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from mqhub.analytics.arrow import DDL, TABLES
from mqhub.analytics.export import SNAPSHOT, source_kind


class JournalFile(InputPartition):
    """One journal file of a snapshot (or the whole index for ``messages``)."""

    def __init__(self, index: int, path: str, length: int) -> None:
        """Remember the file and how many bytes of it belong to the snapshot."""
        super().__init__(index)
        self.path = path
        self.length = length


class MqhubReader(DataSourceReader):
    """Partitions a snapshot by journal file and reads each as Arrow batches."""

    def __init__(self, schema: Any, snapdir: str, table: str) -> None:
        """Keep what the executors need (the reader is pickled to them)."""
        self.schema = schema
        self.snapdir = snapdir
        self.table = table

    def partitions(self) -> list[InputPartition]:
        """One partition per journal file (``messages``: one for the index)."""
        from mqhub.analytics.arrow import snapshot_journal_files

        if self.table == "messages":
            return [JournalFile(0, self.snapdir, 0)]
        files = snapshot_journal_files(self.snapdir)
        return [JournalFile(i, p, n) for i, (p, n) in enumerate(files)] or [
            JournalFile(0, "", 0)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Yield the partition's rows as RecordBatches of exactly the requested schema."""
        from pyspark.sql.pandas.types import to_arrow_schema

        from mqhub.analytics.arrow import table_batches

        target = to_arrow_schema(self.schema, timezone="UTC")
        assert isinstance(partition, JournalFile)
        if self.table != "messages" and not partition.path:
            return
        part = None if self.table == "messages" else (partition.path, partition.length)
        for batch in table_batches(self.snapdir, self.table, part):
            if batch.num_rows:
                yield batch.cast(target)


class MqhubDataSource(DataSource):
    """``spark.read.format("mqhub").option("table", T).load(SNAPDIR)``."""

    @classmethod
    def name(cls) -> str:
        """The short name."""
        return "mqhub"

    def _table(self) -> str:
        """The table option (default ``events``), checked."""
        table = self.options.get("table", "events")
        if table not in TABLES:
            raise ValueError(f"mqhub data source: table must be one of {TABLES}, got {table!r}")
        return table

    def schema(self) -> str:
        """The table's DDL schema."""
        return DDL[self._table()]

    def reader(self, schema: Any) -> DataSourceReader:
        """A reader for the snapshot directory given to ``load()`` (or the ``path`` option)."""
        path = self.options.get("path")
        if not path:
            raise ValueError("mqhub data source: load(SNAPDIR) or option('path', SNAPDIR)")
        snapdir = os.path.abspath(path)
        if source_kind(snapdir) != SNAPSHOT:
            raise ValueError(f"mqhub data source: {snapdir!r} is not a snapshot")
        return MqhubReader(schema, snapdir, self._table())


DefaultSource = MqhubDataSource
