"""The pub/sub client's behaviour, once for each twin.

Each test is written once, against the sync API, and runs twice (as
uvloop's tests run one base class against both loops): with
``fastbus.Client`` called directly, and with ``fastbus.aio.Client`` called
through an adapter that runs each call in one event loop (a coroutine is
awaited there; ``listen()`` is iterated there).  The assertions are the
same; only how the calls wait differs.  Real brokers in subprocesses.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time

import pytest
from brokers import STEADY_FILTER, free_port

import fastbus
import fastbus.aio
from fastbus.errors import ConnectionClosed


class SyncTwin:
    """The sync client, called directly; "later" is another thread."""

    name = "sync"

    def __init__(self) -> None:
        self.made: list = []
        self.timers: list[threading.Timer] = []

    def client(self, **kw):
        c = fastbus.Client(**kw)
        self.made.append(c)
        return c

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def later(self, delay: float, obj, method: str, *args) -> None:
        """Call ``obj.method(*args)`` after ``delay`` s, while the test waits."""
        t = threading.Timer(delay, getattr(obj, method), args)
        self.timers.append(t)
        t.start()

    def close(self) -> None:
        for t in self.timers:
            t.cancel()
            t.join(5)
        for c in self.made:
            c.close(timeout=1.0)


class _InLoop:
    """An aio object seen through the sync API: each call runs in the twin's
    loop (awaited if it is a coroutine); what it returns is wrapped again."""

    def __init__(self, raw, twin: AsyncTwin) -> None:
        self.raw = raw
        self._twin = twin

    def __getattr__(self, name):
        if name == "close" and isinstance(self.raw, fastbus.aio.PubSub):
            name = "aclose"                       # (close() is deprecated there, as in redis.asyncio)
        value = getattr(self.raw, name)
        if not callable(value):
            return value
        if inspect.isasyncgenfunction(value):
            return lambda *a, **k: self._twin.iterate(value(*a, **k))
        return lambda *a, **k: self._twin.run(value, *a, **k)


class AsyncTwin:
    """The asyncio twin, called through one event loop; "later" is a
    callback of that loop (it runs while the test's call is waiting)."""

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
        return _InLoop(out, self) if isinstance(out, (fastbus.aio.Client, fastbus.aio.PubSub)) else out

    def iterate(self, agen):
        while True:
            try:
                yield self.loop.run_until_complete(agen.__anext__())
            except StopAsyncIteration:
                return

    def client(self, **kw):
        c = self.run(fastbus.aio.Client, **kw)
        self.made.append(c)
        return c

    def sleep(self, seconds: float) -> None:
        self.loop.run_until_complete(asyncio.sleep(seconds))

    def later(self, delay: float, obj, method: str, *args) -> None:
        if method == "close" and isinstance(obj.raw, fastbus.aio.PubSub):
            method = "aclose"
        fn = getattr(obj.raw, method)

        def fire():
            r = fn(*args)
            if inspect.isawaitable(r):
                self.loop.create_task(r)
        self.loop.call_later(delay, fire)

    def close(self) -> None:
        for c in self.made:
            c.close(timeout=1.0)
        self.loop.run_until_complete(asyncio.sleep(0))
        self.loop.close()


@pytest.fixture(params=["sync", "async"])
def twin(request, brokers):
    """Each test runs once per twin (the brokers outlive the clients)."""
    t = SyncTwin() if request.param == "sync" else AsyncTwin()
    yield t
    t.close()


# -- helpers through the twin (a wait lets the loop run) -----------------------

def wait_until(twin, predicate, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        twin.sleep(0.01)


def confirms(p, n: int) -> list:
    got = []
    while len(got) < n:
        m = p.get_message(timeout=5)
        assert m is not None, f"only {len(got)} of {n} confirmations"
        got.append(m)
    return got


def data_messages(p, n: int, timeout: float = 10.0) -> list:
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        m = p.get_message(timeout=0.1)
        if m is not None and m["type"] in ("message", "pmessage"):
            out.append(m)
    return out


def wanted(twin, c, *channels) -> None:
    wait_until(twin, lambda: c.stats()["filter_active"] and all(c.is_wanted(ch) for ch in channels),
               f"the publisher to want {channels}")


# -- the behaviour -------------------------------------------------------------

def test_publish_subscribe_confirm(twin, brokers):
    b = brokers(*STEADY_FILTER)
    c = twin.client(endpoint=b.endpoint)
    p = c.pubsub()
    p.subscribe("a", "b")
    assert [(m["type"], m["channel"], m["data"]) for m in confirms(p, 2)] == [
        ("subscribe", b"a", 1), ("subscribe", b"b", 2)]
    assert p.subscribed and set(p.channels) == {b"a", b"b"}
    wanted(twin, c, "a", "b")
    assert c.publish("a", b"1") == 1
    assert c.publish("b", "2") == 1                       # str is sent as UTF-8
    assert c.publish("nobody", b"x") == 0                 # the broker's filter: not sent
    c.flush()
    got = data_messages(p, 2)
    assert [(m["type"], m["pattern"], m["channel"], m["data"]) for m in got] == [
        ("message", None, b"a", b"1"), ("message", None, b"b", b"2")]
    assert c.stats()["filtered"] == 1
    p.unsubscribe("a")
    assert confirms(p, 1) == [{"type": "unsubscribe", "pattern": None, "channel": b"a", "data": 1}]
    wait_until(twin, lambda: not c.is_wanted("a"), "the filter to drop a")
    assert c.publish("a", b"no") == 0
    c.publish("b", b"yes")
    c.flush()
    assert [m["data"] for m in data_messages(p, 1)] == [b"yes"]
    assert p.get_message(timeout=0.2) is None             # nothing else, nothing twice


def test_patterns_deliver_once_with_the_longest_pattern(twin, brokers):
    b = brokers(*STEADY_FILTER)
    c = twin.client(endpoint=b.endpoint, decode_responses=True)
    p = c.pubsub(ignore_subscribe_messages=True)
    p.subscribe("n.a")
    p.psubscribe("n.*", "n.b*")
    wait_until(twin, lambda: p.get_message(timeout=0) is None and p.subscribed, "confirmations")
    wanted(twin, c, "n.a", "n.b", "n.c")
    for ch, data in [("n.a", "1"), ("n.bx", "2"), ("n.c", "3"), ("m", "4")]:
        c.publish(ch, data)
    c.flush()
    got = [(m["type"], m["pattern"], m["channel"], m["data"]) for m in data_messages(p, 3)]
    assert got == [("message", None, "n.a", "1"), ("pmessage", "n.b*", "n.bx", "2"),
                   ("pmessage", "n.*", "n.c", "3")]
    p.punsubscribe()
    wait_until(twin, lambda: not p.patterns, "the patterns to go")
    wait_until(twin, lambda: not c.is_wanted("n.c"), "the filter to drop n.*")
    assert c.publish("n.c", "gone") == 0


def test_get_message_and_get_batch_timeouts(twin, brokers):
    b = brokers()
    c = twin.client(endpoint=b.endpoint)
    p = c.pubsub()
    p.subscribe("t")
    confirms(p, 1)
    t0 = time.monotonic()
    assert p.get_message(timeout=0) is None
    assert time.monotonic() - t0 < 0.1                    # 0: does not wait
    for call in (lambda: p.get_message(timeout=0.3), lambda: p.get_batch(timeout=0.3)):
        t0 = time.monotonic()
        assert call() in (None, [])
        took = time.monotonic() - t0
        assert 0.25 <= took < 2.0, took                   # waits the timeout, then returns
    wanted(twin, c, "t")
    c.publish_many([("t", b"%d" % i) for i in range(100)])
    c.flush()
    batch = []
    deadline = time.monotonic() + 10
    while len(batch) < 100 and time.monotonic() < deadline:
        batch += p.get_batch(timeout=1, max_messages=30)
    assert batch == [(b"t", b"%d" % i) for i in range(100)]    # in order, each once
    with pytest.raises(ValueError):
        p.get_batch(timeout=0, max_messages=0)


def test_close_releases_a_waiting_reader(twin, brokers):
    b = brokers()
    c = twin.client(endpoint=b.endpoint)
    p = c.pubsub()
    p.subscribe("r")
    confirms(p, 1)
    twin.later(0.3, p, "close")
    t0 = time.monotonic()
    assert list(p.listen()) == []                         # ends when closed, without a message
    assert time.monotonic() - t0 < 5
    assert p.closed
    with pytest.raises(ConnectionClosed):
        p.get_message(timeout=None)
    p.subscribe("again")                                  # as redis-py: a closed PubSub connects again
    confirms(p, 1)
    assert not p.closed and p.subscribed
    p.close()
    # A reader blocked with no timeout, released by the client's close.
    q = c.pubsub()
    q.subscribe("s")
    confirms(q, 1)
    twin.later(0.3, c, "close", 1.0)
    t0 = time.monotonic()
    with pytest.raises(ConnectionClosed):
        while True:
            q.get_message(timeout=None)
    assert time.monotonic() - t0 < 5
    assert c.closed and q.closed
    with pytest.raises(ConnectionClosed):
        c.publish("x", b"y")
    with pytest.raises(ConnectionClosed):
        c.flush()


def test_flush_confirms_and_times_out(twin, brokers):
    b = brokers(*STEADY_FILTER)
    c = twin.client(endpoint=b.endpoint)
    p = c.pubsub()
    p.subscribe("f")
    confirms(p, 1)
    wanted(twin, c, "f")
    assert c.publish_many([("f", b"%d" % i) for i in range(500)] + [("nobody", b"x")]) == 500
    c.flush(timeout=10)
    assert c.broker_stats()["messages_in"] == 500         # flushed: the broker has them all
    assert c.stats()["queued"] == 0
    lost = twin.client(endpoint=f"tcp://127.0.0.1:{free_port()}")     # nobody there
    lost.publish("f", b"x")
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        lost.flush(timeout=0.3)
    assert time.monotonic() - t0 < 3
    lost.shutdown(0.2)
    assert lost.closed
