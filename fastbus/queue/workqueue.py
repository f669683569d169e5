"""Reliable work queues on Redis (the rmq design of seed 001, its holes closed).

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
import os
import secrets
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Self

import redis

from fastbus.queue._common import (
    DEFAULT_PREFIX,
    AsyncHandle,
    Call,
    Cmd,
    ConsumerTagInUse,
    Many,
    Message,
    Op,
    SyncHandle,
    as_bytes,
    check_name,
    chunks,
    decode_items,
    id_key,
    namespace,
    pairs,
    positive_int,
    positive_seconds,
)

log = logging.getLogger("fastbus.queue")

__all__ = ["AsyncConsumer", "AsyncWorkQueue", "CleanResult", "Consumer", "QueueStats", "SettleResult", "WorkQueue"]

COUNTERS = ("put", "get", "ack", "reject", "requeue", "dead", "returned", "expired")
_NETWORK_ERRORS = (redis.ConnectionError, redis.TimeoutError, OSError)


@dataclass(slots=True)
class SettleResult:
    """What :meth:`Consumer.settle` did.  ``missing``: the messages given that
    this consumer did not hold (already settled, or returned to the queue
    after its heartbeat expired: another consumer may have them now)."""

    acked: int = 0
    rejected: int = 0
    requeued: int = 0
    dead: int = 0          # requeued ones that had reached max_deliveries: moved to failed
    missing: list = field(default_factory=list)


@dataclass(slots=True)
class CleanResult:
    """What a cleaner run did: messages back to ready, messages moved to
    failed (max deliveries reached) and dead consumers removed."""

    returned: int = 0
    dead: int = 0
    consumers: int = 0


@dataclass(slots=True)
class QueueStats:
    """A snapshot of one queue (or one logical consumer of a topic).

    ``unacked``: per consumer tag, what it holds; ``alive``: per tag, whether
    its heartbeat is current (a dead one's messages wait for the cleaner);
    ``totals``: running counts since the queue was made; ``rates``: per
    second, averaged over the last ``window`` whole seconds of server time."""

    name: str
    ready: int
    failed: int
    unacked: dict[str, int]
    alive: dict[str, bool]
    totals: dict[str, int]
    rates: dict[str, float]
    window: int

    def to_dict(self) -> dict:
        return asdict(self)


def queue_namespace(prefix: str, name: str) -> str:
    return namespace("q", prefix, check_name("queue name", name))


def _tag(tag: str | None) -> str:
    if tag is None:
        return f"{socket.gethostname().split('.')[0][:40]}-{os.getpid()}-{secrets.token_hex(4)}"
    return check_name("consumer tag", tag)


def _max_deliveries(value: Any) -> int:
    return 0 if value is None else positive_int("max_deliveries", value)


# -- the operations, once for both APIs


class _Space:
    """Operations on one queue namespace ``ns`` (a work queue, or a topic's
    logical consumer with bodies under ``body_ns``)."""

    def __init__(self, name: str, ns: str, body_ns: str, max_deliveries: int) -> None:
        self.name = name
        self.ns = ns
        self.ready = ns + "ready"
        self.body_ns = body_ns
        self.max = max_deliveries

    def put_many(self, payloads: list) -> Op:
        payloads = [as_bytes(p) for p in payloads]
        if not payloads:
            return []
        parts = list(chunks(payloads))
        firsts = yield Many([Call("PUT", self.ready, (self.ns, *part)) for part in parts])
        ids: list[int] = []
        for first, part in zip(firsts, parts):
            ids.extend(range(first, first + len(part)))
        return ids

    def put(self, payload: Any) -> Op:
        return (yield Call("PUT", self.ready, (self.ns, as_bytes(payload))))

    def peek(self, count: int, failed: bool) -> Op:
        positive_int("count", count)
        items = yield Cmd(("LRANGE", self.ns + ("failed" if failed else "ready"), 0, count - 1))
        return decode_items(items)

    def return_failed(self, count: int | None, ttl_ms: int = 0) -> Op:
        n = positive_int("count", count, allow_none=True) or 0
        return (yield Call("RETURN_FAILED", self.ready, (self.ns, n, self.body_ns, ttl_ms)))

    def purge(self, which: str) -> Op:
        if which not in ("ready", "failed"):
            raise ValueError(f"purge 'ready' or 'failed', not {which!r}")
        return (yield Call("PURGE", self.ready, (self.ns, which, self.body_ns)))

    def clean(self) -> Op:
        r = yield Call("CLEAN", self.ready, ("q", self.ns, self.max))
        return CleanResult(*r)

    def stats(self, window: int) -> Op:
        window = positive_int("window", window)
        if window > 100:
            raise ValueError(f"window is at most 100 seconds (rates are kept 120 s), not {window}")
        ready, failed, totals, cons, now, buckets = yield Call("STATS", self.ready, (self.ns, window))
        return _stats(self.name, ready, failed, totals, cons, now, buckets, window)


def _stats(name, ready, failed, totals, cons, now, buckets, window) -> QueueStats:
    unacked, alive = {}, {}
    for i in range(0, len(cons), 3):
        tag = cons[i].decode()
        unacked[tag] = int(cons[i + 1])
        alive[tag] = int(cons[i + 2]) > 0
    sums = dict.fromkeys(COUNTERS, 0)
    for i in range(0, len(buckets), 2):
        if int(buckets[i]) < now:               # whole seconds only
            for k, v in pairs(buckets[i + 1]).items():
                sums[k] = sums.get(k, 0) + v
    total = dict.fromkeys(COUNTERS, 0)
    total.update(pairs(totals))
    return QueueStats(name, int(ready), int(failed), unacked, alive, total,
                      {k: v / window for k, v in sums.items()}, window)


class _Holder:
    """One consumer's side of a namespace: its tag, token and heartbeat."""

    def __init__(self, space: _Space, tag: str | None, heartbeat_ttl: Any, clean_interval: Any,
                 owner: Any) -> None:
        heartbeat_ttl = positive_seconds("heartbeat_ttl", heartbeat_ttl)
        self.clean_interval = positive_seconds("clean_interval", clean_interval, allow_none=True)
        self.next_clean = time.monotonic() + (self.clean_interval or 0)
        self.space = space
        self.tag = _tag(tag)
        self.token = secrets.token_hex(12)
        self.ttl_ms = max(1, int(heartbeat_ttl * 1000))
        self.period = heartbeat_ttl / 3
        self.owner = owner

    def register(self) -> Op:
        s = self.space
        back, dead = yield Call("REGISTER", s.ready, (s.ns, self.tag, self.token, self.ttl_ms, s.body_ns, s.max))
        if back or dead:
            log.info("consumer %s of %s: %d messages a previous consumer with this tag held went back "
                     "to the queue, %d to failed", self.tag, s.name, back, dead)
        return CleanResult(back, dead, 0)

    def heartbeat(self) -> Op:
        s = self.space
        yield Call("HEARTBEAT", s.ready, (s.ns, self.tag, self.token, self.ttl_ms))

    def tick(self) -> Op:
        """What the consumer's thread (or task) does every ``period``: extend
        the heartbeat, and run the cleaner when it is due."""
        yield from self.heartbeat()
        if self.clean_interval is not None and time.monotonic() >= self.next_clean:
            self.next_clean = time.monotonic() + self.clean_interval
            r = yield from self.space.clean()
            if r.returned or r.dead:
                log.info("cleaner (consumer %s of %s): %s", self.tag, self.space.name, r)

    def failed(self, error: Exception) -> bool:
        """A tick failed: log it; True if the consumer lost its tag (stop beating)."""
        if isinstance(error, ConsumerTagInUse):
            log.error("consumer %s of %s lost its tag: %s", self.tag, self.space.name, error)
            return True
        if isinstance(error, _NETWORK_ERRORS):
            log.warning("consumer %s: heartbeat failed (%s); retrying", self.tag, error)
        else:
            log.error("consumer %s: heartbeat failed", self.tag, exc_info=error)
        return False

    def get_many(self, n: int, timeout: float | None) -> Op:
        positive_int("n", n)
        positive_seconds("timeout", timeout, allow_none=True, allow_zero=True)
        s = self.space
        deadline = None if timeout is None else time.monotonic() + timeout
        get = Call("GET", s.ready, (s.ns, self.tag, self.token, self.ttl_ms, n, s.body_ns))
        items = yield get
        while not items:
            wait = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            if wait <= 0:
                return []
            # Block until a producer's token arrives (no polling), and take
            # in the same round trip: the server runs the pipelined GET as
            # soon as BLPOP returns.  A token is only a hint, so the loop
            # waits again if another consumer was faster.  The 1 s slices
            # bound the wait for a token lost with a consumer that died
            # holding it.
            _token, items = yield Many([Cmd(("BLPOP", s.ns + "notify", max(0.01, round(wait, 3)))), get])
        return decode_items(items, self.owner)

    def settle(self, ack, reject, requeue) -> Op:
        ack, reject, requeue = list(ack), list(reject), list(requeue)
        given = ack + reject + requeue
        if not given:
            return SettleResult()
        keys = [id_key(m) for m in given]
        if len(set(keys)) != len(keys):
            raise ValueError("a message is given twice to settle")
        a, r = len(ack), len(ack) + len(reject)
        ids = (b"".join(keys[:a]), b"".join(keys[a:r]), b"".join(keys[r:]))
        s = self.space
        r = yield Call("SETTLE", s.ready, (s.ns, self.tag, self.token, self.ttl_ms, s.body_ns, s.max, *ids))
        missing = [given[i - 1] for i in r[4]]
        if missing:
            log.warning("consumer %s of %s: %d of %d messages settled were not held by it (its heartbeat "
                        "expired and they went back to the queue, or they were settled already)",
                        self.tag, s.name, len(missing), len(given))
        return SettleResult(r[0], r[1], r[2], r[3], missing)

    def release(self) -> Op:
        s = self.space
        r = yield Call("RELEASE", s.ready, (s.ns, self.tag, self.token, s.body_ns))
        return r[0]


# -- synchronous API


class Consumer:
    """One consumer of a queue (from :meth:`WorkQueue.consumer`).

    Registering refuses a tag that another live consumer holds
    (:class:`~fastbus.queue.ConsumerTagInUse`).  A daemon thread refreshes the
    heartbeat every ``heartbeat_ttl / 3`` seconds and, every
    ``clean_interval`` seconds (None: never), runs the cleaner for the whole
    queue.  :meth:`close` gives back what is held unacked (not counted as a
    delivery) and removes the consumer's keys.  Thread-safe."""

    def __init__(self, driver, space: _Space, tag: str | None, heartbeat_ttl: float,
                 clean_interval: float | None) -> None:
        self._driver = driver
        self._h = _Holder(space, tag, heartbeat_ttl, clean_interval, self)
        self._stop = threading.Event()
        self._closed = False
        self.lost: Exception | None = None   # set if another consumer took the tag
        driver.run(self._h.register())
        self._thread = threading.Thread(target=self._beat, name=f"fastbus-heartbeat-{self.tag}", daemon=True)
        self._thread.start()

    @property
    def tag(self) -> str:
        return self._h.tag

    def get(self, timeout: float | None = None) -> Message | None:
        """The next message, waiting up to ``timeout`` seconds (None: for
        ever, 0: not at all); None if there was none."""
        got = self._driver.run(self._h.get_many(1, timeout))
        return got[0] if got else None

    def get_many(self, n: int, timeout: float | None = None) -> list[Message]:
        """Up to ``n`` messages in one round trip: whatever is ready now,
        else waits up to ``timeout`` for the first ones (None: for ever)."""
        return self._driver.run(self._h.get_many(n, timeout))

    def settle(self, ack=(), reject=(), requeue=()) -> SettleResult:
        """Ack, reject (to the failed list) and requeue (to the head of the
        queue, counted as a delivery) messages in one atomic round trip."""
        return self._driver.run(self._h.settle(ack, reject, requeue))

    def ack(self, *messages) -> SettleResult:
        """Acknowledge: the messages are done and leave Redis."""
        return self.settle(ack=messages)

    def reject(self, *messages) -> SettleResult:
        """Move the messages to the queue's failed list."""
        return self.settle(reject=messages)

    def requeue(self, *messages) -> SettleResult:
        """Back to the head of the queue for another delivery (to the failed
        list instead once a message has had ``max_deliveries``)."""
        return self.settle(requeue=messages)

    def _beat(self) -> None:
        while not self._stop.wait(self._h.period):
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
        except _NETWORK_ERRORS as e:
            log.warning("consumer %s closed without giving back its messages (%s): the cleaner will, "
                        "once its heartbeat expires", self.tag, e)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
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
        self._space = _Space(self.name, queue_namespace(prefix, name), "", _max_deliveries(max_deliveries))
        super().__init__(redis)

    def put(self, payload: bytes) -> int:
        """Append one message; returns its id once the server has it."""
        return self._driver.run(self._space.put(payload))

    def put_many(self, payloads) -> list[int]:
        """Append many messages in one round trip (script calls of up to
        1000 messages, pipelined); returns their ids, in order, once the
        server has them all."""
        return self._driver.run(self._space.put_many(payloads))

    def consumer(self, tag: str | None = None, *, heartbeat_ttl: float = 15.0,
                 clean_interval: float | None = 30.0) -> Consumer:
        """Register a consumer (``tag`` None: host-pid-random)."""
        return Consumer(self._driver, self._space, tag, heartbeat_ttl, clean_interval)

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



class AsyncConsumer:
    """:class:`Consumer` for asyncio (from :meth:`AsyncWorkQueue.consumer`);
    the heartbeat is a task of the running loop."""

    def __init__(self, driver, space: _Space, tag: str | None, heartbeat_ttl: float,
                 clean_interval: float | None, before=None) -> None:
        self._driver = driver
        self._h = _Holder(space, tag, heartbeat_ttl, clean_interval, self)
        self._task: asyncio.Task | None = None
        self._before = before           # e.g. registering a topic's logical consumer
        self.lost: Exception | None = None

    async def start(self) -> Self:
        """Register (refusing a tag held by a live consumer) and start the heartbeat."""
        if self._task is not None:
            return self
        if self._before is not None:
            await self._before()
        await self._driver.run(self._h.register())
        self._task = asyncio.get_running_loop().create_task(self._beat())
        return self

    def __await__(self):
        return self.start().__await__()

    @property
    def tag(self) -> str:
        return self._h.tag

    async def get(self, timeout: float | None = None) -> Message | None:
        got = await self._driver.run(self._h.get_many(1, timeout))
        return got[0] if got else None

    async def get_many(self, n: int, timeout: float | None = None) -> list[Message]:
        return await self._driver.run(self._h.get_many(n, timeout))

    async def settle(self, ack=(), reject=(), requeue=()) -> SettleResult:
        return await self._driver.run(self._h.settle(ack, reject, requeue))

    async def ack(self, *messages) -> SettleResult:
        return await self.settle(ack=messages)

    async def reject(self, *messages) -> SettleResult:
        return await self.settle(reject=messages)

    async def requeue(self, *messages) -> SettleResult:
        return await self.settle(requeue=messages)

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self._h.period)
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
        except _NETWORK_ERRORS as e:
            log.warning("consumer %s closed without giving back its messages (%s)", self.tag, e)

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()


class AsyncWorkQueue(AsyncHandle):
    """:class:`WorkQueue` for asyncio: ``redis`` is a URL, a
    ``redis.asyncio`` client (plain or cluster) or None.  Consumers:
    ``async with q.consumer("w1") as c:`` (or ``c = await q.consumer(...)``)."""

    def __init__(self, name: str, redis: Any = None, *, max_deliveries: int | None = 10,
                 prefix: str = DEFAULT_PREFIX) -> None:
        self.name = check_name("queue name", name)
        self._space = _Space(self.name, queue_namespace(prefix, name), "", _max_deliveries(max_deliveries))
        super().__init__(redis)

    async def put(self, payload: bytes) -> int:
        return await self._driver.run(self._space.put(payload))

    async def put_many(self, payloads) -> list[int]:
        return await self._driver.run(self._space.put_many(payloads))

    def consumer(self, tag: str | None = None, *, heartbeat_ttl: float = 15.0,
                 clean_interval: float | None = 30.0) -> AsyncConsumer:
        return AsyncConsumer(self._driver, self._space, tag, heartbeat_ttl, clean_interval)

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
