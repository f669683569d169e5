"""A data pipeline on fastbus and Spark, on embedded defaults (no server to
install): events published to a fastbus topic -> a Spark Structured
Streaming job with a windowed aggregation -> results published back to a
fastbus topic -> printed by a subscriber.

    pip install ".[spark]" && python examples/spark_pipeline.py

Needs Java 17+ for Spark.  ``--help`` for the knobs."""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from typing import Any


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0, help="how long events are published (default 20)")
    ap.add_argument("--rate", type=int, default=2000, help="events per second (default 2000)")
    ap.add_argument("--window", type=int, default=2, help="window length in seconds (default 2)")
    ap.add_argument("--url", default=None, help="a Redis URL (default: fastbus's embedded server)")
    args = ap.parse_args(argv)
    if args.seconds <= 0 or args.rate <= 0 or args.window <= 0:
        ap.error("--seconds, --rate and --window must be > 0")

    # Spark's Python workers must run this interpreter (with fastbus in it).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import fastbus.spark
    from fastbus.queue import Topic

    print("starting Spark (local[2]) ...", flush=True)
    spark = (SparkSession.builder.master("local[2]").appName("fastbus-pipeline")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    url = fastbus.spark.register(spark, args.url)
    print(f"fastbus on {url}", flush=True)

    events, totals = Topic("events", url), Topic("totals", url)
    # Registered before anything is published, the job's logical consumer
    # keeps every event for the query, however long Spark takes to start;
    # the subscriber's gets every result.
    events.register("windowed-totals")
    totals.register("printer")

    # 1. the Spark job: JSON events -> totals per user per window -> topic "totals"
    schema = "user string, amount long"
    counts = (spark.readStream.format("fastbus")
              .option("topic", "events").option("consumer", "windowed-totals").load()
              .select(F.from_json(F.col("value").cast("string"), schema).alias("e"), "timestamp")
              .withWatermark("timestamp", "1 second")
              .groupBy(F.window("timestamp", f"{args.window} seconds"), "e.user")
              .agg(F.count("*").alias("events"), F.sum("e.amount").alias("amount")))
    checkpoint = tempfile.mkdtemp(prefix="fastbus-pipeline-")
    query = (counts.select(F.to_json(F.struct(
                F.date_format("window.start", "HH:mm:ss").alias("window"), "user", "events", "amount")).alias("value"))
             .writeStream.format("fastbus").option("topic", "totals")
             .option("checkpointLocation", checkpoint).outputMode("append")
             .trigger(processingTime="1 second").start())

    # 2. the producer: events at --rate for --seconds
    published = [0, 0]                         # events, total amount

    def produce() -> None:
        rng = random.Random(7)
        batch = max(1, args.rate // 20)
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            t0 = time.monotonic()
            rows: list[dict[str, Any]] = [{"user": f"u{rng.randrange(5)}", "amount": rng.randrange(1, 100)}
                                          for _ in range(batch)]
            events.publish_many([json.dumps(r).encode() for r in rows])
            published[0] += len(rows)
            published[1] += sum(r["amount"] for r in rows)
            time.sleep(max(0.0, 0.05 - (time.monotonic() - t0)))

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()

    # 3. the subscriber: prints each result as it arrives
    received = [0, 0]
    with totals.consumer("printer", clean_interval=None) as sub:
        # Give up only when nothing has happened for a while (no result, no
        # batch of the query completed, none running): Spark's batches take
        # tens of seconds each on a busy machine.  Never later than give_up,
        # even while batches go on (the ticks below keep them coming).
        patience = 4 * args.window + 60
        started = time.monotonic()
        deadline = started + args.seconds + patience
        give_up = started + args.seconds + 3 * patience
        last_batch = -1
        while time.monotonic() < min(deadline, give_up):
            progress = query.lastProgress
            if progress is not None and progress["batchId"] != last_batch:
                last_batch = progress["batchId"]
                deadline = max(deadline, time.monotonic() + patience)
            elif query.status.get("isTriggerActive"):
                deadline = max(deadline, time.monotonic() + patience)    # a batch is running
            for m in sub.get_many(100, timeout=0.5):
                deadline = max(deadline, time.monotonic() + patience)
                r = json.loads(m.payload)
                m.ack()
                if r["user"] == "tick":
                    continue
                received[0] += r["events"]
                received[1] += r["amount"]
                print(f"window {r['window']}  {r['user']}: {r['events']:6d} events, amount {r['amount']:8d}",
                      flush=True)
            failure = query.exception()
            if failure is not None:
                raise failure
            if not producer.is_alive():
                # windows close once the watermark passes them: keep events
                # (and so event time) flowing until every window is out
                if received[0] >= published[0]:
                    break
                events.publish(json.dumps({"user": "tick", "amount": 0}).encode())
        query.processAllAvailable()            # idle before stopping: no batch cut short
        query.stop()
    ticks = "" if received[0] >= published[0] else \
        f" (the last windows had not closed after {time.monotonic() - started:.0f} s and {last_batch + 1} batches)"
    print(f"published {published[0]} events (amount {published[1]}); the job reported "
          f"{received[0]} events (amount {received[1]}){ticks}")
    events.unregister("windowed-totals")
    totals.unregister("printer")
    spark.stop()
    return 0 if received == published else 1


if __name__ == "__main__":
    sys.exit(main())
