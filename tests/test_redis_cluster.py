"""Redis Cluster: three embedded servers with cluster mode on, the slots
split between them; BufferedListProducer and sharded BufferedPublisher
route each key to its owner, and follow MOVED replies."""

from __future__ import annotations

import pytest
import redis
from fastbus._core import key_slot

from fastbus.redis import BufferedListProducer, BufferedPublisher


@pytest.fixture
def cluster(redis_cluster):
    return redis_cluster


def test_key_slot_matches_redis_py():
    import redis.crc
    for key in (b"", b"foo", b"123456789", b"{user}.a", b"a{}b", b"x{y}z{w}", "é".encode()):
        assert key_slot(key) == redis.crc.key_slot(key)


def test_list_producer_routes_every_key_to_its_owner(cluster):
    keys = [f"q{i}" for i in range(60)]              # spread over all three primaries
    assert len({cluster.nodes_manager.get_node_from_slot(key_slot(k)).name for k in keys}) == 3
    with BufferedListProducer(cluster) as lists:
        for i in range(3000):
            lists.push(keys[i % 60], b"%d" % i)
        assert lists.stats()["nodes"] == 3
    for j, k in enumerate(keys):
        assert cluster.lrange(k, 0, -1) == [b"%d" % i for i in range(j, 3000, 60)]


def test_moved_replies_are_followed(cluster):
    """A stale slot map (every slot on one node) gets MOVED replies for two
    thirds of the keys; they reach their owners, none is reported lost."""
    lists = BufferedListProducer(cluster)
    lists._table = [lists._table[0]] * 16384
    for i in range(600):
        lists.push(f"m{i % 30}", b"%d" % i)
    lists.close()
    st = lists.stats()
    assert st["redirected"] > 0 and st["errors"] == 0
    for j in range(30):
        assert sorted(int(x) for x in cluster.lrange(f"m{j}", 0, -1)) == list(range(j, 600, 30))


def test_sharded_publish_on_a_cluster(cluster):
    node = cluster.nodes_manager.get_node_from_slot(key_slot("shard-ch"))
    p = redis.Redis(host=node.host, port=node.port).pubsub()
    p.ssubscribe("shard-ch")
    assert p.get_sharded_message(timeout=5)["type"] == "ssubscribe"
    with BufferedPublisher(cluster, sharded=True) as pub:
        for i in range(100):
            pub.publish("shard-ch", b"%d" % i)
    got = []
    while len(got) < 100 and (m := p.get_sharded_message(timeout=5)) is not None:
        got.append(m["data"])
    assert got == [b"%d" % i for i in range(100)]


def test_plain_publish_on_a_cluster_goes_through_one_node(cluster):
    with BufferedPublisher(cluster) as pub:              # PUBLISH: any node reaches all
        pub.publish("everyone", "hi")
        assert type(pub) is BufferedPublisher
