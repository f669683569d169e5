"""format("fastbus") on a local Spark: rows per second through the source
and through the sink, against a row-at-a-time Python data source doing the
same work on the same server in the same run.

  source   N messages of --size bytes are published to a topic first (not
           timed here; the publish rate is printed apart).  Then:
           batch     spark.read.format("fastbus") of the topic's retained
                     range into Spark's no-op sink (df.write.format("noop")),
                     with minPartitions 1 and 2;
           stream    the same range as one availableNow micro-batch of a
                     streaming query (a registered logical consumer,
                     startingOffsets earliest) into the no-op sink;
           rowwise   a Python data source as one is usually written: the
                     same READ script calls, Messages decoded, one tuple
                     yielded per row (no Arrow), 1 and 2 partitions.
  copy     a streaming query (availableNow, one batch) from the topic to
           another through the exactly-once streaming sink: tasks stage rows
           in Redis, the driver's commit publishes them (both sides counted).
  sink     N rows of --size bytes made in the JVM (spark.range + repeat),
           df.write.format("fastbus") to a topic, 1 and 2 partitions; against
           a row-wise DataSourceWriter (Row objects, publish_many per 1000).
           After each case the topic is checked to hold N messages.

Spark session start is timed apart.  Each figure is rows / wall time of the
action (planning, Python workers and all), best of --repeat runs after a
first "cold" run (which starts Python workers and warms the JIT; reported
apart).  Needs Java
17+, pyspark 4 and pyarrow.

    python bench/spark_bench.py [--messages 1000000] [--size 100] [--repeat 3] [--server PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--server", default=None, help="redis-server binary (default: fastbus's bundled one)")
    ap.add_argument("--skip-rowwise", action="store_true", help="skip the row-wise baselines")
    args = ap.parse_args()
    if not 1 <= args.messages <= 10_000_000 or not 1 <= args.size <= 1 << 20 or args.repeat < 1:
        ap.error("--messages 1..10M, --size 1..1MiB, --repeat >= 1")

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONSAFEPATH"] = "1"         # workers import the installed fastbus
    from pyspark.sql import SparkSession
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceReader,
        DataSourceWriter,
        WriterCommitMessage,
    )

    import fastbus.spark
    from fastbus.queue import Topic
    from fastbus.redis.server import EmbeddedServer
    from fastbus.spark._read import split_ids

    server = EmbeddedServer(args.server).start()
    url = server.url
    N, size = args.messages, args.size
    results: list[tuple[str, str, float]] = []

    t0 = time.perf_counter()
    spark = (SparkSession.builder.master("local[2]").appName("fastbus-bench")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.memory", "4g")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    fastbus.spark.register(spark, url)
    start_s = time.perf_counter() - t0
    print(f"Spark session start: {start_s:.1f} s (local[2], {spark.version}); server {server.version}", flush=True)

    # the row-wise baselines, as a Python data source is usually written
    class RowwiseReader(DataSourceReader):
        def __init__(self, options):
            self.options = options

        def partitions(self):
            return split_ids(1, int(self.options["last"]), int(self.options["parts"]))

        def read(self, part):
            t = Topic(self.options["topic"], self.options["url"])
            for a in range(part.first, part.last + 1, 10000):
                for m in t.read(a, min(part.last, a + 9999)):
                    yield (None, m.payload, self.options["topic"], 0, m.id, None, 0)
            t.close()

    class Commit(WriterCommitMessage):
        pass

    class RowwiseWriter(DataSourceWriter):
        def __init__(self, options):
            self.options = options

        def write(self, rows):
            t = Topic(self.options["topic"], self.options["url"])
            batch = []
            for row in rows:
                batch.append(row.value)
                if len(batch) == 1000:
                    t.publish_many(batch)
                    batch = []
            if batch:
                t.publish_many(batch)
            t.close()
            return Commit()

    class Rowwise(DataSource):
        @classmethod
        def name(cls):
            return "rowwise"

        def schema(self):
            return ("key binary, value binary, topic string, partition int, offset bigint, "
                    "timestamp timestamp, timestampType int")

        def reader(self, schema):
            return RowwiseReader(self.options)

        def writer(self, schema, overwrite):
            return RowwiseWriter(self.options)

    spark.dataSource.register(Rowwise)

    def best(label: str, what: str, action, check=None) -> None:
        # The first run of a case starts Python workers and warms the JVM's
        # JIT: reported apart ("cold"); the figure is the best warm run.
        t = time.perf_counter()
        action()
        cold = time.perf_counter() - t
        if check:
            check()
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            action()
            times.append(time.perf_counter() - t)
            if check:
                check()
        rate = N / min(times)
        results.append((label, what, rate, N / cold))
        print(f"  {label:<40} {what:<7} {rate / 1e3:6.0f}k rows/s   (best of {args.repeat}: "
              f"{min(times):.2f} s; all {', '.join(f'{x:.2f}' for x in times)}; cold run {cold:.2f} s)",
              flush=True)

    # -- source
    src = Topic("bench-src", url, ttl=3600)
    src.register("keep")                       # bodies stay while we read them
    payload = b"x" * size
    t = time.perf_counter()
    for i in range(0, N, 10000):
        src.publish_many([payload] * min(10000, N - i))
    pub = N / (time.perf_counter() - t)
    last = src.last_id()
    print(f"published {N} x {size} B to the topic: {pub / 1e3:.0f}k msg/s (Topic.publish_many, not Spark)")
    print("source -> no-op sink:")
    for parts in (1, 2):
        best(f"fastbus batch read, {parts} partition(s)", "source",
             lambda p=parts: spark.read.format("fastbus").option("topic", "bench-src")
             .option("minPartitions", p).load().write.format("noop").mode("overwrite").save())
    for parts in (1, 2):
        def stream(p=parts):
            ck = tempfile.mkdtemp(prefix="fb-bench-ck-")
            consumer = f"stream{p}-{time.monotonic_ns()}"
            src.register(consumer)
            q = (spark.readStream.format("fastbus").option("topic", "bench-src").option("consumer", consumer)
                 .option("startingOffsets", "earliest").option("minPartitions", p).load()
                 .writeStream.format("noop").option("checkpointLocation", ck).trigger(availableNow=True).start())
            q.awaitTermination()
            rows = sum(x["numInputRows"] for x in q.recentProgress)
            assert rows == N, f"the streaming read saw {rows} rows, not {N}"
            src.unregister(consumer)
            shutil.rmtree(ck, ignore_errors=True)
        best(f"fastbus streaming read, {parts} partition(s)", "source", stream)
    if not args.skip_rowwise:
        for parts in (1, 2):
            best(f"row-wise Python source, {parts} partition(s)", "source",
                 lambda p=parts: spark.read.format("rowwise").option("topic", "bench-src").option("url", url)
                 .option("last", str(last)).option("parts", str(p)).load()
                 .write.format("noop").mode("overwrite").save())

    # the streaming sink: the same range copied by one availableNow batch
    # into a topic through the staged, exactly-once writer (source + sink)
    def copy(p=2):
        ck = tempfile.mkdtemp(prefix="fb-bench-ck-")
        consumer = f"copy-{time.monotonic_ns()}"
        src.register(consumer)
        q = (spark.readStream.format("fastbus").option("topic", "bench-src").option("consumer", consumer)
             .option("startingOffsets", "earliest").option("minPartitions", p).load().select("value")
             .writeStream.format("fastbus").option("topic", "bench-copy").option("checkpointLocation", ck)
             .trigger(availableNow=True).start())
        q.awaitTermination()
        src.unregister(consumer)
        shutil.rmtree(ck, ignore_errors=True)

    def copied():
        out = Topic("bench-copy", url)
        n = out.last_id()
        assert n == N, f"the streaming copy published {n} messages, not {N}"
        out.redis.delete(*out.redis.keys("fastbus:t:{bench-copy}:*"))
        out.close()

    best("fastbus stream copy, staged sink, 2 part.", "both", copy, copied)
    src.unregister("keep")

    # -- sink
    print("DataFrame -> sink:")
    df = spark.range(N).selectExpr(f"CAST(repeat('y', {size}) AS BINARY) AS value").cache()
    df.count()

    def sink_case(fmt: str, parts: int):
        name = f"bench-out-{fmt}-{parts}"
        out = Topic(name, url, ttl=600)

        def action():
            (df.repartition(parts).write.format(fmt).option("topic", name).option("url", url)
             .mode("append").save())

        def check():
            n = out.last_id()
            assert n % N == 0, f"{name}: {n} messages after the write, not a multiple of {N}"
            out.redis.delete(*out.redis.keys(f"fastbus:t:{{{name}}}:*"))   # keep the server's memory flat

        return action, check

    for parts in (1, 2):
        best(f"fastbus batch write, {parts} partition(s)", "sink", *sink_case("fastbus", parts))
    if not args.skip_rowwise:
        for parts in (1, 2):
            best(f"row-wise Python sink, {parts} partition(s)", "sink", *sink_case("rowwise", parts))

    rate = {label: r for label, _, r, _ in results}
    print("\nsummary (rows/s, best warm run; the cold first run apart):")
    for label, what, r, cold in results:
        print(f"  {what:<7} {label:<40} {r / 1e3:6.0f}k   cold {cold / 1e3:6.0f}k")
    if not args.skip_rowwise:
        for parts in (1, 2):
            a = rate[f"fastbus batch read, {parts} partition(s)"] / rate[f"row-wise Python source, {parts} partition(s)"]
            b = rate[f"fastbus batch write, {parts} partition(s)"] / rate[f"row-wise Python sink, {parts} partition(s)"]
            print(f"  {parts} partition(s): source {a:.2f}x the row-wise source, sink {b:.2f}x the row-wise sink")
    spark.stop()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
