"""Topics with logical consumers (the RedisQ design of the article "Reliable
Delivery Pub/Sub Message Queues with Redis", its holes closed).

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
message).  A block's expiry is set once, when it is created: ``ttl`` plus a
tenth.  It takes publishes only during that tenth; a later publish starts
at the next block (ids stay increasing, with a gap).  A block is deleted
when every logical consumer has acked (or rejected: the failed list keeps
its own copy) every message of it that it got, or when it expires,
whichever is first: a body lives at least ``ttl`` and at most
``1.1 * ttl``, unless all its consumers are done with its block first.

A registered logical consumer that never reads keeps a 21-byte header of
every message published since it registered in its list, and its
references keep every block until it expires (other consumers' acks no
longer free it early): the bodies are bounded by the TTL, its list and the
``refs`` hash (a field per block) are not.  ``stats().consumers[name].ready``
shows one falling behind; ``unregister(name)`` drops it for good, and
``ack_upto(name, retained()[0] - 1)`` drops only the headers whose bodies
are gone already (nothing a reader could still get; with no block
retained, ``retained()[0]`` is 0: use ``last_id()``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastbus._twins import twin_of
from fastbus.queue.common import Message
from fastbus.queue.names import DEFAULT_PREFIX
from fastbus.queue.driver import AsyncHandle, SyncHandle
from fastbus.queue.engine import CleanResult, TopicOps, TopicStats
from fastbus.queue.workqueue import (
    AsyncConsumer,
    Consumer,
)

__all__ = ["AsyncTopic", "Topic", "TopicStats"]


class Topic(SyncHandle):
    """A topic with logical consumers.

    ``redis``: a URL, ``redis.Redis``, ``RedisCluster`` or None (embedded
    server).  ``ttl``: seconds a body is kept (default one day): at least
    ``ttl`` and at most ``1.1 * ttl`` after its publish, less if every
    logical consumer is done with its block of 1024 ids; a consumer that
    takes it later finds it expired (counted in ``expired``).  Clients of
    one topic should agree on ``ttl``.  A registered consumer that never
    reads keeps a header of every message in its list, without bound, until
    :meth:`unregister` (or :meth:`ack_upto` up to the oldest retained id:
    see the module docstring).  ``max_deliveries``: per logical consumer, as in
    :class:`~fastbus.queue.WorkQueue`.  Thread-safe."""

    def __init__(self, name: str, redis: Any = None, *, ttl: float = 86400.0,
                 max_deliveries: int | None = 10, prefix: str = DEFAULT_PREFIX) -> None:
        self._ops = TopicOps(name, prefix, ttl, max_deliveries)
        self.name = self._ops.name
        super().__init__(redis)

    def publish(self, payload: bytes) -> int:
        """Store one message and fan it out; returns its id."""
        return self._driver.run(self._ops.publish(payload))

    def publish_many(self, payloads: Iterable[bytes]) -> list[int]:
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
                 heartbeat_ttl: float = 15.0, clean_interval: float | None = 30.0, prefetch: int = 1) -> Consumer:
        """An instance of logical consumer ``consumer`` (registering it first
        unless ``register=False``).  Instances share the consumer's messages;
        each needs its own ``tag`` (None: host-pid-random).  ``prefetch``: as
        for :meth:`WorkQueue.consumer <fastbus.queue.WorkQueue.consumer>`."""
        space = self._ops.space(consumer)
        if register:
            self.register(consumer)
        return Consumer(self._driver, space, tag, heartbeat_ttl, clean_interval, prefetch)

    def last_id(self) -> int:
        """The id of the newest message (0 before the first)."""
        return self._driver.run(self._ops.last_id())

    def read(self, first: int, last: int) -> list[Message]:
        """The retained messages with ids ``first..last`` (at most 10000),
        without consuming them; ``deliveries`` is 0."""
        return self._driver.run(self._ops.read(first, last))

    def read_columns(self, first: int, last: int) -> tuple[int, bytes, bytes, bytes, bytes]:
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
        the same list would lose what they have not taken.  ValueError if
        ``last`` is past the last id published (nothing is removed)."""
        return self._driver.run(self._ops.ack_upto(consumer, last))

    def stats(self, window: int = 5) -> TopicStats:
        """Per logical consumer, counts and rates (over the last ``window`` seconds)."""
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



@twin_of(Topic)
class AsyncTopic(AsyncHandle):
    """:class:`Topic` for asyncio (``redis``: URL, ``redis.asyncio`` client or None)."""

    def __init__(self, name: str, redis: Any = None, *, ttl: float = 86400.0,
                 max_deliveries: int | None = 10, prefix: str = DEFAULT_PREFIX) -> None:
        self._ops = TopicOps(name, prefix, ttl, max_deliveries)
        self.name = self._ops.name
        super().__init__(redis)

    async def publish(self, payload: bytes) -> int:
        return await self._driver.run(self._ops.publish(payload))

    async def publish_many(self, payloads: Iterable[bytes]) -> list[int]:
        return await self._driver.run(self._ops.publish_many(payloads))

    async def register(self, consumer: str) -> bool:
        return await self._driver.run(self._ops.register(consumer))

    async def unregister(self, consumer: str) -> int:
        return await self._driver.run(self._ops.unregister(consumer))

    async def consumers(self) -> list[str]:
        return await self._driver.run(self._ops.consumers())

    def consumer(self, consumer: str, tag: str | None = None, *, register: bool = True,
                 heartbeat_ttl: float = 15.0, clean_interval: float | None = 30.0, prefetch: int = 1) -> AsyncConsumer:
        """An instance of logical consumer ``consumer`` (registered first
        unless ``register=False``): ``async with t.consumer("billing") as c:``
        or ``c = await t.consumer("billing")``."""
        space = self._ops.space(consumer)
        if not register:
            return AsyncConsumer(self._driver, space, tag, heartbeat_ttl, clean_interval, prefetch)
        return _RegisteringConsumer(self, consumer, self._driver, space, tag, heartbeat_ttl, clean_interval, prefetch)

    async def last_id(self) -> int:
        return await self._driver.run(self._ops.last_id())

    async def read(self, first: int, last: int) -> list[Message]:
        return await self._driver.run(self._ops.read(first, last))

    async def read_columns(self, first: int, last: int) -> tuple[int, bytes, bytes, bytes, bytes]:
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


class _RegisteringConsumer(AsyncConsumer):
    """An instance of a topic's logical consumer that registers the logical
    consumer as it starts (Topic.consumer registers it before constructing
    the sync twin; an __init__ cannot await)."""

    def __init__(self, topic: AsyncTopic, consumer: str, *args: Any) -> None:
        super().__init__(*args)
        self._topic = topic
        self._consumer = consumer

    async def _before_start(self) -> None:
        await self._topic.register(self._consumer)
