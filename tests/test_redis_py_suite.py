"""redis-py's own pub/sub tests, run against fastbus (issue 23 item 3).

Nobody here wrote them, which is what makes them worth passing.  The test
fetches the source distribution of a pinned redis-py release from the
package index, takes its ``tests/`` directory and its pytest settings
(never its ``redis/`` package: the suite runs on the redis-py release
installed beside it, from the index too), appends to its two conftests one
import each of ``tests/redis_py/fastbus_factory.py`` (which makes the
suite's client factories build fastbus clients on a fastbus broker), and
runs ``tests/test_pubsub.py`` and ``tests/test_asyncio/test_pubsub.py``.

``tests/redis_py/expected.txt`` says for every test: passes, not
applicable (and why), or a documented difference, which must be a row of
README.md's table of differences from redis-py.  Any test whose outcome
differs from the list, or that the list does not name, fails this test.

The same suite runs a second time as released (no factory: plain
redis-py clients) with ``--redis-url`` on a broker's Redis-protocol
listener (``--resp``), as against a Redis server;
``tests/redis_py/expected_resp.txt`` says what each test does there.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import suites
from brokers import free_port

HERE = Path(__file__).resolve().parent
EXPECTED = HERE / "redis_py" / "expected.txt"
EXPECTED_RESP = HERE / "redis_py" / "expected_resp.txt"
FACTORY = HERE / "redis_py" / "fastbus_factory.py"
README = HERE.parent / "README.md"

#: The redis-py release whose tests the list describes, and the pytest
#: plugins its suite needs (pinned, so the list stays exact).
REDIS_PY = "8.1.0"
PLUGINS = ["pytest-asyncio==1.5.0", "pytest-timeout==2.4.0"]
SUITE_FILES = ["tests/test_pubsub.py", "tests/test_asyncio/test_pubsub.py"]


def read_expected(path: Path = EXPECTED) -> dict[str, tuple[str, str]]:
    """{test id: (outcome, why)}: outcome ``pass``, ``n/a`` or ``differs``."""
    return suites.read_expected(path)


def readme_difference_rows() -> set[str]:
    """The redis-py cells of README.md's table of differences (without
    their backquotes)."""
    text = README.read_text()
    start = text.index("Every difference from redis-py's pub/sub")
    rows = set()
    for line in text[start:].splitlines()[1:]:
        if line.startswith("| ") and not line.startswith("| redis-py |"):
            rows.add(line.split(" | ")[0][2:].strip().replace("`", ""))
        elif rows and not line.startswith("|"):
            break
    return rows


def test_the_list_of_outcomes_is_consistent():
    """Every documented difference is a row of the README's table (the
    README's claims and the suite's results are the same list)."""
    expected = read_expected()
    rows = readme_difference_rows()
    assert len(rows) >= 5, rows
    for test, (outcome, why) in expected.items():
        if outcome == "differs":
            for row in why.split(" | "):
                assert row in rows, f"{test}: {row!r} is not a row of README.md's table of differences"
    outcomes = [o for o, _w in expected.values()]
    assert outcomes.count("pass") > 150 and outcomes.count("differs") <= 4


def test_the_list_of_outcomes_on_the_resp_listener_is_consistent():
    """expected_resp.txt names the same tests as expected.txt (the same
    suite), says why for each that does not pass, and a plain Redis client
    on the broker passes every test that fastbus's own client passes."""
    expected, resp = read_expected(), read_expected(EXPECTED_RESP)
    assert set(resp) == set(expected), sorted(set(resp) ^ set(expected))
    for test, (outcome, why) in resp.items():
        assert outcome == "pass" or why.strip(), f"{test}: {outcome} without a why"
    assert [t for t, (o, _w) in expected.items() if o == "pass" and resp[t][0] != "pass"] == []
    outcomes = [o for o, _w in resp.values()]
    assert outcomes.count("pass") > 280 and outcomes.count("differs") <= 6


@pytest.fixture(scope="module")
def released(tmp_path_factory) -> Path:
    """redis-py's tests and their settings as released, in a directory of
    their own; ``site/`` two levels up holds redis-py and the plugins."""
    root = tmp_path_factory.mktemp("redis-py-suite")
    return suites.fetch_suite(root, "redis", REDIS_PY, "pyproject.toml", PLUGINS)


@pytest.fixture(scope="module")
def suite(released) -> Path:
    """A copy of them with the fastbus factory (beside the released one:
    the same ``site/``)."""
    src = released.with_name(released.name + "-fastbus")
    shutil.copytree(released, src)
    (src / "fastbus_factory.py").write_text(FACTORY.read_text())
    with open(src / "tests" / "conftest.py", "a") as f:
        f.write("\nfrom fastbus_factory import _get_client  # noqa: E402,F401  (fastbus)\n")
    with open(src / "tests" / "test_asyncio" / "conftest.py", "a") as f:
        f.write("\nfrom fastbus_factory import create_redis  # noqa: E402,F401  (fastbus)\n")
    return src


def run_suite(src: Path, redis_url: str, expected_path: Path, env: dict | None = None) -> list[str]:
    """redis-py's pub/sub suite in ``src``, with ``--redis-url``: the tests
    that did not do what ``expected_path`` says (each with what it did)."""
    junit = src / "report.xml"
    junit.unlink(missing_ok=True)
    env = {**os.environ, **(env or {}), "PYTHONPATH": str(src.parent.parent / "site")}
    # Without hypothesis's plugin (installed for fastbus's own tests): its
    # summary hook imports hypothesis at the very end, and CPython 3.11.7's
    # parser, after a test of the suite hit the recursion limit, failed
    # that import with "SystemError: AST constructor recursion depth
    # mismatch": the run's summary line was lost (once in CI, once in a
    # local run).
    r = subprocess.run([sys.executable, "-m", "pytest", *SUITE_FILES, "-p", "no:cacheprovider", "-p", "no:hypothesis",
                        "-q",
                        "--tb=line", "--timeout", "30", "--timeout-method=thread",
                        "--redis-url", redis_url, f"--junitxml={junit}"],
                       cwd=src, env=env, capture_output=True, text=True, timeout=900)
    assert junit.exists(), f"redis-py's suite did not run (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    got = suites.junit_outcomes(junit)
    assert len(got) >= 300
    assert re.search(r"\d+ passed", r.stdout), f"(exit {r.returncode})\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    wrong = suites.mismatches(got, read_expected(expected_path), expected_path.name)
    return wrong + ([f"--- pytest said:\n{r.stdout[-2000:]}"] if wrong else [])


def test_redis_py_pubsub_suite_against_fastbus(suite, brokers):
    """Every test redis-py's pub/sub suite holds does what the list says:
    the applicable ones pass, sync and asyncio."""
    b = brokers()
    # Port 1 has no server: the suite's session start then takes its
    # "optimistic defaults" (a recent standalone Redis) instead of asking one.
    wrong = run_suite(suite, "redis://127.0.0.1:1/0", EXPECTED, {"FASTBUS_REDIS_PY_ENDPOINT": b.endpoint})
    assert not wrong, "\n".join(wrong)


def test_redis_py_pubsub_suite_against_the_resp_listener(released, brokers):
    """The suite as released, plain redis-py on the broker's --resp
    listener as on a Redis server (whose INFO its session start reads):
    every test does what expected_resp.txt says."""
    for attempt in range(5):
        port = free_port()
        try:
            brokers("--resp", f"tcp://127.0.0.1:{port}")
            break
        except RuntimeError as exc:           # another test took the port we chose
            if "address already in use" not in str(exc) or attempt == 4:
                raise
    wrong = run_suite(released, f"redis://127.0.0.1:{port}/0", EXPECTED_RESP)
    assert not wrong, "\n".join(wrong)
