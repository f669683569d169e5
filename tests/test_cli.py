"""The fastbus command line, run as a user would (installed console script)."""

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def fastbus_cmd():
    # The script installed next to this interpreter, else the one on PATH.
    script = Path(sys.executable).with_name("fastbus")
    exe = str(script) if script.exists() else shutil.which("fastbus")
    return [exe] if exe else [sys.executable, "-m", "fastbus"]


def run(*args, timeout=120):
    # From a neutral directory, so the source tree cannot shadow the install.
    with tempfile.TemporaryDirectory() as cwd:
        return subprocess.run(fastbus_cmd() + list(args), capture_output=True, text=True,
                              timeout=timeout, cwd=cwd)


def test_help():
    r = run("--help")
    assert r.returncode == 0 and "demo" in r.stdout
    r = run("demo", "--help")
    assert r.returncode == 0 and "--subscriptions" in r.stdout


def test_no_command_prints_help_and_fails():
    r = run()
    assert r.returncode == 2 and "usage" in r.stdout


def test_demo_runs_and_reports_rates():
    r = run("demo", "--subscriptions", "20000", "--subscribers", "50", "--seconds", "0.3")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "20,001 subscriptions from 51 subscribers" in out   # + one prefix subscription
    assert "topics/s" in out and "bytes per subscription" in out
    assert "+market.NYSE.00001.trades, -market.NYSE.*" in out   # the subsume diff, in order
    assert "1000 records of 20 bytes" in out


def test_bad_arguments_are_rejected_clearly():
    r = run("demo", "--seconds", "-1")
    assert r.returncode == 2 and "between 0 and 3600" in r.stderr
    r = run("demo", "--subscriptions", "zero")
    assert r.returncode == 2 and "invalid" in r.stderr


def test_version():
    r = run("version")
    assert r.returncode == 0 and "batch format v1" in r.stdout
