"""The fastbus command line, run as a user would (installed console script)."""

import json
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
    assert r.returncode == 0
    for cmd in ("broker", "stats", "demo", "core-demo", "keygen"):
        assert cmd in r.stdout
    r = run("core-demo", "--help")
    assert r.returncode == 0 and "--subscriptions" in r.stdout
    r = run("broker", "--help")
    assert r.returncode == 0 and "--upstream" in r.stdout and "--slow-policy" in r.stdout


def test_no_command_prints_help_and_fails():
    r = run()
    assert r.returncode == 2 and "usage" in r.stdout


def test_core_demo_runs_and_reports_rates():
    r = run("core-demo", "--subscriptions", "20000", "--subscribers", "50", "--seconds", "0.3")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "20,001 subscriptions from 51 subscribers" in out   # + one prefix subscription
    assert "topics/s" in out and "bytes per subscription" in out
    assert "+market.NYSE.00001.trades, -market.NYSE.*" in out   # the subsume diff, in order
    assert "1000 records of 20 bytes" in out


def test_bad_arguments_are_rejected_clearly():
    r = run("core-demo", "--seconds", "-1")
    assert r.returncode == 2 and "between 0 and 3600" in r.stderr
    r = run("core-demo", "--subscriptions", "zero")
    assert r.returncode == 2 and "invalid" in r.stderr
    r = run("broker", "--bind", "tcp://0.0.0.0:1")
    assert r.returncode == 2 and "loopback" in r.stderr
    r = run("broker", "--bind", "tcp://127.0.0.1:1", "--curve-allow", "/nonexistent")
    assert r.returncode != 0 and "--curve-allow needs --curve-cert" in r.stderr


def test_live_demo_delivers_everything():
    r = run("demo", "--seconds", "1.5", timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "delivered" in r.stdout and "(no loss)" in r.stdout


def test_broker_runs_answers_stats_and_stops_on_sigterm(tmp_path):
    import signal
    import time

    from brokers import free_port
    port = free_port()
    proc = subprocess.Popen(fastbus_cmd() + ["broker", "--bind", f"tcp://127.0.0.1:{port}", "--name", "cli-test"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            r = run("stats", "--port", str(port), "--timeout", "0.5")
            if r.returncode == 0 or time.monotonic() > deadline:
                break
        assert r.returncode == 0, r.stderr
        assert "broker cli-test" in r.stdout and "subscriptions 0" in r.stdout
        r = run("stats", "--port", str(port), "--json")
        assert json.loads(r.stdout)["name"] == "cli-test"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0
    assert "listening on" in out and "stopped after" in out and "0 messages in" in out
    r = run("stats", "--port", str(port), "--timeout", "0.3")
    assert r.returncode == 1 and "no broker answered" in r.stderr


def test_keygen(tmp_path):
    r = run("keygen", "--dir", str(tmp_path), "--name", "k")
    assert r.returncode == 0
    assert (tmp_path / "k.key").exists() and (tmp_path / "k.key_secret").exists()


def test_version():
    r = run("version")
    assert r.returncode == 0 and "batch format v1" in r.stdout
