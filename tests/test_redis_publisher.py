"""BufferedPublisher and BufferedListProducer against a real server (the
embedded one; CI also runs these against Debian's redis-server 7)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time

import pytest
import redis

from fastbus.redis import (
    AsyncBufferedListProducer,
    AsyncBufferedPublisher,
    BufferedListProducer,
    BufferedPublisher,
    PublishError,
    PublishTimeout,
)


def subscribe(url: str, *channels: str):
    """A redis-py subscriber whose subscriptions are confirmed."""
    p = redis.Redis.from_url(url).pubsub()
    p.subscribe(*channels)
    for _ in channels:
        m = p.get_message(timeout=5)
        assert m is not None and m["type"] == "subscribe", m
    p.ignore_subscribe_messages = True
    return p


def received(p, n: int, timeout: float = 10.0) -> list:
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        m = p.get_message(timeout=0.5)
        if m is not None and m["type"] == "message":
            out.append(m["data"])
    return out


@pytest.mark.parametrize("how", ["size", "time", "flush", "close"])
def test_nothing_lost_or_reordered_whatever_flushes(redis_url, how):
    n = 2500
    p = subscribe(redis_url, "ch")
    pub = BufferedPublisher(redis_url, max_messages=1000 if how == "size" else 100_000,
                            max_delay=0.05 if how == "time" else 30)
    for i in range(n):
        assert pub.publish("ch", b"%d" % i) == 1
    if how == "flush":
        pub.flush()
    elif how == "close":
        pub.close()
    elif how == "size":
        got = received(p, 2000)                  # two full batches went by themselves
        assert got == [b"%d" % i for i in range(2000)]
    got = received(p, n if how != "size" else n - 2000)
    if how == "size":
        assert got == []                         # the rest waits for flush or close...
        pub.close()
        got = [b"%d" % i for i in range(2000)] + received(p, n - 2000)
    assert got == [b"%d" % i for i in range(n)]
    if how == "time":
        pub.flush()          # the subscriber can have them before the publisher reads the replies
    st = pub.stats()
    assert st["published"] == n and st["errors"] == 0 and st["buffered"] == 0
    assert st["receivers"] == n                  # PUBLISH replies: one subscriber each time
    pub.close()


def test_many_threads_publishing_at_once(redis_url):
    threads, per = 8, 5000
    pub = BufferedPublisher(redis_url, max_messages=500)
    r = redis.Redis.from_url(redis_url)
    with BufferedListProducer(redis_url, max_messages=700) as lists:
        def work(t: int) -> None:
            for i in range(per):
                pub.publish(f"t{t}", b"%d" % i)
                lists.push(f"list{t}", b"%d" % i)

        ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    pub.close()
    for t in range(threads):                   # every message, in each thread's order
        assert r.lrange(f"list{t}", 0, -1) == [b"%d" % i for i in range(per)]
    assert pub.stats()["published"] == threads * per


def test_binary_large_and_numeric_payloads(redis_url):
    p = subscribe(redis_url, "bin")
    big = bytes(range(256)) * (10 * 1024 * 1024 // 256)          # 10 MB
    odd = b"\r\n$3\r\n*1\r\n\x00\xff"
    with BufferedPublisher(redis_url) as pub:
        pub.publish("bin", odd)
        pub.publish("bin", big)
        pub.publish(b"bin", 42)
        pub.publish("bin", 1.5)
        pub.publish("bin", "")
    assert received(p, 5, timeout=20) == [odd, big, b"42", b"1.5", b""]


def test_server_errors_are_reported_not_swallowed(redis_url):
    r = redis.Redis.from_url(redis_url)
    r.set("not-a-list", "x")
    seen = []
    lists = BufferedListProducer(redis_url, on_error=lambda err, failed: seen.append((err.reason, failed)))
    lists.push("q", "a")
    lists.push("not-a-list", "b")
    lists.push("q", "c")
    with pytest.raises(PublishError, match="WRONGTYPE") as ei:
        lists.flush()
    assert ei.value.failed == [(b"not-a-list", b"b")] and ei.value.count == 1
    assert seen and seen[0][1] == [(b"not-a-list", b"b")]
    assert r.lrange("q", 0, -1) == [b"a", b"c"]         # the others in the batch went through
    st = lists.stats()
    assert (st["published"], st["errors"]) == (2, 1)
    lists.flush()                                        # reported once
    lists.close()


def test_server_killed_and_restarted_mid_stream(redis_server, redis_url):
    """Kill -9 while publishing, restart on the same port: the failed
    batches are retried, and every message is accounted for: answered
    before the kill, in the list after the restart, or reported failed."""
    n = 60_000
    failed: list = []
    lists = BufferedListProducer(redis_url, max_messages=500, max_delay=0.01,
                                 on_error=lambda err, msgs: failed.extend(msgs))
    answered_before = None
    for i in range(n):
        lists.push("q", b"%d" % i)
        if i == n // 3:
            lists.flush()
            answered_before = lists.stats()["published"]
            redis_server.kill()
        if i == n // 2:
            time.sleep(0.2)                              # publishing on while it is down
            redis_server.start()                         # same port, empty
    try:
        lists.flush(timeout=60)
    except PublishError:
        pass
    lists.close()
    r = redis.Redis.from_url(redis_url)
    after = [int(x) for x in r.lrange("q", 0, -1)]
    st = lists.stats()
    lost = {int(v) for _k, v in failed}
    assert st["retries"] > 0                              # the failure was seen
    assert st["errors"] == len(failed)
    # In order (a retried tail may repeat the last messages once).
    assert all(b >= a or b >= after[0] for a, b in zip(after, after[1:]))
    accounted = set(range(answered_before)) | set(after) | lost
    assert accounted == set(range(n)), f"unaccounted: {sorted(set(range(n)) - accounted)[:10]}"
    assert after[-1] == n - 1 or (n - 1) in lost


def test_unreachable_server_fails_loudly(redis_server, redis_url):
    from redis.backoff import NoBackoff
    from redis.retry import Retry
    seen = []
    pub = BufferedPublisher(redis_url, retry=Retry(NoBackoff(), 1), socket_timeout=2,
                            on_error=lambda err, msgs: seen.append(len(msgs)))
    pub.publish("ch", "first")
    pub.flush()
    redis_server.kill()
    for i in range(10):
        pub.publish("ch", b"%d" % i)
    with pytest.raises(PublishError) as ei:
        pub.flush()
    assert ei.value.count == 10 and ei.value.failed[0] == (b"ch", b"0")
    assert seen == [10]
    assert pub.stats()["errors"] == 10
    pub.close()
    redis_server.start()


def test_publish_blocks_then_times_out_when_nothing_drains(redis_server, redis_url):
    from redis.backoff import ConstantBackoff
    from redis.retry import Retry
    redis_server.kill()
    pub = BufferedPublisher(redis_url, max_bytes=1000, max_buffer_bytes=20_000, block_timeout=0.3,
                            retry=Retry(ConstantBackoff(0.5), 20))
    t0 = time.monotonic()
    with pytest.raises(PublishTimeout):
        for _ in range(100_000):
            pub.publish("ch", b"x" * 100)
    assert time.monotonic() - t0 < 10
    redis_server.start()
    pub.flush(timeout=30)                      # the retries get through once the server is back
    pub.close()


def test_bad_arguments(redis_url):
    with pytest.raises(ValueError, match="not a Redis URL"):
        BufferedPublisher("http://127.0.0.1:6379")
    with pytest.raises(TypeError, match="expected a Redis URL"):
        BufferedPublisher(42)
    for kw in ({"max_messages": 0}, {"max_bytes": 0}, {"max_delay": 0}, {"socket_timeout": -1},
               {"block_timeout": -1}, {"max_buffer_bytes": 10}):
        with pytest.raises(ValueError):
            BufferedPublisher(redis_url, **kw)
    with pytest.raises(TypeError, match="on_error"):
        BufferedPublisher(redis_url, on_error="print")
    with BufferedPublisher(redis.Redis.from_url(redis_url)) as pub:   # a client, or its pool
        with pytest.raises(TypeError, match="expected bytes"):
            pub.publish("ch", None)
        with pytest.raises(TypeError):
            pub.publish("ch", True)
    pub2 = BufferedPublisher(redis.ConnectionPool.from_url(redis_url))
    pub2.close()
    with pytest.raises(PublishError, match="closed"):
        pub2.publish("ch", "late")


def test_sharded_publish(redis_url):
    r = redis.Redis.from_url(redis_url)
    p = r.pubsub()
    p.ssubscribe("shard")
    assert p.get_sharded_message(timeout=5)["type"] == "ssubscribe"
    with BufferedPublisher(redis_url, sharded=True) as pub:
        for i in range(100):
            pub.publish("shard", b"%d" % i)
    got = []
    while len(got) < 100 and (m := p.get_sharded_message(timeout=5)) is not None:
        got.append(m["data"])
    assert got == [b"%d" % i for i in range(100)]


def test_asyncio_publisher(redis_url):
    p = subscribe(redis_url, "aio")

    async def main():
        async with AsyncBufferedPublisher(redis_url, max_delay=0.01) as pub:
            for i in range(1000):
                await pub.publish("aio", b"%d" % i)
            await pub.flush()
            assert pub.stats()["published"] == 1000

    asyncio.run(main())
    assert received(p, 1000) == [b"%d" % i for i in range(1000)]


def test_the_users_shared_server_by_default(monkeypatch):
    from fastbus.redis.shared import registered
    monkeypatch.delenv("FASTBUS_REDIS_URL", raising=False)
    with BufferedListProducer() as lists:
        lists.push("default-q", "hello")
    r = redis.Redis.from_url(registered()["url"])
    assert r.lrange("default-q", 0, -1) == [b"hello"]
    r.delete("default-q")


# -- batches form by themselves (issue 13) -------------------------------------
#
# With the default (no linger) a message leaves as soon as the flush thread
# is idle; ``max_delay`` only holds it when set.  The bounds here are loose
# (a second against a five-second linger): timing targets are for the bench.

LINGER = 5.0
ONE_BY_ONE = 10          # messages, each awaited before the next: a 0.2 s timer would take 2 s


def _first_message(p, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = p.get_message(timeout=0.05)
        if m is not None and m["type"] == "message":
            return m["data"]
    return None


@pytest.mark.parametrize("kind", ["sync", "asyncio"])
def test_lone_messages_are_published_at_once_unless_a_linger_holds_them(redis_url, kind):
    p = subscribe(redis_url, "lone")
    if kind == "sync":
        pub = BufferedPublisher(redis_url)
        publish = pub.publish
    else:
        pub = AsyncBufferedPublisher(redis_url)

        def publish(channel, data):
            asyncio.run(pub.publish(channel, data))
    t0 = time.monotonic()
    for i in range(ONE_BY_ONE):
        publish("lone", b"%d" % i)
        assert _first_message(p, 1.0) == b"%d" % i      # no flush(): it left by itself
    took = time.monotonic() - t0
    assert took < 1.0, f"{ONE_BY_ONE} messages one by one took {took:.3f} s"

    # The same with a linger: held until it expires, or flush().
    held = BufferedPublisher(redis_url, max_delay=LINGER) if kind == "sync" else \
        AsyncBufferedPublisher(redis_url, max_delay=LINGER)
    if kind == "sync":
        held.publish("lone", b"held")
    else:
        asyncio.run(held.publish("lone", b"held"))
    assert _first_message(p, 0.5) is None
    if kind == "sync":
        held.flush()
        held.close()
        pub.close()
    else:
        asyncio.run(held.flush())
        asyncio.run(held.close())
        asyncio.run(pub.close())
    assert _first_message(p, 5.0) == b"held"
    assert pub.stats()["batches"] == ONE_BY_ONE           # one write each


@pytest.mark.parametrize("kind", ["sync", "asyncio"])
def test_lone_pushes_are_written_at_once_unless_a_linger_holds_them(redis_url, kind):
    r = redis.Redis.from_url(redis_url)
    if kind == "sync":
        lists = BufferedListProducer(redis_url)
        push = lists.push
    else:
        lists = AsyncBufferedListProducer(redis_url)

        def push(key, data):
            asyncio.run(lists.push(key, data))
    t0 = time.monotonic()
    for i in range(ONE_BY_ONE):
        push("lone-q", b"%d" % i)
        assert r.blpop("lone-q", timeout=1) == (b"lone-q", b"%d" % i)   # a BLPOP sees it
    took = time.monotonic() - t0
    assert took < 1.0, f"{ONE_BY_ONE} pushes one by one took {took:.3f} s"

    held = BufferedListProducer(redis_url, max_delay=LINGER) if kind == "sync" else \
        AsyncBufferedListProducer(redis_url, max_delay=LINGER)
    if kind == "sync":
        held.push("lone-q", b"held")
    else:
        asyncio.run(held.push("lone-q", b"held"))
    assert r.blpop("lone-q", timeout=0.5) is None
    if kind == "sync":
        held.flush()
        held.close()
        lists.close()
    else:
        asyncio.run(held.flush())
        asyncio.run(held.close())
        asyncio.run(lists.close())
    assert r.blpop("lone-q", timeout=5) == (b"lone-q", b"held")


def test_a_burst_published_while_a_write_is_in_flight_arrives_whole_and_in_order(redis_url):
    """The server holds the first write's reply (CLIENT PAUSE WRITE) while
    the burst is published: it forms the next writes, nothing is lost or
    reordered, and it went out in a few writes, not one per message."""
    n = 20_000
    r = redis.Redis.from_url(redis_url)
    p = subscribe(redis_url, "burst")
    pub = BufferedPublisher(redis_url)
    lists = BufferedListProducer(redis_url)
    pub.publish("burst", b"warm")
    lists.push("burst-q", b"warm")
    pub.flush()
    lists.flush()
    assert received(p, 1) == [b"warm"]
    r.execute_command("CLIENT", "PAUSE", 300, "WRITE")
    try:
        pub.publish("burst", b"first")                # written at once, its reply held
        lists.push("burst-q", b"first")
        time.sleep(0.05)
        for i in range(n):
            pub.publish("burst", b"%d" % i)
            lists.push("burst-q", b"%d" % i)
        assert pub.stats()["published"] == 1          # the server has answered nothing since
    finally:
        pub.flush()
        lists.flush()
    want = [b"first"] + [b"%d" % i for i in range(n)]
    assert received(p, n + 1) == want
    assert r.lrange("burst-q", 0, -1) == [b"warm"] + want
    for w in (pub, lists):
        st = w.stats()
        assert st["published"] == n + 2 and st["errors"] == 0 and st["buffered"] == 0
        assert st["batches"] < 100, st                  # batched while waiting, not one write each
        w.close()


def test_max_delay_is_an_optional_linger(redis_url):
    for bad in (0, -1, 61, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"max_delay must be None .*not " + repr(bad).replace("(", r"\(")):
            BufferedPublisher(redis_url, max_delay=bad)
        with pytest.raises(ValueError, match="max_delay"):
            BufferedListProducer(redis_url, max_delay=bad)
    for bad in ("0.1", True):
        with pytest.raises(TypeError, match="max_delay"):
            BufferedPublisher(redis_url, max_delay=bad)
    for ok in (None, 0.001, 60):
        BufferedPublisher(redis_url, max_delay=ok).close()


def test_cluster_router_checks_options_and_sends_at_once(redis_cluster):
    with pytest.raises(ValueError, match="max_delay must be None"):
        BufferedListProducer(redis_cluster, max_delay=0)
    with pytest.raises(ValueError, match="max_messages"):
        BufferedPublisher(redis_cluster, sharded=True, max_messages=0)
    for key in ("lone{a}", "lone{b}", "lone{c}"):
        redis_cluster.delete(key)
    with BufferedListProducer(redis_cluster) as lists:
        for key in ("lone{a}", "lone{b}", "lone{c}"):
            t0 = time.monotonic()
            lists.push(key, b"one")
            got = redis_cluster.blpop([key], timeout=1)
            assert got == (key.encode(), b"one") and time.monotonic() - t0 < 1.0


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    """A server with a TLS port as well (Debian's redis-server; the bundled
    Valkey is built without TLS): (its EmbeddedServer, the rediss:// URL)."""
    from fastbus.redis import EmbeddedServer
    binary = os.environ.get("FASTBUS_TEST_REDIS_SERVER") or shutil.which("redis-server")
    if binary is None or shutil.which("openssl") is None:
        pytest.skip("needs a redis-server built with TLS and the openssl command")
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", d / "key.pem",
                    "-out", d / "cert.pem", "-days", "2", "-subj", "/CN=127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = EmbeddedServer(binary, args=["--tls-port", str(port), "--tls-cert-file", str(d / "cert.pem"),
                                       "--tls-key-file", str(d / "key.pem"), "--tls-ca-cert-file",
                                       str(d / "cert.pem"), "--tls-auth-clients", "no"])
    try:
        srv.start()
    except Exception as exc:
        pytest.skip(f"{binary} does not take TLS options: {exc}")
    try:
        yield srv, f"rediss://127.0.0.1:{port}?ssl_cert_reqs=none"
    finally:
        srv.stop()


def test_tls_path_sends_at_once_and_keeps_order(tls_server):
    """rediss:// takes the Python socket path (_pump_python): lone messages
    leave by themselves, and a burst during a held write arrives whole and
    in order."""
    srv, tls_url = tls_server
    r = redis.Redis.from_url(srv.url)
    p = subscribe(srv.url, "tls")
    pub = BufferedPublisher(tls_url)
    try:
        t0 = time.monotonic()
        for i in range(ONE_BY_ONE):
            pub.publish("tls", b"%d" % i)
            assert _first_message(p, 1.0) == b"%d" % i
        assert time.monotonic() - t0 < 1.0
        assert isinstance(pub._conn.redis_conn._sock, ssl.SSLSocket)
        n = 20_000
        r.execute_command("CLIENT", "PAUSE", 300, "WRITE")
        pub.publish("tls", b"first")
        time.sleep(0.05)
        for i in range(n):
            pub.publish("tls", b"%d" % i)
        pub.flush()
        assert received(p, n + 1) == [b"first"] + [b"%d" % i for i in range(n)]
        st = pub.stats()
        assert st["published"] == ONE_BY_ONE + n + 1 and st["errors"] == 0
        assert st["batches"] < ONE_BY_ONE + 100, st
    finally:
        pub.close()


# -- every accepted message ends written or reported; close(timeout) keeps it (issue 14, item 4)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Reported:
    """on_error's messages, by id (payloads b"<id>:<padding>")."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.calls = 0

    def __call__(self, err, msgs) -> None:
        assert isinstance(err, PublishError) and err.reason and "\n" not in err.reason
        self.calls += 1
        self.ids.extend(int(p.split(b":")[0]) for _c, p in msgs)


def _close_timed(pub, timeout: float):
    t0 = time.monotonic()
    try:
        pub.close(timeout=timeout)
        error = None
    except PublishError as exc:
        error = exc
    return time.monotonic() - t0, error


def test_unreachable_from_the_start_every_accepted_message_is_reported():
    """Nothing listens: publish until publish() refuses (PublishTimeout after
    block_timeout, or PublishError for what already failed), then close():
    every accepted message reaches on_error once, and close keeps its timeout."""
    url = f"redis://127.0.0.1:{_free_port()}"
    cb = _Reported()
    pub = BufferedPublisher(url, block_timeout=1, on_error=cb, max_buffer_bytes=4 << 20)
    accepted: list[int] = []
    raised = 0
    pad = b"x" * 4000
    t0 = time.monotonic()
    for i in range(200_000):
        if time.monotonic() - t0 > 30:
            break
        try:
            pub.publish("ch", b"%d:%s" % (i, pad))
        except PublishTimeout:
            break
        except PublishError as exc:
            raised += exc.count
            if raised > 5000:
                break
            continue
        accepted.append(i)
    assert accepted
    took, error = _close_timed(pub, 5)
    assert took < 5 + 3, f"close(timeout=5) took {took:.1f} s"
    assert sorted(cb.ids) == accepted, f"{len(cb.ids)} of {len(accepted)} reported"
    assert pub.stats()["errors"] == len(accepted) and pub.stats()["published"] == 0
    if error is not None:
        assert f"127.0.0.1:{url.rsplit(':', 1)[1]}" in error.reason


def test_close_timeout_bounds_retries_that_would_go_on():
    """Retries that would go on for minutes: close(timeout=2) stops them,
    reports every message and returns (raises) in about 2 s."""
    from redis.backoff import ConstantBackoff
    from redis.retry import Retry
    url = f"redis://127.0.0.1:{_free_port()}"
    cb = _Reported()
    pub = BufferedPublisher(url, retry=Retry(ConstantBackoff(0.5), 1000), on_error=cb)
    for i in range(100):
        pub.publish("ch", b"%d:x" % i)
    took, error = _close_timed(pub, 2)
    assert took < 2 + 3, f"close(timeout=2) took {took:.1f} s"
    assert error is not None and sorted(int(p.split(b":")[0]) for _c, p in error.failed) == list(range(100))
    assert "close(timeout=2)" in error.reason and url.split("//")[1] in error.reason
    assert sorted(cb.ids) == list(range(100)) and cb.calls == 1


def test_server_killed_mid_stream_every_accepted_message_written_or_reported(redis_server, redis_url):
    """Kill -9 mid-stream and leave it down: each accepted message is either
    answered by the server (stats published) or reported once to on_error;
    close(timeout) keeps its timeout."""
    cb = _Reported()
    pub = BufferedPublisher(redis_url, block_timeout=1, on_error=cb)
    accepted: list[int] = []
    n = 15_400
    try:
        for i in range(n):
            if i == 5_000:
                redis_server.kill()
            if i % 1000 == 0:
                time.sleep(0.01)                   # a steady stream, not one burst
            try:
                pub.publish("ch", b"%d:payload" % i)
            except PublishTimeout:
                break
            except PublishError:
                continue                           # reported already; this one was not queued
            accepted.append(i)
        took, _error = _close_timed(pub, 5)
        assert took < 5 + 3, f"close(timeout=5) took {took:.1f} s"
        assert len(cb.ids) == len(set(cb.ids))                       # once each
        assert set(cb.ids) <= set(accepted)
        st = pub.stats()
        assert st["published"] + len(cb.ids) == len(accepted), (st, len(cb.ids), len(accepted))
        assert len(cb.ids) > 0
    finally:
        redis_server.start()
