"""channels_redis's own tests, run against fastbus.channels (issue 25 item 2).

Nobody here wrote them.  The test fetches the source distribution of a
pinned channels_redis release from the package index, takes its ``tests/``
directory and its pytest settings, installs that release beside it (its
tests import its exceptions and layer classes), writes
``tests/channels_redis/fastbus_layers.py`` as the suite's conftest (it
makes both of channels_redis's layer classes build
:class:`fastbus.channels.ChannelLayer` objects on fastbus brokers), and
runs ``tests/test_pubsub.py`` and ``tests/test_core.py``.  The sentinel
tests need Redis Sentinel, and the serializer and utility tests test
channels_redis's own helpers: they are not run.

``tests/channels_redis/expected.txt`` says for every test: passes, or not
applicable and why (two of those race, and are run but not judged).  Any test whose outcome differs from the list, or that
the list does not name, fails this test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import suites

pytest.importorskip("channels", reason="fastbus.channels needs channels: pip install 'fastbus[channels]'")
pytest.importorskip("msgpack", reason="fastbus.channels needs msgpack: pip install 'fastbus[channels]'")

HERE = Path(__file__).resolve().parent
EXPECTED = HERE / "channels_redis" / "expected.txt"
CONFTEST = HERE / "channels_redis" / "fastbus_layers.py"

#: The channels_redis release whose tests the list describes, and what its
#: suite imports besides channels and redis-py (pinned, so the list stays exact).
CHANNELS_REDIS = "4.3.0"
PLUGINS = ["pytest-asyncio==1.5.0", "pytest-timeout==2.4.0", "async-timeout==5.0.1"]
SUITE_FILES = ["tests/test_pubsub.py", "tests/test_core.py"]


def read_expected() -> dict[str, tuple[str, str]]:
    """{test id: (outcome, why)}: outcome ``pass``, ``n/a`` or ``either``."""
    return suites.read_expected(EXPECTED, ("pass", "n/a", "either"))


def test_the_list_of_outcomes_is_consistent():
    """Every test not run as passing says why, and most of the suite is
    listed as passing."""
    expected = read_expected()
    for test, (outcome, why) in expected.items():
        assert outcome == "pass" or len(why) > 20, f"{test}: {outcome} needs a reason"
    outcomes = [o for o, _w in expected.values()]
    assert outcomes.count("pass") >= 30 and outcomes.count("n/a") + outcomes.count("either") <= 10, outcomes
    assert outcomes.count("either") <= 2, outcomes


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    """channels_redis's tests and settings, with the fastbus conftest, in a
    directory of their own; ``site/`` beside them holds channels_redis and
    the plugins."""
    root = tmp_path_factory.mktemp("channels-redis-suite")
    src = suites.fetch_suite(root, "channels_redis", CHANNELS_REDIS, "setup.cfg", PLUGINS)
    assert not (src / "tests" / "conftest.py").exists()
    (src / "tests" / "conftest.py").write_text(CONFTEST.read_text())
    return src


def test_channels_redis_suite_against_fastbus(suite, brokers):
    """Every test of channels_redis's core and pub/sub suites does what the
    list says: the applicable ones pass, on one broker and sharded over two."""
    one, two = brokers(), brokers()
    junit = suite / "report.xml"
    env = {**os.environ, "FASTBUS_CHANNELS_ENDPOINT": one.endpoint,
           "FASTBUS_CHANNELS_ENDPOINTS": f"{one.endpoint},{two.endpoint}",
           "PYTHONPATH": str(suite.parent.parent / "site")}
    r = subprocess.run([sys.executable, "-m", "pytest", *SUITE_FILES, "-p", "no:cacheprovider", "-q", "--tb=line",
                        f"--junitxml={junit}"],
                       cwd=suite, env=env, capture_output=True, text=True, timeout=600)
    assert junit.exists(), f"channels_redis's suite did not run (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    got = suites.junit_outcomes(junit)
    wrong = suites.mismatches(got, read_expected(), EXPECTED.name)
    assert not wrong, "\n".join(wrong) + f"\n--- pytest said:\n{r.stdout[-3000:]}"
    assert len(got) >= 40
