"""Message headers (``publish(channel, data, headers={...})``) with real
brokers in subprocesses: every client and reader, a federation, a sharded
client, a broker restart with its journal, the broker's limits, and bad
input from the network."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
import zmq
from brokers import (BrokerProcess, collect, confirm, expect_kick, free_port, quiet, raw_dealer, wait_for,
                     wait_wanted)

import fastbus
import fastbus.aio
from fastbus import protocol as P
from fastbus.errors import MessageTooLarge

TRACE = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "k=v"}


def data(msgs: list) -> list:
    return [(m["data"], m.get("headers")) for m in msgs]


def test_headers_reach_every_way_of_reading(brokers, clients):
    """get_message() gives a dict with ``headers`` for a message that has
    them and redis-py's four keys for one that has none; get_batch() a
    triple or a pair; decode_responses makes the values str; order and
    bytes are kept, whatever the mix in one batch."""
    b = brokers()
    sub = clients(b.endpoint)
    text = clients(b.endpoint, decode_responses=True)
    p, q, r = sub.pubsub(), text.pubsub(), sub.pubsub()
    for s in (p, q, r):
        s.subscribe("news")
        confirm(s, 1)
    pub = clients(b.endpoint)
    wait_wanted(pub, "news")
    binary = {"bin": b"\x00\xff\r\n", "ключ": "значение", "empty": b""}
    assert pub.publish("news", b"plain") == 1
    assert pub.publish("news", b"traced", headers=TRACE) == 1
    assert pub.publish("news", b"binary", headers=binary) == 1
    assert pub.publish("news", b"no headers", headers={}) == 1         # an empty mapping is none
    assert pub.publish_many([("news", b"m1"), ("news", b"m2", {"n": "2"}), ("news", b"m3", None)]) == 3
    pub.flush()
    want = [(b"plain", None), (b"traced", {k: v.encode() for k, v in TRACE.items()}),
            (b"binary", {"bin": b"\x00\xff\r\n", "ключ": "значение".encode(), "empty": b""}),
            (b"no headers", None), (b"m1", None), (b"m2", {"n": b"2"}), (b"m3", None)]
    got = collect(p, 7)
    assert data(got) == want
    assert set(got[0]) == {"type", "pattern", "channel", "data"}                 # redis-py's dict
    assert got[1] == {"type": "message", "pattern": None, "channel": b"news", "data": b"traced",
                      "headers": want[1][1]}
    texts = collect(q, 7)
    assert [(m["data"], m.get("headers")) for m in texts[:2]] == [("plain", None), ("traced", TRACE)]
    assert texts[2]["headers"] == {"bin": b"\x00\xff\r\n", "ключ": "значение", "empty": ""}   # binary stays bytes
    assert texts[5]["headers"] == {"n": "2"}
    batch = []
    deadline = time.monotonic() + 10
    while len(batch) < 7 and time.monotonic() < deadline:
        batch += r.get_batch(timeout=0.5)
    assert batch == [(b"news", d) if h is None else (b"news", d, h) for d, h in want]


def test_headers_after_get_batch_leaves_some_for_get_message(brokers, clients):
    """What get_batch() leaves (max_messages) and get_message() takes keeps
    its headers, and the other way round."""
    b = brokers()
    c = clients(b.endpoint)
    p = c.pubsub()
    p.subscribe("t")
    confirm(p, 1)
    wait_wanted(c, "t")
    for i in range(10):
        c.publish("t", b"%d" % i, headers={"i": str(i)})
    c.flush()
    wait_for(lambda: p.get_batch(timeout=0.1, max_messages=1) or None, what="the first message")
    m = p.get_message(timeout=5)
    assert (m["data"], m["headers"]) == (b"1", {"i": b"1"})
    rest = []
    deadline = time.monotonic() + 10
    while len(rest) < 8 and time.monotonic() < deadline:
        rest += p.get_batch(timeout=0.5)
    assert rest == [(b"t", b"%d" % i, {"i": b"%d" % i}) for i in range(2, 10)]


def test_headers_through_the_asyncio_client(brokers):
    b = brokers()

    async def main():
        async with fastbus.aio.Client(b.endpoint) as c:
            p = c.pubsub()
            await p.subscribe("a")
            assert (await p.get_message(timeout=5))["type"] == "subscribe"
            for _ in range(100):
                if c.is_wanted("a"):
                    break
                await asyncio.sleep(0.05)
            await c.publish("a", b"one", headers={"h": "1"})
            await c.publish("a", b"two")
            await c.publish_many([("a", b"three", {"h": b"3"})])
            await c.flush()
            got = []
            while len(got) < 3:
                m = await p.get_message(timeout=5)
                assert m is not None, got
                got.append((m["data"], m.get("headers")))
            await p.aclose()
            return got

    assert asyncio.run(main()) == [(b"one", {"h": b"1"}), (b"two", None), (b"three", {"h": b"3"})]


def test_headers_cross_a_federation_both_ways(brokers, clients):
    top = brokers("--allow-broker", "local", port=free_port())
    leaf = brokers("--upstream", top.endpoint)
    up_sub = clients(top.endpoint).pubsub()
    up_sub.subscribe("from.leaf")
    confirm(up_sub, 1)
    down_sub = clients(leaf.endpoint).pubsub()
    down_sub.psubscribe("from.top.*")
    confirm(down_sub, 1)
    at_top, at_leaf = clients(top.endpoint), clients(leaf.endpoint)
    wait_wanted(at_top, "from.top.x")
    wait_wanted(at_leaf, "from.leaf")
    at_top.publish("from.top.x", b"down", headers=TRACE)
    at_leaf.publish("from.leaf", b"up", headers={"k": b"\x01"})
    at_leaf.publish("from.leaf", b"plain")
    at_top.flush()
    at_leaf.flush()
    assert data(collect(down_sub, 1)) == [(b"down", {k: v.encode() for k, v in TRACE.items()})]
    assert data(collect(up_sub, 2)) == [(b"up", {"k": b"\x01"}), (b"plain", None)]


def test_headers_through_a_sharded_client(brokers):
    b1, b2 = brokers(), brokers()
    c = fastbus.ShardedClient([b1.endpoint, b2.endpoint])
    try:
        # Four channels on each broker (the ring depends on the ports).
        by_shard: dict[int, list] = {0: [], 1: []}
        for i in range(10_000):
            if len(by_shard[c.shard(f"ch{i}")]) < 4:
                by_shard[c.shard(f"ch{i}")].append(f"ch{i}")
        channels = by_shard[0] + by_shard[1]
        assert len(channels) == 8 and len({c.shard(ch) for ch in channels}) == 2   # both brokers carry some
        p = c.pubsub()
        p.subscribe(*channels)
        confirms = 0
        deadline = time.monotonic() + 10
        while confirms < len(channels) and time.monotonic() < deadline:
            m = p.get_message(timeout=0.2)
            confirms += m is not None and m["type"] == "subscribe"
        for cl in c.clients:
            wait_for(lambda: cl.stats()["filter_active"], what="the filters")
        wait_for(lambda: all(c.clients[c.shard(ch)].is_wanted(ch) for ch in channels), what="every channel wanted")
        for ch in channels:
            c.publish(ch, ch.encode(), headers={"ch": ch})
        c.publish_many([(ch, b"many", {"n": "1"}) for ch in channels])
        c.flush()
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 16 and time.monotonic() < deadline:
            m = p.get_message(timeout=0.2)
            if m is not None and m["type"] == "message":
                got.append(m)
        assert sorted((m["channel"], m["data"], tuple(m["headers"].items())) for m in got) == sorted(
            [(ch.encode(), ch.encode(), (("ch", ch.encode()),)) for ch in channels] +
            [(ch.encode(), b"many", (("n", b"1"),)) for ch in channels])
        p.close()
    finally:
        c.close()


def test_headers_survive_a_broker_killed_and_restarted_with_its_journal(brokers, tmp_path):
    b = brokers("--journal", str(tmp_path / "journal"))
    with fastbus.Client(b.endpoint) as c:
        p = c.pubsub(durable="ledger")
        p.subscribe("seq")
        assert p.get_message(timeout=5)["type"] == "subscribe"
        p.close()
        for i in range(200):
            c.publish("seq", str(i), headers={"i": str(i)} if i % 2 else None)
        c.flush()                                   # (once the journal has them)
    b.kill()
    b.start()
    with fastbus.Client(b.endpoint) as c:
        q = c.pubsub(durable="ledger")
        q.subscribe("seq")
        got = collect(q, 200, timeout=20)
        q.close()
    assert data(got) == [(str(i).encode(), {"i": str(i).encode()} if i % 2 else None) for i in range(200)]


def test_headers_count_against_max_payload(brokers, clients):
    """The client refuses a message whose payload and headers together are
    over the broker's --max-payload, before it is queued; a batch from the
    network with one such record has that record dropped and counted
    (oversize), its neighbours delivered."""
    b = brokers("--max-payload", "100")
    c = clients(b.endpoint)
    p = c.pubsub()
    p.subscribe("t")
    confirm(p, 1)
    wait_wanted(c, "t")
    c.publish("t", b"x" * 90, headers={"k": "v"})                  # 90 + 4 bytes: fits
    with pytest.raises(MessageTooLarge, match="headers"):
        c.publish("t", b"x" * 90, headers={"key": "v" * 10})      # 90 + 15
    with pytest.raises(MessageTooLarge):
        c.publish_many([("t", b"ok"), ("t", b"x" * 90, {"key": "v" * 10})])   # none of them queued
    c.flush()
    assert data(collect(p, 1)) == [(b"x" * 90, {"k": b"v"})]
    s = raw_dealer(b.endpoint)
    s.send_multipart([P.HELLO, P.dump_json({"v": 1, "role": "client", "pub": True, "name": "raw"})])
    s.send_multipart([P.PUB, bytes(fastbus.encode([("t", b"a"), ("t", b"x" * 90, {"key": "v" * 10}),
                                                   ("t", b"b", {"k": "v"})]))])
    assert data(collect(p, 2)) == [(b"a", None), (b"b", {"k": b"v"})]
    assert quiet(p) == []
    assert wait_for(lambda: b.stats()["drops"]["oversize"] == 1, what="the oversize count")
    s.close()


def _one_record(block: bytes) -> bytes:
    return b"FB\x01\x02\x01\x00\x00\x00" + bytes([1, 1, len(block)]) + b"t" + block + b"x"


@pytest.mark.parametrize("bad", [_one_record(b"\x00\x01v"), _one_record(b"\x03k\x01v"), _one_record(b"\x01k\x03v"),
                                 _one_record(b"\x81\x00k\x01v"),
                                 b"FB\x01\x06\x01\x00\x00\x00\x01\x01\x01tx",
                                 b"FB\x01\x06\x02\x00\x00\x00\x01\x01\x00tx\x01\x01\x01tx",
                                 b"FB\x01\x04\x01\x00\x00\x00\x01\x01tx"],
                         ids=["empty name", "name past the block", "value past the block", "non-minimal length",
                              "a repeat first", "a repeat after no headers", "repeats without headers"])
def test_a_malformed_header_block_from_the_network_is_refused(brokers, clients, bad):
    """A batch whose header block is malformed, or a repeat (flag bit 2)
    of no block, is refused whole (the sender is told and dropped, as for
    any malformed batch); the broker serves others on."""
    b = brokers()
    p = clients(b.endpoint).pubsub()
    p.subscribe("t")
    confirm(p, 1)
    s = raw_dealer(b.endpoint)
    s.send_multipart([P.HELLO, P.dump_json({"v": 1, "role": "client", "pub": True, "name": "evil"})])
    with pytest.raises(fastbus.BatchError):
        fastbus.decode(bad)
    s.send_multipart([P.PUB, bad])
    assert "protocol error" in expect_kick(s)
    s.close()
    assert quiet(p) == []
    assert b.stats()["drops"]["malformed"] == 1
    c = clients(b.endpoint)
    wait_wanted(c, "t")
    c.publish("t", b"fine", headers={"k": "v"})
    c.flush()
    assert data(collect(p, 1)) == [(b"fine", {"k": b"v"})]


def test_bad_headers_are_clear_errors_and_queue_nothing(brokers, clients):
    b = brokers()
    c = clients(b.endpoint)
    cases = [({1: "v"}, TypeError, "name must be a str"), ({"": "v"}, ValueError, "must not be empty"),
             ({"k": 3}, TypeError, "must be str or bytes"), (["k", "v"], TypeError, "mapping"),
             ({"k": None}, TypeError, "must be str or bytes")]
    for headers, error, text in cases:
        with pytest.raises(error, match=text):
            c.publish("t", b"x", headers=headers)
    with pytest.raises(TypeError):
        c.publish_many([("t", b"ok"), ("t", b"x", {"k": 3})])
    assert c.stats()["published"] == 0


def test_headers_and_the_redis_protocol(brokers, clients):
    """Redis's PUBLISH and its push messages carry no headers: a Redis
    client on the broker's --resp listener gets the message without them
    (documented), and fastbus's Redis publisher refuses them rather than
    drop them."""
    port = free_port()
    b = BrokerProcess("--resp", f"tcp://127.0.0.1:{port}")
    try:
        r = redis.Redis(port=port)
        ps = r.pubsub(ignore_subscribe_messages=True)
        ps.subscribe("t")
        c = clients(b.endpoint)
        wait_wanted(c, "t")
        c.publish("t", b"with", headers={"k": "v"})
        c.flush()
        m = None
        deadline = time.monotonic() + 10
        while m is None and time.monotonic() < deadline:
            m = ps.get_message(timeout=0.5)
        assert m == {"type": "message", "pattern": None, "channel": b"t", "data": b"with"}
        ps.close()
        r.close()
        from fastbus.redis import BufferedPublisher
        with BufferedPublisher(f"redis://127.0.0.1:{port}") as pub:
            with pytest.raises(ValueError, match="headers cannot go to Redis"):
                pub.publish("t", b"x", headers={"k": "v"})
    finally:
        b.stop()


def test_the_plain_zeromq_bridge_drops_headers(brokers, clients):
    """--zmq-pub's SUB sockets get [channel, payload]: ZeroMQ's pub/sub
    has no place for headers (documented)."""
    xpub = f"tcp://127.0.0.1:{free_port()}"
    b = brokers("--zmq-pub", xpub)
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.linger = 0
    sub.connect(xpub)
    sub.subscribe(b"t")
    c = clients(b.endpoint)
    try:
        wait_wanted(c, "t")
        c.publish("t", b"payload", headers={"k": "v"})
        c.flush()
        assert sub.poll(10_000)
        assert sub.recv_multipart() == [b"t", b"payload"]
    finally:
        sub.close()


def _raw_subscriber(endpoint: str, hello: dict) -> zmq.Socket:
    """A session on the wire: HELLO as given, SUB "t", until its CONFIRM."""
    s = raw_dealer(endpoint)
    s.send_multipart([P.HELLO, P.dump_json({"v": 1, "role": "client", "name": "raw", **hello})])
    s.send_multipart([P.SUB, P.pack_u64(1), bytes(P.encode_ops([(fastbus.SUBSCRIBE, b"t", False)]))])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if s.poll(500) and s.recv_multipart()[0] == P.CONFIRM:
            return s
    raise AssertionError("no CONFIRM")


def _data(s: zmq.Socket) -> bytes:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if s.poll(500):
            frames = s.recv_multipart()
            if frames[0] == P.DATA:
                return frames[2]
    raise AssertionError("no DATA")


def test_a_peer_whose_hello_does_not_say_headers_gets_none(brokers, clients):
    """Headers go only to peers that said they read them (HELLO
    ``"headers": true``; docs/PROTOCOL.md, versioning): an older client
    gets the same messages in the batch format it knows, without them."""
    b = brokers()
    old = _raw_subscriber(b.endpoint, {})
    new = _raw_subscriber(b.endpoint, {"headers": True})
    c = clients(b.endpoint)
    wait_wanted(c, "t")
    c.publish("t", b"one", headers={"k": "v"})
    c.publish("t", b"two")
    c.flush()
    for s, want in ((old, [(b"t", b"one"), (b"t", b"two")]), (new, [(b"t", b"one", {"k": b"v"}), (b"t", b"two")])):
        got = []
        while len(got) < 2:
            batch = _data(s)
            records = fastbus.decode(batch)
            # Flag bit 1 only where it is read, and only on a batch with a record that has headers.
            assert bool(batch[3] & fastbus.BATCH_F_HEADERS) == (s is new and any(len(r) == 3 for r in records))
            got += records
        assert got == want
        s.close()


def _fake_broker() -> tuple[zmq.Socket, fastbus.Client]:
    """A raw ROUTER standing for a broker, and a client of it."""
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.linger = 0
    port = router.bind_to_random_port("tcp://127.0.0.1")
    return router, fastbus.Client(endpoint=f"tcp://127.0.0.1:{port}")


def _hello_of(router: zmq.Socket, c: fastbus.Client) -> tuple[bytes, dict]:
    """Make the client connect (a first publish) and read its HELLO."""
    c.publish("t", b"first")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        assert router.poll(5000), "no HELLO"
        ident, cmd, *rest = router.recv_multipart()
        if cmd == P.HELLO:
            return ident, P.load_json(rest[0])
    raise AssertionError("no HELLO")


def test_a_broker_whose_welcome_does_not_say_headers_is_sent_none():
    """An older broker refuses a whole batch with an unknown flag: once its
    WELCOME shows it takes no headers, publish() with headers is a clear
    error and queues nothing, and messages without them go on."""
    router, c = _fake_broker()
    try:
        ident, hello = _hello_of(router, c)
        assert hello["headers"] is True                             # what this client says
        router.send_multipart([ident, P.WELCOME, P.dump_json({"v": 1, "instance": "old", "name": "old",
                                                              "limits": {}})])
        wait_for(lambda: c._publisher.headers_refused is not None, what="the WELCOME to be read")
        before = c.stats()["published"]
        with pytest.raises(ValueError, match="does not take headers"):
            c.publish("t", b"x", headers={"k": "v"})
        assert c.stats()["published"] == before
        assert c.publish("t", b"plain") == 1
    finally:
        c.close(timeout=0.5)
        router.close()


def test_repeated_headers_go_as_repeats_only_to_peers_that_read_them(brokers, clients):
    """A stream whose messages carry the same headers: the broker sends a
    record whose block is the one before's as a repeat (flag bit 2, one
    byte; docs/BATCH_FORMAT.md) to a peer whose HELLO said
    ``"headers_again": true``, and whole blocks to one that did not.  Both
    read the same messages, each with its headers."""
    b = brokers()
    plain = _raw_subscriber(b.endpoint, {"headers": True})
    again = _raw_subscriber(b.endpoint, {"headers": True, "headers_again": True})
    c = clients(b.endpoint)
    wait_wanted(c, "t")
    sent = [(b"%d" % i, TRACE if i != 10 else {"k": "v"}) for i in range(20)] + [(b"none", None)]
    for payload, headers in sent:
        c.publish("t", payload, headers=headers)
    c.flush()
    want = [(b"t", p, {k: v.encode() for k, v in h.items()}) if h else (b"t", p) for p, h in sent]
    for s, repeats in ((plain, False), (again, True)):
        got = []
        while len(got) < len(want):
            batch = _data(s)
            records = fastbus.decode(batch)
            got += records
            # (How the records fall into batches is the broker's timing: a
            # batch that holds a repeat says so exactly when the peer reads them.)
            assert bool(batch[3] & fastbus.BATCH_F_HEADERS_AGAIN) == (repeats and _repeats_in(records))
        assert got == want
        s.close()


def _repeats_in(records: list) -> bool:
    """Do two records in a row carry the same (non-empty) headers?"""
    return any(len(a) == len(b) == 3 and a[2] == b[2] for a, b in zip(records, records[1:]))


@pytest.mark.parametrize("takes_repeats", [False, True])
def test_a_client_sends_repeats_only_to_a_broker_that_reads_them(takes_repeats):
    """The client's HELLO says it reads repeats; its own batches carry
    them only once the WELCOME says the broker reads them (an older broker
    would refuse the whole batch for the unknown flag)."""
    router, c = _fake_broker()
    try:
        ident, hello = _hello_of(router, c)
        assert hello["headers_again"] is True                       # it reads them
        welcome = {"v": 1, "instance": "fake", "name": "fake", "headers": True, "limits": {"max_topic": 1234}}
        if takes_repeats:
            welcome["headers_again"] = True
        router.send_multipart([ident, P.WELCOME, P.dump_json(welcome)])
        wait_for(lambda: c._publisher.max_topic == 1234, what="the WELCOME to be read")
        assert c._publisher.outbox.header_repeats == takes_repeats
        n = 300                                                     # (enough that batches hold several)
        for i in range(n):
            c.publish("t", b"%d" % i, headers=TRACE)
        records = []
        deadline = time.monotonic() + 10
        while len(records) < n and time.monotonic() < deadline:
            if router.poll(500):
                frames = router.recv_multipart()
                if frames[1] == P.PUB:
                    batch = frames[2]
                    recs = [r for r in fastbus.decode(batch) if r[1] != b"first"]
                    records += recs
                    # (How records fall into batches is the sender's timing; a
                    # batch says repeats exactly when it holds one and the broker reads them.)
                    assert bool(batch[3] & fastbus.BATCH_F_HEADERS_AGAIN) == (takes_repeats and _repeats_in(recs))
        assert records == [(b"t", b"%d" % i, {k: v.encode() for k, v in TRACE.items()}) for i in range(n)]
    finally:
        c.close(timeout=0.5)
        router.close()
