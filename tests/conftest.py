"""Shared test setup.

The tests run against the *installed* package (``pip install ".[test]"`` then
``pytest``), never against the source tree, which has no compiled extension.
"""

import os
import random
import shutil
import socket
import sys
import tempfile
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

# Every Spark JVM of the run (the Spark tests' sessions, and the scripts and
# README example they start, which inherit the environment) compiles with
# the client JIT only and collects with the serial GC: the tests' jobs are
# seconds long, and the default tiered JIT and parallel GC spent more CPU
# than the jobs did.  The README's Spark example alone on the 2-core
# machine: 70 CPU-seconds before, 46 after (wall 46 s -> 38 s).
# spark-submit adds $SPARK_SUBMIT_OPTS to the driver's command line,
# without the banner that JAVA_TOOL_OPTIONS prints.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")

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


#: The modules that take longest under pytest-xdist (measured with 2
#: workers on 2 cores), longest first: they start first, so none is left
#: running alone at the end.  pyproject's ``--dist loadfile`` keeps each
#: module on one worker, so a module fixture (the README's clone and its
#: venv, a Spark session, the C core's objects, mypy's cache) is built
#: once, and the snippets' fixed port (the README's 127.0.0.1:6464) is
#: never taken twice.  The other modules follow, as collected.
LONGEST_FIRST = ("test_readme", "test_spark", "test_redis_py_suite", "test_subscribe_contract",
                 "test_c_core", "test_channels_redis_suite", "test_broker", "test_cli", "test_snippets",
                 "test_native_engine", "test_broker_promises", "test_monitor_broker", "test_types",
                 "test_broker_memory", "test_redis_publisher", "test_forwarder", "test_queue_cli",
                 "test_monitor_remote")
#: What `.ci/run` runs again against Debian's redis-server (``-m
#: redis_server``): the modules whose subject is what a server does, so
#: that a difference between Valkey and Redis 7 shows -- its management
#: (start, limits, errors), pub/sub and glob matching, the queues' Lua
#: scripts and their faults, cluster routing, the figures read from INFO --
#: and any test marked ``@pytest.mark.redis_server`` elsewhere.  Tests that
#: use a server only as a backdrop to something of fastbus's own (the CLI
#: over the same queue calls, the async twins of the same commands, the
#: docs' snippets, close deadlines, the monitoring page) run once, against
#: the default server.
SERVER_MODULES = {"test_redis_server", "test_redis_publisher", "test_redis_subscriber", "test_redis_errors",
                  "test_redis_cluster", "test_glob", "test_queue", "test_queue_reliability", "test_queue_faults",
                  "test_queue_topic", "test_queue_inbox", "test_queue_staged", "test_queue_driver",
                  "test_queue_cluster", "test_monitor_queues"}


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (pyproject's addopts): a worker and a half per CPU.  The
    suite mostly waits on sockets, servers and subprocesses (two workers on
    two cores kept 0.9 of them busy): on the 2-core machine three workers
    took 8:56 where two took 10:25, all passing.  What asserts a wall-clock
    bound is marked serial, so the extra worker does not decide it.  (It
    once made channels_redis's own 1 s flush timeout fail: the asyncio
    client's flush waited for its next ping; fixed, and tested in
    test_pubsub_parity.)"""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:                 # not on Linux
        cpus = os.cpu_count() or 1
    return max(2, cpus + cpus // 2)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "redis_server: tests what a Redis-compatible server does "
                                       "(.ci/run runs these again against Debian's redis-server)")
    config.addinivalue_line("markers", "serial: asserts wall-clock bounds; runs while no other "
                                       "test does (under pytest-xdist too)")
    # pytest-xdist's controller (or a run in one process): a directory for
    # the workers' serial lock (they inherit the environment), removed
    # when the run ends.  Where the environment names one already, the run
    # shares it with the others that do (.ci/run's concurrent runs).
    if not hasattr(config, "workerinput") and "FASTBUS_TEST_LOCKS" not in os.environ:
        locks = os.environ["FASTBUS_TEST_LOCKS"] = tempfile.mkdtemp(prefix="fastbus-tests-")

        def remove() -> None:
            os.environ.pop("FASTBUS_TEST_LOCKS", None)
            shutil.rmtree(locks, ignore_errors=True)
        config.add_cleanup(remove)
    # The user's shared Redis server (what "no URL" means) of this run: in
    # a directory of its own, not the user's, and stopped when the run ends.
    if not hasattr(config, "workerinput") and "FASTBUS_RUNTIME_DIR" not in os.environ:
        shared = tempfile.mkdtemp(prefix="fastbus-shared-")
        os.environ["FASTBUS_RUNTIME_DIR"] = os.path.join(shared, "run")
        os.environ["FASTBUS_STATE_DIR"] = os.path.join(shared, "state")

        def stop_shared() -> None:
            from fastbus.redis.shared import stop_shared
            try:
                stop_shared()
            finally:
                for name in ("FASTBUS_RUNTIME_DIR", "FASTBUS_STATE_DIR"):
                    os.environ.pop(name, None)
                shutil.rmtree(shared, ignore_errors=True)
        config.add_cleanup(stop_shared)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Under pytest-xdist, a test marked ``serial`` runs while no other test
    of the run does (its bounds are about fastbus, not about the CPU other
    workers take); every other test may run beside any other.  The whole
    protocol is inside, so a module's costly fixtures (a venv to build, a
    Spark to start) are set up and torn down inside it too.  A
    readers-writer lock over two files the workers share: every test passes
    a turnstile and holds the room shared; a serial test holds both
    exclusively, so none starts while it waits or runs.  Runs that share
    the directory ($FASTBUS_TEST_LOCKS) share the lock."""
    locks = os.environ.get("FASTBUS_TEST_LOCKS")
    if locks is None:
        return (yield)
    import fcntl
    serial = item.get_closest_marker("serial") is not None
    with open(os.path.join(locks, "turnstile"), "a") as turnstile, open(os.path.join(locks, "room"), "a") as room:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(room, fcntl.LOCK_EX if serial else fcntl.LOCK_SH)
        finally:
            if not serial:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            return (yield)
        finally:
            fcntl.flock(room, fcntl.LOCK_UN)
            if serial:
                fcntl.flock(turnstile, fcntl.LOCK_UN)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests of what a Redis server does (SERVER_MODULES), and order the modules for
    pytest-xdist (``-n``, in pyproject's addopts): LONGEST_FIRST first, in
    that order; then the rest, as collected."""
    for item in items:
        module = item.path.stem
        if module in SERVER_MODULES:
            item.add_marker(pytest.mark.redis_server)
    rank = {m: i for i, m in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))


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


@pytest.fixture
def clients():
    """``clients(endpoint, **options)``: a ``fastbus.Client``, closed (2 s at
    most) at the end of the test."""
    import fastbus
    made = []

    def make(endpoint, **kw):
        c = fastbus.Client(endpoint=endpoint, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close(timeout=2)


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
