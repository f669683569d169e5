"""Errors a user meets: each a fastbus.FastbusError that is also the built-in
it resembles, one line naming what failed and where, and said soon."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time

import pytest

import fastbus
import fastbus.aio
from fastbus.errors import (AddressInUse, BatchError, BrokerTimeout, BrokerUnavailable, FastbusError, FlushTimeout,
                            InvalidEndpoint, InvalidKey, ListenError)


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_flush_against_no_broker_is_said_soon_and_names_the_endpoint():
    port = _closed_port()
    c = fastbus.Client(port=port)
    c.publish("ch", "x")
    t0 = time.monotonic()
    with pytest.raises(BrokerUnavailable) as info:
        c.flush(timeout=10)
    took = time.monotonic() - t0
    assert took < 5, took                              # not the 10 s timeout
    e = info.value
    assert isinstance(e, FastbusError) and isinstance(e, TimeoutError) and isinstance(e, ConnectionRefusedError)
    assert f"tcp://127.0.0.1:{port}" in str(e) and "connection refused" in str(e) and "\n" not in str(e)
    t0 = time.monotonic()
    with pytest.raises(fastbus.FlushTimeout, match=r"1 message\(s\) the broker at tcp://127.0.0.1:\d+ did not take"):
        c.close()                                      # (it could not deliver it: said, not dropped)
    assert time.monotonic() - t0 < 5
    assert c.closed


def test_flush_timeout_names_the_endpoint_when_something_listens_but_does_not_answer():
    with socket.socket() as srv:                      # listens (accepts in the backlog), never speaks ZMTP
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        port = srv.getsockname()[1]
        c = fastbus.Client(port=port)
        c.publish("ch", "x")
        with pytest.raises(FlushTimeout) as info:
            c.flush(timeout=2)
        assert isinstance(info.value, TimeoutError) and f"tcp://127.0.0.1:{port}" in str(info.value)
        with pytest.raises(BrokerTimeout) as info2:
            c.broker_stats(timeout=0.5)
        assert f"tcp://127.0.0.1:{port}" in str(info2.value)
        c.shutdown(0.5)


def test_async_flush_against_no_broker_is_said_soon():
    port = _closed_port()

    async def go():
        c = fastbus.aio.Client(port=port)
        await c.publish("ch", "x")
        t0 = time.monotonic()
        with pytest.raises(BrokerUnavailable) as info:
            await c.flush(timeout=10)
        assert time.monotonic() - t0 < 5
        assert f"tcp://127.0.0.1:{port}" in str(info.value)
        await c.close(timeout=1)

    asyncio.run(asyncio.wait_for(go(), 30))


def test_a_broker_that_starts_late_is_still_waited_for():
    """The absence probe gives up only on a broker refused for a second:
    one that comes up within that (here 0.6 s after the flush began) is
    flushed to as before."""
    import threading
    port = _closed_port()
    c = fastbus.Client(port=port)
    c.publish("ch", "x")
    started = []
    timer = threading.Timer(0.6, lambda: started.append(
        fastbus.Broker(bind=[f"tcp://127.0.0.1:{port}"]).start()))
    timer.start()
    try:
        t0 = time.monotonic()
        c.flush(timeout=20)                            # confirmed by the broker that came up
        assert started and time.monotonic() - t0 >= 0.5
    finally:
        timer.join()
        c.close()
        for b in started:
            b.stop()


def test_query_stats_refused_at_once():
    from fastbus.client import query_stats
    port = _closed_port()
    t0 = time.monotonic()
    with pytest.raises(BrokerUnavailable, match=f"no broker answered at tcp://127.0.0.1:{port}"):
        query_stats(f"tcp://127.0.0.1:{port}", timeout=5)
    assert time.monotonic() - t0 < 1.5


@pytest.mark.parametrize("endpoint", ["foo", "tcp://127.0.0.1", "http://127.0.0.1:80", "ipc://", 6464])
def test_bad_endpoints(endpoint):
    with pytest.raises(InvalidEndpoint) as info:
        fastbus.Client(endpoint=endpoint)
    assert isinstance(info.value, ValueError) and isinstance(info.value, FastbusError)
    assert str(endpoint) in str(info.value) or "not int" in str(info.value)


def test_bad_curve_key_in_query_stats():
    from fastbus.client import query_stats
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        with pytest.raises(InvalidKey, match="not a CURVE key"):
            query_stats(f"tcp://127.0.0.1:{srv.getsockname()[1]}", 1, ("server.key", "x" * 40, "y" * 40))


def test_port_clash_is_a_clear_error():
    with fastbus.Broker(bind=["tcp://127.0.0.1:0"]) as b:
        ep = b.endpoint
        other = fastbus.Broker(bind=["tcp://127.0.0.1:0", ep])     # the first endpoint binds, then the clash
        with pytest.raises(AddressInUse) as info:
            other.start()
        e = info.value
        assert isinstance(e, ListenError) and isinstance(e, OSError) and isinstance(e, FastbusError)
        assert str(e) == f"cannot listen on {ep}: address already in use (another broker?)"
        # what the failed broker had bound is released: it can start again on a free port
        again = fastbus.Broker(bind=["tcp://127.0.0.1:0"]).start()
        again.stop()


def test_ipc_socket_file_removed_at_stop(tmp_path):
    path = tmp_path / "fb.sock"
    with fastbus.Broker(bind=[f"ipc://{path}"]) as b:
        assert path.exists()
        with fastbus.Client(endpoint=b.endpoint) as c:
            c.publish("a", "b")
            c.flush()
    assert not path.exists()


def test_ipc_file_of_another_process_is_left_alone(tmp_path):
    """Only the file this broker made goes: one bound since (after ours was
    replaced) stays."""
    path = tmp_path / "fb.sock"
    b = fastbus.Broker(bind=[f"ipc://{path}"]).start()
    os.unlink(path)
    with socket.socket(socket.AF_UNIX) as other:
        other.bind(str(path))
        b.stop()
        assert path.exists()


def test_batch_error_says_it_once():
    with pytest.raises(BatchError) as info:
        fastbus.decode(b"xx")
    assert str(info.value).count("batch") == 1, str(info.value)


def test_the_fastbus_logger_has_a_null_handler():
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("fastbus").handlers)


@pytest.fixture
def curve_files(tmp_path):
    import zmq.auth
    for name in ("server", "client", "stranger"):
        zmq.auth.create_certificates(str(tmp_path), name)
    return tmp_path


def test_a_refused_curve_client_is_told_so(curve_files):
    import fastbus.curve
    from fastbus.errors import KeyRefused
    d = curve_files
    public, secret = fastbus.curve.load_certificate(d / "server.key_secret")
    cfg = fastbus.BrokerConfig(bind=["tcp://127.0.0.1:0"], curve_public_key=public, curve_secret_key=secret,
                               curve_allowed=[fastbus.curve.public_key(d / "client.key")])
    with fastbus.Broker(cfg) as b:
        with fastbus.Client(endpoint=b.endpoint, **fastbus.curve.client_keys(d / "server.key",
                                                                             d / "client.key_secret")) as ok:
            ok.publish("a", "b")
            ok.flush(timeout=10)                          # the accepted key: confirmed
        cases = [(d / "server.key", d / "stranger.key_secret", "refused this client's CURVE key"),
                 (d / "stranger.key", d / "client.key_secret", "a wrong broker key")]
        for server, cert, said in cases:
            c = fastbus.Client(endpoint=b.endpoint, **fastbus.curve.client_keys(server, cert))
            c.publish("a", "b")
            t0 = time.monotonic()
            with pytest.raises(KeyRefused) as info:
                c.flush(timeout=10)
            assert time.monotonic() - t0 < 5
            assert isinstance(info.value, PermissionError) and isinstance(info.value, FastbusError)
            assert b.endpoint in str(info.value) and said in str(info.value)
            t0 = time.monotonic()
            c.close(timeout=2)
            assert time.monotonic() - t0 < 3
            # a subscriber is told too, by subscribe(), rather than hearing nothing
            c = fastbus.Client(endpoint=b.endpoint, **fastbus.curve.client_keys(server, cert))
            p = c.pubsub()
            t0 = time.monotonic()
            with pytest.raises(KeyRefused, match=said):
                p.subscribe("a")
            assert time.monotonic() - t0 < 5
            with pytest.raises(KeyRefused, match=said):   # and a reader that asks later
                p.get_message(timeout=20)
            assert time.monotonic() - t0 < 10
            c.close(timeout=1)


def test_curve_key_files_or_keys_and_clear_mix_ups(curve_files):
    import fastbus.curve
    d = curve_files
    keys = fastbus.curve.client_keys(d / "server.key", d / "client.key_secret")
    server_public = fastbus.curve.load_certificate(d / "server.key")[0]
    assert keys["curve_server_key"] == server_public
    assert fastbus.curve.client_keys(server_public, d / "client.key_secret") == keys      # the key itself
    with pytest.raises(InvalidKey, match="has no secret key"):
        fastbus.curve.client_keys(d / "server.key", d / "client.key")                     # the public file
    with pytest.raises(InvalidKey, match="is a key, not a certificate file"):
        fastbus.curve.client_keys(d / "server.key", keys["curve_secret_key"])
    with pytest.raises(InvalidKey, match="neither a CURVE key"):
        fastbus.curve.client_keys(d / "nonexistent.key", d / "client.key_secret")
    with pytest.raises(InvalidKey, match="cannot read CURVE certificate"):
        fastbus.curve.client_keys(d / "server.key", d / "nonexistent.key_secret")


def test_a_flush_that_waits_on_a_known_broker_does_not_spin(monkeypatch):
    """A broker that answered once and then went away: the flush waits out
    its timeout without probing and without spinning (a handful of waits,
    not one per poll(0)), and says FlushTimeout."""
    from fastbus.client._session import Session
    waits = [0]
    wait = Session.wait

    def counted(self, deadline):
        waits[0] += 1
        return wait(self, deadline)

    monkeypatch.setattr(Session, "wait", counted)
    with fastbus.Broker(bind=["tcp://127.0.0.1:0"]) as b:
        c = fastbus.Client(endpoint=b.endpoint)
        c.publish("ch", "x")
        c.flush(timeout=20)                            # welcomed
    c.publish("ch", "y")
    waits[0] = 0
    t0 = time.monotonic()
    with pytest.raises(FlushTimeout) as info:
        c.flush(timeout=2)
    assert time.monotonic() - t0 >= 1.9
    assert waits[0] < 50, waits[0]                     # a spin makes ~100,000
    assert b.endpoint in str(info.value)
    c.shutdown(0.5)


@pytest.mark.parametrize("setting, value", [("upstream", "foo"), ("upstream", "tcp://127.0.0.1"),
                                            ("bind", "foo"), ("zmq_pub", ["tcp://127.0.0.1"]),
                                            ("zmq_pull", ["http://127.0.0.1:80"])])
def test_a_broker_with_a_malformed_endpoint_is_refused_as_the_client_refuses_it(setting, value):
    """The same InvalidEndpoint as fastbus.Client's, naming the setting, and
    before anything starts (upstream="foo" was a raw zmq.ZMQError at start())."""
    with pytest.raises(InvalidEndpoint) as info:
        fastbus.Broker(**{setting: value}).start()
    e = info.value
    assert isinstance(e, ValueError) and isinstance(e, FastbusError)
    assert e.setting == setting and str(e).startswith(f"{setting}: ") and "\n" not in str(e)
    assert (value if isinstance(value, str) else value[0]) in str(e)


def test_other_broker_settings_that_cannot_work_are_fastbus_errors():
    from fastbus.errors import InvalidConfig
    for kw, word in [({"slow_policy": "nope"}, "slow_policy"), ({"max_bytes": 0}, "max_bytes"),
                     ({"max_queue_bytes": 200_000}, "max_queue_bytes .200,000. must be at least twice max_bytes"),
                     ({"allow_brokers": ["nope"]}, "allow_brokers"), ({"http": "nope"}, "http")]:
        with pytest.raises(InvalidConfig, match=word) as info:
            fastbus.Broker(**kw)
        assert isinstance(info.value, ValueError) and isinstance(info.value, FastbusError)


def test_a_broker_takes_one_endpoint_as_a_str():
    """bind="tcp://..." (a str, not a list) was "unsupported endpoint 't'"."""
    from brokers import free_port
    ep, pub = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    with fastbus.Broker(bind=ep, zmq_pub=pub, allow_brokers="local") as b:
        assert b.endpoints == [ep] and b.config.zmq_pub == [pub] and b.config.allow_brokers == ["local"]
        from fastbus.client import query_stats
        assert query_stats(ep, timeout=5)["name"] == "fastbus"


def test_a_broker_that_does_not_start_in_time_names_its_endpoint():
    """start()'s timeout was a bare TimeoutError("broker did not start")."""
    import threading

    from brokers import free_port
    gate = threading.Event()

    class SlowToSetUp(fastbus.Broker):       # a loop thread that takes its time before binding
        def _setup(self) -> None:
            gate.wait(30)
            super()._setup()

    ep = f"tcp://127.0.0.1:{free_port()}"
    b = SlowToSetUp(bind=[ep])
    try:
        with pytest.raises(BrokerTimeout) as info:
            b.start(timeout=0.2)
        e = info.value
        assert isinstance(e, TimeoutError) and isinstance(e, FastbusError)
        assert e.endpoint == ep and ep in str(e) and "did not start within 0.2 s" in str(e) and "\n" not in str(e)
    finally:
        gate.set()
        b.stop()


def test_connection_errors_are_redis_pys_too_whichever_is_imported_first(tmp_path):
    """Code ported from redis-py keeps its ``except redis.ConnectionError``
    and ``except redis.TimeoutError``: a broker that is not there, a flush
    that times out, a closed connection.  Importing fastbus does not import
    redis-py (that would double its import time); the classes are redis-py's
    too however the two were imported."""
    import subprocess
    import sys
    port = _closed_port()
    script = (
        "import sys\n"
        "FIRST\n"
        "assert ('redis.exceptions' in sys.modules) == (sys.argv[2] == 'redis-first'), sys.argv[2]\n"
        "import redis, fastbus\n"
        "c = fastbus.Client(port=int(sys.argv[1]))\n"
        "c.publish('news', 'hi')\n"
        "try:\n"
        "    c.flush(timeout=3)\n"
        "except redis.ConnectionError as exc:\n"
        "    assert isinstance(exc, fastbus.BrokerUnavailable) and str(sys.argv[1]) in str(exc)\n"
        "    assert repr(exc).startswith('BrokerUnavailable('), repr(exc)\n"
        "else:\n"
        "    raise SystemExit('no error')\n"
        "assert c.close(timeout=0.1) == 1\n"
        "try:\n"
        "    c.pubsub().subscribe('x')\n"
        "except redis.ConnectionError as exc:\n"
        "    assert isinstance(exc, fastbus.ConnectionClosed), repr(exc)\n"
        "else:\n"
        "    raise SystemExit('a closed client made a pubsub')\n"
        "assert issubclass(fastbus.FlushTimeout, redis.TimeoutError)\n"
        "assert issubclass(fastbus.PublishTimeout, redis.TimeoutError)\n"
        "assert issubclass(fastbus.BrokerTimeout, redis.TimeoutError)\n"
        "print('ok')\n")
    for first, line in (("fastbus-first", "import fastbus"), ("redis-first", "import redis")):
        out = subprocess.run([sys.executable, "-c", script.replace("FIRST", line), str(port), first],
                             capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert out.returncode == 0 and out.stdout == "ok\n", (first, out.stdout, out.stderr[-2000:])


def test_a_client_pointed_at_a_redis_server_says_so_within_a_second(redis_server, redis_url):
    """A client left on Redis's port (a Redis server answers there) is told
    so, in one line naming what answered and where a broker listens, long
    before its timeout: flush(), and a PubSub's subscribe()."""
    import redis as redis_py
    from urllib.parse import urlsplit
    port = urlsplit(redis_url).port
    c = fastbus.Client(port=port)
    try:
        c.publish("news", "hi")
        t0 = time.monotonic()
        with pytest.raises(fastbus.NotABroker) as info:
            c.flush(timeout=20)
        assert time.monotonic() - t0 < 10                    # (its timeout: 20 s)
        msg = str(info.value)
        assert f"tcp://127.0.0.1:{port} is a Redis server" in msg and "PONG" in msg, msg
        assert "not a fastbus broker" in msg and fastbus.DEFAULT_ENDPOINT in msg, msg
        assert isinstance(info.value, BrokerUnavailable) and isinstance(info.value, redis_py.ConnectionError)
        assert info.value.endpoint == f"tcp://127.0.0.1:{port}" and "Redis server" in info.value.what
        p = c.pubsub()
        with pytest.raises(fastbus.NotABroker, match="is a Redis server"):
            p.subscribe("news")
        p.close()
    finally:
        c.close(timeout=0.1)


def test_a_client_pointed_at_an_http_server_says_so():
    import http.server
    import threading

    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    c = fastbus.Client(port=srv.server_address[1])
    try:
        c.publish("news", "hi")
        with pytest.raises(fastbus.NotABroker, match=r"is an HTTP server \(it answered"):
            c.flush(timeout=20)
    finally:
        c.close(timeout=0.1)
        srv.shutdown()
        srv.server_close()
        t.join(5)
