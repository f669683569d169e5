"""format("fastbus") on a real local Spark (local[2], one session for the
module) against a real Redis-compatible server: batch round trips, streaming
with checkpoints and restarts, maxOffsetsPerTrigger, a work-queue query
killed with SIGKILL, a replayed sink batch."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import traceback
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[test,spark]')")
pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install '.[test,spark]')")
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("Spark needs Java 17+ (java is not on PATH and JAVA_HOME is unset; .ci/run installs it)",
                allow_module_level=True)

from pyspark.sql import SparkSession

import fastbus.spark
from fastbus.queue import Topic, WorkQueue
from snippets import SPARK_NAMES, all_snippets, for_this_machine, is_spark, prelude

pytestmark = pytest.mark.slow


def _session(cores: int = 2) -> SparkSession:
    # The JVM starts the Python workers with this environment: this
    # interpreter, and (PYTHONSAFEPATH, as -P) the installed fastbus rather
    # than the source tree of the working directory.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONSAFEPATH"] = "1"
    try:
        return (SparkSession.builder.master(f"local[{cores}]").appName("fastbus-tests")
                .config("spark.ui.enabled", "false")
                .config("spark.sql.shuffle.partitions", "2")
                .config("spark.driver.bindAddress", "127.0.0.1")
                .config("spark.driver.host", "127.0.0.1")
                .getOrCreate())
    finally:
        del os.environ["PYTHONSAFEPATH"]


@pytest.fixture(scope="module")
def spark(redis_server):
    session = _session()
    session.sparkContext.setLogLevel("ERROR")
    fastbus.spark.register(session, redis_server.url)
    yield session
    session.stop()


def _drain(q: WorkQueue) -> list:
    got = []
    with q.consumer(clean_interval=None) as c:
        while part := c.get_many(10000, timeout=0):
            got += part
            c.ack(*part)
    return got


def test_batch_write_then_read_round_trip(spark, redis_url):
    t0 = time.time()
    rows = [(f"v{i}",) for i in range(3000)]
    (spark.createDataFrame(rows, "value string").repartition(2)
     .write.format("fastbus").option("topic", "rt").mode("append").save())
    df = spark.read.format("fastbus").option("topic", "rt").option("minPartitions", 2).load()
    assert df.rdd.getNumPartitions() == 2
    got = df.orderBy("offset").collect()
    assert sorted(r.value for r in got) == sorted(v.encode() for (v,) in rows)
    assert [r.offset for r in got] == list(range(1, 3001))
    assert {(r.topic, r.partition, r.key, r.timestampType) for r in got} == {("rt", 0, None, 0)}
    assert all(t0 - 5 < r.timestamp.timestamp() < time.time() + 5 for r in got)
    part = (spark.read.format("fastbus").option("topic", "rt")
            .option("startingOffsets", "1001").option("endingOffsets", "2000").load())
    assert part.count() == 1000
    assert part.selectExpr("min(offset)", "max(offset)").first() == (1001, 2000)


def test_batch_read_of_a_queues_failed_and_ready_lists(spark, redis_url):
    q = WorkQueue("jobs", redis_url)
    q.put_many([b"j%d" % i for i in range(6)])
    with q.consumer(clean_interval=None) as c:
        a, b = c.get_many(2, timeout=0)
        c.reject(a)
        c.reject(b)
    failed = spark.read.format("fastbus").option("queue", "jobs").load().collect()
    assert [(r.offset, r.value, r.deliveries) for r in failed] == [(1, b"j0", 1), (2, b"j1", 1)]
    ready = spark.read.format("fastbus").option("queue", "jobs").option("list", "ready").load()
    assert sorted(r.value for r in ready.collect()) == [b"j%d" % i for i in range(2, 6)]
    assert q.stats().failed == 2 and q.stats().ready == 4            # left in place
    q.close()


def test_batch_read_of_a_topic_consumers_dead_letters(spark, redis_url):
    t = Topic("tf", redis_url)
    t.register("billing")
    t.publish_many([b"good", b"poison"])
    with t.consumer("billing", clean_interval=None) as c:
        good, bad = c.get_many(2, timeout=0)
        c.settle(ack=[good], reject=[bad])
    rows = (spark.read.format("fastbus").option("topic", "tf").option("consumer", "billing")
            .option("list", "failed").load().collect())
    assert [(r.offset, r.value, r.deliveries, r.topic) for r in rows] == [(2, b"poison", 1, "tf")]
    with pytest.raises(Exception, match="needs option consumer"):   # Spark wraps the OptionError
        spark.read.format("fastbus").option("topic", "tf").option("list", "failed").load().collect()
    t.close()


def test_rows_to_each_rows_topic_and_to_a_work_queue(spark, redis_url):
    df = spark.createDataFrame([("a", "t1"), ("b", "t2"), ("c", "t1")], "value string, topic string")
    df.write.format("fastbus").mode("append").save()
    assert sorted(m.payload for m in Topic("t1", redis_url).read(1, 10)) == [b"a", b"c"]   # two tasks
    assert [m.payload for m in Topic("t2", redis_url).read(1, 10)] == [b"b"]
    df.select("value").write.format("fastbus").option("queue", "wq").mode("append").save()
    assert sorted(m.payload for m in _drain(WorkQueue("wq", redis_url))) == [b"a", b"b", b"c"]


def test_rows_to_a_redis_channel_and_to_a_fastbus_broker_channel(spark, redis_url):
    from brokers import free_port

    import fastbus
    from fastbus.redis import Subscriber

    df = spark.createDataFrame([(f"m{i}",) for i in range(50)], "value string").repartition(2)
    sub = Subscriber(redis_url)
    sub.subscribe("alerts:disk")
    assert sub.get_message(timeout=5)["type"] == "subscribe"
    df.write.format("fastbus").option("channel", "alerts:disk").mode("append").save()
    got = []
    deadline = time.monotonic() + 10
    while len(got) < 50 and time.monotonic() < deadline:
        got += [d for _, d in sub.get_batch(timeout=1)]
    assert sorted(got) == sorted(b"m%d" % i for i in range(50))
    sub.close()

    endpoint = f"tcp://127.0.0.1:{free_port()}"
    with fastbus.Broker(bind=[endpoint]), fastbus.Client(endpoint=endpoint) as client:
        p = client.pubsub(ignore_subscribe_messages=True)
        p.subscribe("spark-out")
        deadline = time.monotonic() + 10
        while not client.is_wanted("spark-out"):
            assert time.monotonic() < deadline, "the broker never confirmed the subscription"
            p.get_message(timeout=0.1)
        df.write.format("fastbus").option("channel", "spark-out").option("broker", endpoint) \
            .mode("append").save()
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 50 and time.monotonic() < deadline:
            got += [d for _, d in p.get_batch(timeout=1)]
        assert sorted(got) == sorted(b"m%d" % i for i in range(50))
        p.close()


def test_bad_options_and_rows_get_clear_errors(spark, redis_url):
    def error_of(action) -> str:
        with pytest.raises(Exception) as e:
            action()
        return str(e.value)

    assert "unknown option(s) topik" in error_of(
        lambda: spark.read.format("fastbus").option("topik", "x").load().collect())
    assert "needs option consumer" in error_of(
        lambda: spark.readStream.format("fastbus").option("topic", "x").load()
        .writeStream.format("memory").queryName("nope").start().processAllAvailable())
    keyed = spark.createDataFrame([("k", "v")], "key string, value string")
    assert "have no key" in error_of(
        lambda: keyed.write.format("fastbus").option("topic", "k").mode("append").save())
    keyed.write.format("fastbus").option("topic", "k").option("ignoreKey", "true").mode("append").save()
    assert [m.payload for m in Topic("k", redis_url).read(1, 5)] == [b"v"]
    extra = spark.createDataFrame([(1, "v")], "n int, value string")
    assert "drop or fold in the column(s) n" in error_of(
        lambda: extra.write.format("fastbus").option("topic", "k").mode("append").save())
    assert "maxOffsetsPerTrigger must be an integer" in error_of(
        lambda: spark.readStream.format("fastbus").option("topic", "x").option("consumer", "c")
        .option("maxOffsetsPerTrigger", "lots").load())


def _run_available_now(spark, reader_opts: dict, sink: str, sink_opts: dict, checkpoint: Path):
    r = spark.readStream.format("fastbus")
    for k, v in reader_opts.items():
        r = r.option(k, v)
    w = r.load().select("value").writeStream.format(sink).option("checkpointLocation", str(checkpoint))
    for k, v in sink_opts.items():
        w = w.option(k, v)
    q = w.trigger(availableNow=True).start()
    assert q.awaitTermination(120), "the query did not finish in 120 s"
    assert q.exception() is None
    return [p for p in q.recentProgress if p["numInputRows"] > 0]


def test_streaming_exactly_once_across_a_restart(spark, redis_url, tmp_path):
    """Topic -> query (maxOffsetsPerTrigger 100) -> work queue, stopped and
    started again on its checkpoint: every message once in the sink, and
    acknowledged in fastbus once Spark committed it."""
    topic = Topic("events", redis_url)
    topic.register("job")
    topic.publish_many([b"e%d" % i for i in range(250)])
    opts = {"topic": "events", "consumer": "job", "startingOffsets": "earliest", "maxOffsetsPerTrigger": "100"}
    ck = tmp_path / "ck"

    first = _run_available_now(spark, opts, "fastbus", {"queue": "sink"}, ck)
    assert [p["numInputRows"] for p in first] == [100, 100, 50]
    # Spark commits a source's batch when the next one starts: the last
    # batch is still held for the consumer (redelivery, never loss)
    assert topic.stats().consumers["job"].ready == 50

    topic.publish_many([b"e%d" % i for i in range(250, 400)])
    second = _run_available_now(spark, opts, "fastbus", {"queue": "sink"}, ck)
    assert [p["numInputRows"] for p in second] == [100, 50]
    assert topic.stats().consumers["job"].ready == 50        # batch 3 committed, batch 4 held

    got = _drain(WorkQueue("sink", redis_url))
    assert sorted(m.payload for m in got) == sorted(b"e%d" % i for i in range(400))
    assert len(got) == 400
    topic.close()


def test_a_replayed_sink_batch_publishes_nothing_twice(spark, redis_url, tmp_path):
    """The query's last batch is run again after a restart (its commit record
    removed, as when the driver dies between the sink's commit and Spark's):
    the sink sees the batch id done and publishes nothing."""
    src = Topic("src", redis_url)
    src.register("copier")
    src.publish_many([b"s%d" % i for i in range(120)])
    opts = {"topic": "src", "consumer": "copier", "startingOffsets": "earliest", "maxOffsetsPerTrigger": "50"}
    ck = tmp_path / "ck"
    first = _run_available_now(spark, opts, "fastbus", {"topic": "copy"}, ck)
    last_batch = first[-1]["batchId"]
    copy = Topic("copy", redis_url)
    assert copy.last_id() == 120

    (ck / "commits" / str(last_batch)).unlink()
    (ck / "commits" / f".{last_batch}.crc").unlink(missing_ok=True)
    replay = _run_available_now(spark, opts, "fastbus", {"topic": "copy"}, ck)
    assert [p["batchId"] for p in replay] == [last_batch]       # Spark did run it again
    assert replay[0]["numInputRows"] == 20
    assert copy.last_id() == 120                                # and nothing was published twice
    assert sorted(m.payload for m in copy.read(1, 200)) == sorted(b"s%d" % i for i in range(120))
    copy.close()
    src.close()


_KILLED_QUERY = textwrap.dedent("""
    import os, sys, time
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    import fastbus.spark
    spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
             .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
             .getOrCreate())
    fastbus.spark.register(spark, os.environ["URL"])

    def hang(df, batch_id):
        with open(os.environ["MARK"] + ".tmp", "w") as f:
            f.write(str(df.count()))
        os.replace(os.environ["MARK"] + ".tmp", os.environ["MARK"])
        time.sleep(600)                  # killed here: batch 0 never commits

    (spark.readStream.format("fastbus").option("queue", "work").option("consumer", "sq")
     .option("heartbeatTtl", "2").load()
     .writeStream.foreachBatch(hang).option("checkpointLocation", os.environ["CK"]).start()
     .awaitTermination(600))
""")


def test_work_queue_source_redelivers_what_a_killed_query_had_not_committed(spark, redis_url, tmp_path):
    q = WorkQueue("work", redis_url)
    q.put_many([b"w%d" % i for i in range(30)])
    script = tmp_path / "killed.py"
    script.write_text(_KILLED_QUERY)
    mark = tmp_path / "mark"
    env = dict(os.environ, URL=redis_url, MARK=str(mark), CK=str(tmp_path / "ck1"), PYTHONSAFEPATH="1")
    proc = subprocess.Popen([sys.executable, "-P", str(script)], env=env, start_new_session=True, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 150
        while not mark.exists():
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the query in the subprocess never got its batch"
            time.sleep(0.2)
        assert mark.read_text() == "30"
        assert q.stats().unacked == {"sq": 30}          # taken, not acked
    finally:
        os.killpg(proc.pid, signal.SIGKILL)             # the driver, its JVM and workers
        proc.wait()
        proc.stderr.close()
    time.sleep(2.5)                                      # the dead consumer's heartbeat lapses

    r = (spark.readStream.format("fastbus").option("queue", "work").option("consumer", "sq")
         .option("heartbeatTtl", "2").load())
    query = (r.writeStream.format("memory").queryName("redelivered")
             .option("checkpointLocation", str(tmp_path / "ck2")).trigger(availableNow=True).start())
    assert query.awaitTermination(120)
    rows = spark.table("redelivered").collect()
    assert sorted(r.value for r in rows) == sorted(b"w%d" % i for i in range(30))
    assert {r.deliveries for r in rows} == {2}           # the killed query's delivery was the first
    assert len({r.offset for r in rows}) == 30           # the message id, for a de-duplicating sink
    q.close()


def test_a_new_query_starts_at_its_consumers_position(spark, redis_url, tmp_path):
    """latest (the default) is the logical consumer's position, which does
    not move while the query starts (Spark asks for the initial offset more
    than once); a consumer registered before keeps everything for the query."""
    t = Topic("pos", redis_url)
    t.publish_many([b"before"] * 5)                 # nobody registered: not for the query
    t.register("q")
    t.publish_many([b"p%d" % i for i in range(20)])
    assert t.position("q") == 5
    progress = _run_available_now(spark, {"topic": "pos", "consumer": "q"}, "fastbus", {"queue": "pos-out"},
                                  tmp_path / "ck")
    assert sum(p["numInputRows"] for p in progress) == 20
    assert sorted(m.payload for m in _drain(WorkQueue("pos-out", redis_url))) == sorted(
        b"p%d" % i for i in range(20))
    t.close()


def test_register_without_url_uses_the_embedded_server(spark, redis_server):
    """register(spark) with no URL starts fastbus's embedded server in this
    process, and the workers use it."""
    saved = os.environ.pop("FASTBUS_REDIS_URL", None)
    try:
        url = fastbus.spark.register(spark)
        assert url != redis_server.url and url.startswith("redis://127.0.0.1:")
        spark.createDataFrame([("x",)], "value string").write.format("fastbus") \
            .option("topic", "emb").mode("append").save()
        assert [m.payload for m in Topic("emb", url).read(1, 5)] == [b"x"]
    finally:
        if saved is not None:
            os.environ["FASTBUS_REDIS_URL"] = saved
        fastbus.spark.register(spark, redis_server.url)


def test_the_docs_spark_snippets_run(spark, redis_url, tmp_path):
    """Every Spark snippet of README.md and docs/ (tests/snippets.py) runs
    in this module's session, each in a namespace of its own, with the
    names a reader has given real values (the session, a DataFrame, two
    streaming DataFrames) and its Redis URLs pointed at the test's server;
    the queries a snippet starts are stopped after it."""
    snippets = [(where, code) for where, code in all_snippets() if is_spark(code)]
    assert len(snippets) >= 5, [where for where, _code in snippets]
    rate = spark.readStream.format("rate").option("rowsPerSecond", 5).load()
    given = {"spark": spark, "df": spark.createDataFrame([("a", 1)], "k string, n long"),
             "totals": rate.selectExpr("value AS total"), "counts": rate.selectExpr("value AS count")}
    failed = {}
    for where, code in snippets:
        source = for_this_machine(prelude(code, leave_out=SPARK_NAMES) + code, redis_url, tmp_path)
        try:
            exec(compile(source, where, "exec"), dict(given))
        except Exception:
            failed[where] = traceback.format_exc()
        finally:
            for query in spark.streams.active:
                query.stop()
    assert not failed, "\n\n".join(f"{where}:\n{tb}" for where, tb in failed.items())
