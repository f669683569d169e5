"""Writers: rows (``value``, optional ``key`` and ``topic``) published to a
topic, a work queue, a Redis channel or a fastbus broker channel."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, StringType, StructType

from fastbus.queue import StagedWriter, Topic, WorkQueue
from fastbus.spark._options import OptionError, Options
from fastbus.spark._redis import client

_COLUMNS = ("value", "key", "topic")


def check_schema(schema: StructType, o: Options) -> None:
    """Refuse, before any task runs, what would be lost or misrouted."""
    names = {f.name: f.dataType for f in schema.fields}
    if "value" not in names:
        raise OptionError(f"writing to fastbus needs a value column (binary or string); the columns are "
                          f"{', '.join(names)}")
    extra = sorted(set(names) - set(_COLUMNS))
    if extra:
        raise OptionError(f"fastbus messages are value (and key, topic) only; drop or fold in the "
                          f"column(s) {', '.join(extra)} (e.g. to_json(struct(*)) AS value)")
    for col in ("value", "key", "topic"):
        if col in names and not isinstance(names[col], (BinaryType, StringType)):
            raise OptionError(f"column {col} must be binary or string, not {names[col].simpleString()}")
    if not (o.topic or o.queue or o.channel):
        if "topic" not in names:
            raise OptionError("say where rows go: option topic, queue or channel, or a topic column")
        if o.broker:
            raise OptionError("with option broker, give option channel")


def _key_check(batch: pa.RecordBatch, o: Options) -> None:
    if o.ignore_key or "key" not in batch.schema.names:
        return
    keys = batch.column("key")
    if keys.null_count != len(keys):
        raise OptionError("fastbus messages have no key: a row has a non-null key, which would be lost. "
                          "Fold it into the value, or set option ignoreKey=true to drop keys")


def _groups(batches: Iterator[pa.RecordBatch], o: Options) -> Iterator[dict[str, list]]:
    """Per Arrow batch: {target name: [values]}, rows in order.  Checks and
    the split by a topic column are Arrow calls, not a loop over the rows."""
    fixed = o.topic or o.queue or o.channel
    for batch in batches:
        if batch.num_rows == 0:
            continue
        _key_check(batch, o)
        if batch.column("value").null_count:
            raise OptionError("a row has a null value: fastbus messages need a value")
        if fixed:
            yield {fixed: batch.column("value").to_pylist()}
            continue
        targets = batch.column("topic")
        if targets.null_count:
            raise OptionError("a row has a null topic and no topic option is set")
        if pa.types.is_binary(targets.type):
            targets = targets.cast(pa.string())
        out = {}
        for t in pc.unique(targets).to_pylist():
            out[t] = batch.column("value").filter(pc.equal(targets, t)).to_pylist()
        yield out


class _Publisher:
    """Direct publishing from a task (batch writes; streaming to a broker)."""

    def __init__(self, o: Options) -> None:
        self.o = o
        self.kind = o.kind
        self._handles: dict = {}
        self._pub = None

    def send(self, target: str, values: list) -> None:
        o = self.o
        if self.kind == "channel":
            if self._pub is None:
                if o.broker:
                    from fastbus.client import Client
                    self._pub = Client(endpoint=o.broker)
                else:
                    from fastbus.redis import BufferedPublisher
                    self._pub = BufferedPublisher(o.redis_url())
            if o.broker:
                self._pub.publish_many([(target, v) for v in values])
            else:
                publish = self._pub.publish
                for v in values:
                    publish(target, v)
            return
        h = self._handles.get(target)
        if h is None:
            r = client(o.redis_url())
            h = self._handles[target] = (WorkQueue(target, r, prefix=o.prefix) if self.kind == "queue"
                                         else Topic(target, r, prefix=o.prefix, ttl=o.ttl))
        if self.kind == "queue":
            h.put_many(values)
        else:
            h.publish_many(values)

    def close(self) -> None:
        if self._pub is not None:
            if self.o.broker:
                self._pub.flush()
            self._pub.close()                  # Redis: flushes; raises PublishError if any failed


@dataclass
class Written(WriterCommitMessage):
    rows: int = 0
    staged: dict = field(default_factory=dict)     # target -> staging list key


class BatchWriter(DataSourceArrowWriter):
    """``df.write.format("fastbus")``: each task publishes its rows as they
    come (confirmed by the server: ``put_many``/``publish_many`` per 1000
    rows).  A failed job leaves what its finished tasks published: retry a
    batch write and those rows go twice (use the streaming writer, or a
    consumer that de-duplicates by content, where that matters)."""

    def __init__(self, o: Options) -> None:
        self.o = o

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        pub = _Publisher(self.o)
        rows = 0
        try:
            for groups in _groups(iterator, self.o):
                for target, values in groups.items():
                    pub.send(target, values)
                    rows += len(values)
        finally:
            pub.close()
        return Written(rows)


class StreamWriter(DataSourceStreamArrowWriter):
    """``writeStream.format("fastbus")``: tasks stage their rows in Redis;
    ``commit(batchId)`` publishes them once per batch id and target
    (:class:`fastbus.queue.StagedWriter`), so a replayed batch publishes
    nothing twice.  To a fastbus broker (option ``broker``) tasks publish
    directly: at least once (a replayed batch goes again)."""

    def __init__(self, o: Options) -> None:
        if o.writer_id is None and not o.broker:
            raise OptionError("a streaming write needs option checkpointLocation (or writerId): it "
                              "names the sink's progress in Redis, so a replayed batch is not published twice")
        self.o = o

    def _staged(self, target: str) -> StagedWriter:
        o = self.o
        return StagedWriter(o.kind, target, client(o.redis_url()), writer_id=o.writer_id,
                            prefix=o.prefix, ttl=o.ttl)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        o = self.o
        if o.broker:
            return BatchWriter(o).write(iterator)
        per: dict[str, list] = defaultdict(list)
        for groups in _groups(iterator, o):
            for target, values in groups.items():
                per[target].extend(values)
        staged = {}
        rows = 0
        for target, values in per.items():
            key, n = self._staged(target).stage(values)
            staged[target] = key
            rows += n
        return Written(rows, staged)

    def commit(self, messages: list, batchId: int) -> None:
        keys: dict[str, list] = defaultdict(list)
        for m in messages:                     # in task (partition) order
            if m is not None:
                for target, key in m.staged.items():
                    keys[target].append(key)
        for target in sorted(keys):
            self._staged(target).commit(batchId, keys[target])

    def abort(self, messages: list, batchId: int) -> None:
        for m in messages:
            if m is not None:
                for target, key in m.staged.items():
                    self._staged(target).discard([key])
