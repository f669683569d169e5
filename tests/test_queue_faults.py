"""Queues under faults and bad input (issue 14): a topic instance killed with
SIGKILL and dead-lettered by another instance's own cleaner, batches that
cannot be written whole, a str where a list belongs, a logical consumer
unregistered under a live instance, and what the documentation promises."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import redis

from fastbus.queue import Topic

HOLDER = r"""
import sys, time
from fastbus.queue import Topic
t = Topic("ev", sys.argv[1], max_deliveries=1)
c = t.consumer("billing", "A", heartbeat_ttl=0.5, clean_interval=None)
held = c.get_many(100, timeout=5)
print(" ".join(str(m.id) for m in held), flush=True)
time.sleep(60)
"""


def _held_then_killed(url: str) -> list[int]:
    """A process takes what it can as instance A of "billing", says which
    ids, and is killed with SIGKILL holding them."""
    p = subprocess.Popen([sys.executable, "-P", "-c", HOLDER, url], stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
    return [int(x) for x in line.split()]


def _wait_for(cond, limit: float, what: str) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


def _topic_keys(client, name="ev") -> dict:
    """The body blocks and the reference counts of topic ``name``."""
    ns = f"fastbus:t:{{{name}}}:"
    blocks = sorted(k.decode() for k in client.scan_iter(match=ns + "m:*"))
    return {"blocks": blocks, "refs": {k.decode(): int(v) for k, v in client.hgetall(ns + "refs").items()}}


def test_an_instance_cleaner_dead_letters_a_killed_instance_s_messages_with_their_bodies(redis_url):
    """Item 1: instance A takes 5 messages and is killed; instance B's own
    cleaner (not t.clean()) finds A dead and, max_deliveries=1, moves them to
    billing's failed list.  They keep their bodies there, the block's
    reference count drops by 5, another logical consumer still reads the
    original bodies, and once everyone is done the block is gone."""
    client = redis.Redis.from_url(redis_url)
    t = Topic("ev", redis_url, max_deliveries=1)
    t.register("billing")
    t.register("audit")
    bodies = [b"order-%d" % i for i in range(5)]
    ids = t.publish_many(bodies)
    assert _topic_keys(client)["refs"] == {"0": 10}          # 5 messages x 2 consumers
    assert _held_then_killed(redis_url) == ids
    with t.consumer("billing", "B", heartbeat_ttl=1.5, clean_interval=0.2) as b:
        _wait_for(lambda: len(t.peek_failed("billing", 10)) == 5, 10, "B's cleaner to dead-letter A's messages")
        assert b.get_many(10, timeout=0) == []
    failed = t.peek_failed("billing", 10)
    assert [m.id for m in failed] == ids                     # oldest first (item 11)
    assert [m.payload for m in failed] == bodies
    assert _topic_keys(client)["refs"] == {"0": 5}           # billing's references released
    # billing's copies back to its list: the shared block is not overwritten
    assert t.return_failed("billing") == 5
    with t.consumer("audit", "au", clean_interval=None) as c:
        got = c.get_many(10, timeout=0)
        assert [m.payload for m in got] == bodies
        c.ack(*got)
    with t.consumer("billing", "B2", clean_interval=None) as c:
        got = c.get_many(10, timeout=0)
        assert [(m.id, m.payload, m.deliveries) for m in got] == [(i, p, 1) for i, p in zip(ids, bodies)]
        c.ack(*got)
    assert _topic_keys(client) == {"blocks": [], "refs": {}}  # no leak: the block went with the last ack
    t.close()
    client.close()


# -- item 2: batches all or nothing where Redis allows it, else an error that says what was written


@pytest.fixture
def client(redis_url):
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


@pytest.fixture
def server_config(client):
    """Set server settings for one test; they are put back afterwards (the
    server is shared by the session)."""
    saved = {}

    def set_(name, value):
        if name not in saved:
            saved[name] = client.config_get(name)[name]
        client.config_set(name, value)
    yield set_
    for name, value in saved.items():
        client.config_set(name, value)


def _ready_ids(client, ns="fastbus:q:{jobs}:") -> list[int]:
    return [int.from_bytes(item[5:13], "big") for item in client.lrange(ns + "ready", 0, -1)]


def test_a_payload_over_the_server_limit_is_refused_before_anything_is_sent(redis_url, client):
    """The issue's case: 1,500 small messages and one of 600 MB.  Before, the
    first 1,500 were stored and then the server broke the connection (the
    payload is over proto-max-bulk-len, 512 MB); now nothing is sent."""
    from fastbus.queue import PayloadTooLarge, WorkQueue
    q = WorkQueue("jobs", redis_url)
    t = Topic("ev", redis_url)
    t.register("billing")
    big = bytes(600 << 20)
    batch = [b"m%d" % i for i in range(1500)] + [big]
    with pytest.raises(PayloadTooLarge, match=r"a value of 600 MiB is over the proto-max-bulk-len \(512 MiB\) of "
                                              r"Redis at 127\.0\.0\.1:\d+ \(put_many on queue 'jobs', payload 1501 "
                                              r"of 1501; nothing was written\)") as ei:
        q.put_many(batch)
    assert ei.value.size == 600 << 20 and ei.value.limit == 512 << 20
    with pytest.raises(PayloadTooLarge, match="publish_many on topic 'ev'"):
        t.publish_many(batch)
    with pytest.raises(PayloadTooLarge, match=r"\(put on queue 'jobs'; nothing was written\)"):
        q.put(big)
    with pytest.raises(ValueError):                     # PayloadTooLarge is a ValueError too
        t.publish(big)
    del big, batch
    assert client.llen("fastbus:q:{jobs}:ready") == 0 and client.get("fastbus:q:{jobs}:seq") is None
    assert t.last_id() == 0 and t.stats().consumers["billing"].ready == 0
    q.close()
    t.close()


def test_the_limit_is_the_server_s_and_the_default_where_config_is_not_allowed(redis_url, client, server_config):
    from fastbus.queue import PayloadTooLarge, WorkQueue
    server_config("proto-max-bulk-len", "1mb")
    q = WorkQueue("jobs", redis_url)
    with pytest.raises(PayloadTooLarge, match=r"over the proto-max-bulk-len \(1\.0 MiB\)"):
        q.put_many([b"a", bytes((1 << 20) + 1)])
    assert q.put_many([b"a", bytes(1 << 20)]) == [1, 2]              # at the limit: fine
    q.close()
    # a user without CONFIG: the default limit (512 MB) is assumed
    client.execute_command("ACL", "SETUSER", "noconfig", "on", ">pw", "~*", "+@all", "-config")
    try:
        host, port = client.connection_pool.connection_kwargs["host"], client.connection_pool.connection_kwargs["port"]
        q = WorkQueue("jobs", f"redis://noconfig:pw@{host}:{port}/0")
        with pytest.raises(PayloadTooLarge, match=r"\(512 MiB\)"):
            q.put(bytes((512 << 20) + 1))
        q.close()
    finally:
        client.execute_command("ACL", "DELUSER", "noconfig")


def test_a_batch_refused_part_way_out_of_memory_says_which_ids_were_written(redis_url, client, server_config):
    """The issue's case: maxmemory reached during a put_many of 20,000: the
    calls before stored, the rest refused.  Each script call is all or
    nothing (its first write is INCRBY, which Redis refuses under OOM); the
    error carries exactly what was written."""
    from fastbus.queue import PartialBatchError, WorkQueue
    q = WorkQueue("jobs", redis_url)
    t = Topic("ev", redis_url)
    t.register("billing")
    used = int(client.info("memory")["used_memory"])
    server_config("maxmemory", str(used + (4 << 20)))
    payloads = [b"%05d" % i + bytes(1000) for i in range(20000)]
    with pytest.raises(PartialBatchError, match=r"queue 'jobs': put_many wrote [\d,]+ of 20,000 messages "
                                                r"\(\d+ of 20 script calls\); [\d,]+ were not written: "
                                                r"OutOfMemoryError") as e:
        q.put_many(payloads)
    err = e.value
    assert 0 < len(err.written) < 20000 and len(err.written) % 1000 == 0   # whole calls only
    assert err.total == 20000 and err.unknown == [] and len(err.ids) == len(err.written)
    assert _ready_ids(client) == err.ids                                  # exactly those are in the queue
    stored = [item[21:] for item in client.lrange("fastbus:q:{jobs}:ready", 0, -1)]
    assert stored == [payloads[i] for i in err.written]
    # nothing written at all: the server's own error
    server_config("maxmemory", str(int(client.info("memory")["used_memory"]) // 2))
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        q.put_many(payloads[:10])
    # a full server can still be drained: a consumer starts, gets and acks
    with q.consumer("drain", clean_interval=None) as c:
        got = c.get_many(1000, timeout=0)
        assert [m.id for m in got] == err.ids[:1000]
        assert c.ack(*got).acked == 1000
    err.ids[:1000] = []
    # the topic's publish_many likewise
    client.delete("fastbus:q:{jobs}:ready")
    server_config("maxmemory", str(int(client.info("memory")["used_memory"]) + (4 << 20)))
    with pytest.raises(PartialBatchError, match=r"topic 'ev': publish_many wrote [\d,]+ of 20,000") as e:
        t.publish_many(payloads)
    assert 0 < len(e.value.written) < 20000 and len(e.value.written) % 1000 == 0
    server_config("maxmemory", "0")
    assert [m.id for m in t.read(1, len(e.value.written))] == e.value.ids
    assert t.stats().consumers["billing"].ready == len(e.value.ids)
    q.close()
    t.close()


def test_a_batch_whose_connection_breaks_part_way_says_which_ids_were_written(redis_url, client, server_config):
    """The connection breaks in the middle of a pipelined put_many (here the
    server drops it: proto-max-bulk-len was lowered after this client read
    it).  The calls before were applied, the replies were lost; the client
    asks the server which calls were applied and fences the others, so the
    error is exact and the rest can be retried without duplicates."""
    from fastbus.queue import PartialBatchError, WorkQueue
    q = WorkQueue("jobs", redis_url)
    q.put(bytes((1 << 20) + 1))                          # reads proto-max-bulk-len (512 MB)
    client.delete("fastbus:q:{jobs}:ready")
    server_config("proto-max-bulk-len", "1mb")
    payloads = [b"s%d" % i for i in range(2000)] + [bytes(2 << 20)] + [b"t%d" % i for i in range(1500)]
    with pytest.raises(PartialBatchError, match=r"wrote 2,000 of 3,501 messages \(2 of 4 script calls\); "
                                                r"1,501 were not written: ") as e:
        q.put_many(payloads)                             # calls: 1000, 1000, the big one + 999, 501
    assert e.value.written == list(range(2000)) and e.value.ids == list(range(2, 2002))
    assert _ready_ids(client) == e.value.ids
    server_config("proto-max-bulk-len", "512mb")
    rest = [payloads[i] for i in range(len(payloads)) if i not in set(e.value.written)]
    assert q.put_many(rest) == list(range(2002, 3503))    # the retry: no duplicates
    assert len(_ready_ids(client)) == 3501
    q.close()


# -- item 3: a str or bytes where a list of payloads belongs


def test_a_single_str_or_bytes_is_not_a_list_of_payloads(redis_url, client):
    from fastbus.queue import AsyncTopic, AsyncWorkQueue, StagedWriter, WorkQueue
    q = WorkQueue("jobs", redis_url)
    t = Topic("ev", redis_url)
    w = StagedWriter("queue", "jobs", redis_url, writer_id="w")
    for bad in ("abc", b"abc", bytearray(b"abc"), memoryview(b"abc")):
        with pytest.raises(TypeError, match="a list .* of payloads, not a single"):
            q.put_many(bad)
        with pytest.raises(TypeError, match="a list .* of payloads, not a single"):
            t.publish_many(bad)
        with pytest.raises(TypeError, match="rows must be a list"):
            w.stage(bad)
    with pytest.raises(TypeError, match="not int"):
        q.put_many(7)
    assert q.put_many(iter([b"a", "b"])) == [1, 2]      # any other iterable is fine

    async def aio():
        async with AsyncWorkQueue("jobs", redis_url) as aq, AsyncTopic("ev", redis_url) as at:
            with pytest.raises(TypeError):
                await aq.put_many("abc")
            with pytest.raises(TypeError):
                await at.publish_many(b"abc")
    import asyncio
    asyncio.run(aio())
    assert client.llen("fastbus:q:{jobs}:ready") == 2 and t.last_id() == 0
    assert [k for k in client.keys("*") if b"stage" in k] == []
    for o in (q, t, w):
        o.close()


# -- item 10: unregister under a live instance; heartbeat_ttl's lower bound


def _consumer_keys(client, name="billing", topic="ev") -> dict:
    return {k.decode(): client.type(k).decode() for k in client.keys(f"fastbus:t:{{{topic}}}:c:{name}:*")}


def test_unregister_under_a_live_instance_stops_it_and_its_heartbeat_does_not_undo_it(redis_url, client):
    """Before, the instance's heartbeat made the consumer's keys again until
    it closed.  Now its next call raises ConsumerGone, its heartbeat stops,
    nothing of the consumer is made again, and a consumer registered again
    under the same name is a new one that the old instance does not join."""
    from fastbus.queue import ConsumerGone
    t = Topic("ev", redis_url)
    t.register("billing")
    t.publish_many([b"a", b"b", b"c"])
    c = t.consumer("billing", "i1", register=False, heartbeat_ttl=0.3, clean_interval=0.1)
    held = c.get(timeout=0)
    assert held.payload == b"a"
    assert t.unregister("billing") == 3
    time.sleep(0.6)                                      # six heartbeat periods, several cleaner runs
    assert isinstance(c.lost, ConsumerGone)              # the heartbeat saw it and stopped
    assert not c._thread.is_alive()
    assert t.consumers() == []
    # nothing of the consumer was made again: at most the instance's GONE
    # mark is left, which lives no longer than its heartbeat would have
    hb = "fastbus:t:{ev}:c:billing:hb:i1"
    assert set(_consumer_keys(client)) <= {hb}
    assert client.get(hb) in (None, b"fastbus:gone") and client.pttl(hb) <= 300
    with pytest.raises(ConsumerGone, match=r"topic ev: logical consumer 'billing' is not registered"):
        c.get(timeout=0)
    with pytest.raises(ConsumerGone):
        c.ack(held)
    with pytest.raises(LookupError):                     # ConsumerGone is a LookupError too
        c.get_many(5, timeout=0)
    c.close()
    assert _consumer_keys(client) == {}
    t.close()


def test_an_instance_does_not_join_a_consumer_registered_again(redis_url, client):
    from fastbus.queue import ConsumerGone
    t = Topic("ev", redis_url)
    c = t.consumer("billing", "i1", heartbeat_ttl=5, clean_interval=None)
    t.unregister("billing")
    t.register("billing")                                # again, before the instance's next call
    t.publish(b"new")
    with pytest.raises(ConsumerGone):
        c.get(timeout=0)
    with t.consumer("billing", "i2", clean_interval=None) as c2:    # a new instance gets it
        assert c2.get(timeout=0).payload == b"new"
    c.close()
    with t.consumer("billing", "i1", clean_interval=None) as c3:    # the tag is free again
        assert c3.get(timeout=0).payload == b"new"       # i2 closed without acking: back to ready
    # an instance of a consumer that is not registered is refused, and makes no keys
    with pytest.raises(ConsumerGone):
        t.consumer("nobody", register=False)
    assert _consumer_keys(client, "nobody") == {}
    t.close()


def test_unregister_under_a_live_asyncio_instance(redis_url, client):
    import asyncio

    from fastbus.queue import AsyncTopic, ConsumerGone

    async def main():
        async with AsyncTopic("ev", redis_url) as t:
            c = await t.consumer("billing", "a1", heartbeat_ttl=0.3, clean_interval=None)
            await t.unregister("billing")
            await asyncio.sleep(0.5)
            assert isinstance(c.lost, ConsumerGone)
            with pytest.raises(ConsumerGone):
                await c.get(timeout=0)
            await c.close()
        assert _consumer_keys(client) == {}
    asyncio.run(main())


def test_heartbeat_ttl_and_clean_interval_have_a_lower_bound(redis_url):
    from fastbus.queue import WorkQueue
    q = WorkQueue("jobs", redis_url)
    t = Topic("ev", redis_url)
    with pytest.raises(ValueError, match=r"heartbeat_ttl must be at least 0.1 s .*not 0.003"):
        q.consumer(heartbeat_ttl=0.003)
    with pytest.raises(ValueError, match="heartbeat_ttl must be at least"):
        t.consumer("billing", heartbeat_ttl=0.05)
    with pytest.raises(ValueError, match=r"clean_interval must be at least 0.1 s"):
        q.consumer(clean_interval=0.001)
    q.consumer(heartbeat_ttl=0.1, clean_interval=0.1).close()
    q.close()
    t.close()


# -- item 11: what the documentation says is what happens


def test_a_dead_lettered_batch_keeps_its_order_in_the_failed_list(redis_url):
    from fastbus.queue import WorkQueue
    q = WorkQueue("jobs", redis_url, max_deliveries=1)
    ids = q.put_many([b"%d" % i for i in range(5)])
    with q.consumer("w", clean_interval=None) as c:
        got = c.get_many(5, timeout=0)
        assert c.requeue(*reversed(got)).dead == 5       # each had its one delivery: to failed
    assert [m.id for m in q.peek(10, failed=True)] == ids
    q.close()


CLEAN_HOLDER = r"""
import sys, time
from fastbus.queue import WorkQueue
q = WorkQueue("jobs", sys.argv[1])
c = q.consumer("doomed", heartbeat_ttl=0.3, clean_interval=None)
print(len(c.get_many(10, timeout=5)), flush=True)
time.sleep(60)
"""


def test_the_cleaner_runs_every_clean_interval_not_at_the_next_heartbeat(redis_url):
    """clean_interval=0.2 with a heartbeat every 2 s: before, the cleaner ran
    only with the heartbeat (every 2 s); now on its own schedule."""
    from fastbus.queue import WorkQueue
    q = WorkQueue("jobs", redis_url)
    q.put_many([b"x"] * 3)
    p = subprocess.Popen([sys.executable, "-P", "-c", CLEAN_HOLDER, redis_url], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "3"
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
    with q.consumer("janitor", heartbeat_ttl=6, clean_interval=0.2) as c:
        start = time.monotonic()
        _wait_for(lambda: q.stats().ready == 3, 5, "the janitor's cleaner")
        took = time.monotonic() - start
        assert took < 1.2, took                          # the holder's TTL (0.3 s) + a cleaner period or two
        c.ack(*c.get_many(3, timeout=0))
    q.close()


def test_a_topic_body_lives_between_ttl_and_a_tenth_more_whatever_is_published_after_it(redis_url):
    """ttl=1 s, a publish every 0.06 s for 1.8 s.  Before, each publish into
    the block of 1024 ids set the block's expiry again, so the first body
    lived as long as publishes went on.  Now, for every body and every read:
    read before publish + ttl -> there; read after publish + 1.1 * ttl -> gone."""
    t = Topic("ttl", redis_url, ttl=1.0)
    sent: list[tuple[int, float, float]] = []          # (id, before the publish, after it)
    seen: list[tuple[float, float, dict[int, bool]]] = []
    start = time.monotonic()
    next_pub = start
    while time.monotonic() - start < 2.6:
        now = time.monotonic()
        if now >= next_pub and now - start < 1.8:
            before = time.monotonic()
            i = t.publish(b"body-%d" % len(sent))
            sent.append((i, before, time.monotonic()))
            next_pub += 0.06
        before = time.monotonic()
        there = {i: bool(t.read(i, i)) for i, _b, _a in sent}
        seen.append((before, time.monotonic(), there))
        time.sleep(0.02)
    ids = [i for i, _b, _a in sent]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    checked_gone = 0
    for r_before, r_after, present in seen:
        for i, p_before, p_after in sent:
            if i not in present:
                continue                                 # published after this read
            if r_after < p_before + 1.0:
                assert present[i], f"id {i} gone {r_after - p_before:.2f} s after its publish (ttl 1 s)"
            if r_before > p_after + 1.1 + 0.02:             # (the server counts in whole ms)
                assert not present[i], f"id {i} still there {r_before - p_after:.2f} s after its publish"
                checked_gone += 1
    assert checked_gone > 0
    assert ids[-1] > 1024                                # publishes met a closed block: a gap
    t.close()


def test_a_consumer_that_never_reads_can_be_trimmed_to_what_is_retained(redis_url, client):
    """What the Topic docstring says bounds a registered consumer that never
    reads: ack_upto(name, retained()[0] - 1) drops the headers whose bodies
    expired (and their references), and nothing a reader could still get."""
    t = Topic("idle", redis_url, ttl=0.3)
    t.register("idle")
    t.register("busy")
    t.publish_many([b"old"] * 2000)
    time.sleep(0.45)
    new = t.publish_many([b"new"] * 3)
    with t.consumer("busy", clean_interval=None) as c:   # the other consumer keeps up
        got = c.get_many(3000, timeout=0)
        assert [m.id for m in got] == new
        c.ack(*got)
    assert t.stats().consumers["idle"].ready == 2003
    first, last = t.retained()
    assert first == new[0] and last == new[-1]
    assert t.ack_upto("idle", first - 1) == 2000
    assert t.stats().consumers["idle"].ready == 3
    refs = {k.decode(): int(v) for k, v in client.hgetall("fastbus:t:{idle}:refs").items()}
    assert refs == {str(new[0] // 1024): 3}
    with t.consumer("idle", clean_interval=None) as c:
        assert [m.payload for m in c.get_many(10, timeout=0)] == [b"new"] * 3
    t.close()
