"""Batches form by themselves: a message on an idle hop leaves at once, and a
linger (``max_delay``) only makes batches larger under load.

Timings here are generous bounds that a timer would blow (a linger of 5 s
against "well under a second"); the latency figures themselves are
bench/latency_bench.py's.  Real brokers in subprocesses, on loopback.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest
from brokers import wait_for

import fastbus

LINGER = 5.0          # a timer this long would fail every test below
PROMPT = 1.0          # "well under a second": what a message on an idle hop takes, with room for a slow machine


def _subscribed(c: fastbus.Client, channel: str):
    p = c.pubsub()
    p.subscribe(channel)
    m = p.get_message(timeout=10)
    assert m is not None and m["type"] == "subscribe"
    return p


def _wanted(c: fastbus.Client, channel: str) -> None:
    wait_for(lambda: c.stats()["filter_active"] and c.is_wanted(channel), what=f"the filter to want {channel}")


def _receive(p, timeout: float = PROMPT) -> dict | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = p.get_message(timeout=max(0.0, deadline - time.monotonic()))
        if m is not None and m["type"] == "message":
            return m
    return None


def test_a_lone_message_arrives_long_before_any_linger(brokers):
    """max_delay=5 on both ends (client and broker) and still a single
    message arrives in well under a second: a linger never holds a message
    on an idle hop."""
    b = brokers("--max-delay", str(LINGER))
    with fastbus.Client(endpoint=b.endpoint, max_delay=LINGER) as pub, \
            fastbus.Client(endpoint=b.endpoint, max_delay=LINGER) as sub:
        p = _subscribed(sub, "lone")
        _wanted(pub, "lone")
        t0 = time.monotonic()
        assert pub.publish("lone", b"hello") == 1
        m = _receive(p)
        assert m is not None and m["data"] == b"hello", f"the message did not arrive within {PROMPT} s"
        assert time.monotonic() - t0 < PROMPT


def test_a_linger_holds_only_what_follows_a_send(brokers):
    """With a linger, what is published within max_delay of the previous
    batch waits for the rest of it (that is what a linger is for); then it
    arrives, without flush()."""
    linger = 0.5
    b = brokers()
    with fastbus.Client(endpoint=b.endpoint, max_delay=linger) as pub, fastbus.Client(endpoint=b.endpoint) as sub:
        p = _subscribed(sub, "w")
        _wanted(pub, "w")
        pub.publish("w", b"first")                       # idle: leaves at once
        assert (m := _receive(p)) is not None and m["data"] == b"first"
        t0 = time.monotonic()
        pub.publish("w", b"second")                      # within the linger of the first
        m = _receive(p, timeout=5)
        took = time.monotonic() - t0
        assert m is not None and m["data"] == b"second"
        assert linger / 4 < took < 5, took


def test_default_settings_deliver_without_flush_or_timer(brokers):
    """With the defaults, a message needs neither flush() nor a timer, from
    a publisher used at a low rate and from one in a burst (the keeper
    sends what the burst left once the publishing thread goes idle)."""
    b = brokers()
    with fastbus.Client(endpoint=b.endpoint) as pub, fastbus.Client(endpoint=b.endpoint) as sub:
        p = _subscribed(sub, "d")
        _wanted(pub, "d")
        pub.publish("d", b"one")
        assert (m := _receive(p)) is not None and m["data"] == b"one"
        # A burst: back to back, more than fit in one batch and not a multiple of it.
        n = 2500
        for i in range(n):
            pub.publish("d", b"%d" % i)
        got = []
        deadline = time.monotonic() + 10
        while len(got) < n and time.monotonic() < deadline:
            got += [d for _c, d in p.get_batch(timeout=0.5)]
        assert got == [b"%d" % i for i in range(n)]              # all, in order, with no flush()


def test_publishing_threads_share_a_client(brokers):
    """Several threads publishing through one client: every message arrives
    once, in order per thread (inline sends and the keeper share the
    connection under its lock)."""
    b = brokers()
    with fastbus.Client(endpoint=b.endpoint) as pub, fastbus.Client(endpoint=b.endpoint) as sub:
        p = _subscribed(sub, "t")
        _wanted(pub, "t")
        threads, per = 4, 3000

        def run(k: int) -> None:
            for i in range(per):
                pub.publish("t", b"%d:%d" % (k, i))
                if i % 500 == 0:
                    time.sleep(0.001)          # idle moments: inline sends mix with batches

        ts = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        got = []
        deadline = time.monotonic() + 15
        while len(got) < threads * per and time.monotonic() < deadline:
            got += [d for _c, d in p.get_batch(timeout=0.5)]
        assert len(got) == threads * per
        for k in range(threads):
            mine = [int(d.split(b":")[1]) for d in got if d.startswith(b"%d:" % k)]
            assert mine == list(range(per))


def test_linger_makes_larger_batches_under_load(brokers):
    """A linger is for larger batches: published flat out, the same messages
    reach the broker in far fewer batches with max_delay=0.05 than without."""
    batches = {}
    for linger in (None, 0.05):
        b = brokers()
        with fastbus.Client(endpoint=b.endpoint) as sub, \
                fastbus.Client(endpoint=b.endpoint, max_delay=linger, max_messages=100_000,
                               max_bytes=64 << 20) as pub:
            p = _subscribed(sub, "L")
            _wanted(pub, "L")
            t0 = time.monotonic()
            n = 0
            while time.monotonic() - t0 < 0.5:
                for _ in range(50):
                    pub.publish("L", b"x")
                n += 50
                time.sleep(0.0005)            # idle moments, where a publisher without linger sends
            pub.flush()
            got = 0
            deadline = time.monotonic() + 10
            while got < n and time.monotonic() < deadline:
                got += len(p.get_batch(timeout=0.5))
            assert got == n
            batches[linger] = b.stats()["batches_in"]
    assert batches[0.05] * 3 < batches[None], batches


def test_asyncio_lone_message_and_burst(brokers):
    """The asyncio client: a lone message with max_delay=5 arrives well
    under a second, and a burst published without yielding leaves when the
    task yields, without flush()."""
    b = brokers("--max-delay", str(LINGER))

    async def main() -> None:
        async with fastbus.aio.Client(endpoint=b.endpoint, max_delay=LINGER) as pub, \
                fastbus.aio.Client(endpoint=b.endpoint, max_delay=LINGER) as sub:
            p = sub.pubsub()
            await p.subscribe("a")
            assert (await p.get_message(timeout=10))["type"] == "subscribe"
            deadline = time.monotonic() + 10
            while not pub.is_wanted("a") or not pub.stats()["filter_active"]:
                assert time.monotonic() < deadline, "the filter never wanted 'a'"
                await pub.publish("other", b"warm")        # binds the client to this loop
                await asyncio.sleep(0.01)
            t0 = time.monotonic()
            assert await pub.publish("a", b"lone") == 1
            m = await p.get_message(timeout=PROMPT)
            assert m is not None and m["data"] == b"lone", m
            assert time.monotonic() - t0 < PROMPT
            await asyncio.sleep(0.05)
            for i in range(500):
                await pub.publish("a", b"%d" % i)          # no yield in between
            got = []
            t0 = time.monotonic()
            while len(got) < 500 and time.monotonic() - t0 < 10:
                got += [d for _c, d in await p.get_batch(timeout=0.5)]
            assert got == [b"%d" % i for i in range(500)]
            await p.aclose()

    asyncio.run(main())


def test_asyncio_flush_while_the_broker_is_not_reading(brokers):
    """An asyncio flush() of 5 MB published while the broker is stopped
    (SIGSTOP): the pipe to it fills, and what is left the client's native
    sender sends once the broker reads again, without telling the loop.
    The flush still sees it go, and confirms; every message arrives, in
    order.  (A flush that waited for the loop to be told waited out its
    timeout.)"""
    b = brokers()

    async def main() -> None:
        async with fastbus.aio.Client(endpoint=b.endpoint) as pub:
            with fastbus.Client(endpoint=b.endpoint) as sub:
                p = sub.pubsub(ignore_subscribe_messages=True)
                p.subscribe("big")
                deadline = time.monotonic() + 10
                while not pub.is_wanted("big"):
                    assert time.monotonic() < deadline, "the filter never wanted 'big'"
                    await pub.publish("other", b"warm")
                    await asyncio.sleep(0.01)
                n = 5000
                os.kill(b.proc.pid, signal.SIGSTOP)
                try:
                    for i in range(n):
                        await pub.publish("big", b"%06d" % i + b"x" * 994)
                    flush = asyncio.create_task(pub.flush(timeout=10))
                    await asyncio.sleep(0.3)
                    assert not flush.done()
                finally:
                    os.kill(b.proc.pid, signal.SIGCONT)
                await flush
                got = []
                while len(got) < n:
                    batch = p.get_batch(timeout=5)
                    assert batch, f"{len(got)} of {n} arrived"
                    got += [int(d[:6]) for _c, d in batch]
                assert got == list(range(n))
                p.close()

    asyncio.run(main())


def test_asyncio_publish_waits_for_room_without_blocking_the_loop(brokers):
    """A full buffer (no broker) makes publish() wait without stopping the
    event loop, and raise PublishTimeout after block_timeout."""
    from brokers import free_port

    async def main() -> None:
        c = fastbus.aio.Client(endpoint=f"tcp://127.0.0.1:{free_port()}", max_buffer_bytes=64 * 1024,
                               max_bytes=4096, block_timeout=0.5)
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        t = asyncio.create_task(ticker())
        t0 = time.monotonic()
        with pytest.raises(fastbus.PublishTimeout):
            for _ in range(100_000):
                await c.publish("x", b"y" * 100)
        assert time.monotonic() - t0 < 5
        t.cancel()
        assert ticks >= 20, ticks                        # the loop kept running meanwhile
        await c.aclose(timeout=0.2)

    asyncio.run(main())
