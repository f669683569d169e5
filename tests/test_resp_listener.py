"""The broker's Redis-protocol listener (``fastbus broker --resp``): plain
Redis clients (redis-py, redis-cli, raw sockets) publish and subscribe on a
fastbus broker, and meet fastbus's own clients there.  Real broker
processes, real sockets on loopback."""

from __future__ import annotations

import json
import os
import resource
import shutil
import socket
import subprocess
import time

import pytest
import redis

import fastbus
from brokers import BrokerProcess, free_port

from fastbus.client import query_stats


def _resp_broker(*args: str) -> tuple[BrokerProcess, int]:
    for _ in range(5):
        port = free_port()
        try:
            return BrokerProcess("--resp", f"tcp://127.0.0.1:{port}", *args), port
        except RuntimeError as exc:
            if "address already in use" not in str(exc):
                raise
    raise RuntimeError("no free port for --resp")


@pytest.fixture
def resp():
    broker, port = _resp_broker()
    yield broker, port
    broker.stop()


def _raw(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _request(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def _read_until(s: socket.socket, want: bytes, timeout: float = 5.0) -> bytes:
    """Bytes from s until they end with ``want`` (or the peer closes)."""
    got = b""
    s.settimeout(timeout)
    while not got.endswith(want):
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def _closed(s: socket.socket, timeout: float = 5.0) -> bool:
    s.settimeout(timeout)
    try:
        while True:
            if not s.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def _messages(p, n: int, timeout: float = 10.0) -> list[dict]:
    out, deadline = [], time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        m = p.get_message(timeout=0.5)
        if m is not None and m["type"] in ("message", "pmessage", "smessage"):
            out.append(m)
    return out


def test_redis_py_publishes_and_subscribes_with_redis_replies(resp):
    _broker, port = resp
    r = redis.Redis(port=port)
    assert r.ping() is True
    assert r.echo("hi") == b"hi"
    assert r.publish("news", "nobody") == 0
    p = r.pubsub()
    p.subscribe("news", "sport")
    p.psubscribe("n*")
    first = [p.get_message(timeout=2) for _ in range(3)]
    assert [(m["type"], m["channel"], m["data"]) for m in first] == \
        [("subscribe", b"news", 1), ("subscribe", b"sport", 2), ("psubscribe", b"n*", 3)]
    # One connection, two subscriptions that match: the broker routes the
    # message to it once, and it is told of it as Redis would, twice.
    assert redis.Redis(port=port).publish("news", "hello") == 1
    got = _messages(p, 2)
    assert [(m["type"], m["pattern"], m["channel"], m["data"]) for m in got] == \
        [("message", None, b"news", b"hello"), ("pmessage", b"n*", b"news", b"hello")]
    p.unsubscribe("news")
    assert p.get_message(timeout=2)["type"] == "unsubscribe"
    r.publish("news", "after")
    r.publish("sport", "goal")
    got = _messages(p, 2)
    assert [(m["type"], m["channel"], m["data"]) for m in got] == \
        [("pmessage", b"news", b"after"), ("message", b"sport", b"goal")]
    assert r.pubsub_channels() == [b"sport"]
    assert r.pubsub_numsub("sport", "none") == [(b"sport", 1), (b"none", 0)]
    assert r.pubsub_numpat() == 1
    p.close()


def test_resp3_pushes_hello_and_the_commands_clients_send_at_connect(resp):
    _broker, port = resp
    r = redis.Redis(port=port, protocol=3, client_name="worker-1")
    assert r.ping() is True
    assert r.client_getname() == b"worker-1"
    assert isinstance(r.client_id(), int)
    assert r.execute_command("SELECT", 0) is not None
    with pytest.raises(redis.ResponseError, match="DB index is out of range"):
        r.execute_command("SELECT", 1)
    info = r.info("server")
    assert info["redis_version"].startswith("7.") and "fastbus_version" in info
    with pytest.raises(redis.ResponseError, match="unknown command 'GET'"):
        r.get("k")
    assert r.ping() is True                              # an unknown command never drops the connection
    p = r.pubsub()
    p.subscribe("a")
    assert p.get_message(timeout=2)["type"] == "subscribe"
    assert r.publish("a", "x") == 1                      # RESP3: PUBLISH on any connection
    assert [m["data"] for m in _messages(p, 1)] == [b"x"]
    st = query_stats(_broker.endpoint, clients=True)
    assert {"worker-1"} <= {c["name"] for c in st["connz"] if c["role"] == "redis"}
    assert st["links"]["redis"] >= 1 and st["connections"]["resp_accepted"] >= 1
    p.close()


def test_resp2_subscribed_mode_refuses_other_commands_as_redis_does(resp):
    _broker, port = resp
    s = _raw(port)
    s.sendall(_request(b"SUBSCRIBE", b"c"))
    assert _read_until(s, b":1\r\n") == b"*3\r\n$9\r\nsubscribe\r\n$1\r\nc\r\n:1\r\n"
    s.sendall(_request(b"PUBLISH", b"c", b"x") + _request(b"PING"))
    got = _read_until(s, b"$0\r\n\r\n")
    assert got.startswith(b"-ERR Can't execute 'publish': only (P|S)SUBSCRIBE")
    assert got.endswith(b"*2\r\n$4\r\npong\r\n$0\r\n\r\n")
    s.sendall(_request(b"RESET"))
    assert _read_until(s, b"+RESET\r\n").endswith(b"+RESET\r\n")
    s.sendall(_request(b"PUBLISH", b"c", b"x"))
    assert _read_until(s, b"\r\n") == b":0\r\n"               # RESET left nothing subscribed
    s.close()


def test_messages_cross_between_fastbus_and_redis_clients_in_order(resp):
    broker, port = resp
    n = 2000
    r = redis.Redis(port=port)
    rp = r.pubsub(ignore_subscribe_messages=True)
    rp.subscribe("from-fastbus")
    assert _messages(rp, 0, 0.5) == []
    with fastbus.Client(broker.endpoint) as c:
        fp = c.pubsub()
        fp.subscribe("from-redis")
        # PUBLISH counts the receivers the broker routed to: the fastbus one.
        assert r.publish("from-redis", "0") == 1
        pipe = r.pipeline(transaction=False)
        for i in range(1, n):
            pipe.publish("from-redis", str(i))
        assert pipe.execute() == [1] * (n - 1)
        got = []
        deadline = time.monotonic() + 10
        while len(got) < n and time.monotonic() < deadline:
            m = fp.get_message(timeout=0.5)
            if m and m["type"] == "message":
                got.append(int(m["data"]))
        assert got == list(range(n))
        for i in range(n):
            c.publish("from-fastbus", str(i).encode())
        c.flush()
        assert [int(m["data"]) for m in _messages(rp, n)] == list(range(n))
    rp.close()


@pytest.mark.parametrize("form", ["tcp://127.0.0.1:{port}", "redis://127.0.0.1:{port}/0"])
def test_a_fastbus_client_connects_on_the_resp_port_too(resp, form):
    """One redis:// URL serves both kinds of client: a fastbus client's
    ZMTP greeting is told from a Redis request by its first byte."""
    _broker, port = resp
    with fastbus.Client.from_url(form.format(port=port)) as c:
        p = c.pubsub()
        p.subscribe("both")
        assert redis.Redis(port=port).publish("both", "hi") == 1
        m = None
        deadline = time.monotonic() + 5
        while m is None and time.monotonic() < deadline:
            m = p.get_message(timeout=0.5, ignore_subscribe_messages=True)
        assert m is not None and m["data"] == b"hi"


@pytest.mark.parametrize("bad, error", [
    (b"*2\r\nxx\r\n", b"-ERR Protocol error: expected '$', got 'x'\r\n"),
    (b"*1\r\n$1099511627776\r\n", b"-ERR Protocol error: invalid bulk length\r\n"),          # 2^40
    (b"*2147483648\r\n", b"-ERR Protocol error: invalid multibulk length\r\n"),              # 2^31
    (b"*1\r\n$-5\r\n", b"-ERR Protocol error: invalid bulk length\r\n"),
    (b"*1\r\n$2\r\nabcd\r\n", b"-ERR Protocol error: expected CRLF after a bulk string\r\n"),
    (b"*1x\r\n", b"-ERR Protocol error: invalid multibulk length\r\n"),
    (b"A" * 70000, b"-ERR Protocol error: too big inline request\r\n"),
])
def test_bad_input_is_a_protocol_error_that_closes_only_that_connection(resp, bad, error):
    broker, port = resp
    s = _raw(port)
    s.sendall(_request(b"PING") + bad)
    assert _read_until(s, error) == b"+PONG\r\n" + error
    assert _closed(s)
    assert redis.Redis(port=port).ping() is True
    assert broker.proc.poll() is None


def test_a_pipeline_cut_at_every_byte_gets_the_same_replies(resp):
    _broker, port = resp
    pipeline = (_request(b"PING") + b"PING hello\r\n" + _request(b"ECHO", b"a\r\nb")
                + _request(b"PUBLISH", b"ch", b"payload") + _request(b"SELECT", b"0") + _request(b"QUIT"))
    want = b"+PONG\r\n$5\r\nhello\r\n$4\r\na\r\nb\r\n:0\r\n+OK\r\n+OK\r\n"
    s = _raw(port)
    s.sendall(pipeline)
    assert _read_until(s, want) == want and _closed(s)
    for cut in range(1, len(pipeline)):
        s = _raw(port)
        s.sendall(pipeline[:cut])
        time.sleep(0.002)                      # (the broker reads the first part alone)
        s.sendall(pipeline[cut:])
        assert _read_until(s, want) == want, cut
        s.close()


#: A broker under AddressSanitizer (.ci/run's sanitized stage preloads it,
#: and the broker inherits the environment) keeps what it frees in ASan's
#: quarantine, up to 256 MiB by default, to catch a use after free: its RSS
#: counts that on top of what the broker holds.
_ASAN_QUARANTINE = 256 << 20 if "asan" in os.environ.get("LD_PRELOAD", "") else 0


def test_ten_thousand_half_requests_hold_bounded_memory_and_others_are_served():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 10_500 and hard != resource.RLIM_INFINITY:
        pytest.skip(f"this machine allows {hard} descriptors a process")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        broker, port = _resp_broker()
        try:
            rss0 = query_stats(broker.endpoint)["rss_bytes"]
            half = _request(b"PUBLISH", b"channel", b"x" * 100)[:40]
            conns = []
            for _ in range(10_000):
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                s.sendall(half)
                conns.append(s)
            r = redis.Redis(port=port, socket_timeout=5)
            t0 = time.monotonic()
            assert r.ping() is True and r.publish("other", "x") == 0
            assert time.monotonic() - t0 < 5
            st = query_stats(broker.endpoint)
            grown = st["rss_bytes"] - rss0
            assert grown < (300 << 20) + _ASAN_QUARANTINE, \
                f"10,000 half requests grew the broker by {grown >> 20} MiB"
            for s in conns:
                s.close()
        finally:
            broker.stop()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize("policy", ["disconnect", "drop"])
def test_a_redis_subscriber_that_never_reads_is_bounded_and_counted(policy):
    broker, port = _resp_broker("--max-queue-bytes", str(1 << 20), "--slow-policy", policy, "--flow-pause-bytes", "0")
    try:
        s = _raw(port)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(_request(b"SUBSCRIBE", b"flood"))
        assert _read_until(s, b":1\r\n").endswith(b":1\r\n")
        r = redis.Redis(port=port)
        payload = b"x" * 1000
        deadline = time.monotonic() + 20
        sent = 0
        while time.monotonic() < deadline and sent < 200_000:
            pipe = r.pipeline(transaction=False)
            for _ in range(1000):
                pipe.publish("flood", payload)
            pipe.execute()
            sent += 1000
            st = query_stats(broker.endpoint)
            if st["drops"]["disconnected_slow" if policy == "disconnect" else "slow_consumer"]:
                break
        st = query_stats(broker.endpoint)
        assert st["rss_bytes"] < 400 << 20
        if policy == "disconnect":
            assert st["drops"]["disconnected_slow"] >= 1
            assert _closed(s, 10)
        else:
            assert st["drops"]["slow_consumer"] > 0
            assert r.ping() is True
        s.close()
    finally:
        broker.stop()


def test_auth_with_a_password_and_with_users():
    broker, port = _resp_broker("--resp-password", "s3cret", "--resp-user", "app:pw")
    try:
        s = _raw(port)
        s.sendall(_request(b"PUBLISH", b"c", b"x"))
        assert _read_until(s, b"\r\n") == b"-NOAUTH Authentication required.\r\n"
        s.sendall(_request(b"AUTH", b"wrong"))
        assert _read_until(s, b"\r\n").startswith(b"-WRONGPASS")
        s.sendall(_request(b"AUTH", b"s3cret") + _request(b"PUBLISH", b"c", b"x"))
        assert _read_until(s, b":0\r\n") == b"+OK\r\n:0\r\n"
        assert redis.Redis(port=port, username="app", password="pw").ping() is True
        assert redis.Redis(port=port, password="s3cret", protocol=3).ping() is True
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port, password="nope").ping()
        assert query_stats(broker.endpoint)["drops"]["resp_auth"] >= 2
    finally:
        broker.stop()


def test_auth_without_a_password_configured_is_refused_as_redis_says(resp):
    _broker, port = resp
    s = _raw(port)
    s.sendall(_request(b"AUTH", b"x"))
    assert _read_until(s, b"\r\n").startswith(b"-ERR AUTH <password> called without any password configured")
    s.close()


def test_broker_refuses_resp_where_it_cannot_serve_it():
    from fastbus.broker import BrokerConfig
    from fastbus.errors import InvalidConfig, InvalidEndpoint
    with pytest.raises(InvalidEndpoint, match="not a loopback address"):
        BrokerConfig(resp=["tcp://0.0.0.0:6379"]).check()
    with pytest.raises(InvalidConfig, match="need a Redis-protocol endpoint"):
        BrokerConfig(resp_password="x").check()
    cfg = BrokerConfig(resp=["redis://127.0.0.1", "unix:///tmp/x.sock"])
    cfg.check()
    assert cfg.resp == ["tcp://127.0.0.1:6379", "ipc:///tmp/x.sock"]


@pytest.mark.skipif(shutil.which("redis-cli") is None, reason="redis-cli not installed (Debian's redis-tools)")
def test_redis_cli_subscribes_in_one_process_and_publishes_in_another(resp):
    _broker, port = resp
    sub = subprocess.Popen(["redis-cli", "-p", str(port), "--no-raw", "SUBSCRIBE", "cli"],
                           stdout=subprocess.PIPE, text=True)
    try:
        r = redis.Redis(port=port)
        deadline = time.monotonic() + 10
        while r.pubsub_numsub("cli")[0][1] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        out = subprocess.run(["redis-cli", "-p", str(port), "PUBLISH", "cli", "hello from redis-cli"],
                             capture_output=True, text=True, timeout=10)
        assert out.stdout.strip().endswith("1")
        lines = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "hello from redis-cli" not in "".join(lines):
            lines.append(sub.stdout.readline())
        assert any("hello from redis-cli" in line for line in lines), lines
    finally:
        sub.kill()
        sub.wait()


def test_client_kill_closes_a_redis_subscriber(resp):
    _broker, port = resp
    s = _raw(port)
    s.sendall(_request(b"CLIENT", b"SETNAME", b"victim") + _request(b"SUBSCRIBE", b"k"))
    assert _read_until(s, b":1\r\n").endswith(b":1\r\n")
    r = redis.Redis(port=port)
    victim = [c for c in r.client_list() if c["name"] == "victim"]
    assert len(victim) == 1
    assert r.client_kill_filter(_id=victim[0]["id"]) == 1
    assert _closed(s)
    assert r.flushdb() is True and r.dbsize() == 0     # a broker holds no keys: nothing to flush
