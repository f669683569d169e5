"""Shared test setup.

The tests run against the *installed* package (``pip install ".[test]"`` then
``pytest``), never against the source tree, which has no compiled extension.
"""

import os
import random
import socket
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

REPO = Path(__file__).resolve().parent.parent

# Machines here are small and noisy: no per-example deadline; CI may ask for
# more examples with HYPOTHESIS_PROFILE=thorough.
settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", deadline=None, max_examples=1000,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

try:
    import fastbus  # noqa: F401
    from fastbus import _core  # noqa: F401
except ImportError as exc:  # pragma: no cover - a setup problem, not a test failure
    where = sys.modules.get("fastbus")
    hint = ""
    if where is not None and Path(where.__file__).resolve().parent == REPO / "fastbus":
        hint = (" (imported from the source tree: install with `pip install .` and run `pytest`, "
                "not `python -m pytest`, from the repository root)")
    pytest.exit(f"cannot import the compiled fastbus extension: {exc}{hint}", returncode=4)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture
def brokers():
    """Start brokers in subprocesses: ``brokers(*cli_args)``; all are
    stopped at the end of the test."""
    from brokers import BrokerProcess
    started = []

    def start(*args, port=None, curve=None):
        b = BrokerProcess(*args, port=port, curve=curve)
        started.append(b)
        return b

    yield start
    internal = {}
    for b in started:
        if b.proc.poll() is None:
            try:
                n = b.stats()["drops"].get("internal", 0)
            except TimeoutError:
                n = 0
            if n:
                internal[b.endpoint] = (n, b.log()[-3000:])
        b.stop()
    # The broker survives its own bugs by design; the tests must not.
    assert not internal, f"brokers logged internal errors: {internal}"


@pytest.fixture(scope="session")
def redis_server():
    """One embedded Redis-compatible server for the session
    (``fastbus.redis.EmbeddedServer``): ``$FASTBUS_TEST_REDIS_SERVER`` if set,
    else fastbus's default binary.  Tests may kill or restart it."""
    from fastbus.redis import EmbeddedServer
    with EmbeddedServer(os.environ.get("FASTBUS_TEST_REDIS_SERVER") or None) as server:
        yield server


@pytest.fixture
def redis_url(redis_server) -> str:
    """The URL of the session's server, running (started again if a test
    killed it) and emptied (FLUSHALL)."""
    redis_server.start()
    client = redis_server.client()
    try:
        client.flushall()
    finally:
        client.close()
    return redis_server.url


def cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free and valid."""
    for _ in range(200):
        port = random.randint(20000, 55000)
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


@pytest.fixture(scope="session")
def redis_cluster():
    """A 3-node Redis Cluster of embedded servers on loopback, the slots split
    evenly; yields a ``redis.cluster.RedisCluster`` client."""
    from redis.cluster import RedisCluster

    from fastbus.redis import EmbeddedServer
    binary = os.environ.get("FASTBUS_TEST_REDIS_SERVER") or None
    servers = [EmbeddedServer(binary, port=cluster_port(),
                              args=["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"])
               for _ in range(3)]
    try:
        for s in servers:
            s.start()
        ranges = [(0, 5460), (5461, 10922), (10923, 16383)]
        for s, (lo, hi) in zip(servers, ranges):
            c = s.client()
            c.execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
            c.execute_command("CLUSTER", "MEET", "127.0.0.1", servers[0].port)
        deadline = time.monotonic() + 30
        while not all(s.client().execute_command("CLUSTER", "INFO").decode().find("cluster_state:ok") >= 0
                      for s in servers):
            assert time.monotonic() < deadline, "the cluster did not form"
            time.sleep(0.1)
        rc = RedisCluster(host="127.0.0.1", port=servers[0].port)
        yield rc
        rc.close()
    finally:
        for s in servers:
            s.stop()
