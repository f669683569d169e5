"""Topics with logical consumers (the RedisQ design of seed 002, its holes closed).

    t = Topic("orders")
    t.register("billing")                      # gets every message published from now on
    t.publish(b"order 1")
    with t.consumer("billing") as c:           # any number of instances share "billing"'s list
        for m in c.get_many(100, timeout=1.0):
            ...
            m.ack()

``publish`` stores the body once, under a monotonic id with a TTL, and
appends the id to every registered logical consumer's list, all in one
script: a consumer registered before the publish gets it, one registered
after does not, and no consumer can see half a fan-out.  Each logical
consumer's list is a work queue of ids (:mod:`fastbus.queue.workqueue`):
instances take ids with their bodies, ack them, and a crashed instance's
unacked ids are delivered again (the retry RedisQ lacks; RedisQ's BLPOP lost
the message of a consumer that died after the pop).

Bodies are kept in blocks of 1024 consecutive ids (one hash each, so a
publish or a read of an id range costs a few server calls per block, not per
message).  A block is deleted when every logical consumer has acked (or
rejected: the failed list keeps its own copy) every message of it that it
got, or when the TTL has passed since the last publish into it, whichever is
first: a body lives at least ``ttl`` unless all its consumers are done with
its block.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from fastbus._core import topic_columns, topic_decode
from fastbus.queue._common import (
    DEFAULT_PREFIX,
    AsyncHandle,
    Call,
    Cmd,
    Many,
    Message,
    Op,
    QueueError,
    SyncHandle,
    as_bytes,
    check_name,
    chunks,
    namespace,
    pairs,
    positive_int,
    positive_seconds,
)
from fastbus.queue.workqueue import (
    AsyncConsumer,
    CleanResult,
    Consumer,
    QueueStats,
    _max_deliveries,
    _Space,
    _stats,
)

__all__ = ["AsyncTopic", "Topic", "TopicStats"]

MAX_READ = 10000


@dataclass(slots=True)
class TopicStats:
    """``last_id``: the newest message id; ``published``: messages ever
    published; ``consumers``: per logical consumer, its queue's stats."""

    name: str
    last_id: int
    published: int
    consumers: dict[str, QueueStats]

    def to_dict(self) -> dict:
        return asdict(self)


class _TopicOps:
    def __init__(self, name: str, prefix: str, ttl: float, max_deliveries: int | None) -> None:
        self.name = check_name("topic name", name)
        self.ns = namespace("t", prefix, self.name)
        self.seq = self.ns + "seq"
        self.ttl_ms = max(1, int(positive_seconds("ttl", ttl) * 1000))
        self.max = _max_deliveries(max_deliveries)

    def space(self, consumer: str) -> _Space:
        consumer = check_name("consumer name", consumer)
        return _Space(f"{self.name}/{consumer}", f"{self.ns}c:{consumer}:", self.ns, self.max)

    def publish_many(self, payloads) -> Op:
        payloads = [as_bytes(p) for p in payloads]
        if not payloads:
            return []
        parts = list(chunks(payloads))
        firsts = yield Many([Call("PUBLISH", self.seq, (self.ns, self.ttl_ms, *p)) for p in parts])
        ids: list[int] = []
        for first, part in zip(firsts, parts):
            ids.extend(range(first, first + len(part)))
        return ids

    def publish(self, payload) -> Op:
        return (yield Call("PUBLISH", self.seq, (self.ns, self.ttl_ms, as_bytes(payload))))

    def register(self, consumer: str) -> Op:
        new, _last = yield Call("SUBSCRIBE", self.seq, (self.ns, check_name("consumer name", consumer)))
        return bool(new)

    def unregister(self, consumer: str) -> Op:
        dropped = yield Call("UNSUBSCRIBE", self.seq, (self.ns, check_name("consumer name", consumer)))
        if dropped < 0:
            raise QueueError(f"topic {self.name} has no consumer named {consumer!r}")
        return dropped

    def consumers(self) -> Op:
        names = yield Cmd(("SMEMBERS", self.ns + "consumers"))
        return sorted(n.decode() for n in names)

    def last_id(self) -> Op:
        v = yield Cmd(("GET", self.seq))
        return int(v or 0)

    def read(self, first: int, last: int) -> Op:
        positive_int("first", first)
        positive_int("last", last)
        if last < first:
            return []
        if last - first >= MAX_READ:
            raise ValueError(f"read at most {MAX_READ} ids per call, not {last - first + 1}")
        values = yield Call("READ", self.seq, (self.ns, first, last))
        return topic_decode(values, first)

    def read_columns(self, first: int, last: int) -> Op:
        positive_int("first", first)
        positive_int("last", last)
        if last < first:
            return topic_columns([], first)
        if last - first >= MAX_READ:
            raise ValueError(f"read at most {MAX_READ} ids per call, not {last - first + 1}")
        values = yield Call("READ", self.seq, (self.ns, first, last))
        return topic_columns(values, first)

    def retained(self) -> Op:
        while True:
            first, last = yield Call("RETAINED", self.seq, (self.ns,))
            if first >= 0:
                return int(first), int(last)

    def position(self, consumer: str) -> Op:
        consumer = check_name("consumer name", consumer)
        pos = yield Call("POSITION", self.seq, (self.ns, consumer))
        if pos < 0:
            raise QueueError(f"topic {self.name} has no consumer named {consumer!r}")
        return pos

    def ack_upto(self, consumer: str, last: int, step: int = 10000) -> Op:
        consumer = check_name("consumer name", consumer)
        total = 0
        while True:
            removed, more = yield Call("ACK_UPTO", self.seq, (self.ns, consumer, int(last), step))
            if removed < 0:
                raise QueueError(f"topic {self.name} has no consumer named {consumer!r}")
            total += removed
            if not more:
                return total

    def stats(self, window: int) -> Op:
        positive_int("window", window)
        last, names, totals = yield Call("TOPIC_INFO", self.seq, (self.ns,))
        names = sorted(n.decode() for n in names)
        spaces = [self.space(n) for n in names]
        replies = (yield Many([Call("STATS", s.ready, (s.ns, window)) for s in spaces])) if spaces else []
        return TopicStats(self.name, int(last), pairs(totals).get("put", 0),
                          {s.name.split("/", 1)[1]: _stats(s.name, *r, window) for s, r in zip(spaces, replies)})

    def clean(self) -> Op:
        r = yield Call("CLEAN", self.seq, ("t", self.ns, self.max))
        return CleanResult(*r)

    def return_failed(self, consumer: str, count: int | None) -> Op:
        return (yield from self.space(consumer).return_failed(count, self.ttl_ms))


class Topic(SyncHandle):
    """A topic with logical consumers.

    ``redis``: a URL, ``redis.Redis``, ``RedisCluster`` or None (embedded
    server).  ``ttl``: seconds a body is kept at most (default one day);
    ``max_deliveries``: per logical consumer, as in
    :class:`~fastbus.queue.WorkQueue`.  Thread-safe."""

    def __init__(self, name: str, redis: Any = None, *, ttl: float = 86400.0,
                 max_deliveries: int | None = 10, prefix: str = DEFAULT_PREFIX) -> None:
        self._ops = _TopicOps(name, prefix, ttl, max_deliveries)
        self.name = self._ops.name
        super().__init__(redis)

    def publish(self, payload: bytes) -> int:
        """Store one message and fan it out; returns its id."""
        return self._driver.run(self._ops.publish(payload))

    def publish_many(self, payloads) -> list[int]:
        """Publish many in one round trip; returns their ids in order."""
        return self._driver.run(self._ops.publish_many(payloads))

    def register(self, consumer: str) -> bool:
        """Register a logical consumer: it gets every message published from
        now on.  Returns False if it was registered already (nothing changes)."""
        return self._driver.run(self._ops.register(consumer))

    def unregister(self, consumer: str) -> int:
        """Remove a logical consumer and all its keys (pending, unacked,
        failed); returns how many pending messages it dropped."""
        return self._driver.run(self._ops.unregister(consumer))

    def consumers(self) -> list[str]:
        """The registered logical consumers."""
        return self._driver.run(self._ops.consumers())

    def consumer(self, consumer: str, tag: str | None = None, *, register: bool = True,
                 heartbeat_ttl: float = 15.0, clean_interval: float | None = 30.0) -> Consumer:
        """An instance of logical consumer ``consumer`` (registering it first
        unless ``register=False``).  Instances share the consumer's messages;
        each needs its own ``tag`` (None: host-pid-random)."""
        space = self._ops.space(consumer)
        if register:
            self.register(consumer)
        return Consumer(self._driver, space, tag, heartbeat_ttl, clean_interval)

    def last_id(self) -> int:
        """The id of the newest message (0 before the first)."""
        return self._driver.run(self._ops.last_id())

    def read(self, first: int, last: int) -> list[Message]:
        """The retained messages with ids ``first..last`` (at most 10000),
        without consuming them; ``deliveries`` is 0."""
        return self._driver.run(self._ops.read(first, last))

    def read_columns(self, first: int, last: int) -> tuple:
        """:meth:`read` as column buffers, with no Python object per message
        (decoded in C): ``(rows, ids, micros, offsets, data)``, native int64
        ids and created times (µs), int32 offsets (rows + 1) and the payloads
        end to end: the buffers of Arrow int64, timestamp[us] and binary
        columns (``fastbus._core.topic_columns``)."""
        return self._driver.run(self._ops.read_columns(first, last))

    def retained(self) -> tuple[int, int]:
        """``(first, last)``: the oldest retained message id (0 if none is)
        and the newest id.  Ids between may be gone (acked by every consumer
        of their block of 1024, or expired)."""
        return self._driver.run(self._ops.retained())

    def position(self, consumer: str) -> int:
        """Logical consumer ``consumer``'s position for position-based
        readers: the id it was registered at, moved up by :meth:`ack_upto`."""
        return self._driver.run(self._ops.position(consumer))

    def ack_upto(self, consumer: str, last: int) -> int:
        """Remove from logical consumer ``consumer``'s list every message
        with an id up to ``last``, releasing their bodies; returns how many.
        For a consumer that reads by id range (:meth:`read`) and keeps its
        position elsewhere, as the Spark source does; instances taking from
        the same list would lose what they have not taken."""
        return self._driver.run(self._ops.ack_upto(consumer, last))

    def stats(self, window: int = 5) -> TopicStats:
        return self._driver.run(self._ops.stats(window))

    def clean(self) -> CleanResult:
        """Run the cleaner for every logical consumer (see :meth:`WorkQueue.clean`)."""
        return self._driver.run(self._ops.clean())

    def peek_failed(self, consumer: str, count: int = 10) -> list[Message]:
        """A logical consumer's failed messages (with their bodies), left in place."""
        return self._driver.run(self._ops.space(consumer).peek(count, True))

    def return_failed(self, consumer: str, count: int | None = None) -> int:
        """A logical consumer's failed messages back to its list."""
        return self._driver.run(self._ops.return_failed(consumer, count))



class AsyncTopic(AsyncHandle):
    """:class:`Topic` for asyncio (``redis``: URL, ``redis.asyncio`` client or None)."""

    def __init__(self, name: str, redis: Any = None, *, ttl: float = 86400.0,
                 max_deliveries: int | None = 10, prefix: str = DEFAULT_PREFIX) -> None:
        self._ops = _TopicOps(name, prefix, ttl, max_deliveries)
        self.name = self._ops.name
        super().__init__(redis)

    async def publish(self, payload: bytes) -> int:
        return await self._driver.run(self._ops.publish(payload))

    async def publish_many(self, payloads) -> list[int]:
        return await self._driver.run(self._ops.publish_many(payloads))

    async def register(self, consumer: str) -> bool:
        return await self._driver.run(self._ops.register(consumer))

    async def unregister(self, consumer: str) -> int:
        return await self._driver.run(self._ops.unregister(consumer))

    async def consumers(self) -> list[str]:
        return await self._driver.run(self._ops.consumers())

    def consumer(self, consumer: str, tag: str | None = None, *, register: bool = True,
                 heartbeat_ttl: float = 15.0, clean_interval: float | None = 30.0) -> AsyncConsumer:
        """An instance of logical consumer ``consumer`` (registered first
        unless ``register=False``): ``async with t.consumer("billing") as c:``
        or ``c = await t.consumer("billing")``."""
        space = self._ops.space(consumer)
        before = (lambda: self.register(consumer)) if register else None
        return AsyncConsumer(self._driver, space, tag, heartbeat_ttl, clean_interval, before)

    async def last_id(self) -> int:
        return await self._driver.run(self._ops.last_id())

    async def read(self, first: int, last: int) -> list[Message]:
        return await self._driver.run(self._ops.read(first, last))

    async def read_columns(self, first: int, last: int) -> tuple:
        return await self._driver.run(self._ops.read_columns(first, last))

    async def retained(self) -> tuple[int, int]:
        return await self._driver.run(self._ops.retained())

    async def position(self, consumer: str) -> int:
        return await self._driver.run(self._ops.position(consumer))

    async def ack_upto(self, consumer: str, last: int) -> int:
        return await self._driver.run(self._ops.ack_upto(consumer, last))

    async def stats(self, window: int = 5) -> TopicStats:
        return await self._driver.run(self._ops.stats(window))

    async def clean(self) -> CleanResult:
        return await self._driver.run(self._ops.clean())

    async def peek_failed(self, consumer: str, count: int = 10) -> list[Message]:
        return await self._driver.run(self._ops.space(consumer).peek(count, True))

    async def return_failed(self, consumer: str, count: int | None = None) -> int:
        return await self._driver.run(self._ops.return_failed(consumer, count))
