"""Readers: a topic's logical consumer (streaming), a work queue (streaming),
and batch reads of a topic's retained range or of a queue's lists."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from fastbus.queue.common import decode_items
from fastbus.queue import QueueError, Topic, WorkQueue
from fastbus.queue.engine import TopicOps, queue_namespace
from fastbus.spark._options import OptionError, Options
from fastbus.spark._redis import client

READ_STEP = 10000          # ids per READ script call (a few ms of server time)
MIN_SPLIT = 1000           # no partition smaller than this many ids
QUEUE_CAP = 100_000        # messages a work-queue micro-batch takes at most by default

_TS = pa.timestamp("us", tz="UTC")


# -- Arrow batches ---------------------------------------------------------

def _kafka_columns(name: str, rows: int, value: pa.Array, offset: pa.Array, ts: pa.Array) -> list:
    zeros = pa.repeat(pa.scalar(0, pa.int32()), rows)
    return [pa.nulls(rows, pa.binary()), value, pa.repeat(pa.scalar(name, pa.string()), rows),
            zeros, offset, ts, zeros]


KAFKA_NAMES = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]


def topic_batches(url: str, prefix: str, name: str, first: int, last: int) -> Iterator[pa.RecordBatch]:
    """The retained messages with ids first..last, as Arrow batches built
    from the server's reply with no Python object per message."""
    t = Topic(name, client(url), prefix=prefix)
    for a in range(first, last + 1, READ_STEP):
        b = min(last, a + READ_STEP - 1)
        rows, ids, micros, offsets, data = t.read_columns(a, b)
        if not rows:
            continue
        value = pa.Array.from_buffers(pa.binary(), rows, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
        offset = pa.Array.from_buffers(pa.int64(), rows, [None, pa.py_buffer(ids)])
        ts = pa.Array.from_buffers(_TS, rows, [None, pa.py_buffer(micros)])
        yield pa.RecordBatch.from_arrays(_kafka_columns(name, rows, value, offset, ts), names=KAFKA_NAMES)


def queue_batch(name: str, ids: list, payloads: list, created_ms: list, deliveries: list) -> pa.RecordBatch:
    rows = len(ids)
    micros = pc.multiply(pa.array(created_ms, pa.int64()), 1000).cast(_TS)
    cols = _kafka_columns(name, rows, pa.array(payloads, pa.binary()), pa.array(ids, pa.int64()), micros)
    cols.append(pa.array(deliveries, pa.int32()))
    return pa.RecordBatch.from_arrays(cols, names=KAFKA_NAMES + ["deliveries"])


# -- partitions ------------------------------------------------------------

@dataclass
class IdRange(InputPartition):
    first: int
    last: int


@dataclass
class ListRange(InputPartition):
    key: str
    start: int
    stop: int            # inclusive, as LRANGE


@dataclass
class Rows(InputPartition):
    ids: list
    payloads: list
    created_ms: list
    deliveries: list


def split_ids(first: int, last: int, wanted: int) -> list[IdRange]:
    """first..last in at most ``wanted`` ranges of at least MIN_SPLIT ids."""
    count = last - first + 1
    if count <= 0:
        return []
    k = max(1, min(wanted, math.ceil(count / MIN_SPLIT)))
    size = math.ceil(count / k)
    return [IdRange(a, min(last, a + size - 1)) for a in range(first, last + 1, size)]


def _read_list(url: str, name: str, part: ListRange) -> Iterator[pa.RecordBatch]:
    r = client(url)
    for a in range(part.start, part.stop + 1, READ_STEP):
        items = r.lrange(part.key, a, min(part.stop, a + READ_STEP - 1))
        if not items:
            return
        ms = decode_items(items)
        yield queue_batch(name, [m.id for m in ms], [m.payload for m in ms],
                          [round(m.created_at * 1000) for m in ms], [m.deliveries for m in ms])


# -- batch reads -----------------------------------------------------------

class BatchReader(DataSourceReader):
    """``spark.read.format("fastbus")``: a topic's retained messages
    (``startingOffsets``/``endingOffsets``: earliest, latest or ids), a
    topic consumer's or a queue's ``failed`` (default for queues) or
    ``ready`` list, left in place."""

    def __init__(self, o: Options) -> None:
        self.o = o
        if not (o.topic or o.queue):
            raise OptionError("a batch read needs option topic or queue")
        if o.topic and o.list == "ready":
            raise OptionError("a topic consumer's ready list holds ids only: read the topic's retained "
                              "range (list retained, the default) instead")
        if o.topic and o.list == "failed" and not o.consumer:
            raise OptionError("reading a topic's failed list needs option consumer (whose list)")
        if o.queue and o.list == "retained":
            raise OptionError("option list retained is for topics; a queue has the lists failed and ready")

    def _list_key(self) -> str:
        o = self.o
        if o.queue:
            return queue_namespace(o.prefix, o.queue) + (o.list or "failed")
        return TopicOps(o.topic, o.prefix, o.ttl, o.max_deliveries).space(o.consumer).ns + "failed"

    def partitions(self) -> list:
        o = self.o
        url = o.redis_url()
        if o.queue or o.list in ("failed", "ready"):
            key = self._list_key()
            n = client(url).llen(key)
            if n == 0:
                return []
            return [ListRange(key, r.first - 1, r.last - 1) for r in split_ids(1, n, o.min_partitions)]
        with Topic(o.topic, url, prefix=o.prefix) as t:
            low, last = t.retained()
        first = low if (o.starting or "earliest") == "earliest" else last + 1 if o.starting == "latest" \
            else int(o.starting)
        end = last if (o.ending or "latest") == "latest" else 0 if o.ending == "earliest" else int(o.ending)
        if low == 0:
            return []
        return split_ids(max(first, low), min(end, last), o.min_partitions)

    def read(self, partition) -> Iterator[pa.RecordBatch]:
        o = self.o
        if isinstance(partition, IdRange):
            yield from topic_batches(o.redis_url(), o.prefix, o.topic, partition.first, partition.last)
        else:
            yield from _read_list(o.redis_url(), o.queue or o.topic, partition)


# -- streaming: a topic's logical consumer ---------------------------------

class TopicStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are topic message ids: ``{"id": n}`` = everything up to id n.

    The query's logical consumer (option ``consumer``) is registered when the
    query starts: from then on its list references every message published,
    which keeps the bodies in Redis until the query commits them, so a
    replayed micro-batch reads the same rows.  ``commit(end)`` removes ids up
    to ``end`` from the list (:meth:`Topic.ack_upto`)."""

    def __init__(self, o: Options) -> None:
        if not o.consumer:
            raise OptionError(
                "a streaming read of a topic needs option consumer: the logical consumer that holds "
                "what the query has not committed yet (one per query; see Topic.register)")
        self.o = o
        self._topic: Topic | None = None
        self._target: int | None = None
        self._checked = False

    def __getstate__(self) -> dict:            # executors get the options only
        return {"o": self.o, "_topic": None, "_target": self._target, "_checked": False}

    @property
    def topic(self) -> Topic:
        if self._topic is None:
            o = self.o
            self._topic = Topic(o.topic, o.redis_url(), prefix=o.prefix, ttl=o.ttl)
        return self._topic

    def initialOffset(self) -> dict:
        # Spark may ask more than once, from different processes: the
        # answer must not move while the query starts, so it comes from the
        # consumer's position (its registration point, moved only by
        # commits), not from the topic's newest id at the time of the call.
        o, t = self.o, self.topic
        t.register(o.consumer)
        self._checked = True
        start = o.starting or "latest"
        if start == "latest":
            return {"id": t.position(o.consumer)}
        if start == "earliest":
            low, last = t.retained()
            return {"id": min(t.position(o.consumer), low - 1 if low else last)}
        return {"id": int(start) - 1}

    def getDefaultReadLimit(self):
        return ReadMaxRows(self.o.max_per_trigger) if self.o.max_per_trigger else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.topic.last_id()

    def latestOffset(self, start: dict, limit) -> dict:
        t = self.topic
        if not self._checked:                  # a restart from a checkpoint
            if self.o.consumer not in t.consumers():
                raise QueueError(
                    f"the logical consumer {self.o.consumer!r} of topic {self.o.topic} is not registered "
                    "(unregistered since the checkpoint?): what was published meanwhile is not kept for "
                    "it. Register it again (Topic.register) to go on from the checkpoint, or start the "
                    "query with a new checkpoint")
            self._checked = True
        begin = int(start["id"])
        last = t.last_id() if self._target is None else self._target
        if isinstance(limit, ReadMaxRows):
            last = min(last, begin + limit.max_rows)
        return {"id": max(begin, last)}

    def reportLatestOffset(self) -> dict:
        return {"id": self.topic.last_id()}

    def partitions(self, start: dict, end: dict) -> list:
        return split_ids(int(start["id"]) + 1, int(end["id"]), self.o.min_partitions)

    def read(self, partition: IdRange) -> Iterator[pa.RecordBatch]:
        o = self.o
        yield from topic_batches(o.redis_url(), o.prefix, o.topic, partition.first, partition.last)

    def commit(self, end: dict) -> None:
        self.topic.ack_upto(self.o.consumer, int(end["id"]))

    def stop(self) -> None:
        if self._topic is not None:
            self._topic.close()
            self._topic = None


# -- streaming: a work queue -----------------------------------------------

class QueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """At-least-once from a :class:`WorkQueue`.  The driver takes messages
    with a consumer of its own (``{"n": k}`` counts what this query took),
    hands them to the tasks inside the partitions, and acks them in
    ``commit``.  A crash before the commit leaves them unacked in that
    consumer: once its heartbeat lapses (``heartbeatTtl``), any consumer's
    cleaner returns them to the queue and they are delivered again, counted
    in ``deliveries``; a stopped query returns them at once."""

    def __init__(self, o: Options) -> None:
        self.o = o
        self._queue: WorkQueue | None = None
        self._consumer = None
        self._held: list = []                  # (n, Message), oldest first
        self._next: int | None = None
        self._left: int | None = None          # availableNow: how many may still be taken

    def __getstate__(self) -> dict:
        return {"o": self.o, "_queue": None, "_consumer": None, "_held": [], "_next": None, "_left": None}

    def _c(self):
        if self._consumer is None:
            o = self.o
            self._queue = WorkQueue(o.queue, o.redis_url(), prefix=o.prefix, max_deliveries=o.max_deliveries)
            self._consumer = self._queue.consumer(o.consumer, heartbeat_ttl=o.heartbeat_ttl)
        return self._consumer

    def initialOffset(self) -> dict:
        return {"n": 0}

    def getDefaultReadLimit(self):
        return ReadMaxRows(self.o.max_per_trigger or QUEUE_CAP)

    def prepareForTriggerAvailableNow(self) -> None:
        self._c()
        self._left = self._queue.stats().ready

    def latestOffset(self, start: dict, limit) -> dict:
        c = self._c()
        begin = int(start["n"])
        if self._next is None or self._next < begin:
            self._next = begin
        want = limit.max_rows if isinstance(limit, ReadMaxRows) else QUEUE_CAP
        if self._left is not None:
            want = min(want, self._left)
        taken = 0
        while taken < want:
            got = c.get_many(min(10000, want - taken), timeout=0)
            if not got:
                break
            for m in got:
                self._next += 1
                self._held.append((self._next, m))
            taken += len(got)
        if self._left is not None:
            self._left -= taken
        return {"n": self._next}

    def partitions(self, start: dict, end: dict) -> list:
        a, b = int(start["n"]), int(end["n"])
        # after a restart the previous run's messages are not here: they come
        # back through the queue (redelivery), so the replayed batch is empty
        ms = [m for n, m in self._held if a < n <= b]
        if not ms:
            return []
        k = max(1, min(self.o.min_partitions, math.ceil(len(ms) / MIN_SPLIT)))
        size = math.ceil(len(ms) / k)
        return [Rows([m.id for m in part], [m.payload for m in part],
                     [round(m.created_at * 1000) for m in part], [m.deliveries for m in part])
                for part in (ms[i:i + size] for i in range(0, len(ms), size))]

    def read(self, partition: Rows) -> Iterator[pa.RecordBatch]:
        yield queue_batch(self.o.queue, partition.ids, partition.payloads, partition.created_ms,
                          partition.deliveries)

    def commit(self, end: dict) -> None:
        b = int(end["n"])
        done = [m for n, m in self._held if n <= b]
        self._held = [(n, m) for n, m in self._held if n > b]
        if done:
            self._c().ack(*done)

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()             # what was taken and not committed goes back
            self._queue.close()
            self._consumer = self._queue = None
