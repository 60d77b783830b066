"""The analytics Spark job: the report tables from the ``events`` and ``counters`` tables.

The same code runs on ``local[N]`` and on a standalone cluster. Table contract (docs/analytics.md):

- ``throughput``: address, origin, minute, published, delivered, acked
- ``latency``: address, kind (deliver | ack), count, p50_ms, p90_ms, p99_ms, max_ms
- ``redeliveries``: queue, messages_redelivered, redeliveries, max_attempt
- ``dead_letters``: queue, reason, count
- ``expired``: queue, reason, count (``ttl``: the message's own TTL; ``queue_expired``: its
  queue's own, an mq9 mailbox's TTL; empty in journals written before issue 27)
- ``purged``: queue, reason, count (removed with the whole queue: ``queue_deleted``, ``purged``)
- ``protocols``: origin, messages, bytes
- ``sizes``: bucket, count

A message is *published* once (its first ``published`` event, whatever number of queues got a
copy); memory-tier counters add to ``published``/``delivered`` and to ``protocols``.
"""

from __future__ import annotations

from typing import Any

SIZE_BUCKETS = (64, 256, 1024, 4096, 16384, 65536)
BUCKET_NAMES = tuple(str(b) for b in SIZE_BUCKETS) + ("larger",)
TABLE_NAMES = ("throughput", "latency", "redeliveries", "dead_letters", "expired", "purged",
               "protocols", "sizes")


def load_tables(spark: Any, src: str) -> tuple[Any, Any, Any]:
    """Return the ``(events, counters, messages)`` DataFrames of a snapshot or export directory."""
    import os

    from mqhub.analytics.arrow import DDL
    from mqhub.analytics.export import SNAPSHOT, source_kind

    src = os.path.abspath(src)
    if source_kind(src) == SNAPSHOT:
        from mqhub.analytics.datasource import MqhubDataSource

        spark.dataSource.register(MqhubDataSource)
        reader = spark.read.format("mqhub")
        return (reader.option("table", "events").load(src),
                reader.option("table", "counters").load(src),
                reader.option("table", "messages").load(src))
    frames = []
    for table in ("events", "counters", "messages"):
        path = os.path.join(src, table)
        if os.path.isdir(path):
            frames.append(spark.read.parquet(path).drop("day"))
        else:
            frames.append(spark.createDataFrame([], DDL[table]))
    return frames[0], frames[1], frames[2]


def build_tables(events: Any, counters: Any) -> dict[str, Any]:
    """Return ``{table name: DataFrame}`` for the report (lazy; nothing runs yet)."""
    from pyspark.sql import functions as F

    ev = events
    pub = (ev.filter(F.col("event") == "published").groupBy("msg_id")
           .agg(F.min("ts").alias("pub_ts"), F.min("address").alias("address"),
                F.min("origin").alias("origin"), F.max("size").alias("size"))
           .cache())  # four tables start from it
    one, zero = F.lit(1).cast("long"), F.lit(0).cast("long")

    def minute(col: str) -> Any:
        return F.date_trunc("minute", F.col(col)).alias("minute")

    # only published rows carry address and origin: the other events get them from there
    rest = (ev.filter(F.col("event") != "published")
            .join(pub.select("msg_id", F.col("address").alias("p_address"),
                             F.col("origin").alias("p_origin"), "pub_ts"), "msg_id", "left")
            .withColumn("address", F.coalesce("address", "p_address"))
            .withColumn("origin", F.coalesce("origin", "p_origin"))
            .drop("p_address", "p_origin")
            .cache())  # throughput and latency both start from it
    parts = [
        pub.select("address", "origin", minute("pub_ts"), one.alias("published"),
                   zero.alias("delivered"), zero.alias("acked")),
        rest.filter(F.col("event").isin("delivered", "acked")).select(
            "address", "origin", minute("ts"), zero.alias("published"),
            (F.col("event") == "delivered").cast("long").alias("delivered"),
            (F.col("event") == "acked").cast("long").alias("acked")),
        counters.select(
            "address", "origin", minute("second"),
            F.when(F.col("kind") == "published", F.col("messages")).otherwise(0)
            .alias("published"),
            F.when(F.col("kind") == "delivered", F.col("messages")).otherwise(0)
            .alias("delivered"),
            zero.alias("acked")),
    ]
    flows = parts[0]
    for p in parts[1:]:
        flows = flows.unionByName(p)
    throughput = (flows.groupBy("address", "origin", "minute")
                  .agg(F.sum("published").alias("published"),
                       F.sum("delivered").alias("delivered"), F.sum("acked").alias("acked"))
                  .orderBy("minute", "address", "origin"))

    # deliver = first delivery on a queue (attempt 1, the core counts them); ack = each ack
    lat = (rest.filter(F.col("pub_ts").isNotNull()
                       & (((F.col("event") == "delivered") & (F.col("attempt") == 1))
                          | (F.col("event") == "acked")))
           .select("address", F.when(F.col("event") == "acked", "ack").otherwise("deliver")
                   .alias("kind"),
                   ((F.unix_micros("ts") - F.unix_micros("pub_ts")) / 1000.0).alias("ms")))
    q = F.percentile_approx("ms", [0.5, 0.9, 0.99], 10000)
    latency = (lat.groupBy("address", "kind")
               .agg(F.count("*").alias("count"), q.alias("p"), F.max("ms").alias("max_ms"))
               .select("address", "kind", "count", F.col("p")[0].alias("p50_ms"),
                       F.col("p")[1].alias("p90_ms"), F.col("p")[2].alias("p99_ms"), "max_ms")
               .orderBy("address", "kind"))

    dl = ev.filter(F.col("event") == "delivered")
    again = F.col("attempt") > 1
    redeliveries = (dl.groupBy("queue")
                    .agg(F.countDistinct(F.when(again, F.col("msg_id")))
                         .cast("long").alias("messages_redelivered"),
                         F.sum(F.when(again, 1).otherwise(0)).cast("long").alias("redeliveries"),
                         F.max("attempt").alias("max_attempt"))
                    .orderBy("queue"))
    # messages that left without an ack, per queue and reason: table -> its event
    left = {table: (ev.filter(F.col("event") == event)
                    .groupBy("queue", F.coalesce("reason", F.lit("")).alias("reason"))
                    .agg(F.count("*").alias("count")).orderBy("queue", "reason"))
            for table, event in (("dead_letters", "dead_lettered"), ("expired", "expired"),
                                 ("purged", "purged"))}
    mem = counters.filter(F.col("kind") == "published").select(
        F.coalesce("origin", F.lit("")).alias("origin"), F.col("messages"), F.col("bytes"))
    durable = pub.select(F.coalesce("origin", F.lit("")).alias("origin"),
                         one.alias("messages"), F.col("size").alias("bytes"))
    protocols = (durable.unionByName(mem).groupBy("origin")
                 .agg(F.sum("messages").alias("messages"), F.sum("bytes").alias("bytes"))
                 .orderBy("origin"))
    bucket = F.lit("larger")
    for b in reversed(SIZE_BUCKETS):
        bucket = F.when(F.col("size") <= b, F.lit(str(b))).otherwise(bucket)
    spark = events.sparkSession
    all_buckets = spark.createDataFrame([(n, i) for i, n in enumerate(BUCKET_NAMES)],
                                        "bucket STRING, pos INT")
    counted = pub.select(bucket.alias("bucket")).groupBy("bucket").agg(F.count("*").alias("n"))
    sizes = (all_buckets.join(counted, "bucket", "left")
             .select("bucket", F.coalesce("n", F.lit(0)).cast("long").alias("count"), "pos")
             .orderBy("pos").drop("pos"))
    return {"throughput": throughput, "latency": latency, "redeliveries": redeliveries,
            **left, "protocols": protocols, "sizes": sizes}


def summary_rows(events: Any, counters: Any) -> tuple[list[Any], list[Any]]:
    """Per-event and per-counter-kind totals with their time spans (two tiny aggregates)."""
    from pyspark.sql import functions as F

    ev = (events.groupBy("event")
          .agg(F.count("*").alias("n"), F.min("ts").alias("first"), F.max("ts").alias("last"))
          .collect())
    ct = (counters.groupBy("kind")
          .agg(F.sum("messages").alias("n"), F.min("second").alias("first"),
               F.max("second").alias("last"))
          .collect())
    return ev, ct
