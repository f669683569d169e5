"""The shell commands of README.md and docs/, typed as written, from the root
of a fresh copy of the repository (what a new user has after ``git clone``).

The rest of the suite runs its subprocesses from temporary directories or
with ``python -P``; these tests do not: they catch a command that works only
away from the source tree (``python -m`` and friends put the current
directory first on ``sys.path``, and the clone's ``fastbus/`` has no
compiled extension).

Once per module: the tracked and untracked (not ignored) files of this
checkout are copied to a temporary directory, a fresh virtual environment
is made, and the README's first command, ``pip install . && fastbus demo``,
runs there as written.  Every shell command in the documents is either run
here or listed in ``NOT_RUN`` with the reason (a new command fails
``test_every_documented_command_is_accounted_for`` until it is one or the
other).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

QUICK_START = "pip install . && fastbus demo"
SPARK_EXAMPLE = "python examples/spark_pipeline.py"

# Shell commands of the documents run by the tests below (as written).
RUN = {
    QUICK_START: "test_quick_start_from_the_clone_root",
    "fastbus redis-server": "test_redis_server_from_the_clone_root",
    f'pip install ".[spark]" && {SPARK_EXAMPLE}': "test_spark_example_from_the_clone_root",
    "make -C examples/embed run": "test_embedding_example_from_the_clone_root",
}

# Shell commands of the documents not run here, and why.
NOT_RUN = {
    'pip install ".[test,spark]" && pytest': "this test suite (.ci/run runs it from a clean checkout)",
    'pip install ".[test]" && pytest': "this test suite",
    "export FASTBUS_REDIS_URL=redis://127.0.0.1:41873": "what `fastbus redis-server` prints (checked there)",
    "python producer.py &": "the reader's own scripts",
    "python consumer.py": "the reader's own scripts",
    "python producer.py": "the reader's own scripts (tests/test_shared_redis.py runs two such scripts and the CLI)",
    'fastbus queue put jobs "one more"': "tests/test_shared_redis.py runs it between two scripts given no URL",
    "make -C examples/embed asan": ".ci/run runs it (a sanitizer build, minutes)",
    'pip install ".[channels]" daphne && fastbus broker':
        "the chat example's broker, which runs until stopped: tests/test_channels_chat.py starts brokers itself",
    "cd examples/chat && daphne chat.asgi:application":
        "the chat example's server, which runs until stopped: tests/test_channels_chat.py runs this app under "
        "daphne, from examples/chat",
    "make -C csrc check": "tests/test_c_core.py builds and runs the C tests",
    "make -C csrc asan": "tests/test_c_core.py builds and runs the C tests under ASan/UBSan",
    "wheels/build.sh": ".ci/run runs it (a wheel build and a whole test run, minutes)",
    "pip install cibuildwheel && cibuildwheel --platform linux --print-build-identifiers":
        "tests/test_packaging.py asks cibuildwheel for the same list",
    "FASTBUS_SANITIZE=1 pip install .": ".ci/run does this sanitized build",
    "FASTBUS_DEBUG=1 pip install .": "a debug build of the same setup.py",
    'LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)" '
    "ASAN_OPTIONS=detect_leaks=0 pytest tests/test_trie.py tests/test_forwarder.py tests/test_codec.py":
        ".ci/run runs these tests under ASan/UBSan",
    'pip install ".[bench]"': "the benchmarks' extra (not part of the test run)",
    "pytest bench/ --benchmark-only": "benchmarks, minutes (their brokers run in temporary directories)",
    "python bench/trie_memory.py": "a benchmark, minutes",
    "python bench/latency_bench.py": "a benchmark, minutes",
    "python bench/subscribe_bench.py": "a benchmark, minutes",
    "python bench/lease_bench.py": "a benchmark: a minute, a broker and four publisher processes a run",
    "python bench/federation_bench.py": "a benchmark: two brokers, a publisher and a subscriber process a run",
    "python bench/slow_consumer_bench.py": "a benchmark: a broker, a publisher process and subscribers a run",
    "python bench/flow_bench.py": "a benchmark: a minute, a broker and three processes a round",
    "python bench/aio_roundtrip_bench.py": "a benchmark: a broker and a thousand asyncio round trips",
    "python bench/glob_bench.py": "a benchmark: minutes (Redis scanning 1,000 patterns for a million publishes)",
    "python bench/pubsub_bench.py": "a benchmark, minutes",
    "python bench/percall_bench.py": "a benchmark: minutes, a server and a peer process a round",
    "python bench/threads_bench.py": "a benchmark: a broker (or a proxy) and two client processes a round",
    "python bench/journal_bound.py": "a benchmark: a minute, a broker writing 80 MB to its journal",
    'pip install "fastbus[spark]"': "an install from PyPI",
}


def shell_commands(path: Path) -> list[str]:
    """The commands of a document's ```sh blocks: continuation lines joined,
    a leading "$ " prompt and trailing "# ..." comments dropped."""
    commands = []
    for block in re.findall(r"^```sh\n(.*?)^```", path.read_text(), re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line.strip().removeprefix("$ ")).strip()
            if line and not line.startswith("#"):
                commands.append(re.sub(r"\s+", " ", line))
    return commands


def test_every_documented_command_is_accounted_for():
    found = {cmd: path.name for path in DOCS for cmd in shell_commands(path)}
    assert QUICK_START in found                     # the parser sees the README's blocks
    unknown = {cmd: where for cmd, where in found.items() if cmd not in RUN and cmd not in NOT_RUN}
    assert not unknown, f"documented commands neither run by tests/test_readme.py nor listed in NOT_RUN: {unknown}"


# --------------------------------------------------------------------------- the clone

def _git_files() -> list[str] | None:
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        return None
    r = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                       capture_output=True, timeout=60, check=False)
    return [f for f in r.stdout.decode().split("\0") if f] if r.returncode == 0 else None


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """The checkout's files as a fresh clone has them (tracked, plus new files
    not yet committed; no build output)."""
    files = _git_files()
    if not files:
        pytest.skip("not a git checkout (these tests need the repository, not a copy of tests/)")
    root = tmp_path_factory.mktemp("clone") / "fastbus"
    for name in files:
        src = REPO / name
        if src.is_file():
            dest = root / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest)
    return root


def _shell_env(bin_dir: Path, virtual_env: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONSAFEPATH", "PYTHONHOME", "VIRTUAL_ENV", "FASTBUS_REDIS_URL")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    if virtual_env is not None:
        env["VIRTUAL_ENV"] = str(virtual_env)
    return env


def sh(command: str, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """``command`` as a user types it into a shell."""
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.fixture(scope="module")
def quick_start(clone, tmp_path_factory):
    """A fresh virtual environment, then the README's first command in the
    clone's root: (the completed process, the shell environment)."""
    env_dir = tmp_path_factory.mktemp("venv") / "venv"
    venv.EnvBuilder(with_pip=True, symlinks=True).create(env_dir)
    env = _shell_env(env_dir / "bin", env_dir)
    return sh(QUICK_START, clone, env, timeout=900), env


@pytest.mark.slow
def test_quick_start_from_the_clone_root(quick_start):
    r, _env = quick_start
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "delivered" in r.stdout and "(no loss)" in r.stdout, r.stdout[-2000:]
    assert "Traceback" not in r.stderr, r.stderr[-4000:]


@pytest.mark.slow
def test_commands_from_the_clone_root(quick_start, clone, tmp_path):
    """The commands of the README's command-line section, from the clone's
    root, with the package the quick start installed."""
    r, env = quick_start
    if r.returncode != 0:
        pytest.skip("the quick start failed (test_quick_start_from_the_clone_root says why)")
    r = sh("fastbus --version && fastbus --help && fastbus core-demo --seconds 0.2 --subscriptions 1000",
           clone, env, 120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("fastbus ") and "routing:" in r.stdout
    r = sh(f"fastbus keygen --dir {tmp_path}", clone, env, 60)
    assert r.returncode == 0 and (tmp_path / "fastbus.key_secret").exists(), r.stdout + r.stderr
    from brokers import free_port
    port = free_port()
    broker = subprocess.Popen(["bash", "-c", f"exec fastbus broker --bind tcp://127.0.0.1:{port}"],
                              cwd=clone, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            r = sh(f"fastbus stats --port {port} --timeout 0.5", clone, env, 60)
            if r.returncode == 0 or time.monotonic() > deadline or broker.poll() is not None:
                break
            time.sleep(0.2)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "broker fastbus" in r.stdout
    finally:
        broker.send_signal(signal.SIGTERM)
        _out, err = broker.communicate(timeout=30)
    assert broker.returncode == 0, err[-3000:]


@pytest.mark.slow
def test_the_source_tree_says_what_to_do(quick_start, clone):
    """``python -c "import fastbus"`` and ``python -m fastbus`` in the clone's
    root import its uncompiled tree: one line says so and what to do;
    ``python -P`` (the installed package) works."""
    r, env = quick_start
    if r.returncode != 0:
        pytest.skip("the quick start failed (test_quick_start_from_the_clone_root says why)")
    for command in ('python -c "import fastbus"', "python -m fastbus --version"):
        r = sh(command, clone, env, 60)
        assert r.returncode == 1, r.stdout + r.stderr
        assert (f"you are importing the source tree at {clone} (the current directory), which has no "
                "compiled extension") in r.stderr, r.stderr
        assert "pip install -e ." in r.stderr and "No module named" not in r.stderr
    r = sh('python -P -c "import fastbus; print(fastbus.__file__)"', clone, env, 60)
    assert r.returncode == 0 and "site-packages" in r.stdout, r.stdout + r.stderr


@pytest.mark.slow
def test_redis_server_from_the_clone_root(quick_start, clone):
    r, env = quick_start
    if r.returncode != 0:
        pytest.skip("the quick start failed (test_quick_start_from_the_clone_root says why)")
    proc = subprocess.Popen(["bash", "-c", "exec fastbus redis-server"], cwd=clone, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()         # the server started, or the command failed (EOF)
        assert re.fullmatch(r"export FASTBUS_REDIS_URL=redis://127\.0\.0\.1:\d+\n", line), \
            line + (proc.stderr.read() if proc.poll() is not None else "")
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "stopped (SIGTERM)" in err, err


@pytest.mark.slow
def test_spark_example_from_the_clone_root(clone, tmp_path):
    """``python examples/spark_pipeline.py`` in the clone's root: Spark starts
    its Python workers with ``python -m`` in that directory.  ``python`` is
    this test run's interpreter (installed with the spark extra, as the
    README's ``pip install ".[spark]"`` does), not the quick start's.  On
    embedded defaults, end to end: every event published is counted in the
    results the subscriber prints."""
    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[test,spark]')")
    pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install '.[test,spark]')")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java 17+ (java is not on PATH and JAVA_HOME is unset)")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "python").chmod(0o755)
    env = _shell_env(bin_dir, None)
    env.pop("PYSPARK_PYTHON", None)
    r = sh(f"{SPARK_EXAMPLE} --seconds 2 --rate 500", clone, env, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    m = re.search(r"published (\d+) events \(amount (\d+)\); the job reported (\d+) events \(amount (\d+)\)",
                  r.stdout)
    assert m and m.group(1, 2) == m.group(3, 4), r.stdout[-2000:]
    assert int(m.group(1)) >= 500 and "window " in r.stdout, r.stdout[-2000:]


@pytest.mark.slow
def test_embedding_example_from_the_clone_root(clone):
    if shutil.which("make") is None or shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("needs make and a C compiler")
    r = sh("make -C examples/embed run", clone, _shell_env(Path(sys.executable).parent, None), timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
