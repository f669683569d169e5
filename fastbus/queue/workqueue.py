"""Reliable work queues on Redis (the rmq design of the article "Building a
Message Queue Using Redis in Go", its holes closed).

    q = WorkQueue("jobs")                      # embedded server; or WorkQueue("jobs", "redis://...")
    q.put(b"resize 42.png")
    with q.consumer("worker-1") as c:
        for m in c.get_many(100, timeout=1.0):
            ...
            m.ack()

Producers append to ``ready``.  A consumer takes messages into its own
``unacked`` hash in the same script that removes them from ``ready``; it then
acks, rejects (to the ``failed`` list) or requeues each one, any mix of them
in one round trip (:meth:`Consumer.settle`).  A consumer proves it is alive
with a heartbeat key; when that expires, any consumer or :meth:`WorkQueue.clean`
returns what it held to ``ready``.  Every message counts its deliveries; one
delivered ``max_deliveries`` times without an ack goes to ``failed``.

Guarantee: at least once.  A message leaves Redis only by an ack (or a
purge); a consumer that dies or stalls past its heartbeat has its messages
delivered again, so a stalled consumer's late work can overlap its
successor's: make processing idempotent, or check ``deliveries``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Generator, Iterable
from typing import Any, Self

from fastbus._twins import twin_of
from fastbus.queue.common import Message, MessageRef
from fastbus.queue.names import DEFAULT_PREFIX, check_name
from fastbus.queue.driver import AsyncDriver, AsyncHandle, SyncDriver, SyncHandle
from fastbus.queue.gather import AsyncGathering, SyncGathering
from fastbus.queue.engine import (
    NETWORK_ERRORS,
    CleanResult,
    ConsumerState,
    QueueSpace,
    QueueStats,
    SettleResult,
    max_deliveries_of,
    queue_namespace,
)

log = logging.getLogger("fastbus.queue")

__all__ = ["AsyncConsumer", "AsyncWorkQueue", "CleanResult", "Consumer", "QueueStats", "SettleResult", "WorkQueue"]


# -- synchronous API


class Consumer:
    """One consumer of a queue (from :meth:`WorkQueue.consumer`).

    Registering refuses a tag that another live consumer holds
    (:class:`~fastbus.queue.ConsumerTagInUse`).  A daemon thread refreshes the
    heartbeat every ``heartbeat_ttl / 3`` seconds and, every
    ``clean_interval`` seconds (None: never), runs the cleaner for the whole
    queue.  :meth:`close` gives back what is held unacked (not counted as a
    delivery) and removes the consumer's keys.  Thread-safe."""

    def __init__(self, driver: SyncDriver, space: QueueSpace, tag: str | None, heartbeat_ttl: float,
                 clean_interval: float | None, prefetch: int = 1) -> None:
        self._driver = driver
        self._h = ConsumerState(space, tag, heartbeat_ttl, clean_interval, self, prefetch)
        self._stop = threading.Event()
        self._closed = False
        self.lost: Exception | None = None   # set if another consumer took the tag
        driver.run(self._h.register())
        self._thread = threading.Thread(target=self._beat, name=f"fastbus-heartbeat-{self.tag}", daemon=True)
        self._thread.start()

    @property
    def tag(self) -> str:
        """This consumer's tag (unique among the queue's live consumers)."""
        return self._h.tag

    def get(self, timeout: float | None = None, ack: MessageRef | None = None) -> Message | None:
        """The next message, waiting up to ``timeout`` seconds (None: for
        ever, 0: not at all); None if there was none.  ``ack``: the message
        this consumer is done with, acknowledged in the same round trip
        (``m = c.get(ack=m)``: a worker's loop costs one round trip a
        message; a message it no longer held is logged, as by ack())."""
        got = self._driver.run(self._h.get_many(1, timeout, ack))
        return got[0] if got else None

    def get_many(self, n: int, timeout: float | None = None, ack: MessageRef | None = None) -> list[Message]:
        """Up to ``n`` messages in one round trip: whatever is ready now,
        else waits up to ``timeout`` for the first ones (None: for ever);
        ``ack`` as for :meth:`get`."""
        return self._driver.run(self._h.get_many(n, timeout, ack))

    def settle(self, ack: Iterable[MessageRef] = (), reject: Iterable[MessageRef] = (),
               requeue: Iterable[MessageRef] = ()) -> SettleResult:
        """Ack, reject (to the failed list) and requeue (to the head of the
        queue, counted as a delivery) messages in one atomic round trip."""
        return self._driver.run(self._h.settle(ack, reject, requeue))

    def ack(self, *messages: MessageRef) -> SettleResult:
        """Acknowledge: the messages are done and leave Redis."""
        if len(messages) == 1:
            return self._driver.run(self._h.ack1(messages[0]))
        return self.settle(ack=messages)

    def reject(self, *messages: MessageRef) -> SettleResult:
        """Move the messages to the queue's failed list."""
        return self.settle(reject=messages)

    def requeue(self, *messages: MessageRef) -> SettleResult:
        """Back to the head of the queue for another delivery (to the failed
        list instead once a message has had ``max_deliveries``)."""
        return self.settle(requeue=messages)

    def _beat(self) -> None:
        while not self._stop.wait(self._h.wait()):
            try:
                self._driver.run(self._h.tick())
            except Exception as e:  # noqa: BLE001 - the thread must go on beating
                if self._h.failed(e):
                    self.lost = e
                    return

    def close(self) -> None:
        """Stop the heartbeat; give back what is unacked; remove the consumer."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._thread.join()
        try:
            back = self._driver.run(self._h.release())
            if back:
                log.info("consumer %s closed: %d unacked messages back to the queue", self.tag, back)
        except NETWORK_ERRORS as e:
            log.warning("consumer %s closed without giving back its messages (%s): the cleaner will, "
                        "once its heartbeat expires", self.tag, e)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WorkQueue(SyncHandle):
    """A reliable work queue on Redis.

    ``redis``: a URL, a ``redis.Redis`` or ``redis.cluster.RedisCluster``, or
    None for fastbus's embedded server.  ``max_deliveries``: a message
    delivered this many times without an ack goes to the failed list (None:
    no limit).  ``prefix``: the first part of every key
    (``prefix:q:{name}:...``).  Thread-safe."""

    def __init__(self, name: str, redis: Any = None, *, max_deliveries: int | None = 10,
                 prefix: str = DEFAULT_PREFIX) -> None:
        self.name = check_name("queue name", name)
        self._space = QueueSpace(self.name, queue_namespace(prefix, name), "", max_deliveries_of(max_deliveries))
        self._puts = SyncGathering()
        super().__init__(redis)

    def put(self, payload: bytes) -> int:
        """Append one message; returns its id once the server has it.
        put()s from several threads that overlap go in one script call
        (fastbus/queue/gather.py), each still returning its own id."""
        payload = self._driver.run(self._space.admit(payload))
        return self._puts.put(payload, self._put_gathered)

    def _put_gathered(self, payloads: list[bytes]) -> int:
        return self._driver.run(self._space.put_gathered(payloads))

    def put_many(self, payloads: Iterable[bytes]) -> list[int]:
        """Append many messages in one round trip (script calls of up to
        1000 messages, pipelined); returns their ids, in order, once the
        server has them all."""
        return self._driver.run(self._space.put_many(payloads))

    def consumer(self, tag: str | None = None, *, heartbeat_ttl: float = 15.0,
                 clean_interval: float | None = 30.0, prefetch: int = 1) -> Consumer:
        """Register a consumer (``tag`` None: host-pid-random).
        ``prefetch``: how many ready messages a take asks for (at most
        1000): get() hands out the ones taken ahead with no round trip, and
        an ack given with get(ack=) then goes with the next round trip (a
        take, the heartbeat every ``heartbeat_ttl / 3``, close()).  Those
        ahead are held by this consumer like the one it works on: close()
        gives them back uncounted, a death has the cleaner return them
        (a delivery each).  docs/QUEUES.md, "Taking ahead"."""
        return Consumer(self._driver, self._space, tag, heartbeat_ttl, clean_interval, prefetch)

    def peek(self, count: int = 10, *, failed: bool = False) -> list[Message]:
        """The first ``count`` messages of ready (or failed), left in place."""
        return self._driver.run(self._space.peek(count, failed))

    def return_failed(self, count: int | None = None) -> int:
        """Move the oldest ``count`` (None: all) failed messages back to the
        tail of ready, their delivery counts reset; returns how many."""
        return self._driver.run(self._space.return_failed(count))

    def purge(self, which: str = "ready") -> int:
        """Delete every message of ``which`` ("ready" or "failed"); returns how many."""
        return self._driver.run(self._space.purge(which))

    def clean(self) -> CleanResult:
        """Return the unacked messages of consumers whose heartbeat expired
        (counted as a delivery).  Safe to run from anywhere, any number at once."""
        return self._driver.run(self._space.clean())

    def stats(self, window: int = 5) -> QueueStats:
        """Counts, consumers and rates (over the last ``window`` seconds) in one atomic read."""
        return self._driver.run(self._space.stats(window))

# -- asyncio API



@twin_of(Consumer)
class AsyncConsumer:
    """:class:`Consumer` for asyncio (from :meth:`AsyncWorkQueue.consumer`);
    the heartbeat is a task of the running loop."""

    def __init__(self, driver: AsyncDriver, space: QueueSpace, tag: str | None, heartbeat_ttl: float,
                 clean_interval: float | None, prefetch: int = 1) -> None:
        self._driver = driver
        self._h = ConsumerState(space, tag, heartbeat_ttl, clean_interval, self, prefetch)
        self._task: asyncio.Task | None = None
        self.lost: Exception | None = None

    async def start(self) -> Self:
        """Register (refusing a tag held by a live consumer) and start the heartbeat."""
        if self._task is not None:
            return self
        await self._before_start()
        await self._driver.run(self._h.register())
        self._task = asyncio.get_running_loop().create_task(self._beat())
        return self

    async def _before_start(self) -> None:
        """What a subclass does before registering (what the sync twin's
        caller does before constructing it: __init__ cannot await)."""

    def __await__(self) -> Generator[Any, None, Self]:
        return self.start().__await__()

    @property
    def tag(self) -> str:
        return self._h.tag

    async def get(self, timeout: float | None = None, ack: MessageRef | None = None) -> Message | None:
        got = await self._driver.run(self._h.get_many(1, timeout, ack))
        return got[0] if got else None

    async def get_many(self, n: int, timeout: float | None = None, ack: MessageRef | None = None) -> list[Message]:
        return await self._driver.run(self._h.get_many(n, timeout, ack))

    async def settle(self, ack: Iterable[MessageRef] = (), reject: Iterable[MessageRef] = (),
                     requeue: Iterable[MessageRef] = ()) -> SettleResult:
        return await self._driver.run(self._h.settle(ack, reject, requeue))

    async def ack(self, *messages: MessageRef) -> SettleResult:
        if len(messages) == 1:
            return await self._driver.run(self._h.ack1(messages[0]))
        return await self.settle(ack=messages)

    async def reject(self, *messages: MessageRef) -> SettleResult:
        return await self.settle(reject=messages)

    async def requeue(self, *messages: MessageRef) -> SettleResult:
        return await self.settle(requeue=messages)

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self._h.wait())
            try:
                await self._driver.run(self._h.tick())
            except Exception as e:  # noqa: BLE001 - the task must go on beating
                if self._h.failed(e):
                    self.lost = e
                    return

    async def close(self) -> None:
        if self._task is None:
            return
        task, self._task = self._task, None
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        try:
            await self._driver.run(self._h.release())
        except NETWORK_ERRORS as e:
            log.warning("consumer %s closed without giving back its messages (%s)", self.tag, e)

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


@twin_of(WorkQueue)
class AsyncWorkQueue(AsyncHandle):
    """:class:`WorkQueue` for asyncio: ``redis`` is a URL, a
    ``redis.asyncio`` client (plain or cluster) or None.  Consumers:
    ``async with q.consumer("w1") as c:`` (or ``c = await q.consumer(...)``)."""

    def __init__(self, name: str, redis: Any = None, *, max_deliveries: int | None = 10,
                 prefix: str = DEFAULT_PREFIX) -> None:
        self.name = check_name("queue name", name)
        self._space = QueueSpace(self.name, queue_namespace(prefix, name), "", max_deliveries_of(max_deliveries))
        self._puts = AsyncGathering()
        super().__init__(redis)

    async def put(self, payload: bytes) -> int:
        payload = await self._driver.run(self._space.admit(payload))
        return await self._puts.put(payload, self._put_gathered)

    async def _put_gathered(self, payloads: list[bytes]) -> int:
        return await self._driver.run(self._space.put_gathered(payloads))

    async def put_many(self, payloads: Iterable[bytes]) -> list[int]:
        return await self._driver.run(self._space.put_many(payloads))

    def consumer(self, tag: str | None = None, *, heartbeat_ttl: float = 15.0,
                 clean_interval: float | None = 30.0, prefetch: int = 1) -> AsyncConsumer:
        return AsyncConsumer(self._driver, self._space, tag, heartbeat_ttl, clean_interval, prefetch)

    async def peek(self, count: int = 10, *, failed: bool = False) -> list[Message]:
        return await self._driver.run(self._space.peek(count, failed))

    async def return_failed(self, count: int | None = None) -> int:
        return await self._driver.run(self._space.return_failed(count))

    async def purge(self, which: str = "ready") -> int:
        return await self._driver.run(self._space.purge(which))

    async def clean(self) -> CleanResult:
        return await self._driver.run(self._space.clean())

    async def stats(self, window: int = 5) -> QueueStats:
        return await self._driver.run(self._space.stats(window))
