"""The Redis-side twins' behaviour, once for each twin.

As tests/test_twins_behaviour.py does for the pub/sub client: each test is
written once, against the sync API (``WorkQueue``, ``Topic``, ``Inbox``,
``BufferedListProducer``), and runs twice: with the sync class called
directly, and with its asyncio twin (``AsyncWorkQueue``, ``AsyncTopic``,
``AsyncInbox``, ``AsyncBufferedListProducer``) called through an adapter
that runs each call in one event loop (a coroutine, or an awaitable such
as an ``AsyncConsumer``, is awaited there).  The assertions are the same;
only how the calls wait differs.  A real Redis-compatible server.
"""

from __future__ import annotations

import asyncio
import inspect
import time

import pytest
import redis as redis_py

from fastbus.queue import AsyncConsumer, AsyncInbox, AsyncTopic, AsyncWorkQueue, Inbox, Topic, WorkQueue
from fastbus.redis import AsyncBufferedListProducer, BufferedListProducer

TWINS = {WorkQueue: AsyncWorkQueue, Topic: AsyncTopic, Inbox: AsyncInbox,
         BufferedListProducer: AsyncBufferedListProducer}
ASYNC_OBJECTS = (*TWINS.values(), AsyncConsumer)


class SyncTwin:
    name = "sync"

    def __init__(self) -> None:
        self.made: list = []

    def make(self, cls, *args, **kw):
        obj = cls(*args, **kw)
        self.made.append(obj)
        return obj

    def close(self) -> None:
        for obj in self.made:
            obj.close()


class _InLoop:
    """An asyncio object seen through the sync API: each call runs in the
    twin's loop (awaited if awaitable); a fastbus asyncio object it returns
    is wrapped again."""

    def __init__(self, raw, twin: AsyncTwin) -> None:
        self.raw = raw
        self._twin = twin

    def __getattr__(self, name):
        value = getattr(self.raw, name)
        if not callable(value):
            return value
        return lambda *a, **k: self._twin.run(value, *a, **k)


class AsyncTwin:
    name = "async"

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.made: list = []

    def run(self, fn, *args, **kw):
        async def call():
            r = fn(*args, **kw)
            if inspect.isawaitable(r):
                r = await r
            return r
        out = self.loop.run_until_complete(call())
        if isinstance(out, ASYNC_OBJECTS):
            return _InLoop(out, self)
        return out

    def make(self, cls, *args, **kw):
        obj = self.run(TWINS[cls], *args, **kw)
        self.made.append(obj)
        return obj

    def close(self) -> None:
        for obj in self.made:
            obj.close()
        self.loop.run_until_complete(asyncio.sleep(0))
        self.loop.close()


@pytest.fixture(params=[SyncTwin, AsyncTwin], ids=lambda t: t.name)
def twin(request):
    t = request.param()
    try:
        yield t
    finally:
        t.close()


def test_work_queue_settles_every_way(twin, redis_url):
    q = twin.make(WorkQueue, "twin-jobs", redis_url, max_deliveries=3)
    ids = q.put_many([b"job-%d" % i for i in range(10)])
    assert len(ids) == 10 and ids == sorted(ids)
    c = q.consumer("worker-1", heartbeat_ttl=5.0, clean_interval=None)
    got = c.get_many(10, timeout=1.0)
    assert [m.payload for m in got] == [b"job-%d" % i for i in range(10)]
    assert all(m.deliveries == 1 for m in got)
    c.ack(*got[:5])
    c.reject(*got[5:7])
    c.requeue(*got[7:])
    st = q.stats()
    assert (st.ready, st.failed) == (3, 2)
    assert [m.payload for m in q.peek(10, failed=True)] == [b"job-5", b"job-6"]
    again = c.get_many(10, timeout=1.0)
    assert sorted(m.payload for m in again) == [b"job-7", b"job-8", b"job-9"]
    assert all(m.deliveries == 2 for m in again)
    c.ack(*again)
    assert q.return_failed() == 2
    back = c.get_many(10, timeout=1.0)
    assert sorted(m.payload for m in back) == [b"job-5", b"job-6"]
    c.ack(*back)
    t0 = time.monotonic()
    assert c.get(timeout=0.3) is None                   # empty: waits its timeout, no longer
    assert 0.25 <= time.monotonic() - t0 < 3.0
    c.close()


def test_topic_gives_each_logical_consumer_everything(twin, redis_url):
    t = twin.make(Topic, "twin-events", redis_url)
    assert t.register("billing") is True and t.register("audit") is True
    assert sorted(t.consumers()) == ["audit", "billing"]
    ids = t.publish_many([b"e%d" % i for i in range(5)])
    assert t.last_id() == ids[-1]
    billing = t.consumer("billing", heartbeat_ttl=5.0, clean_interval=None)
    got = billing.get_many(10, timeout=1.0)
    assert [m.payload for m in got] == [b"e%d" % i for i in range(5)]
    billing.ack(*got)
    assert [m.payload for m in t.read(ids[1], ids[2])] == [b"e1", b"e2"]
    # audit skips ahead without reading
    t.ack_upto("audit", ids[3])
    assert t.position("audit") == ids[3]
    audit = t.consumer("audit", heartbeat_ttl=5.0, clean_interval=None)
    assert [m.payload for m in audit.get_many(10, timeout=1.0)] == [b"e4"]
    with pytest.raises(ValueError):
        t.ack_upto("audit", ids[-1] + 100)             # past the last id
    billing.close()
    audit.close()


def test_inbox_keeps_each_message_pending_for_every_member_until_acked(twin, redis_url):
    box = twin.make(Inbox, "twin-chat", redis_url)
    box.create(["ann", "bob", "cy"])
    assert sorted(box.members()) == ["ann", "bob", "cy"]
    first = box.send("ann", b"hello")
    box.send("bob", b"hi ann")
    bob = box.fetch_pending("bob")
    assert [(m.sender, m.payload) for m in bob] == [("ann", b"hello"), ("bob", b"hi ann")]
    cy = box.fetch_pending("cy")
    assert [m.payload for m in cy] == [b"hello", b"hi ann"]
    box.ack("cy", first)
    assert [m.payload for m in box.fetch_pending("cy")] == [b"hi ann"]
    assert box.leave("cy") is True
    assert sorted(box.members()) == ["ann", "bob"]


def test_list_producer_writes_every_push_in_order(twin, redis_url):
    p = twin.make(BufferedListProducer, redis_url)
    for i in range(500):
        p.push("twin-list", b"v%d" % i)
    p.flush(timeout=10)
    stats = p.stats()
    assert stats["published"] == 500 and stats["errors"] == 0 and stats["buffered"] == 0
    r = redis_py.Redis.from_url(redis_url)
    try:
        assert r.lrange("twin-list", 0, -1) == [b"v%d" % i for i in range(500)]
    finally:
        r.close()


def test_a_worker_loop_survives_a_forgotten_script_and_a_killed_connection(twin, redis_url):
    """Both twins send script calls and get(ack=)'s pipelined pair on a
    connection they keep of the client's pool: a server that forgot the
    scripts (SCRIPT FLUSH, as a restart does) has them loaded again, and a
    connection the server closed while it was idle (CLIENT KILL, its idle
    timeout) is connected again before the call, not failed by it."""
    admin = redis_py.Redis.from_url(redis_url)
    q = twin.make(WorkQueue, "twin-kept", redis_url)
    q.put_many([b"a", b"b", b"c"])
    c = q.consumer("worker-1", heartbeat_ttl=5.0, clean_interval=None)
    m = c.get(timeout=1.0)
    assert m.payload == b"a"
    admin.script_flush()
    m = c.get(timeout=1.0, ack=m)                   # ACK1 + GET1 pipelined, both loaded again
    assert m.payload == b"b"
    assert admin.client_kill_filter(_type="normal", skipme=True) >= 1
    time.sleep(0.2)                                 # (closed while idle: its end has reached us)
    m = c.get(timeout=1.0, ack=m)                   # on a connection made again
    assert m.payload == b"c"
    admin.script_flush()
    c.ack(m)                                        # a lone script call, loaded again
    st = q.stats()
    assert (st.ready, st.totals["ack"]) == (0, 3)
    c.close()
    admin.close()


def test_async_queues_made_from_a_url_work_in_one_event_loop_after_another(redis_url):
    """A redis.asyncio client's connections belong to the event loop that
    opened them: an AsyncWorkQueue or AsyncTopic made from a URL (its
    client its own) makes a new one for a loop that follows a closed one
    (a script's second asyncio.run(), a test framework's loop per test),
    and nothing put in one loop is lost to the next."""
    q = AsyncWorkQueue("twin-loops", redis_url)
    t = AsyncTopic("twin-loops-events", redis_url)

    async def put(i: int) -> None:
        await q.put(b"%d" % i)
        await t.publish(b"%d" % i)

    async def take() -> tuple[list[bytes], list[bytes]]:
        got = []
        async with q.consumer("w") as c:
            m = await c.get(timeout=1.0)
            while m is not None:
                got.append(m.payload)
                m = await c.get(timeout=0.2, ack=m)
        seen = [m.payload for m in await t.read(1, await t.last_id())]
        return got, seen

    asyncio.run(t.register("reader"))
    for i in range(3):
        asyncio.run(put(i))                          # each in a loop of its own
    got, seen = asyncio.run(take())
    assert got == [b"0", b"1", b"2"] and seen == [b"0", b"1", b"2"]
    asyncio.run(q.close())
    asyncio.run(t.close())
