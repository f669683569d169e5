"""Shared test setup.

The tests run against the *installed* package (``pip install ".[test]"`` then
``pytest``), never against the source tree, which has no compiled extension.
"""

import os
import sys
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
