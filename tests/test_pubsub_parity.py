"""redis-py parity of the pub/sub API (issue 17 item 3) and the one message
model (issue 18 item 2), against real broker processes and a real
Redis-compatible server.

(This file is over 700 lines because it checks redis-py's pub/sub API call
by call on fastbus and on a real Redis side by side, which is one list to
keep complete.)
"""

import asyncio
import threading
import time

import pytest
import zmq
from brokers import STEADY_FILTER, confirm, wait_for, wait_wanted

import fastbus
import fastbus.aio
from fastbus import _messages as M
from fastbus.errors import NoHandlerError
from fastbus.redis import Subscriber


# -- the one rule for bytes --------------------------------------------------

def test_one_bytes_rule_for_every_subscriber():
    assert M.to_bytes(b"a") == b"a" and M.to_bytes("é") == "é".encode()
    assert M.to_bytes(bytearray(b"x")) == b"x" and M.to_bytes(memoryview(b"y")) == b"y"
    assert M.to_bytes(42) == b"42" and M.to_bytes(1.5) == b"1.5"          # redis-py's rule
    for bad in (True, None, object()):
        with pytest.raises(TypeError):
            M.to_bytes(bad)
    from fastbus.client import to_key
    from fastbus.redis import subscriber
    assert to_key is M.to_bytes and subscriber._name is M.to_bytes
    assert M.pattern_prefix("news.*") == b"news."
    c = fastbus.Client(endpoint="tcp://127.0.0.1:1")     # publish (the C core) follows the same rule
    try:
        assert c.publish(42, 1.5) == 1
        with pytest.raises(TypeError):
            c.publish(True, b"x")
    finally:
        c.shutdown(0.5)
    assert M.pattern_prefix("n?ws.*") == b"n" and M.pattern_prefix("user.*.events") == b"user."


def test_message_buffer_keeps_order_between_the_two_reads():
    buf = M.MessageBuffer()
    buf.dicts.extend([M.message(b"a", b"1"), M.confirmation("subscribe", b"b", 2), M.message(b"c", b"3")])
    assert buf.next_batch(None) == [(b"a", b"1"), (b"c", b"3")]
    assert buf.next_message(True, M.message) is None                      # the confirmation is skipped
    buf.pairs.extend([(b"x", b"1"), (b"y", b"2")])
    buf.notices.append(M.gap(lost=3))
    assert buf.next_message(False, M.message)["data"] == {"lost": 3, "down_s": None}
    assert buf.next_batch(1) == [(b"x", b"1")]
    assert buf.next_message(False, M.message) == M.message(b"y", b"2")
    assert not buf


# -- fastbus.Client / PubSub -------------------------------------------------

def test_handlers_get_their_messages_and_get_message_the_rest(brokers):
    b = brokers()
    with fastbus.Client(endpoint=b.endpoint) as c:
        p = c.pubsub(ignore_subscribe_messages=True)
        seen = []
        p.subscribe("plain", **{"h": seen.append})
        p.psubscribe(**{"hp.*": seen.append})
        assert set(p.channels) == {b"plain", b"h"} and p.channels[b"h"] is not None
        p.ping()
        wait_for(lambda: p.get_message(timeout=0.1) is not None, what="pong")
        wait_wanted(c, "plain", "h", "hp.1")
        c.publish("h", b"1")
        c.publish("hp.1", b"2")
        c.publish("plain", b"3")
        c.flush()
        got = []
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            m = p.get_message(timeout=0.5)
            if m is not None:
                got.append(m)
        assert [(m["type"], m["channel"], m["data"]) for m in got] == [("message", b"plain", b"3")]
        assert [(m["type"], m["pattern"], m["channel"], m["data"]) for m in seen] == [
            ("message", None, b"h", b"1"), ("pmessage", b"hp.*", b"hp.1", b"2")]
        with pytest.raises(TypeError):
            p.subscribe(**{"x": "not callable"})
        p.close()


def test_run_in_thread_with_stop_and_exception_handler(brokers):
    b = brokers()
    with fastbus.Client(endpoint=b.endpoint) as c:
        p = c.pubsub()
        p.subscribe("nohandler")
        with pytest.raises(NoHandlerError):
            p.run_in_thread()
        p.unsubscribe("nohandler")
        got, errors = [], []
        done = threading.Event()

        def handler(m):
            got.append(m["data"])
            if m["data"] == b"boom":
                raise RuntimeError("boom")
            if len(got) == 3:
                done.set()

        p.subscribe(**{"t": handler})
        confirm(p, 2)
        t = p.run_in_thread(sleep_time=0.05, daemon=True,
                            exception_handler=lambda exc, ps, th: errors.append((str(exc), ps, th)))
        assert t.is_alive() and t.daemon
        wait_wanted(c, "t")
        for d in (b"a", b"boom", b"c"):
            c.publish("t", d)
        c.flush()
        assert done.wait(10)
        assert got == [b"a", b"boom", b"c"]
        assert errors == [("boom", p, t)]
        t.stop()
        t.join(5)
        assert not t.is_alive() and p.closed


def test_ping_and_health_check_interval(brokers):
    b = brokers()
    with fastbus.Client(endpoint=b.endpoint, health_check_interval=0.5) as c:
        assert c.ping() is True
        p = c.pubsub()
        p.ping("hi")
        m = p.get_message(timeout=5)
        assert m == {"type": "pong", "pattern": None, "channel": None, "data": b"hi"}
        p.ping()
        assert p.get_message(timeout=5)["data"] == b""
        p.close()
    with pytest.raises(ValueError):
        fastbus.Client(endpoint=b.endpoint, health_check_interval=100)


def test_decode_responses_keys_subscribed_and_with_block(brokers):
    b = brokers()
    with fastbus.Client(endpoint=b.endpoint, decode_responses=True) as c:
        with c.pubsub() as p:
            assert not p.subscribed
            p.subscribe("a", b"b")
            p.psubscribe("p.*")
            assert set(p.channels) == {"a", "b"} and set(p.patterns) == {"p.*"}
            ms = confirm(p, 3)
            assert [(m["type"], m["channel"], m["data"]) for m in ms] == [
                ("subscribe", "a", 1), ("subscribe", "b", 2), ("psubscribe", "p.*", 3)]
            p.unsubscribe()
            p.punsubscribe()
            assert p.channels == {} and p.patterns == {}
            assert p.subscribed                                   # until the confirmations are read
            ms = confirm(p, 3)
            assert [m["data"] for m in ms] == [2, 1, 0]
            assert not p.subscribed
            p.subscribe("c")
            assert p.subscribed
        assert p.channels == {} and p.patterns == {} and not p.subscribed   # leaving ``with``


def test_decode_responses_keeps_a_message_that_is_not_utf8_as_bytes(brokers):
    """One payload that is not UTF-8 in a batch of good ones: it stays
    bytes, and the messages around it arrive (it raised for the whole
    batch, which was then lost)."""
    b = brokers()
    with fastbus.Client(endpoint=b.endpoint, decode_responses=True) as c, \
            c.pubsub(ignore_subscribe_messages=True) as p:
        p.subscribe("x")
        wait_wanted(c, "x")
        for data in (b"one", b"\xff\xfe", "dr\u00fcben".encode(), b"four"):
            c.publish("x", data)
        c.flush()
        got = []
        while len(got) < 4:
            m = p.get_message(timeout=5)
            assert m is not None, got
            got.append((m["channel"], m["data"]))
        assert got == [("x", "one"), ("x", b"\xff\xfe"), ("x", "dr\u00fcben"), ("x", "four")]


def test_subscribe_after_close_connects_again(brokers):
    b = brokers()
    with fastbus.Client(endpoint=b.endpoint) as c:
        p = c.pubsub()
        p.subscribe("x")
        confirm(p, 1)
        p.close()
        assert p.closed and p.channels == {}
        p.unsubscribe("x")                                        # nothing held: nothing to do
        p.subscribe("y")
        assert not p.closed
        assert confirm(p, 1)[0]["channel"] == b"y"
        wait_wanted(c, "y")
        c.publish("y", b"again")
        c.flush()
        m = p.get_message(timeout=5)
        assert m["channel"] == b"y" and m["data"] == b"again"
        p.close()
    with pytest.raises(fastbus.ConnectionClosed):
        p.subscribe("z")                                          # the client itself is closed


def test_sharded_confirmations_in_call_order_with_a_running_count(brokers):
    bs = [brokers() for _ in range(3)]
    with fastbus.ShardedClient([b.endpoint for b in bs]) as c:
        # The brokers' ports are random, so which shard a name lands on is
        # too: take four names that span at least two shards, in order.
        names = [f"ch{i}" for i in range(200)]
        first = c.shard(names[0])
        other = next(n for n in names if c.shard(n) != first)
        chans = [n for n in names if n != other][:3] + [other]
        assert len({c.shard(ch) for ch in chans}) > 1
        with c.pubsub() as p:
            p.subscribe(*chans)
            p.psubscribe("room.*")
            ms = confirm(p, 5)
            assert [(m["type"], m["channel"], m["data"]) for m in ms] == [
                ("subscribe", ch.encode(), i + 1) for i, ch in enumerate(chans)
            ] + [("psubscribe", b"room.*", 5)]
            p.unsubscribe()
            p.punsubscribe()
            assert p.subscribed
            ms = confirm(p, 5)
            assert [m["data"] for m in ms] == [4, 3, 2, 1, 0]
            assert [m["type"] for m in ms] == ["unsubscribe"] * 4 + ["punsubscribe"]
            assert not p.subscribed


# -- the async twin ----------------------------------------------------------

def test_async_twin_handlers_ping_run_in_thread_and_reconnect(brokers):
    b = brokers()

    async def main():
        async with fastbus.aio.Client(endpoint=b.endpoint) as c:
            assert await c.ping() is True
            p = c.pubsub()
            seen = []
            await p.subscribe(**{"a": seen.append})
            await p.ping(b"x")
            ms = [await p.get_message(timeout=5) for _ in range(2)]
            assert [m["type"] for m in ms] == ["subscribe", "pong"]
            task = await p.run_in_thread(sleep_time=0.05)
            while not c.is_wanted("a"):
                await asyncio.sleep(0.01)
            await c.publish("a", b"1")
            await c.flush()
            for _ in range(500):
                if seen:
                    break
                await asyncio.sleep(0.01)
            assert [m["data"] for m in seen] == [b"1"]
            task.stop()
            await asyncio.wait_for(task, 5)
            assert p.closed
            await p.subscribe("b")                                # connects again, driven by the loop
            m = await p.get_message(timeout=5)
            assert m["type"] == "subscribe" and m["channel"] == b"b"
            await p.aclose()

    asyncio.run(main())


# -- the Redis subscriber: the same model ---------------------------------------

def test_redis_subscriber_gap_has_the_one_shape(redis_server, redis_url):
    with Subscriber(redis_url, reconnect_max_delay=0.2) as sub:
        sub.subscribe("g", 7)                                     # numbers as redis-py
        ms = [sub.get_message(timeout=5) for _ in range(2)]
        assert [(m["type"], m["channel"]) for m in ms] == [("subscribe", b"g"), ("subscribe", b"7")]
        redis_server.stop()
        redis_server.start()
        deadline = time.monotonic() + 15
        m = None
        while time.monotonic() < deadline:
            m = sub.get_message(timeout=0.5)
            if m is not None and m["type"] == "gap":
                break
        assert m is not None and m["type"] == "gap"
        assert set(m["data"]) == {"lost", "down_s"} and m["data"]["lost"] is None and m["data"]["down_s"] >= 0


def test_a_bool_is_a_type_error_here_and_the_readme_lists_that_redis_py_says_data_error():
    """redis-py refuses a bool with its DataError (a RedisError, not a
    TypeError); fastbus's pub/sub with TypeError: a difference the README's
    table of differences from redis-py must list."""
    import pathlib

    import redis
    with pytest.raises(redis.exceptions.DataError):
        redis.Redis().connection_pool.get_encoder().encode(True)
    c = fastbus.Client(endpoint="tcp://127.0.0.1:1")
    try:
        with pytest.raises(TypeError):
            c.publish("ch", True)
        with pytest.raises(TypeError):
            c.pubsub().subscribe(True)
    finally:
        c.shutdown(0.5)
    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = readme[readme.index("| redis-py | fastbus |"):]
    table = table[:table.index("\n\n")]
    assert any("bool" in row and "DataError" in row and "TypeError" in row for row in table.splitlines()), table


# -- what redis-py users pass and expect (issue 23 item 2, 4) --------------------

def test_redis_py_connection_keywords_are_accepted(brokers):
    """Code written for redis.Redis passes these; each means what it means
    here (the docstring of fastbus.Client says which are ignored)."""
    import redis
    b = brokers()
    with fastbus.Client(endpoint=b.endpoint, socket_timeout=3.5, socket_connect_timeout=2.0,
                        retry=redis.retry.Retry(redis.backoff.NoBackoff(), 3), retry_on_timeout=True,
                        retry_on_error=[ConnectionError], health_check_interval=2, client_name="kw",
                        socket_keepalive=True) as c:
        assert c.options.subscribe_timeout == 3.5 and c.options.socket_connect_timeout == 2.0
        assert c.options.ping_interval == 2 and c.name == "kw"
        p = c.pubsub()
        p.subscribe("k")
        assert p.get_message(timeout=5)["type"] == "subscribe"
    with pytest.raises(ValueError, match="client_name"):
        fastbus.Client(endpoint=b.endpoint, name="a", client_name="b")


def test_an_endpoint_as_the_first_argument_and_a_trailing_slash(brokers):
    b = brokers()
    with fastbus.Client(b.endpoint) as c:                 # redis-py's host position
        assert c.endpoint == b.endpoint
        assert c.ping() is True
    with pytest.raises(ValueError, match="port"):
        fastbus.Client(b.endpoint, 7000)
    with pytest.raises(ValueError, match="twice"):
        fastbus.Client(b.endpoint, endpoint=b.endpoint)
    for bad in (b.endpoint + "/", b.endpoint + "?x", "tcp://u@127.0.0.1:1"):
        with pytest.raises(fastbus.errors.InvalidEndpoint, match="nothing after the port"):
            fastbus.Client(endpoint=bad)


def test_publish_many_checks_every_pair_before_sending_any(brokers):
    b = brokers(*STEADY_FILTER)
    with fastbus.Client(endpoint=b.endpoint) as pub, fastbus.Client(endpoint=b.endpoint) as sub:
        p = sub.pubsub(ignore_subscribe_messages=True)
        p.subscribe("m")
        wait_wanted(pub, "m")
        for bad in ([("m", b"1"), ("m", True)], [("m", b"1"), ("m",)], [("m", b"1"), 7]):
            with pytest.raises(TypeError):
                pub.publish_many(bad)
        assert pub.stats()["published"] == 0                      # nothing queued
        assert pub.publish_many([("m", b"a"), ("m", b"b"), ("nobody", b"c")]) == 2
        pub.flush()
        got = []
        deadline = time.monotonic() + 5
        while len(got) < 2 and time.monotonic() < deadline:
            got += p.get_batch(timeout=0.5)
        assert got == [(b"m", b"a"), (b"m", b"b")]

    async def aio():
        async with fastbus.aio.Client(endpoint=b.endpoint) as c:
            with pytest.raises(TypeError):
                await c.publish_many([("m", b"1"), ("m", None)])
            assert c.stats()["published"] == 0

    asyncio.run(aio())


def test_listen_ends_when_nothing_is_subscribed(brokers):
    b = brokers()
    with fastbus.Client(endpoint=b.endpoint) as c:
        p = c.pubsub()
        assert list(p.listen()) == []                            # nothing subscribed: nothing to wait for
        p.subscribe("a", "b")
        p.unsubscribe()
        kinds = [m["type"] for m in p.listen()]
        assert kinds == ["subscribe", "subscribe", "unsubscribe", "unsubscribe"]
        q = c.pubsub(ignore_subscribe_messages=True)             # the confirmations are not returned
        q.subscribe("c")
        threading.Timer(0.2, q.unsubscribe).start()
        t0 = time.monotonic()
        assert list(q.listen()) == []
        assert time.monotonic() - t0 < 5
        q.check_health()
        q.close()
        with pytest.raises(fastbus.errors.ConnectionClosed):
            q.check_health()


def test_subscription_objects_and_async_handlers(brokers):
    """redis-py's Subscription(name, handler) objects; a coroutine handler
    is awaited by the asyncio PubSub and refused by the sync one."""
    import redis
    b = brokers()
    with fastbus.Client(endpoint=b.endpoint) as c:
        p = c.pubsub()
        seen = []
        p.subscribe(redis.Subscription("h", seen.append), redis.Subscription("plain"))
        assert p.channels == {b"h": seen.append, b"plain": None}

        async def coro(m):
            pass
        with pytest.raises(TypeError, match="coroutine"):
            p.subscribe(x=coro)
        p.close()

    async def main():
        async with fastbus.aio.Client(endpoint=b.endpoint) as c:
            p = c.pubsub()
            with pytest.raises(RuntimeError, match="subscribe"):
                await p.get_message()                             # as redis.asyncio: not connected yet
            with pytest.raises(RuntimeError):
                await p.check_health()
            got = []

            async def handler(m):
                await asyncio.sleep(0)                            # a real coroutine
                got.append(m["data"])
            await p.subscribe(redis.Subscription("ah", handler), **{"bh": handler})
            await p.psubscribe(**{"p.*": handler})
            await p.check_health()
            while not all(c.is_wanted(ch) for ch in ("ah", "bh", "p.x")):
                await asyncio.sleep(0.01)
            task = asyncio.create_task(p.run(poll_timeout=0.05))
            for ch in ("ah", "bh", "p.x", "ah"):
                await c.publish(ch, ch.encode())
            await c.flush()
            for _ in range(500):
                if len(got) == 4:
                    break
                await asyncio.sleep(0.01)
            assert got == [b"ah", b"bh", b"p.x", b"ah"]               # awaited, in order
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            errors = []
            await p.subscribe(**{"boom": lambda m: 1 / 0})
            while not c.is_wanted("boom"):
                await asyncio.sleep(0.01)

            async def on_error(exc, pubsub):
                errors.append(type(exc))
                await pubsub.aclose()                             # run() ends with its PubSub
            task = asyncio.create_task(p.run(exception_handler=on_error, poll_timeout=0.05))
            await c.publish("boom", b"x")
            await c.flush()
            await asyncio.wait_for(task, 5)
            assert errors == [ZeroDivisionError] and p.closed
            with pytest.warns(DeprecationWarning, match="aclose"):
                await p.close()
            await p.connect()                                     # connects again
            assert not p.closed and await p.get_message() is None
            await p.subscribe("l1")
            await p.unsubscribe()
            assert [m["type"] async for m in p.listen()] == ["subscribe", "unsubscribe"]   # then it ends
            await p.aclose()

    asyncio.run(main())


def test_a_cancel_that_meets_a_wakeup_ends_the_async_receive(brokers):
    """A task waiting for a message (get_message(), and so run()) ends when
    cancelled, even when the cancel comes in the loop turn in which its
    wait was woken (the PubSub's driver wakes it on every PONG, every
    confirmation, every batch).  asyncio.wait_for swallows such a cancel
    on Python 3.11 (CPython gh-86296): redis-py's test_callbacks then
    waited for ever for its cancelled run() task under load."""
    b = brokers()

    async def main():
        async with fastbus.aio.Client(endpoint=b.endpoint) as c:
            p = c.pubsub()
            await p.subscribe("quiet")
            for _ in range(5):
                task = asyncio.create_task(p.get_message(ignore_subscribe_messages=True, timeout=30))
                await asyncio.sleep(0.05)          # it waits (nothing comes)
                p._changed.set()                   # what the driver does when woken...
                await asyncio.sleep(0)             # ...the wait's inner step completes...
                task.cancel()                      # ...and the cancel comes before it resumes
                done, _ = await asyncio.wait({task}, timeout=5)
                if not done:
                    task.cancel()                  # (not to leave it running)
                    await asyncio.wait({task}, timeout=5)
                assert done and task.cancelled(), "the cancel was lost: the receive went on waiting"
            await p.aclose()

    asyncio.run(main())


def _timed_async_flush(b, before_flush) -> float:
    """Seconds an asyncio client's flush() takes after ``before_flush(c)``,
    with pings 5 s apart (a wait that only the loop's next ping ends shows)."""

    async def main():
        async with fastbus.aio.Client(endpoint=b.endpoint, ping_interval=5.0) as c:
            await c.publish("x", b"first")
            await c.flush(10)
            before_flush(c)
            start = time.monotonic()
            await c.publish("x", b"second")
            await c.flush(10)
            return time.monotonic() - start

    return asyncio.run(main())


def test_an_async_flush_that_finds_its_connection_taken_looks_again(brokers):
    """The publishing connection's native reader holds its lock for a
    moment (reading a WANT or a lease PONG, which it handles itself and
    does not wake the loop for).  The asyncio client's send and flush that
    find it taken look again soon; they waited for the loop's next ping (a
    second by default: channels_redis's fixture met its own 1 s flush
    timeout under load)."""
    b = brokers()

    def taken_for_a_moment(c):
        c.session.lock.acquire()                             # as the reader does...
        threading.Timer(0.05, c.session.lock.release).start()   # ...letting go without a word

    took = _timed_async_flush(b, taken_for_a_moment)
    assert took < 1.0, f"the flush took {took:.2f} s: it waited for the next ping"


def test_an_async_flush_whose_answer_is_read_while_letting_go_returns(brokers):
    """The PONG that completes a flush can arrive before the coroutine lets
    go of the connection, and is then read as it lets go (``drain``), by
    the loop's thread, with nothing waking the loop: the flush is told and
    returns, where it waited for the loop's next ping."""
    b = brokers()

    def answer_before_letting_go(c):
        s = c.session
        step = s.flush_step

        def flush_step(f):
            done = step(f)
            if not done and f.pinged:
                s.sock.poll(2000, zmq.POLLIN)   # the broker answers before we let go
            return done

        s.flush_step = flush_step

    took = _timed_async_flush(b, answer_before_letting_go)
    assert took < 1.0, f"the flush took {took:.2f} s: it waited for the next ping"


def _held(p) -> tuple[list, list]:
    return sorted(p.channels), sorted(p.patterns)


def test_lists_where_redis_py_takes_them(brokers, redis_server, redis_url):
    """subscribe(["a", "b"], "c"), psubscribe(("x.*", "y.*")),
    unsubscribe(["a", "b"]), punsubscribe(["x.*"]): what redis-py holds
    after them against a real server, fastbus's clients hold too, and the
    messages come as they come to redis-py's."""
    import redis as redis_py

    def confirmations(p, n: int) -> list:
        out = []
        deadline = time.monotonic() + 10
        while len(out) < n and time.monotonic() < deadline:
            m = p.get_message(timeout=1)
            if m is not None:
                out.append((m["type"], m["channel"]))
        return out

    def calls(p) -> list:
        p.subscribe(["a", "b"], "c")
        p.psubscribe(("x.*", "y.*"))
        first = confirmations(p, 5)
        held = _held(p)
        p.unsubscribe(["a", "b"])
        p.punsubscribe(["x.*"])
        return [first, held, confirmations(p, 3), _held(p)]

    r = redis_py.Redis.from_url(redis_url)
    rp = r.pubsub()
    want = calls(rp)
    rp.close()
    r.close()
    assert want[1:] == [([b"a", b"b", b"c"], [b"x.*", b"y.*"]),
                        [("unsubscribe", b"a"), ("unsubscribe", b"b"), ("punsubscribe", b"x.*")],
                        ([b"c"], [b"y.*"])], want
    assert sorted(want[0]) == sorted([("subscribe", b"a"), ("subscribe", b"b"), ("subscribe", b"c"),
                                      ("psubscribe", b"x.*"), ("psubscribe", b"y.*")]), want
    b = brokers()
    with fastbus.Client(b.endpoint) as c:
        p = c.pubsub()
        assert calls(p) == want
        c.publish("c", "to c")
        c.publish("y.1", "to y.1")
        got = []
        while len(got) < 2:
            m = p.get_message(timeout=5)
            assert m is not None
            if m["type"] in ("message", "pmessage"):
                got.append((m["channel"], m["data"]))
        assert got == [(b"c", b"to c"), (b"y.1", b"to y.1")]
        p.close()
    from fastbus.sharding import ShardedClient
    with ShardedClient([b.endpoint]) as sc:
        sp = sc.pubsub()
        assert calls(sp) == want
        sp.close()

    async def aio() -> list:
        async with fastbus.aio.Client(b.endpoint) as ac:
            ap = ac.pubsub()
            await ap.subscribe(["a", "b"], "c")
            await ap.psubscribe(("x.*", "y.*"))
            held = _held(ap)
            await ap.unsubscribe(["a", "b"])
            await ap.punsubscribe(["x.*"])
            out = [held, _held(ap)]
            await ap.aclose()
            return out

    assert asyncio.run(aio()) == [want[1], want[3]]
    with Subscriber(redis_url) as sub:
        sub.subscribe(["a", "b"], "c")
        sub.psubscribe(("x.*", "y.*"))
        sub.unsubscribe(["a", "b"])
        sub.punsubscribe(["x.*"])
        assert (sorted(sub.channels), sorted(sub.patterns)) == want[3]


def _redis_defaults(cls) -> dict:
    import inspect
    return {name: p.default for name, p in inspect.signature(cls.__init__).parameters.items()
            if name not in ("self", "host", "port") and p.default is not inspect.Parameter.empty}


def test_every_keyword_of_redis_py_is_taken(brokers):
    """Each keyword redis.Redis and redis.asyncio.Redis take, with the value
    a program passes through (its default), is taken by fastbus's Client and
    its asyncio twin, which then work: none is a TypeError.  (When redis-py
    adds one, this fails until fastbus.client._redis_compat says what it
    does here.)"""
    import redis
    import redis.asyncio
    import inspect
    from fastbus.client._redis_compat import REDIS_KEYWORDS, RedisKeywords
    b = brokers()
    sync_kw = _redis_defaults(redis.Redis)
    assert len(sync_kw) > 40
    # The table names each keyword fastbus's Client does not name itself, and the types say the same.
    own = set(inspect.signature(fastbus.Client.__init__).parameters)
    assert set(sync_kw) | set(_redis_defaults(redis.asyncio.Redis)) <= own | set(REDIS_KEYWORDS)
    assert set(RedisKeywords.__annotations__) == set(REDIS_KEYWORDS)
    with fastbus.Client(endpoint=b.endpoint, **{**sync_kw, "socket_timeout": 5}) as c:
        p = c.pubsub()
        p.subscribe("kw")
        assert p.get_message(timeout=5)["type"] == "subscribe"
        c.publish("kw", "x")
        m = p.get_message(timeout=5)
        assert m is not None and m["data"] == b"x"
        p.close()
    aio_kw = _redis_defaults(redis.asyncio.Redis)

    async def main() -> None:
        async with fastbus.aio.Client(endpoint=b.endpoint, **{**aio_kw, "socket_timeout": 5}) as ac:
            ap = ac.pubsub()
            await ap.subscribe("kw")
            await ac.publish("kw", "y")
            got = []
            while len(got) < 2:
                m = await ap.get_message(timeout=5)
                assert m is not None
                got.append(m["type"])
            assert got == ["subscribe", "message"]
            await ap.aclose()

    asyncio.run(main())
    with pytest.raises(TypeError, match="unexpected keyword argument 'dbb'"):
        fastbus.Client(endpoint=b.endpoint, dbb=0)
    for kw, why in ((dict(ssl=True), "TLS"), (dict(connection_pool=object()), "pool"),
                    (dict(encoding="latin-1"), "UTF-8"), (dict(db=-1), "database number")):
        with pytest.raises(ValueError, match=why):
            fastbus.Client(endpoint=b.endpoint, **kw)


def test_from_url_reads_urls_as_redis_py_does(brokers, tmp_path):
    import redis
    for url in ("redis://localhost", "redis://h:1234/3", "redis://user:pa%20ss@h:7/0",
                "redis://:secret@[::1]:6380/2?socket_timeout=1.5", "unix:///run/x.sock?db=4"):
        theirs = redis.ConnectionPool.from_url(url).connection_kwargs
        endpoint, ours = _ours(url)
        if url.startswith("unix"):
            assert endpoint == f"ipc://{theirs['path']}"
        else:
            host = theirs["host"]
            assert endpoint == f"tcp://{'[' + host + ']' if ':' in host else host}:{theirs.get('port', 6379)}", url
        for k in ("db", "password", "username", "socket_timeout"):
            assert ours.get(k, None if k != "db" else 0) == theirs.get(k, None if k != "db" else 0), (url, k)
    b = brokers()
    url = f"redis://127.0.0.1:{b.port}/0?socket_timeout=3&decode_responses=true&client_name=from-url"
    with fastbus.Client.from_url(url, decode_responses=False) as c:   # (the URL's options win, as in redis-py)
        assert c.options.decode_responses and c.options.subscribe_timeout == 3 and c.name == "from-url"
        p = c.pubsub()
        p.subscribe("u")
        c.publish("u", "via url")
        ms = [p.get_message(timeout=5) for _ in range(2)]
        assert [m["data"] for m in ms] == [1, "via url"]
        p.close()
    with fastbus.Client(f"redis://127.0.0.1:{b.port}") as c:         # a plain URL as the first argument
        c.publish("u", "x")
        c.flush()
    with pytest.raises(ValueError, match="from_url"):
        fastbus.Client(f"redis://127.0.0.1:{b.port}?decode_responses=true")
    for bad, why in (("rediss://h:1", "TLS"), ("redis://h:1/x", "database number"), ("http://h", "not a URL"),
                     ("redis://h:1?nosuch=1", "unknown option"), ("redis://h:1?socket_timeout=soon", "not valid")):
        with pytest.raises(fastbus.errors.InvalidURL, match=why):
            fastbus.Client.from_url(bad)
    ipc = f"ipc://{tmp_path}/b.sock"
    bi = brokers("--bind", ipc)
    with fastbus.Client.from_url(f"unix://{tmp_path}/b.sock") as c:
        assert c.endpoint == ipc
        c.publish("u", "x")
        c.flush()

    async def main() -> None:
        ac = fastbus.aio.Client.from_url(url)
        assert isinstance(ac, fastbus.aio.Client) and ac.options.decode_responses
        await ac.publish("u", "x")
        await ac.close()

    asyncio.run(main())


def _ours(url: str):
    from fastbus.client._redis_compat import from_url
    return from_url(url)
