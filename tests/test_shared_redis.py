"""What "no URL" means for a user's programs and commands: the user's shared
Redis server (fastbus.redis.shared), started by the first that needs it and
found by the others, so that they meet (issue 49: a script's WorkQueue("jobs")
and `fastbus queue put jobs` once used two different servers, silently)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

BIN = os.environ.get("FASTBUS_TEST_REDIS_SERVER") or None


@pytest.fixture
def user(tmp_path):
    """A user's environment of its own: runtime and state dirs, no URL; its
    shared server stopped at the end (by the command a user has for it)."""
    env = {k: v for k, v in os.environ.items() if k != "FASTBUS_REDIS_URL"}
    env.update(FASTBUS_RUNTIME_DIR=str(tmp_path / "run"), FASTBUS_STATE_DIR=str(tmp_path / "state"))
    if BIN:
        env["FASTBUS_REDIS_SERVER"] = BIN
    yield env
    r = fastbus(env, "redis-server", "--stop")
    assert r.returncode == 0, r.stderr


def fastbus(env: dict, *args: str) -> subprocess.CompletedProcess:
    script = Path(sys.executable).with_name("fastbus")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "fastbus"]
    with tempfile.TemporaryDirectory() as cwd:
        return subprocess.run(cmd + list(args), capture_output=True, text=True, env=env, cwd=cwd, timeout=60)


def script(env: dict, code: str) -> subprocess.CompletedProcess:
    """A program given no URL, logging at INFO (what it says of the server)."""
    code = "import logging; logging.basicConfig(level=logging.INFO)\n" + textwrap.dedent(code)
    with tempfile.TemporaryDirectory() as cwd:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd,
                              timeout=60)


def registry(env: dict) -> dict | None:
    try:
        return json.loads((Path(env["FASTBUS_RUNTIME_DIR"]) / "redis.json").read_text())
    except OSError:
        return None


def gone(pid: int, within: float = 20.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


PUT = """
    from fastbus.queue import WorkQueue
    with WorkQueue("jobs") as q:
        q.put(b"from a script")
"""

GET = """
    from fastbus.queue import WorkQueue
    with WorkQueue("jobs") as q, q.consumer() as c:
        for _ in range({n}):
            m = c.get(timeout=10)
            print(m.payload.decode(), flush=True)
            m.ack()
"""


def test_two_scripts_and_the_cli_given_no_url_meet_on_one_server(user):
    producer = script(user, PUT)
    assert producer.returncode == 0, producer.stderr
    assert "started the shared Redis server at redis://127.0.0.1:" in producer.stderr, producer.stderr
    reg = registry(user)
    assert reg is not None and reg["url"] in producer.stderr
    r = fastbus(user, "queue", "put", "jobs", "from the cli")
    assert r.returncode == 0, r.stderr
    r = fastbus(user, "queue", "stats", "jobs")
    assert r.returncode == 0 and "ready 2" in r.stdout, r.stdout + r.stderr
    consumer = script(user, GET.format(n=2))
    assert consumer.returncode == 0, consumer.stderr
    assert consumer.stdout.splitlines() == ["from a script", "from the cli"]
    assert f"using the shared Redis server at {reg['url']} (pid {reg['pid']})" in consumer.stderr
    assert registry(user)["pid"] == reg["pid"]                    # one server all along
    r = fastbus(user, "redis-server", "--stop")
    assert r.returncode == 0 and f"stopped the shared server at {reg['url']}" in r.stderr, r.stderr
    assert gone(reg["pid"]) and gone(reg["server_pid"])
    assert registry(user) is None
    r = fastbus(user, "redis-server", "--stop")
    assert r.returncode == 0 and "no shared server runs" in r.stderr


def test_an_idle_shared_server_stops_and_what_it_kept_is_there_for_the_next(user):
    user["FASTBUS_REDIS_IDLE"] = "1"
    assert script(user, PUT).returncode == 0
    first = registry(user)
    assert first is not None
    assert gone(first["pid"]), "the idle shared server did not stop"
    assert registry(user) is None
    consumer = script(user, GET.format(n=1))                     # started again, on the data kept
    assert consumer.returncode == 0, consumer.stderr
    assert consumer.stdout.splitlines() == ["from a script"]
    assert "started the shared Redis server" in consumer.stderr


def test_programs_that_start_at_once_start_one_server(user):
    code = "from fastbus.redis import resolve_url; print(resolve_url(None))"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=user, cwd=tempfile.gettempdir()) for _ in range(4)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    urls = {out.strip() for out, _ in outs}
    assert len(urls) == 1 and registry(user)["url"] in urls, outs


def test_a_runtime_dir_others_may_write_is_refused(user, tmp_path):
    run = Path(user["FASTBUS_RUNTIME_DIR"])
    run.mkdir(mode=0o700)
    run.chmod(0o777)
    r = script(user, PUT)
    assert r.returncode != 0 and "is not this user's own directory" in r.stderr, r.stderr
    run.chmod(0o700)
    r = fastbus(user, "queue", "stats", "jobs")
    assert r.returncode == 0, r.stderr


def test_fastbus_redis_url_still_comes_first(user, redis_url):
    user["FASTBUS_REDIS_URL"] = redis_url
    r = script(user, "from fastbus.redis import resolve_url; print(resolve_url(None))")
    assert r.returncode == 0 and r.stdout.strip() == redis_url, r.stderr
    assert registry(user) is None                                  # no shared server started
