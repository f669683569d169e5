"""StagedWriter: rows staged by tasks, each numbered batch published once
(the Spark streaming sink's exactly-once step), against a real server."""

from __future__ import annotations

import pytest
import redis

from fastbus.queue import StagedWriter, Topic, WorkQueue
from fastbus.queue.common import Call
from fastbus.redis import Subscriber


def _drain(q: WorkQueue) -> list[bytes]:
    with q.consumer(clean_interval=None) as c:
        got = c.get_many(100000, timeout=0)
        c.ack(*got)
    return [m.payload for m in got]


def test_a_batch_is_published_once_and_its_replay_is_not(redis_url):
    q = WorkQueue("out", redis_url)
    w = StagedWriter("queue", "out", redis_url, writer_id="job1")
    k1, n1 = w.stage([b"a", b"b"])
    k2, n2 = w.stage(["c"])
    assert (n1, n2) == (2, 1)
    assert w.last_done() is None
    assert w.commit(0, [k1, k2]) == 3
    assert w.last_done() == 0
    r = redis.Redis.from_url(redis_url)
    assert r.exists(k1, k2) == 0                            # staging lists gone
    # the replay: the same batch staged again by new task attempts
    k3, _ = w.stage([b"a", b"b"])
    k4, _ = w.stage([b"c"])
    assert w.commit(0, [k3, k4]) == 0
    assert r.exists(k3, k4) == 0
    k5, _ = w.stage([b"d"])
    assert w.commit(1, [k5]) == 1
    assert _drain(q) == [b"a", b"b", b"c", b"d"]
    # another writer id has its own progress
    other = StagedWriter("queue", "out", redis_url, writer_id="job2")
    k6, _ = other.stage([b"e"])
    assert other.commit(0, [k6]) == 1
    assert _drain(q) == [b"e"]


def test_a_commit_that_died_half_way_is_finished_without_duplicates(redis_url):
    t = Topic("reports", redis_url)
    t.register("reader")
    w = StagedWriter("topic", "reports", redis_url, writer_id="q")
    rows = [b"r%d" % i for i in range(10)]
    keys = [w.stage(rows[:4])[0], w.stage(rows[4:])[0]]
    # the first script call of a commit, then the driver dies
    w._driver.run(_one_call(w, 3, keys))
    assert [m.payload for m in t.read(1, 100)] == rows[:3]
    # Spark replays the batch: new attempts stage the same rows again
    again = [w.stage(rows[:4])[0], w.stage(rows[4:])[0]]
    assert w.commit(3, again, step=4) == 7
    assert [m.payload for m in t.read(1, 100)] == rows
    assert w.commit(3, [w.stage(rows)[0]]) == 0
    assert t.last_id() == 10
    r = redis.Redis.from_url(redis_url)
    assert set(r.keys("*stage*")) == {k.encode() for k in keys}   # the dead attempt's lists remain...
    assert all(r.pttl(k) > 0 for k in keys)                                  # ...until their TTL
    w.discard(keys)
    assert r.keys("*stage*") == []


def _one_call(w: StagedWriter, step: int, keys: list[str]):
    o = w._ops
    n, done = yield Call("COMMIT_STAGED", o.state, (o.kind, o.target, o.ttl_ms, o.state, 3, step, *keys))
    assert (n, done) == (step, 0)


def test_channel_target_publishes_once(redis_url):
    sub = Subscriber(redis_url)
    sub.subscribe("alerts:disk")
    assert sub.get_message(timeout=2)["type"] == "subscribe"
    w = StagedWriter("channel", "alerts:disk", redis_url, writer_id="x")
    key, _ = w.stage([b"1", b"2"])
    assert w.commit(0, [key]) == 2
    assert w.commit(0, [w.stage([b"1", b"2"])[0]]) == 0
    got = sub.get_batch(timeout=2)
    while len(got) < 2:
        got += sub.get_batch(timeout=2)
    assert [d for _, d in got] == [b"1", b"2"]
    assert sub.get_batch(timeout=0.2) == []
    sub.close()


def test_staged_writer_bad_arguments(redis_url):
    with pytest.raises(ValueError, match="kind"):
        StagedWriter("table", "x", redis_url, writer_id="w")
    with pytest.raises(ValueError, match="channel name"):
        StagedWriter("channel", "a{b}", redis_url, writer_id="w")
    with pytest.raises(ValueError, match="writer id"):
        StagedWriter("queue", "x", redis_url, writer_id="a b")
    w = StagedWriter("queue", "x", redis_url, writer_id="w")
    with pytest.raises(ValueError, match="batch_id"):
        w.commit(-1, [])
    with pytest.raises(ValueError, match="not a staging list"):
        w.commit(0, ["fastbus:q:{other}:stage:w:1"])
    with pytest.raises(TypeError):
        w.stage([None])
