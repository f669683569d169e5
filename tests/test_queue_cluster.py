"""The queue primitives on a 3-node Redis Cluster (embedded servers on
loopback): every key of a queue or topic shares its hash tag, so each
script runs on the one node that owns the queue."""

from __future__ import annotations

import asyncio
import threading
import uuid

import pytest
from fastbus._core import key_slot

from fastbus.queue import AsyncWorkQueue, Topic, WorkQueue


def _names_on_every_node(cluster, n=3) -> list[str]:
    """Queue names (fresh for this test) whose hash tags land on n different nodes."""
    names, nodes = [], set()
    while len(names) < n:
        name = f"q{uuid.uuid4().hex[:8]}"
        node = cluster.nodes_manager.get_node_from_slot(key_slot(name)).name
        if node not in nodes:
            nodes.add(node)
            names.append(name)
    return names


def test_work_queues_on_every_node(redis_cluster):
    for name in _names_on_every_node(redis_cluster):
        q = WorkQueue(name, redis_cluster, max_deliveries=2)
        ids = q.put_many([b"%d" % i for i in range(1500)])      # two script calls
        assert ids == list(range(1, 1501))
        with q.consumer("c1", clean_interval=None) as c:
            got = c.get_many(1000, timeout=0) + c.get_many(1000, timeout=0)
            assert [m.id for m in got] == ids
            r = c.settle(ack=got[:1400], reject=got[1400:1450], requeue=got[1450:])
            assert (r.acked, r.rejected, r.requeued, r.missing) == (1400, 50, 50, [])
            again = c.get_many(100, timeout=0)
            assert {m.deliveries for m in again} == {2}
            r = c.requeue(*again)
            assert (r.requeued, r.dead) == (0, 50)               # max_deliveries=2
        st = q.stats()
        assert (st.ready, st.failed, st.totals["ack"]) == (0, 100, 1400)
        assert q.return_failed(10) == 10 and len(q.peek(100)) == 10
        assert q.purge("failed") == 90 and q.purge("ready") == 10
        assert q.clean().returned == 0
        keys = redis_cluster.keys(f"fastbus:q:{{{name}}}:*", target_nodes=redis_cluster.ALL_NODES)
        assert keys and {key_slot(k) for k in keys} == {key_slot(name)}


def test_blocking_get_on_a_cluster(redis_cluster):
    (name,) = _names_on_every_node(redis_cluster, 1)
    q = WorkQueue(name, redis_cluster)
    with q.consumer(clean_interval=None) as c:
        assert c.get(timeout=0.2) is None
        late = threading.Timer(0.2, q.put, (b"late",))
        late.start()
        m = c.get(timeout=5)
        late.join()
        assert m is not None and m.payload == b"late"
        c.ack(m)


def test_topic_fan_out_on_a_cluster(redis_cluster):
    for name in _names_on_every_node(redis_cluster):
        t = Topic(name, redis_cluster)
        for n in ("a", "b"):
            t.register(n)
        ids = t.publish_many([b"x%d" % i for i in range(50)])
        for n in ("a", "b"):
            with t.consumer(n, clean_interval=None) as c:
                got = c.get_many(100, timeout=0)
                assert [m.id for m in got] == ids
                c.ack(*got)
        assert t.read(1, 50) == [] and t.stats().published == 50
        assert t.unregister("a") == 0 and t.clean().returned == 0


def test_asyncio_queue_on_a_cluster(redis_cluster):
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
    (name,) = _names_on_every_node(redis_cluster, 1)
    node = redis_cluster.get_default_node()

    async def main():
        client = AsyncRedisCluster(host=node.host, port=node.port)
        async with AsyncWorkQueue(name, client) as q:
            ids = await q.put_many([b"a"] * 1200)
            async with q.consumer(clean_interval=None) as c:
                got = await c.get_many(2000, timeout=0)
                assert [m.id for m in got] == ids
                assert (await c.ack(*got)).acked == 1200
        await client.aclose()

    asyncio.run(main())


def test_a_cluster_client_with_decoded_responses_is_refused(redis_cluster):
    from redis.cluster import RedisCluster
    node = redis_cluster.get_default_node()
    rc = RedisCluster(host=node.host, port=node.port, decode_responses=True)
    with pytest.raises(ValueError, match="decode_responses"):
        WorkQueue("x", rc)
    rc.close()
