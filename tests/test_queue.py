"""fastbus.queue.WorkQueue on a real server: the rmq operations with their
holes closed (atomic settle, delivery counts, dead letters, heartbeats and a
cleaner), blocking without polling, stats, bad arguments, asyncio."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis

from fastbus.queue import AsyncWorkQueue, ConsumerTagInUse, QueueError, WorkQueue


@pytest.fixture
def queue(redis_url):
    q = WorkQueue("jobs", redis_url)
    yield q
    q.close()


def test_put_get_ack_in_order_with_ids_and_metadata(queue):
    before = time.time()
    first = queue.put(b"a")
    ids = queue.put_many([b"b", "c", bytearray(b"\x00\xff"), b""])
    assert ids == list(range(first + 1, first + 5))
    with queue.consumer("w1", clean_interval=None) as c:
        got = c.get_many(10, timeout=0)
        assert [m.payload for m in got] == [b"a", b"b", b"c", b"\x00\xff", b""]
        assert [m.id for m in got] == [first, *ids]
        assert all(m.deliveries == 1 and before - 1 <= m.created_at <= time.time() + 1 for m in got)
        assert c.get(timeout=0) is None
        r = c.ack(*got)
        assert (r.acked, r.missing) == (5, [])
    st = queue.stats()
    assert (st.ready, st.failed, st.unacked) == (0, 0, {})
    assert st.totals["put"] == st.totals["get"] == st.totals["ack"] == 5


def test_a_worker_acks_the_previous_message_with_its_next_get(queue, redis_url, caplog):
    """``m = c.get(ack=m)``: the previous message is acknowledged in the
    same round trip as the take (issue 50: one round trip a message);
    at the end (no message left) the ack still happens; one it no longer
    holds is said, and the get still returns."""
    ids = queue.put_many([b"%d" % i for i in range(5)])
    done = []
    with queue.consumer("w", clean_interval=None) as c:
        m = c.get(timeout=0)
        while m is not None:
            done.append(m.payload)
            st = queue.stats()
            assert st.unacked == {"w": 1} and st.totals.get("ack", 0) == len(done) - 1, st
            m = c.get(timeout=0, ack=m)
        assert done == [b"%d" % i for i in range(5)]
        st = queue.stats()
        assert (st.ready, st.unacked, st.totals["ack"]) == (0, {"w": 0}, 5), st
        queue.put(b"again")
        gone = c.get(timeout=0)
        gone.ack()
        with caplog.at_level("WARNING", logger="fastbus.queue"):
            assert c.get(timeout=0, ack=gone) is None             # acked already: said, nothing raised
        assert "was not held by it" in caplog.text
        with pytest.raises((TypeError, ValueError)):
            c.get(timeout=0, ack=object())
    assert ids == list(range(ids[0], ids[0] + 5))

    async def aio():
        async with AsyncWorkQueue("jobs", redis_url) as q:
            await q.put_many([b"x", b"y"])
            async with q.consumer("a", clean_interval=None) as ac:
                m = await ac.get(timeout=0)
                m = await ac.get(timeout=0, ack=m)
                assert m.payload == b"y"
                assert await ac.get(timeout=0, ack=m) is None
            st = await q.stats()
            assert (st.ready, st.unacked, st.totals["ack"]) == (0, {}, 8), st

    asyncio.run(aio())


def test_put_many_splits_large_batches_and_keeps_order(queue):
    payloads = [b"%06d" % i for i in range(2500)] + [b"x" * (3 << 20)] * 4 + [b"end"]
    ids = queue.put_many(payloads)
    assert ids == list(range(1, len(payloads) + 1))
    with queue.consumer(clean_interval=None) as c:
        got = []
        while len(got) < len(payloads):
            batch = c.get_many(1000, timeout=1)
            assert batch
            got += batch
            c.ack(*batch)
    assert [m.payload for m in got] == payloads


def test_settle_acks_rejects_and_requeues_in_one_call(queue):
    queue.put_many([b"%d" % i for i in range(6)])
    with queue.consumer("w", clean_interval=None) as c:
        m = c.get_many(6, timeout=0)
        r = c.settle(ack=m[:2], reject=m[2:4], requeue=[m[5], m[4]])
        assert (r.acked, r.rejected, r.requeued, r.dead, r.missing) == (2, 2, 2, 0, [])
        again = c.get_many(6, timeout=0)
        # back at the head of the queue, oldest first, counted as a second delivery
        assert [(x.payload, x.deliveries) for x in again] == [(b"4", 2), (b"5", 2)]
        assert [x.payload for x in queue.peek(10, failed=True)] == [b"2", b"3"]
        assert [x.deliveries for x in queue.peek(10, failed=True)] == [1, 1]
        # already settled, or never held: reported, nothing else touched
        r = c.settle(ack=[m[0], again[0]], reject=[m[2]])
        assert (r.acked, r.rejected, r.missing) == (1, 0, [m[0], m[2]])
        c.ack(again[1])
    st = queue.stats()
    assert (st.ready, st.failed, st.totals["reject"], st.totals["requeue"]) == (0, 2, 2, 2)


def test_message_methods_settle_through_their_consumer(queue):
    queue.put_many([b"a", b"b", b"c"])
    with queue.consumer(clean_interval=None) as c:
        a, b, cc = c.get_many(3, timeout=0)
        assert a.ack().acked == 1 and b.reject().rejected == 1 and cc.requeue().requeued == 1
        assert c.get(timeout=0).payload == b"c"


def test_max_deliveries_moves_a_poison_message_to_failed(redis_url):
    q = WorkQueue("poison", redis_url, max_deliveries=3)
    q.put(b"bad")
    with q.consumer(clean_interval=None) as c:
        for n in (1, 2):
            m = c.get(timeout=0)
            assert m.deliveries == n
            assert c.requeue(m).requeued == 1
        m = c.get(timeout=0)
        assert m.deliveries == 3
        r = c.requeue(m)
        assert (r.requeued, r.dead) == (0, 1)
        assert c.get(timeout=0) is None
    (dead,) = q.peek(failed=True)
    assert (dead.payload, dead.deliveries) == (b"bad", 3)
    assert q.stats().totals["dead"] == 1
    assert q.return_failed() == 1
    with q.consumer(clean_interval=None) as c:
        m = c.get(timeout=0)
        assert (m.payload, m.deliveries) == (b"bad", 1)      # a fresh start
        c.ack(m)
    q.close()


def test_a_second_live_consumer_with_the_same_tag_is_refused(queue, redis_url):
    with queue.consumer("only-one", clean_interval=None):
        with pytest.raises(ConsumerTagInUse, match="only-one"):
            queue.consumer("only-one")
        other = WorkQueue("jobs", redis_url)        # another client, same queue
        with pytest.raises(ConsumerTagInUse):
            other.consumer("only-one")
        other.close()
    with queue.consumer("only-one", clean_interval=None):   # free again after close
        pass


def test_close_gives_back_unacked_messages_uncounted(queue):
    queue.put_many([b"1", b"2", b"3"])
    with queue.consumer("a", clean_interval=None) as c:
        got = c.get_many(3, timeout=0)
        c.ack(got[0])
    with queue.consumer("b", clean_interval=None) as c:
        again = c.get_many(3, timeout=0)
        assert [(m.payload, m.deliveries) for m in again] == [(b"2", 1), (b"3", 1)]
        c.ack(*again)


def test_blocking_get_wakes_on_put_without_polling(queue, redis_url):
    client = redis.Redis.from_url(redis_url)

    def evalsha_calls() -> int:
        return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))

    with queue.consumer("waiter", clean_interval=None) as c:
        before = evalsha_calls()
        t0 = time.monotonic()
        assert c.get(timeout=1.5) is None
        waited = time.monotonic() - t0
        assert 1.4 <= waited < 3.0
        # one try, then BLPOP in 1 s slices with a try after each: no busy loop
        assert evalsha_calls() - before <= 4
        late = threading.Timer(0.3, queue.put, (b"wake",))
        late.start()
        t0 = time.monotonic()
        m = c.get(timeout=10)
        late.join()                               # (its call has returned before anything closes)
        assert m is not None and m.payload == b"wake"
        assert time.monotonic() - t0 < 2.0
        c.ack(m)
    client.close()


def test_many_blocked_consumers_all_wake_for_a_burst(queue):
    got, lock = [], threading.Lock()
    consumers = [queue.consumer(f"c{i}", clean_interval=None) for i in range(4)]

    def work(c):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            ms = c.get_many(5, timeout=0.5)
            if ms:
                c.ack(*ms)
                with lock:
                    got.extend(m.id for m in ms)
            elif len(got) >= 200:
                return

    threads = [threading.Thread(target=work, args=(c,)) for c in consumers]
    for t in threads:
        t.start()
    time.sleep(0.3)
    ids = queue.put_many([b"m"] * 200)
    for t in threads:
        t.join(30)
    for c in consumers:
        c.close()
    assert sorted(got) == ids


def test_stats_counts_consumers_and_rates(queue):
    queue.put_many([b"x"] * 10)
    with queue.consumer("s1", clean_interval=None) as c:
        ms = c.get_many(4, timeout=0)
        c.ack(*ms[:3])
        st = queue.stats()
        assert (st.ready, st.unacked, st.alive) == (6, {"s1": 1}, {"s1": True})
        # a burst shows at once: the second under way counts (over the time
        # the window spans so far: 4 whole seconds and a part, at least 1 s)
        assert 10 / 5 <= st.rates["put"] <= 10 and 3 / 5 <= st.rates["ack"] <= 3
        time.sleep(1.1)
        st = queue.stats(window=5)
        assert 10 / 5 <= st.rates["put"] <= 10 / 4 and 3 / 5 <= st.rates["ack"] <= 3 / 4
        assert st.to_dict()["totals"]["get"] == 4


def test_return_failed_purge_and_peek(queue):
    queue.put_many([b"a", b"b", b"c"])
    with queue.consumer(clean_interval=None) as c:
        c.reject(*c.get_many(2, timeout=0))
    assert [m.payload for m in queue.peek(failed=True)] == [b"a", b"b"]
    assert [m.payload for m in queue.peek()] == [b"c"]
    assert queue.return_failed(1) == 1
    assert [m.payload for m in queue.peek()] == [b"c", b"a"]
    assert queue.purge("failed") == 1 and queue.purge("ready") == 2
    assert queue.stats().ready == 0 and queue.return_failed() == 0


def test_bad_arguments_are_rejected_clearly(queue, redis_url):
    for bad in ("", "a b", "{x}", "a:b", "x" * 201):
        with pytest.raises(ValueError, match="queue name"):
            WorkQueue(bad, redis_url)
    with pytest.raises(TypeError, match="queue name"):
        WorkQueue(7, redis_url)
    with pytest.raises(TypeError, match="Redis URL"):
        WorkQueue("q", 42)
    with pytest.raises(ValueError, match="max_deliveries"):
        WorkQueue("q", redis_url, max_deliveries=0)
    with pytest.raises(ValueError, match="decode_responses"):
        WorkQueue("q", redis.Redis.from_url(redis_url, decode_responses=True))
    with pytest.raises(TypeError, match="payload"):
        queue.put(12)
    with pytest.raises(TypeError, match="payload"):
        queue.put_many([b"ok", None])
    assert queue.stats().ready == 0                   # nothing of a refused batch was put
    with pytest.raises(ValueError, match="heartbeat_ttl"):
        queue.consumer(heartbeat_ttl=0)
    with pytest.raises(ValueError, match="consumer tag"):
        queue.consumer("bad tag")
    with queue.consumer(clean_interval=None) as c:
        with pytest.raises(ValueError, match="n must be"):
            c.get_many(0)
        with pytest.raises(ValueError, match="timeout"):
            c.get(timeout=-1)
        with pytest.raises(TypeError, match="Message or a message id"):
            c.ack("1")
    with pytest.raises(ValueError, match="purge"):
        queue.purge("everything")
    with pytest.raises(ValueError, match="window"):
        queue.stats(window=1000)


def test_keys_of_another_type_give_a_clear_error(queue, redis_url):
    client = redis.Redis.from_url(redis_url)
    client.set("fastbus:q:{jobs}:ready", "not a list")
    with pytest.raises(QueueError, match="another type"):
        queue.put(b"x")
    client.close()


def test_every_key_of_a_queue_shares_its_hash_tag(queue, redis_url):
    queue.put_many([b"a", b"b"])
    with queue.consumer("t", clean_interval=None) as c:
        c.reject(c.get(timeout=0))
        c.get(timeout=0)
        keys = redis.Redis.from_url(redis_url).keys("*")
    # the registry of names (fastbus.queue.registry) is the one key outside: written by its own SADD
    keys.remove(b"fastbus:registry")
    assert keys and all(k.startswith(b"fastbus:q:{jobs}:") for k in keys)


def test_asyncio_queue(redis_url):
    async def main():
        async with AsyncWorkQueue("aio", redis_url) as q:
            ids = await q.put_many([b"%d" % i for i in range(50)])
            assert ids == list(range(1, 51))
            async with q.consumer("a1", heartbeat_ttl=0.6, clean_interval=None) as c:
                with pytest.raises(ConsumerTagInUse):
                    await q.consumer("a1").start()
                got = await c.get_many(30, timeout=0)
                r = await c.settle(ack=got[:20], reject=got[20:25], requeue=got[25:])
                assert (r.acked, r.rejected, r.requeued) == (20, 5, 5)
                await asyncio.sleep(1.0)          # longer than the TTL: the heartbeat task keeps it
                assert (await q.stats()).alive == {"a1": True}
                rest = await c.get_many(100, timeout=0)
                assert len(rest) == 25 and [m.deliveries for m in rest[:5]] == [2] * 5
                await asyncio.gather(*(m.ack() for m in rest))
                waiter = asyncio.create_task(c.get(timeout=5))
                await asyncio.sleep(0.2)
                await q.put(b"late")
                assert (await waiter).payload == b"late"
            st = await q.stats()
            assert (st.ready, st.failed, st.totals["ack"]) == (1, 5, 45)

    asyncio.run(main())


def test_scripts_are_loaded_again_after_the_server_forgot_them(queue, redis_url):
    """A restart (here SCRIPT FLUSH) empties the server's script cache: plain
    and pipelined calls (put_many of several script calls; the wake-up's
    BLPOP + GET; get(ack=)'s ACK1 + GET1) load them again."""
    client = redis.Redis.from_url(redis_url)
    queue.put(b"warm")
    client.script_flush()
    ids = queue.put_many([b"p"] * 2500)                   # three pipelined script calls
    assert len(ids) == 2500 and queue.stats().ready == 2501
    with queue.consumer(clean_interval=None) as c:
        c.ack(*c.get_many(3000, timeout=0))
        client.script_flush()
        late = threading.Timer(0.2, client.rpush, ("fastbus:q:{jobs}:notify", "1"))
        late.start()
        assert c.get(timeout=0.6) is None                  # woken, GET reloaded, nothing there
        late.join()                                        # (the rpush read its reply: the client may close)
        client.script_flush()
        late = threading.Timer(0.2, queue.put, (b"x",))
        late.start()
        x = c.get(timeout=5)
        assert x.payload == b"x"
        late.join()
        queue.put(b"y")
        client.script_flush()
        y = c.get(timeout=0, ack=x)                         # ACK1 + GET1 pipelined, both reloaded
        assert y.payload == b"y" and queue.stats().totals["ack"] == 2502
        c.ack(y)
    client.close()
