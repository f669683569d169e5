"""What the queues promise when processes die: several producer and
consumer processes with every id accounted for; a consumer killed with
SIGKILL while holding a batch has it delivered again by the cleaner; a
server killed and restarted with appendfsync always keeps everything a
``put`` returned for; the same for a topic's logical consumer."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import redis

from fastbus.queue import Topic, WorkQueue
from fastbus.redis import EmbeddedServer

PRODUCER = r"""
import sys
from fastbus.queue import WorkQueue
url, who, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
q = WorkQueue("jobs", url)
i = 0
while i < n:
    if i % 3 == 0:
        q.put(b"%s-%d" % (who.encode(), i)); i += 1
    else:
        k = min(50, n - i)
        q.put_many([b"%s-%d" % (who.encode(), j) for j in range(i, i + k)]); i += k
"""

CONSUMER = r"""
import json, random, sys, time
from fastbus.queue import WorkQueue
url, tag, out = sys.argv[1], sys.argv[2], sys.argv[3]
q = WorkQueue("jobs", url)
rng = random.Random(tag)
acked = []
deadline = time.monotonic() + 60
idle = 0
with q.consumer(tag, heartbeat_ttl=5) as c:
    while time.monotonic() < deadline and idle < 6:
        ms = c.get_many(rng.choice((1, 7, 40)), timeout=0.5)
        if not ms:
            idle += 1
            continue
        idle = 0
        # a few go round again: requeued, and picked up by anyone
        again = [m for m in ms if m.deliveries == 1 and rng.random() < 0.05]
        done = [m for m in ms if m not in again]
        r = c.settle(ack=done, requeue=again)
        assert r.missing == [], r
        acked += [(m.id, m.payload.decode(), m.deliveries) for m in done]
json.dump(acked, open(out, "w"))
"""


def _run(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-P", "-c", code, *args])


def test_producers_and_consumers_in_processes_account_for_every_id(redis_url, tmp_path):
    producers = [_run(PRODUCER, redis_url, f"p{i}", "3000") for i in range(3)]
    outs = [tmp_path / f"c{i}.json" for i in range(3)]
    consumers = [_run(CONSUMER, redis_url, f"c{i}", str(out)) for i, out in enumerate(outs)]
    for p in producers:
        assert p.wait(60) == 0
    for c in consumers:
        assert c.wait(90) == 0
    acked = [tuple(x) for out in outs for x in json.loads(out.read_text())]
    ids = [a[0] for a in acked]
    assert len(ids) == len(set(ids)) == 9000                 # each acked once
    assert sorted(ids) == list(range(1, 9001))
    assert {a[1] for a in acked} == {f"p{i}-{j}" for i in range(3) for j in range(3000)}
    assert any(a[2] == 2 for a in acked)                     # requeued ones came back
    st = WorkQueue("jobs", redis_url).stats()
    assert (st.ready, st.failed, sum(st.unacked.values())) == (0, 0, 0)
    assert st.totals["put"] == st.totals["ack"] == 9000


HOLDER = r"""
import sys, time
from fastbus.queue import {kind}
url = sys.argv[1]
q = {make}
c = q.consumer({args}, heartbeat_ttl=1.0, clean_interval=None)
held = c.get_many(50, timeout=5)
print(" ".join(str(m.id) for m in held), flush=True)
time.sleep(60)
"""


def _held_then_killed(code: str, url: str) -> list[int]:
    p = subprocess.Popen([sys.executable, "-P", "-c", code, url], stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
    return [int(x) for x in line.split()]


def test_consumer_killed_holding_a_batch_gets_it_delivered_again(redis_url):
    q = WorkQueue("jobs", redis_url)
    ids = q.put_many([b"job-%d" % i for i in range(80)])
    held = _held_then_killed(HOLDER.format(kind="WorkQueue", make='WorkQueue("jobs", url)', args='"doomed"'),
                             redis_url)
    assert held == ids[:50]
    assert q.clean().returned == 0              # its heartbeat is still alive: nothing to do yet
    with pytest.raises(Exception, match="held by another live consumer"):
        q.consumer("doomed")
    time.sleep(1.3)                             # the heartbeat expires
    st = q.stats()
    assert st.unacked == {"doomed": 50} and st.alive == {"doomed": False}
    r = q.clean()
    assert (r.returned, r.dead, r.consumers) == (50, 0, 1)
    assert q.clean().returned == 0              # a second cleaner finds nothing
    with q.consumer("survivor", clean_interval=None) as c:
        got = c.get_many(100, timeout=0)
        c.ack(*got)
    # the dead consumer's batch first, oldest first, counted as a second delivery
    assert [m.id for m in got] == held + ids[50:]
    assert [m.deliveries for m in got] == [2] * 50 + [1] * 30
    st = q.stats()
    assert (st.ready, st.unacked, st.totals["ack"]) == (0, {}, 80)
    q.close()


def test_the_same_tag_coming_back_recovers_what_it_held(redis_url):
    q = WorkQueue("jobs", redis_url)
    q.put_many([b"x"] * 10)
    held = _held_then_killed(HOLDER.format(kind="WorkQueue", make='WorkQueue("jobs", url)', args='"w1"'),
                             redis_url)
    assert len(held) == 10
    time.sleep(1.3)
    with q.consumer("w1", clean_interval=None) as c:        # a restarted worker, same tag
        got = c.get_many(20, timeout=0)
        assert sorted(m.id for m in got) == held and {m.deliveries for m in got} == {2}
        c.ack(*got)
    q.close()


def test_consumers_run_the_cleaner_themselves(redis_url):
    q = WorkQueue("jobs", redis_url)
    q.put_many([b"y"] * 5)
    held = _held_then_killed(HOLDER.format(kind="WorkQueue", make='WorkQueue("jobs", url)', args='"gone"'),
                             redis_url)
    with q.consumer("janitor", heartbeat_ttl=0.6, clean_interval=0.5) as c:
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 5 and time.monotonic() < deadline:
            got += c.get_many(5, timeout=0.5)
        c.ack(*got)
    assert sorted(m.id for m in got) == held
    q.close()


def test_topic_instance_killed_holding_a_batch_is_retried(redis_url):
    t = Topic("events", redis_url)
    t.register("billing")
    t.register("audit")
    ids = t.publish_many([b"e%d" % i for i in range(60)])
    held = _held_then_killed(HOLDER.format(kind="Topic", make='Topic("events", url)', args='"billing", "b1"'),
                             redis_url)
    assert held == ids[:50]
    time.sleep(1.3)
    assert t.clean().returned == 50
    with t.consumer("billing", "b2", clean_interval=None) as c:
        got = c.get_many(100, timeout=0)
        c.ack(*got)
    assert [m.id for m in got] == ids and [m.payload for m in got] == [b"e%d" % i for i in range(60)]
    # audit still holds every message: the bodies stay until it acks
    assert len(t.read(1, 60)) == 60
    with t.consumer("audit", clean_interval=None) as c:
        c.ack(*c.get_many(100, timeout=0))
    assert t.read(1, 60) == []
    t.close()


APPENDER = r"""
import sys
from fastbus.queue import WorkQueue
q = WorkQueue("durable", sys.argv[1])
for i in range(1, 100000):
    print(q.put(b"m%d" % i), flush=True)
"""


@pytest.mark.slow
def test_server_killed_and_restarted_loses_nothing_put_returned_for(tmp_path):
    binary = os.environ.get("FASTBUS_TEST_REDIS_SERVER") or None
    server = EmbeddedServer(binary, data_dir=tmp_path / "data",
                            args=["--appendonly", "yes", "--appendfsync", "always"]).start()
    try:
        url = server.url
        q = WorkQueue("durable", url)
        q.put_many([b"held"] * 3)
        held = _held_then_killed(HOLDER.format(kind="WorkQueue", make='WorkQueue("durable", url)',
                                               args='"w"'), url)
        p = subprocess.Popen([sys.executable, "-P", "-c", APPENDER, url], stdout=subprocess.PIPE, text=True)
        returned = []
        deadline = time.monotonic() + 30
        while len(returned) < 300 and time.monotonic() < deadline:
            returned.append(int(p.stdout.readline()))
        server.kill()                              # SIGKILL mid-stream
        rest = p.stdout.read()
        p.wait(30)
        returned += [int(x) for x in rest.split()]
        assert len(returned) >= 300
        server.start()
        ready = [m.id for m in q.peek(1_000_000)]
        assert set(returned) <= set(ready)          # every id a put returned is there
        assert ready == sorted(ready)
        client = redis.Redis.from_url(url)
        assert client.hlen("fastbus:q:{durable}:unacked:w") == len(held) == 3
        client.close()
        q.close()
    finally:
        server.stop()
