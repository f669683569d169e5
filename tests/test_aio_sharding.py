"""The asyncio client and the sharding client, against real brokers."""

import asyncio
import time

import pytest
from brokers import wait_for

import fastbus


def test_asyncio_client_same_api(brokers):
    b = brokers()

    async def main():
        async with fastbus.aio.Client(endpoint=b.endpoint) as c:
            p = c.pubsub()
            await p.subscribe("a")
            await p.psubscribe("b.*")
            confirms = [await p.get_message(timeout=5), await p.get_message(timeout=5)]
            assert [m["type"] for m in confirms] == ["subscribe", "psubscribe"]
            assert await p.get_message(timeout=0.05) is None          # waits without blocking the loop
            ticks = 0

            async def ticker():                                       # the loop stays responsive
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1

            t = asyncio.create_task(ticker())
            assert await p.get_message(timeout=0.3) is None
            t.cancel()
            assert ticks >= 10
            while not (c.stats()["filter_active"] and c.is_wanted("a") and c.is_wanted("b.1")):
                await asyncio.sleep(0.01)
            assert await c.publish("a", b"1") == 1
            await c.publish("b.1", b"2")
            await c.flush()
            got = []
            async for m in p.listen():
                got.append((m["type"], m["channel"], m["data"]))
                if len(got) == 2:
                    break
            assert got == [("message", b"a", b"1"), ("pmessage", b"b.1", b"2")]
            await c.publish_many([("a", b"%d" % i) for i in range(100)])
            await c.flush()
            batch = []
            while len(batch) < 100:
                batch += await p.get_batch(timeout=5)
            assert [d for _c, d in batch] == [b"%d" % i for i in range(100)]
            assert (await c.broker_stats())["messages_in"] == 102
            await p.aclose()

    asyncio.run(main())


def test_sharded_client_spreads_channels_and_patterns(brokers):
    b1, b2, b3 = brokers(), brokers(), brokers()
    eps = [b1.endpoint, b2.endpoint, b3.endpoint]
    with fastbus.ShardedClient(eps) as c:
        owners = {c.shard(f"ch{i}") for i in range(200)}
        assert owners == {0, 1, 2}                                 # every broker owns some channels
        with fastbus.ShardedClient(list(eps)) as other:            # every process agrees
            assert all(other.shard(f"ch{i}") == c.shard(f"ch{i}") for i in range(200))
        p = c.pubsub()
        chans = [f"ch{i}" for i in range(30)]
        p.subscribe(*chans)
        p.psubscribe("room.*")
        confirms = []
        while len(confirms) < 31:
            m = p.get_message(timeout=5)
            assert m is not None
            confirms.append(m)
        assert [m["type"] for m in confirms].count("psubscribe") == 1   # a pattern is confirmed once
        assert max(m["data"] for m in confirms) == 31
        for cl in c.clients:
            wait_for(lambda cl=cl: cl.stats()["filter_active"], what="filters")
        wait_for(lambda: all(c.clients[c.shard(ch)].is_wanted(ch) for ch in chans), what="channel filters")
        wait_for(lambda: all(cl.is_wanted("room.1") for cl in c.clients), what="pattern filters")
        for ch in chans:
            c.publish(ch, ch.encode())
        for i in range(10):
            c.publish(f"room.{i}", b"r")                           # spread over the shards, all delivered
        c.flush()
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 40 and time.monotonic() < deadline:
            got += p.get_batch(timeout=0.5)
        assert sorted(ch for ch, _d in got) == sorted([ch.encode() for ch in chans] +
                                                      [f"room.{i}".encode() for i in range(10)])
        per_broker = [b.stats()["messages_in"] for b in (b1, b2, b3)]
        assert sum(per_broker) == 40 and all(n > 0 for n in per_broker)
        p.close()
    with pytest.raises(ValueError):
        fastbus.ShardedClient([])


@pytest.mark.parametrize("base", [6464, 20000, 38911, 51234])
def test_sharded_client_gives_brokers_on_neighbouring_ports_even_shares(base):
    """Brokers on neighbouring ports have names that differ in one byte: the
    ring's hash must still spread them (CRC-32C alone gave 28/42/30% on
    6464-6466 and left one broker nothing in some draws).  The ring needs no
    broker to be running: a Client connects in the background."""
    endpoints = [f"tcp://127.0.0.1:{base + i}" for i in range(3)]
    with fastbus.ShardedClient(endpoints) as c:
        shares = [0, 0, 0]
        for i in range(6000):
            shares[c.shard(f"room.{i}")] += 1
        c.close(timeout=0)
    assert all(1500 <= s <= 2500 for s in shares), shares      # a third is 2000
    again = fastbus.ShardedClient(list(endpoints))               # every process agrees
    try:
        assert [again.shard(f"room.{i}") for i in range(300)] == [c.shard(f"room.{i}") for i in range(300)]
    finally:
        again.close(timeout=0)
