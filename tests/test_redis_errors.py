"""Issue 14, item 9: a failure against a Redis server is a fastbus error that
says what failed, against which host:port, and what to do, wherever it
happens (queues sync and asyncio, the buffered publisher's reports, the
subscriber).  Real sockets and real servers: a port where nothing listens,
a silent TCP server, an HTTP server, a Redis with a small maxmemory or
proto-max-bulk-len."""

from __future__ import annotations

import asyncio
import os
import pickle
import socket
import subprocess
import sys
import threading
import time

import pytest
import redis
import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.retry import Retry

import fastbus.errors as errors
from fastbus.errors import FastbusError
from fastbus.queue import AsyncWorkQueue, QueueError, Topic, WorkQueue
from fastbus.redis import BufferedListProducer, BufferedPublisher, EmbeddedServer, PublishError, Subscriber

BIN = os.environ.get("FASTBUS_TEST_REDIS_SERVER") or None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeServer:
    """A TCP server on 127.0.0.1 in a thread: ``silent`` accepts and never
    answers; ``http`` answers every request with an HTTP 400 and closes."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        for _ in range(1000):                      # bounded: a test makes a few connections
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            if self.kind == "http":
                threading.Thread(target=self._http, args=(conn,), daemon=True).start()

    @staticmethod
    def _http(conn: socket.socket) -> None:
        try:
            conn.settimeout(10)
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.fixture
def fake():
    made: list[FakeServer] = []

    def make(kind: str) -> FakeServer:
        made.append(FakeServer(kind))
        return made[-1]

    yield make
    for f in made:
        f.close()


@pytest.fixture(scope="module")
def small_server():
    """A server that refuses values over 1 MiB (proto-max-bulk-len's minimum)
    and writes over 4 MiB of data (maxmemory, noeviction)."""
    with EmbeddedServer(BIN, args=["--proto-max-bulk-len", "1mb", "--maxmemory", "4mb",
                                   "--maxmemory-policy", "noeviction"]) as server:
        yield server


@pytest.fixture
def small_url(small_server):
    small_server.start()
    c = small_server.client()
    c.flushall()
    c.close()
    return small_server.url


def where(url: str) -> str:
    return url.split("//")[1].split("/")[0].split("?")[0]


def assert_one_line(err: BaseException, *parts: str) -> None:
    text = str(err)
    assert "\n" not in text, text
    for part in parts:
        assert part in text, (part, text)
    assert "@user_script" not in text and "script:" not in text, text


# -- the classes ---------------------------------------------------------------


def test_classes_keep_the_builtins_and_redis_py_classes():
    """Existing ``except ConnectionError`` / ``except redis.ConnectionError``
    clauses keep catching what the Redis parts raise."""
    assert issubclass(errors.ServerUnavailable, (FastbusError)) and \
        issubclass(errors.ServerUnavailable, ConnectionError) and \
        issubclass(errors.ServerUnavailable, redis.ConnectionError)
    assert issubclass(errors.NotARedisServer, errors.ServerUnavailable) and \
        issubclass(errors.NotARedisServer, redis.exceptions.InvalidResponse)
    assert issubclass(errors.ServerTimeout, TimeoutError) and issubclass(errors.ServerTimeout, redis.TimeoutError)
    assert issubclass(errors.PayloadTooLarge, ValueError) and issubclass(errors.PayloadTooLarge, redis.DataError)
    assert issubclass(errors.ServerOutOfMemory, redis.exceptions.OutOfMemoryError) and \
        issubclass(errors.ServerOutOfMemory, errors.ServerRefused) and \
        issubclass(errors.ServerRefused, redis.ResponseError)
    assert not issubclass(errors.ServerOutOfMemory, MemoryError)     # that is this process's memory
    for cls in (errors.ServerUnavailable, errors.ServerTimeout, errors.PayloadTooLarge, errors.ServerOutOfMemory):
        assert issubclass(cls, errors.RedisServerError) and cls.__module__ == "fastbus.errors"
        e = cls("what failed at 127.0.0.1:1", address="127.0.0.1:1")
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is cls and str(back) == str(e) and back.address == "127.0.0.1:1"
        assert repr(e) == f"{cls.__name__}({str(e)!r})"


def test_fastbus_errors_does_not_import_redis_py():
    out = subprocess.run([sys.executable, "-c", "import sys, fastbus, fastbus.errors; print('redis' in sys.modules)"],
                         capture_output=True, text=True, timeout=60, cwd="/")
    assert out.stdout.strip() == "False", out.stderr


# -- queues ----------------------------------------------------------------------


def test_queue_where_nothing_listens():
    url = f"redis://127.0.0.1:{free_port()}"
    q = WorkQueue("jobs", url)
    with pytest.raises(FastbusError) as ei:
        q.put(b"x")
    e = ei.value
    assert isinstance(e, errors.ServerUnavailable) and isinstance(e, ConnectionError)
    assert isinstance(e, redis.ConnectionError)                 # as before, for existing handlers
    assert_one_line(e, where(url), "queue 'jobs'", "connection refused", "is the server running")
    assert e.address == where(url)
    q.close()


def test_queue_against_a_silent_server(fake):
    srv = fake("silent")
    q = WorkQueue("jobs", srv.url + "/0?socket_timeout=0.5&socket_connect_timeout=0.5")
    t0 = time.monotonic()
    with pytest.raises(FastbusError) as ei:
        q.put(b"x")
    assert time.monotonic() - t0 < 30
    assert isinstance(ei.value, errors.ServerTimeout) and isinstance(ei.value, TimeoutError)
    assert_one_line(ei.value, f"127.0.0.1:{srv.port}", "queue 'jobs'", "did not answer")
    q.close()


def test_queue_against_an_http_server(fake):
    srv = fake("http")
    q = WorkQueue("jobs", srv.url)
    with pytest.raises(FastbusError) as ei:
        q.put(b"x")
    assert isinstance(ei.value, errors.NotARedisServer) and isinstance(ei.value, ConnectionError)
    assert_one_line(ei.value, f"127.0.0.1:{srv.port}", "does not speak the Redis protocol", "HTTP")
    q.close()


def test_asyncio_queue_errors_are_translated_too(fake):
    srv = fake("http")
    url_refused = f"redis://127.0.0.1:{free_port()}"

    async def main():
        out = []
        for url in (srv.url, url_refused):
            q = AsyncWorkQueue("jobs", url)
            try:
                await q.put(b"x")
            except FastbusError as e:
                out.append(e)
            finally:
                await q.close()
        return out

    http, refused = asyncio.run(main())
    assert isinstance(http, errors.NotARedisServer)
    assert_one_line(http, f"127.0.0.1:{srv.port}", "queue 'jobs'")
    assert isinstance(refused, errors.ServerUnavailable)
    assert_one_line(refused, where(url_refused), "connection refused")


@pytest.mark.parametrize("size_mb", [2, 32])
def test_queue_value_over_the_servers_proto_max_bulk_len(small_url, size_mb):
    """2 MiB: the server answers "invalid bulk length"; 32 MiB: it closes the
    connection while the value is still being written (a broken pipe).
    Either way: the size, the limit and the server."""
    q = WorkQueue("big", small_url)
    with pytest.raises(FastbusError) as ei:
        q.put(b"x" * (size_mb << 20))
    e = ei.value
    assert isinstance(e, errors.PayloadTooLarge) and isinstance(e, ValueError)
    assert e.size == size_mb << 20 and e.limit == 1 << 20
    assert_one_line(e, f"{size_mb}", "proto-max-bulk-len", "1.0 MiB", where(small_url), "queue 'big'")
    q.put(b"small")                                      # the queue works on
    assert q.stats().ready == 1
    q.close()


def test_queue_out_of_memory_inside_a_script(small_url):
    q = WorkQueue("full", small_url)
    payload = b"y" * 4000
    t0 = time.monotonic()
    with pytest.raises(FastbusError) as ei:
        for _ in range(20_000):                          # 80 MB: far over the 4 MB maxmemory
            q.put(payload)
            assert time.monotonic() - t0 < 60
    e = ei.value
    assert isinstance(e, errors.ServerOutOfMemory) and isinstance(e, redis.exceptions.OutOfMemoryError)
    assert_one_line(e, "out of memory", "maxmemory", where(small_url), "queue 'full'")
    q.close()


def test_queue_refusals_of_its_own_stay_queue_errors(redis_url):
    redis.Redis.from_url(redis_url).set("fastbus:q:{typed}:ready", "a string")
    q = WorkQueue("typed", redis_url)
    with pytest.raises(QueueError) as ei:
        q.put(b"x")
    assert_one_line(ei.value, "WRONGTYPE", where(redis_url))
    q.close()


@pytest.mark.parametrize("cls", [WorkQueue, Topic])
def test_an_asyncio_client_given_to_a_sync_class(redis_url, cls):
    client = aioredis.Redis.from_url(redis_url)
    with pytest.raises(TypeError) as ei:
        cls("jobs", client)
    assert "asyncio" in str(ei.value) and "AsyncWorkQueue" in str(ei.value)
    asyncio.run(client.aclose())


def test_a_sync_client_given_to_an_asyncio_class(redis_url):
    client = redis.Redis.from_url(redis_url)
    with pytest.raises(TypeError, match="synchronous Redis client.*redis.asyncio"):
        AsyncWorkQueue("jobs", client)
    client.close()


# -- the buffered publisher ----------------------------------------------------


def test_publisher_reports_name_the_server():
    url = f"redis://127.0.0.1:{free_port()}"
    seen: list = []
    pub = BufferedPublisher(url, retry=Retry(NoBackoff(), 1), on_error=lambda err, msgs: seen.append(err))
    pub.publish("ch", "a")
    with pytest.raises(PublishError) as ei:
        pub.flush(timeout=20)
    e = ei.value
    assert e.failed == [(b"ch", b"a")]
    assert where(url) in e.reason and "connection refused" in e.reason and "\n" not in e.reason
    assert isinstance(e.error, errors.ServerUnavailable)
    assert seen and seen[0].reason == e.reason
    pub.close(timeout=5)


def test_publisher_against_an_http_server(fake):
    srv = fake("http")
    pub = BufferedPublisher(srv.url, retry=Retry(NoBackoff(), 1))
    pub.publish("ch", "a")
    with pytest.raises(PublishError) as ei:
        pub.flush(timeout=20)
    assert isinstance(ei.value.error, errors.NotARedisServer)
    assert f"127.0.0.1:{srv.port}" in ei.value.reason and "Redis protocol" in ei.value.reason
    pub.close(timeout=5)


def test_publisher_value_over_proto_max_bulk_len_is_reported_alone(small_url):
    """Redis would refuse it and close the connection, failing the whole
    window with it: it is taken out and reported; the rest is written."""
    big = b"z" * (2 << 20)
    seen: list = []
    lists = BufferedListProducer(small_url, on_error=lambda err, msgs: seen.extend(msgs))
    lists.push("l", "before")
    lists.push("l", big)
    lists.push("l", "after")
    with pytest.raises(PublishError) as ei:
        lists.flush(timeout=20)
    assert ei.value.failed == [(b"l", big)] and seen == [(b"l", big)]
    assert isinstance(ei.value.error, errors.PayloadTooLarge) and ei.value.error.limit == 1 << 20
    assert "proto-max-bulk-len" in ei.value.reason and where(small_url) in ei.value.reason
    assert redis.Redis.from_url(small_url).lrange("l", 0, -1) == [b"before", b"after"]
    assert lists.stats()["errors"] == 1
    lists.close(timeout=5)


def test_publisher_out_of_memory_is_reported_by_name(small_url):
    seen: list = []
    lists = BufferedListProducer(small_url, on_error=lambda err, msgs: seen.append(err))
    payload = b"m" * 4000
    with pytest.raises(PublishError) as ei:
        for _ in range(5_000):                             # 20 MB: over the 4 MB maxmemory
            lists.push("full", payload)
        lists.flush(timeout=60)
    assert isinstance(ei.value.error, errors.ServerOutOfMemory)
    assert "out of memory" in ei.value.reason and where(small_url) in ei.value.reason
    try:
        lists.close(timeout=30)
    except PublishError:
        pass


# -- the subscriber --------------------------------------------------------------


def test_subscriber_where_nothing_listens():
    url = f"redis://127.0.0.1:{free_port()}"
    sub = Subscriber(url)
    with pytest.raises(errors.ServerUnavailable) as ei:
        sub.subscribe("ch")
    assert_one_line(ei.value, where(url), "connection refused")
    assert not sub.subscribed
    sub.close()


def test_subscriber_against_an_http_server(fake):
    srv = fake("http")
    sub = Subscriber(srv.url)
    with pytest.raises(errors.NotARedisServer) as ei:
        sub.subscribe("ch")
        sub.get_message(timeout=5)
    assert f"127.0.0.1:{srv.port}" in str(ei.value)
    sub.close()


def test_a_server_error_an_operation_raises_from_a_reply_is_translated_too(small_url):
    """Operations that collect errors as replies (a batch written in part)
    and raise one of them: the driver translates it as one it met itself."""
    from fastbus.queue.common import Cmd
    from fastbus.queue.driver import SyncDriver
    r = redis.Redis.from_url(small_url)
    real = None
    for i in range(5_000):                                  # 20 MB: over the 4 MB maxmemory
        try:
            r.set(f"fill{i}", b"f" * 4000)
        except redis.exceptions.OutOfMemoryError as exc:
            real = exc
            break
    assert real is not None

    def op():
        yield Cmd(("PING",))
        raise real

    with pytest.raises(errors.ServerOutOfMemory) as ei:
        SyncDriver(r).run(op())
    assert_one_line(ei.value, "out of memory", where(small_url))
    r.close()


def test_one_parser_reads_proto_max_bulk_len_from_every_reply_form(redis_url):
    """The flat list a raw connection or the queue driver gets, redis-py's
    dict, and a cluster client's dict of node -> either (the smallest)."""
    from fastbus.redis.errors import CONFIG_GET_LIMIT, DEFAULT_MAX_BULK_LEN, max_bulk_len, parse_limit
    assert parse_limit([b"proto-max-bulk-len", b"2097152"]) == 2 << 20
    assert parse_limit({"proto-max-bulk-len": "3145728"}) == 3 << 20
    assert parse_limit({"127.0.0.1:7000": [b"proto-max-bulk-len", b"4194304"],
                        "127.0.0.1:7001": {b"proto-max-bulk-len": b"2097152"}}) == 2 << 20
    assert parse_limit([]) == parse_limit({}) == DEFAULT_MAX_BULK_LEN
    client = redis.Redis.from_url(redis_url)
    try:
        raw = client.execute_command(*CONFIG_GET_LIMIT)
        assert parse_limit(raw) == max_bulk_len(client) == int(client.config_get("proto-max-bulk-len")[
            "proto-max-bulk-len"])
    finally:
        client.close()
