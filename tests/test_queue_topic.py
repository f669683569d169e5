"""fastbus.queue.Topic: RedisQ's logical consumers with its holes closed
(atomic fan-out, ack and retry, cleanup when everyone is done)."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from fastbus.errors import FastbusError
from fastbus.queue import AsyncTopic, ConsumerGone, PastLastId, QueueError, Topic


@pytest.fixture
def topic(redis_url):
    t = Topic("orders", redis_url)
    yield t
    t.close()


def _drain(c, n=1000):
    got = c.get_many(n, timeout=0)
    c.ack(*got)
    return got


def test_every_logical_consumer_gets_every_message_once(topic):
    names = ["billing", "audit", "mail"]
    for n in names:
        assert topic.register(n) is True
    assert topic.register("billing") is False          # registering again changes nothing
    ids = topic.publish_many([b"o%d" % i for i in range(100)])
    assert ids == list(range(1, 101)) and topic.last_id() == 100
    for n in names:
        with topic.consumer(n, clean_interval=None) as c:
            got = _drain(c)
            assert [m.id for m in got] == ids
            assert [m.payload for m in got] == [b"o%d" % i for i in range(100)]
    st = topic.stats()
    assert st.published == 100 and sorted(st.consumers) == sorted(names)
    assert all(s.totals["ack"] == 100 and s.ready == 0 for s in st.consumers.values())
    assert topic.read(1, 100) == []                     # everyone acked: the bodies are gone


def test_a_consumer_registered_later_starts_from_that_point(topic):
    topic.register("early")
    topic.publish_many([b"1", b"2"])
    topic.register("late")
    topic.publish(b"3")
    with topic.consumer("early", clean_interval=None) as c:
        assert [m.payload for m in _drain(c)] == [b"1", b"2", b"3"]
    with topic.consumer("late", clean_interval=None) as c:
        assert [m.payload for m in _drain(c)] == [b"3"]


def test_instances_of_one_logical_consumer_share_its_messages(topic):
    topic.register("workers")
    ids = topic.publish_many([b"x"] * 30)
    with topic.consumer("workers", "w1", clean_interval=None) as a, \
            topic.consumer("workers", "w2", clean_interval=None) as b:
        got_a = a.get_many(10, timeout=0)
        got_b = b.get_many(100, timeout=0)
        a.ack(*got_a)
        b.ack(*got_b)
    assert sorted(m.id for m in got_a + got_b) == ids
    assert not {m.id for m in got_a} & {m.id for m in got_b}


def test_bodies_live_until_the_last_consumer_acks(topic, redis_url):
    client = redis.Redis.from_url(redis_url)
    topic.register("a")
    topic.register("b")
    (mid,) = topic.publish_many([b"body"])
    key = "fastbus:t:{orders}:m:0"            # the block of ids 0..1023
    with topic.consumer("a", clean_interval=None) as c:
        _drain(c)
    assert client.exists(key) == 1 and [m.payload for m in topic.read(mid, mid)] == [b"body"]
    with topic.consumer("b", clean_interval=None) as c:
        _drain(c)
    assert client.exists(key) == 0
    client.close()


def test_bodies_expire_at_the_ttl_and_are_skipped(redis_url):
    t = Topic("short", redis_url, ttl=0.3)
    t.register("slow")
    t.publish_many([b"old1", b"old2"])
    time.sleep(0.5)
    t.publish(b"new")
    with t.consumer("slow", clean_interval=None) as c:
        assert [m.payload for m in _drain(c)] == [b"new"]
    assert t.stats().consumers["slow"].totals["expired"] == 2
    t.close()


def test_rejected_messages_keep_their_body_and_can_come_back(topic, redis_url):
    topic.register("r")
    topic.register("other")
    topic.publish_many([b"good", b"bad"])
    with topic.consumer("r", clean_interval=None) as c:
        good, bad = c.get_many(2, timeout=0)
        c.settle(ack=[good], reject=[bad])
    with topic.consumer("other", clean_interval=None) as c:
        _drain(c)
    assert topic.read(1, 2) == []                          # no consumer needs the bodies now
    (failed,) = topic.peek_failed("r")
    assert (failed.id, failed.payload, failed.deliveries) == (2, b"bad", 1)
    assert topic.return_failed("r") == 1
    with topic.consumer("r", clean_interval=None) as c:
        (m,) = _drain(c)
    assert (m.id, m.payload, m.deliveries) == (2, b"bad", 1)
    assert redis.Redis.from_url(redis_url).exists("fastbus:t:{orders}:m:0") == 0


def test_unregister_removes_every_key_of_the_consumer(topic, redis_url):
    client = redis.Redis.from_url(redis_url)
    topic.register("gone")
    topic.publish_many([b"a", b"b", b"c"])
    with topic.consumer("gone", "g1", clean_interval=None) as c:
        c.reject(c.get(timeout=0))
        held = c.get(timeout=0)               # an instance still running, holding "b"
        assert held is not None
        assert topic.unregister("gone") == 2               # ready "c" and the unacked "b"
        with pytest.raises(ConsumerGone, match="'gone' is not registered"):
            c.get(timeout=0)                               # it gets nothing more, and says why
    assert topic.consumers() == []
    leftover = [k for k in client.keys("*") if b":c:gone:" in k]
    assert leftover == []
    assert topic.read(1, 3) == []                          # no one else wanted them
    with pytest.raises(QueueError, match="no consumer named"):
        topic.unregister("gone")
    client.close()


def test_messages_across_body_blocks(topic, redis_url):
    """Bodies live in blocks of 1024 ids: a publish, a get and a read that
    span blocks see every message, and the blocks go when all are acked."""
    client = redis.Redis.from_url(redis_url)
    topic.register("c")
    payloads = [b"m%d" % i for i in range(3000)]
    ids = topic.publish_many(payloads)
    assert ids == list(range(1, 3001))
    assert [m.payload for m in topic.read(1000, 1100)] == payloads[999:1100]
    assert [m.id for m in topic.read(2990, 3005)] == list(range(2990, 3001))
    with topic.consumer("c", clean_interval=None) as c:
        got = []
        while part := _drain(c, 700):                  # gets that straddle blocks
            got += part
        assert [m.payload for m in got] == payloads
        assert all(m.created_at > 0 for m in got)
    assert client.keys("fastbus:t:{orders}:m:*") == []
    assert client.hlen("fastbus:t:{orders}:refs") == 0
    assert client.zcard("fastbus:t:{orders}:blocks") == 0
    assert topic.retained() == (0, 3000)
    client.close()


def test_retained_range_and_ack_upto(topic, redis_url):
    topic.publish_many([b"before"] * 10)                  # no consumer: kept until the TTL
    assert topic.retained() == (1, 10)
    topic.register("spark")
    topic.publish_many([b"x%d" % i for i in range(2490)])  # ids 11..2500
    assert topic.ack_upto("spark", 1500) == 1490
    assert topic.stats().consumers["spark"].ready == 1000
    assert topic.ack_upto("spark", 1500) == 0              # again: nothing more
    assert [m.payload for m in topic.read(1501, 1502)] == [b"x1490", b"x1491"]
    # block 0 (ids 1..1023) had one consumer, done with all of it: deleted,
    # with the 10 messages nobody was registered for
    assert topic.read(1, 1023) == []
    assert topic.retained() == (1024, 2500)
    with pytest.raises(PastLastId, match=r"past the last id published \(2500\)") as info:
        topic.ack_upto("spark", 10**9)                     # a position nothing reached: refused
    assert isinstance(info.value, FastbusError) and isinstance(info.value, ValueError)
    assert topic.position("spark") == 1500
    assert topic.ack_upto("spark", 2500) == 1000
    assert topic.position("spark") == 2500
    assert topic.retained() == (0, 2500)
    with pytest.raises(QueueError, match="no consumer named"):
        topic.ack_upto("nobody", 5)


def test_retained_prunes_many_expired_blocks_in_bounded_steps(redis_url):
    """1100 expired blocks: RETAINED prunes at most 1000 a call, and
    Topic.retained() calls again until it knows."""
    t = Topic("sparse", redis_url, ttl=0.2)
    r = t.redis
    pipe = r.pipeline(transaction=False)
    for _ in range(1100):                       # one message per block of 1024 ids
        t.publish(b"old")
        pipe.incrby("fastbus:t:{sparse}:seq", 1023)
        pipe.execute()
    assert r.zcard("fastbus:t:{sparse}:blocks") == 1100
    time.sleep(0.4)
    with Topic("sparse", redis_url) as lasting:      # the default TTL: this one stays
        (newest,) = lasting.publish_many([b"new"])
    assert t.retained() == (newest, newest)
    assert r.zcard("fastbus:t:{sparse}:blocks") == 1
    t.close()


def test_retained_skips_expired_blocks(redis_url):
    t = Topic("brief", redis_url, ttl=0.2)
    t.publish_many([b"a"] * 1500)
    assert t.retained() == (1, 1500)
    time.sleep(0.4)
    assert t.retained() == (0, 1500)
    assert t.read(1, 1500) == []
    t.close()


def test_topic_bad_arguments(topic):
    with pytest.raises(ValueError, match="topic name"):
        Topic("a:b")
    with pytest.raises(ValueError, match="ttl"):
        Topic("t", ttl=0)
    with pytest.raises(ValueError, match="consumer name"):
        topic.register("x y")
    with pytest.raises(ValueError, match="at most 10000"):
        topic.read(1, 20000)
    with pytest.raises(TypeError, match="payload"):
        topic.publish(None)


def test_asyncio_topic(redis_url):
    async def main():
        async with AsyncTopic("atopic", redis_url) as t:
            await t.register("x")
            await t.register("y")
            ids = await t.publish_many([b"%d" % i for i in range(20)])
            for name in ("x", "y"):
                async with t.consumer(name, clean_interval=None) as c:
                    got = await c.get_many(100, timeout=0)
                    assert [m.id for m in got] == ids
                    await c.ack(*got)
            assert (await t.read(1, 20)) == []
            assert (await t.stats()).published == 20

    asyncio.run(main())
