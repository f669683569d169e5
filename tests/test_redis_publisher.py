"""BufferedPublisher and BufferedListProducer against a real server (the
embedded one; CI also runs these against Debian's redis-server 7)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis

from fastbus.redis import (
    AsyncBufferedPublisher,
    BufferedListProducer,
    BufferedPublisher,
    PublishError,
    PublishTimeout,
)


def subscribe(url: str, *channels: str):
    """A redis-py subscriber whose subscriptions are confirmed."""
    p = redis.Redis.from_url(url).pubsub()
    p.subscribe(*channels)
    for _ in channels:
        m = p.get_message(timeout=5)
        assert m is not None and m["type"] == "subscribe", m
    p.ignore_subscribe_messages = True
    return p


def received(p, n: int, timeout: float = 10.0) -> list:
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        m = p.get_message(timeout=0.5)
        if m is not None and m["type"] == "message":
            out.append(m["data"])
    return out


@pytest.mark.parametrize("how", ["size", "time", "flush", "close"])
def test_nothing_lost_or_reordered_whatever_flushes(redis_url, how):
    n = 2500
    p = subscribe(redis_url, "ch")
    pub = BufferedPublisher(redis_url, max_messages=1000 if how == "size" else 100_000,
                            max_delay=0.05 if how == "time" else 30)
    for i in range(n):
        assert pub.publish("ch", b"%d" % i) == 1
    if how == "flush":
        pub.flush()
    elif how == "close":
        pub.close()
    elif how == "size":
        got = received(p, 2000)                  # two full batches went by themselves
        assert got == [b"%d" % i for i in range(2000)]
    got = received(p, n if how != "size" else n - 2000)
    if how == "size":
        assert got == []                         # the rest waits for flush or close...
        pub.close()
        got = [b"%d" % i for i in range(2000)] + received(p, n - 2000)
    assert got == [b"%d" % i for i in range(n)]
    st = pub.stats()
    assert st["published"] == n and st["errors"] == 0 and st["buffered"] == 0
    assert st["receivers"] == n                  # PUBLISH replies: one subscriber each time
    pub.close()


def test_many_threads_publishing_at_once(redis_url):
    threads, per = 8, 5000
    pub = BufferedPublisher(redis_url, max_messages=500)
    r = redis.Redis.from_url(redis_url)
    with BufferedListProducer(redis_url, max_messages=700) as lists:
        def work(t: int) -> None:
            for i in range(per):
                pub.publish(f"t{t}", b"%d" % i)
                lists.push(f"list{t}", b"%d" % i)

        ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    pub.close()
    for t in range(threads):                   # every message, in each thread's order
        assert r.lrange(f"list{t}", 0, -1) == [b"%d" % i for i in range(per)]
    assert pub.stats()["published"] == threads * per


def test_binary_large_and_numeric_payloads(redis_url):
    p = subscribe(redis_url, "bin")
    big = bytes(range(256)) * (10 * 1024 * 1024 // 256)          # 10 MB
    odd = b"\r\n$3\r\n*1\r\n\x00\xff"
    with BufferedPublisher(redis_url) as pub:
        pub.publish("bin", odd)
        pub.publish("bin", big)
        pub.publish(b"bin", 42)
        pub.publish("bin", 1.5)
        pub.publish("bin", "")
    assert received(p, 5, timeout=20) == [odd, big, b"42", b"1.5", b""]


def test_server_errors_are_reported_not_swallowed(redis_url):
    r = redis.Redis.from_url(redis_url)
    r.set("not-a-list", "x")
    seen = []
    lists = BufferedListProducer(redis_url, on_error=lambda err, failed: seen.append((err.reason, failed)))
    lists.push("q", "a")
    lists.push("not-a-list", "b")
    lists.push("q", "c")
    with pytest.raises(PublishError, match="WRONGTYPE") as ei:
        lists.flush()
    assert ei.value.failed == [(b"not-a-list", b"b")] and ei.value.count == 1
    assert seen and seen[0][1] == [(b"not-a-list", b"b")]
    assert r.lrange("q", 0, -1) == [b"a", b"c"]         # the others in the batch went through
    st = lists.stats()
    assert (st["published"], st["errors"]) == (2, 1)
    lists.flush()                                        # reported once
    lists.close()


def test_server_killed_and_restarted_mid_stream(redis_server, redis_url):
    """Kill -9 while publishing, restart on the same port: the failed
    batches are retried, and every message is accounted for: answered
    before the kill, in the list after the restart, or reported failed."""
    n = 60_000
    failed: list = []
    lists = BufferedListProducer(redis_url, max_messages=500, max_delay=0.01,
                                 on_error=lambda err, msgs: failed.extend(msgs))
    answered_before = None
    for i in range(n):
        lists.push("q", b"%d" % i)
        if i == n // 3:
            lists.flush()
            answered_before = lists.stats()["published"]
            redis_server.kill()
        if i == n // 2:
            time.sleep(0.2)                              # publishing on while it is down
            redis_server.start()                         # same port, empty
    try:
        lists.flush(timeout=60)
    except PublishError:
        pass
    lists.close()
    r = redis.Redis.from_url(redis_url)
    after = [int(x) for x in r.lrange("q", 0, -1)]
    st = lists.stats()
    lost = {int(v) for _k, v in failed}
    assert st["retries"] > 0                              # the failure was seen
    assert st["errors"] == len(failed)
    # In order (a retried tail may repeat the last messages once).
    assert all(b >= a or b >= after[0] for a, b in zip(after, after[1:]))
    accounted = set(range(answered_before)) | set(after) | lost
    assert accounted == set(range(n)), f"unaccounted: {sorted(set(range(n)) - accounted)[:10]}"
    assert after[-1] == n - 1 or (n - 1) in lost


def test_unreachable_server_fails_loudly(redis_server, redis_url):
    from redis.backoff import NoBackoff
    from redis.retry import Retry
    seen = []
    pub = BufferedPublisher(redis_url, retry=Retry(NoBackoff(), 1), socket_timeout=2,
                            on_error=lambda err, msgs: seen.append(len(msgs)))
    pub.publish("ch", "first")
    pub.flush()
    redis_server.kill()
    for i in range(10):
        pub.publish("ch", b"%d" % i)
    with pytest.raises(PublishError) as ei:
        pub.flush()
    assert ei.value.count == 10 and ei.value.failed[0] == (b"ch", b"0")
    assert seen == [10]
    assert pub.stats()["errors"] == 10
    pub.close()
    redis_server.start()


def test_publish_blocks_then_times_out_when_nothing_drains(redis_server, redis_url):
    from redis.backoff import ConstantBackoff
    from redis.retry import Retry
    redis_server.kill()
    pub = BufferedPublisher(redis_url, max_bytes=1000, max_buffer_bytes=20_000, block_timeout=0.3,
                            retry=Retry(ConstantBackoff(0.5), 20))
    t0 = time.monotonic()
    with pytest.raises(PublishTimeout):
        for _ in range(100_000):
            pub.publish("ch", b"x" * 100)
    assert time.monotonic() - t0 < 10
    redis_server.start()
    pub.flush(timeout=30)                      # the retries get through once the server is back
    pub.close()


def test_bad_arguments(redis_url):
    with pytest.raises(ValueError, match="not a Redis URL"):
        BufferedPublisher("http://127.0.0.1:6379")
    with pytest.raises(TypeError, match="expected a Redis URL"):
        BufferedPublisher(42)
    for kw in ({"max_messages": 0}, {"max_bytes": 0}, {"max_delay": 0}, {"socket_timeout": -1},
               {"block_timeout": -1}, {"max_buffer_bytes": 10}):
        with pytest.raises(ValueError):
            BufferedPublisher(redis_url, **kw)
    with pytest.raises(TypeError, match="on_error"):
        BufferedPublisher(redis_url, on_error="print")
    with BufferedPublisher(redis.Redis.from_url(redis_url)) as pub:   # a client, or its pool
        with pytest.raises(TypeError, match="expected bytes"):
            pub.publish("ch", None)
        with pytest.raises(TypeError):
            pub.publish("ch", True)
    pub2 = BufferedPublisher(redis.ConnectionPool.from_url(redis_url))
    pub2.close()
    with pytest.raises(PublishError, match="closed"):
        pub2.publish("ch", "late")


def test_sharded_publish(redis_url):
    r = redis.Redis.from_url(redis_url)
    p = r.pubsub()
    p.ssubscribe("shard")
    assert p.get_sharded_message(timeout=5)["type"] == "ssubscribe"
    with BufferedPublisher(redis_url, sharded=True) as pub:
        for i in range(100):
            pub.publish("shard", b"%d" % i)
    got = []
    while len(got) < 100 and (m := p.get_sharded_message(timeout=5)) is not None:
        got.append(m["data"])
    assert got == [b"%d" % i for i in range(100)]


def test_asyncio_publisher(redis_url):
    p = subscribe(redis_url, "aio")

    async def main():
        async with AsyncBufferedPublisher(redis_url, max_delay=0.01) as pub:
            for i in range(1000):
                await pub.publish("aio", b"%d" % i)
            await pub.flush()
            assert pub.stats()["published"] == 1000

    asyncio.run(main())
    assert received(p, 1000) == [b"%d" % i for i in range(1000)]


def test_embedded_server_by_default():
    from fastbus.redis import default_server
    with BufferedListProducer() as lists:
        lists.push("default-q", "hello")
    r = redis.Redis.from_url(default_server().url)
    assert r.lrange("default-q", 0, -1) == [b"hello"]
    r.delete("default-q")
