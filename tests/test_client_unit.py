"""Client internals that need no broker."""

import threading

import pytest
import time

import fastbus
from brokers import free_port
from fastbus.client._items import Batch


def test_get_batch_returns_while_batches_keep_arriving():
    """A sender as fast as the reader must not keep get_batch() from
    returning (it once looped while the inbox was non-empty)."""
    c = fastbus.Client(endpoint=f"tcp://127.0.0.1:{free_port()}", max_inbox_bytes=4 << 20)
    p = c.pubsub()
    batch = bytes(fastbus.encode([(b"t", b"x" * 20)] * 1000))
    stop = threading.Event()

    def flood():
        # Like a reader of the connection: refill as fast as possible,
        # pausing while the inbox is full.
        while not stop.is_set():
            if p._inbox_full():
                time.sleep(0.0001)
                continue
            for _ in range(200):
                p._deliver(Batch(0, batch))
                if p._inbox_full():
                    break

    t = threading.Thread(target=flood)
    t.start()
    try:
        time.sleep(0.05)
        for _ in range(20):
            result = []
            reader = threading.Thread(target=lambda: result.append(p.get_batch(timeout=1)), daemon=True)
            reader.start()
            reader.join(3)                       # a stuck call fails the test instead of hanging it
            assert not reader.is_alive(), "get_batch did not return while batches kept arriving"
            assert result and result[0]
    finally:
        stop.set()
        t.join()
        c.close(timeout=0.2)


def test_mixed_receive_calls_keep_order_and_lose_nothing():
    """get_message(), get_batch(max_messages=k) and get_batch() interleaved
    return every message once, in arrival order (each keeps what the others
    left for later)."""
    c = fastbus.Client(endpoint=f"tcp://127.0.0.1:{free_port()}")
    p = c.pubsub()
    p.subscribe_nowait("t")                       # no broker: requested, never confirmed
    n, per = 5000, 250
    for start in range(0, n, per):
        batch = fastbus.encode([(b"t", b"%d" % i) for i in range(start, start + per)])
        p._deliver(Batch(0, bytes(batch)))
    got = []
    calls = 0
    while len(got) < n:
        calls += 1
        kind = calls % 3
        if kind == 0:
            m = p.get_message(ignore_subscribe_messages=True, timeout=1)
            if m is not None and m["type"] == "message":
                got.append(int(m["data"]))
        elif kind == 1:
            part = p.get_batch(timeout=1, max_messages=calls % 700 + 1)
            assert len(part) <= calls % 700 + 1
            got.extend(int(d) for _c, d in part)
        else:
            got.extend(int(d) for _c, d in p.get_batch(timeout=1))
        assert calls < 10_000
    assert got == list(range(n))
    assert p.get_batch(timeout=0.05) == []
    with pytest.raises(ValueError, match="max_messages"):
        p.get_batch(max_messages=0)
    c.close(timeout=0.2)


def test_a_pubsub_tells_each_received_channel_its_subscription_without_a_broker():
    """What a PubSub makes of a received batch's channels (the decoder's
    subscription table, in C): an exact subscription beats any pattern; of
    the patterns, the longest literal prefix wins, then the first
    subscribed; a glob must match the whole channel; a channel nothing
    matches is dropped; unsubscribing changes the answer at once."""
    c = fastbus.Client(endpoint=f"tcp://127.0.0.1:{free_port()}")
    p = c.pubsub()
    p.psubscribe_nowait("news.*")                 # no broker: requested, never confirmed
    p.psubscribe_nowait("news.sp*")
    p.psubscribe_nowait("news.sp?rt", "news.s*")  # same literal prefix as "news.sp*": subscribed later
    p.subscribe_nowait("news.sport")
    p.psubscribe_nowait("other.[ab]")
    channels = [b"news.sport", b"news.spam", b"news.spert", b"news.x", b"other.a", b"other.c", b"nothing"]
    p._deliver(Batch(0, bytes(fastbus.encode([(ch, ch) for ch in channels]))))
    got = {m["data"]: (m["type"], m["pattern"]) for m in iter(lambda: p.get_message(True, timeout=0), None)}
    assert got == {b"news.sport": ("message", None),
                   b"news.spam": ("pmessage", b"news.sp*"),
                   b"news.spert": ("pmessage", b"news.sp*"),   # (news.sp?rt: the same prefix, later)
                   b"news.x": ("pmessage", b"news.*"),
                   b"other.a": ("pmessage", b"other.[ab]")}
    p.unsubscribe_nowait("news.sport")
    p.punsubscribe("news.sp*")
    p._deliver(Batch(0, bytes(fastbus.encode([(b"news.sport", b"1"), (b"news.spam", b"2")]))))
    got = [(m["type"], m["pattern"], m["data"]) for m in iter(lambda: p.get_message(True, timeout=0), None)]
    assert got == [("pmessage", b"news.sp?rt", b"1"), ("pmessage", b"news.s*", b"2")]
    assert [x for x in p.get_batch(timeout=0)] == []
    c.close(timeout=0.2)
