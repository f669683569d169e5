"""fastbus.redis.Subscriber against a real server (the embedded one; CI also
runs these against Debian's redis-server 7)."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from fastbus.redis import BufferedPublisher, Subscriber


def confirmed(sub: Subscriber, n: int) -> list:
    out = []
    while len(out) < n:
        m = sub.get_message(timeout=5)
        assert m is not None, f"only {len(out)} confirmations"
        out.append(m)
    return out


def test_exact_and_pattern_messages_shaped_like_redis_py(redis_url):
    r = redis.Redis.from_url(redis_url)
    with Subscriber(redis_url) as sub:
        sub.subscribe("news")
        sub.psubscribe("market.*")
        assert [m["type"] for m in confirmed(sub, 2)] == ["subscribe", "psubscribe"]
        r.publish("news", b"\x00bin\r\n")
        r.publish("market.eu", "up")
        r.publish("other", "nobody")
        assert sub.get_message(timeout=5) == {"type": "message", "pattern": None, "channel": b"news",
                                              "data": b"\x00bin\r\n"}
        assert sub.get_message(timeout=5) == {"type": "pmessage", "pattern": b"market.*",
                                              "channel": b"market.eu", "data": b"up"}
        assert sub.get_message(timeout=0.2) is None
        sub.unsubscribe("news")
        assert sub.get_message(timeout=5)["type"] == "unsubscribe"


def test_batches_many_per_call_in_order_and_large_payloads(redis_url):
    n = 20_000
    big = bytes(range(256)) * (10 * 1024 * 1024 // 256)           # 10 MB
    with Subscriber(redis_url) as sub:
        sub.subscribe("ch")
        confirmed(sub, 1)
        with BufferedPublisher(redis_url) as pub:
            for i in range(n):
                pub.publish("ch", b"%d" % i)
            pub.publish("ch", big)
        got = []
        calls = 0
        while len(got) < n + 1 and calls < 10_000:
            got += sub.get_batch(timeout=5)
            calls += 1
        assert [d for _c, d in got[:n]] == [b"%d" % i for i in range(n)]
        assert got[n] == (b"ch", big)
        assert calls < n / 10                                    # many per call
        assert sub.get_batch(timeout=0.1) == []


def test_decode_responses(redis_url):
    with Subscriber(redis_url, decode_responses=True) as sub:
        sub.subscribe("txt")
        assert confirmed(sub, 1)[0] == {"type": "subscribe", "pattern": None, "channel": "txt", "data": 1}
        redis.Redis.from_url(redis_url).publish("txt", "héllo")
        assert sub.get_message(timeout=5)["data"] == "héllo"


def test_reconnects_resubscribes_and_reports_the_gap(redis_server, redis_url):
    with Subscriber(redis_url, ignore_subscribe_messages=True) as sub:
        sub.subscribe("ch")
        sub.psubscribe("p.*")
        confirmed(sub, 0)
        assert sub.get_message(timeout=1) is None           # confirmations, ignored
        redis_server.kill()
        time.sleep(0.3)
        redis_server.start()                                # same port, empty
        m = sub.get_message(timeout=10)
        assert m is not None and m["type"] == "gap" and m["data"]["down_s"] >= 0
        r = redis.Redis.from_url(redis_url)
        deadline = time.monotonic() + 10
        while r.pubsub_numsub("ch")[0][1] < 1 or r.pubsub_numpat() < 1:    # resubscribed by itself
            assert time.monotonic() < deadline, "no resubscription"
            time.sleep(0.05)
        r.publish("ch", "after")
        r.publish("p.x", "after too")
        assert sub.get_message(timeout=5)["data"] == b"after"
        assert sub.get_message(timeout=5)["data"] == b"after too"
        assert sub.reconnects == 1


def test_bad_arguments(redis_url):
    with Subscriber(redis_url) as sub:
        with pytest.raises(ValueError):
            sub.subscribe()
        with pytest.raises(TypeError):
            sub.subscribe(True)                              # the one rule (fastbus._messages): a bool is refused
        assert sub.get_message(timeout=0.05) is None        # nothing subscribed: no wait, no error
    with pytest.raises(ValueError, match="not a Redis URL"):
        Subscriber("http://127.0.0.1:1")
    with pytest.raises(ValueError):
        Subscriber(redis_url, reconnect_max_delay=0)


# -- while the server is down (issue 14, items 5 and 6) -------------------------


def _in_thread(fn, within: float):
    """(finished, result, seconds) of ``fn()`` run in a thread, waited for
    ``within`` seconds (a read that never returns must not hang the suite)."""
    out: list = []
    t0 = time.monotonic()
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(within)
    return (not t.is_alive()), (out[0] if out else None), time.monotonic() - t0


def test_reads_honour_their_timeout_while_the_server_is_down(redis_server, redis_url):
    sub = Subscriber(redis_url, ignore_subscribe_messages=True)
    try:
        sub.subscribe("ch")
        assert sub.get_message(timeout=1) is None                    # the confirmation, ignored
        redis_server.kill()
        for read, empty in ((lambda: sub.get_message(timeout=1), None), (lambda: sub.get_batch(timeout=1), [])):
            done, result, took = _in_thread(read, within=15)
            assert done, "a read with timeout=1 was still blocked after 15 s"
            assert result == empty and took < 6, (result, took)
        assert sub.get_message(timeout=0) is None                    # a poll returns at once too
        redis_server.start()
        m = sub.get_message(timeout=10)
        assert m is not None and m["type"] == "gap"
        r = redis.Redis.from_url(redis_url)
        deadline = time.monotonic() + 10
        while r.pubsub_numsub("ch")[0][1] < 1:
            assert time.monotonic() < deadline, "no resubscription"
            time.sleep(0.05)
        r.publish("ch", "back")
        assert sub.get_message(timeout=5)["data"] == b"back"
    finally:
        sub.close()
        redis_server.start()


def test_gap_measures_the_outage_when_the_subscriber_was_not_reading(redis_server, redis_url):
    with Subscriber(redis_url) as sub:
        sub.subscribe("ch")
        confirmed(sub, 1)                                         # read: connected now
        redis_server.kill()
        time.sleep(1.0)                                           # not reading meanwhile
        redis_server.start()
        m = sub.get_message(timeout=10)
        assert m is not None and m["type"] == "gap"
        assert 0.9 <= m["data"]["down_s"] < 30, m


def test_gap_of_a_subscriber_reading_through_the_outage(redis_server, redis_url):
    """Reading when the server dies: the gap counts from then, not from the
    start of the read."""
    with Subscriber(redis_url, ignore_subscribe_messages=True) as sub:
        sub.subscribe("ch")
        assert sub.get_message(timeout=0.5) is None
        threading.Timer(2.0, redis_server.kill).start()
        threading.Timer(2.5, redis_server.start).start()
        m = sub.get_message(timeout=20)
        assert m is not None and m["type"] == "gap"
        assert m["data"]["down_s"] < 2.0, m                        # the outage, not the 2 s of reading before it
    time.sleep(1.0)
    redis_server.start()
