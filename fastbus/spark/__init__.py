"""Spark source and sink for fastbus topics and queues (``format("fastbus")``).

Pure Python on Spark's Python Data Source API (pyspark 4.0+, with pyarrow):
``pip install "fastbus[spark]"``.

    import fastbus.spark
    fastbus.spark.register(spark, "redis://127.0.0.1:6379/0")   # no URL: the embedded server

    # a topic's logical consumer, as a stream (Kafka's schema)
    events = (spark.readStream.format("fastbus")
              .option("topic", "events").option("consumer", "daily-report").load())

    # publish rows (value, optional key and topic columns), once per batch id
    (counts.selectExpr("to_json(struct(*)) AS value").writeStream.format("fastbus")
        .option("topic", "reports").option("checkpointLocation", "/tmp/ck").start())

Options (all strings; keys are case-insensitive):

``url``
    the Redis server (else ``$FASTBUS_REDIS_URL`` of the Spark processes,
    else the URL given to :func:`register`).
``topic`` / ``queue`` / ``channel``
    what to read or write: a :class:`~fastbus.queue.Topic`, a
    :class:`~fastbus.queue.WorkQueue`, or (writes only) a Redis pub/sub
    channel, or a fastbus broker channel with ``broker`` (``tcp://...``).
``consumer``
    streaming topic reads: the query's logical consumer (required; one per
    query).  Work queues: the consumer tag (default: a unique one).
``startingOffsets`` / ``endingOffsets``
    ``earliest``, ``latest`` or a message id (``endingOffsets``: batch only).
    A new streaming query's ``latest`` (the default) is its logical
    consumer's position: for a consumer the query registers, the first
    message published after; for one registered before, where its last
    commit left it (a logical consumer never skips what it holds: unregister
    it to start afresh).
``maxOffsetsPerTrigger``, ``minPartitions``
    as in Spark's Kafka source.
``list``
    batch reads: ``retained`` (a topic's messages, the default), ``failed``
    (a queue's or a topic consumer's dead letters, the queue default) or
    ``ready`` (a queue's waiting messages).
``checkpointLocation`` / ``writerId``
    the streaming sink's progress in Redis (see ``fastbus.queue.staged``).
``ignoreKey``
    ``true`` drops non-null keys (fastbus messages have none; by default a
    row with a key is an error rather than a silent loss).
``prefix``, ``ttl``, ``maxDeliveries``, ``heartbeatTtl``
    as the :mod:`fastbus.queue` objects take them.

Guarantees: docs/SPARK.md.
"""

from __future__ import annotations

from typing import Any

try:
    from pyspark.sql.datasource import DataSource
except ImportError as e:                       # pragma: no cover - depends on the environment
    raise ImportError("fastbus.spark needs pyspark 4.0+ and pyarrow: pip install 'fastbus[spark]'") from e

from fastbus.spark._options import KAFKA_SCHEMA, QUEUE_SCHEMA, OptionError, parse

__all__ = ["FastbusDataSource", "OptionError", "register"]


class FastbusDataSource(DataSource):
    """``format("fastbus")``: see the module documentation for the options."""

    _default_url: str | None = None

    @classmethod
    def name(cls) -> str:
        return "fastbus"

    def _opts(self):
        return parse(self.options, self._default_url)

    def schema(self) -> str:
        o = self._opts()
        if o.queue or (o.topic and o.list in ("failed", "ready")):
            return QUEUE_SCHEMA
        return KAFKA_SCHEMA

    def reader(self, schema):
        from fastbus.spark._read import BatchReader
        return BatchReader(self._opts())

    def streamReader(self, schema):
        from fastbus.spark._read import QueueStreamReader, TopicStreamReader
        o = self._opts()
        if o.topic:
            return TopicStreamReader(o)
        if o.queue:
            return QueueStreamReader(o)
        raise OptionError("a streaming read needs option topic (with consumer) or queue")

    def writer(self, schema, overwrite: bool):
        from fastbus.spark._write import BatchWriter, check_schema
        if overwrite:
            raise OptionError("fastbus targets are appended to: use mode('append')")
        o = self._opts()
        check_schema(schema, o)
        return BatchWriter(o)

    def streamWriter(self, schema, overwrite: bool):
        from fastbus.spark._write import StreamWriter, check_schema
        if overwrite:
            raise OptionError("fastbus targets are appended to: use outputMode('append') or 'update'")
        o = self._opts()
        check_schema(schema, o)
        return StreamWriter(o)


def register(spark: Any, url: str | None = None) -> str:
    """Register ``format("fastbus")`` with ``spark`` (a SparkSession), with
    ``url`` as the default of option ``url``; returns that URL.

    With no ``url`` (and no ``$FASTBUS_REDIS_URL``), the user's shared
    server (:func:`fastbus.redis.resolve_url`: joined, or started):
    right for ``local[*]`` sessions, whose workers share this machine's
    loopback; on a cluster, pass a URL the executors can reach."""
    from fastbus.redis.server import resolve_url
    url = resolve_url(url)
    # A subclass made here is pickled by value (it is not reachable by name),
    # so the workers that run the source get the default URL with it.
    cls = type("FastbusDataSource", (FastbusDataSource,),
               {"_default_url": url, "__module__": __name__, "__qualname__": "FastbusDataSource"})
    _register_safe_path(spark, cls)
    # Spark 4.x finds Python data sources for writeStream.start() through the
    # JVM thread's *active* session, which a new session has not set until
    # it has run a batch query ([DATA_SOURCE_NOT_FOUND] otherwise).
    jvm, jsession = getattr(spark, "_jvm", None), getattr(spark, "_jsparkSession", None)
    if jvm is not None and jsession is not None:
        jvm.org.apache.spark.sql.SparkSession.setActiveSession(jsession)
    return url


def _register_safe_path(spark: Any, cls: type) -> None:
    """Register ``cls`` with PYTHONSAFEPATH=1 in the environment of the
    Python workers that run it: Spark starts them with ``python -m
    pyspark.daemon`` in the driver's working directory (local mode), and
    ``-m`` puts that directory first on ``sys.path``, so from a fastbus
    source checkout's root the workers would import its uncompiled tree
    instead of the installed package.  Only this data source's functions
    get it: the session's other Python functions keep their environment."""
    env = None
    try:
        env = spark.sparkContext.environment       # classic sessions (not Spark Connect)
    except Exception:
        pass
    if not isinstance(env, dict) or "PYTHONSAFEPATH" in env:
        spark.dataSource.register(cls)
        return
    env["PYTHONSAFEPATH"] = "1"
    try:
        spark.dataSource.register(cls)
    finally:
        env.pop("PYTHONSAFEPATH", None)
