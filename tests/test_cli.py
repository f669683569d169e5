"""The fastbus command line, run as a user would (installed console script)."""

import json
import os
import time
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
    assert r.returncode == 2 and "--subscriptions: must be a positive integer, not zero" in r.stderr
    r = run("broker", "--bind", "tcp://0.0.0.0:1")
    assert r.returncode == 2 and "loopback" in r.stderr
    r = run("broker", "--bind", "tcp://127.0.0.1:1", "--curve-allow", "/nonexistent")
    assert r.returncode != 0 and "--curve-allow and --curve-allow-broker need --curve-cert" in r.stderr


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


def _options(parser, path=()):
    """(command path, action) for every option of every (sub)command."""
    import argparse
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from _options(sub, (*path, name))
        elif a.dest not in ("help", "version"):
            yield path, a


def test_every_option_has_help_and_shows_its_default():
    import argparse

    from fastbus.cli import build_parser
    seen = 0
    for path, a in _options(build_parser()):
        seen += 1
        name = f"fastbus {' '.join(path)} {'/'.join(a.option_strings) or a.dest}"
        assert a.help, f"{name} has no help text"
        if a.option_strings and a.default not in (None, False, [], argparse.SUPPRESS):
            assert "default" in a.help.lower(), f"{name}: its --help does not say its default {a.default!r}"
    assert seen > 50
    r = run("broker", "--help")
    assert "(default: 4096)" in r.stdout and "(default: INFO)" in r.stdout


def test_version_flag():
    r = run("--version")
    assert r.returncode == 0 and r.stdout.startswith("fastbus ") and "batch format v1" in r.stdout


def _one_line_error(r, code, *words) -> str:
    """Check a command failed with exit ``code`` and one line on stderr
    holding every one of ``words``; that line."""
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    for w in words:
        assert w in r.stderr, r.stderr
    return r.stderr.strip()


def test_errors_are_one_line_with_one_exit_code_convention(tmp_path):
    from brokers import free_port
    # usage: 2
    _one_line_error(run("stats", "--connect", "foo"), 2, "invalid endpoint 'foo'", "tcp://HOST:PORT")
    _one_line_error(run("stats", "--curve-server-key", "abc", "--curve-cert", "x"), 2,
                    "--curve-server-key 'abc' is neither a CURVE key")
    assert run("keygen", "--dir", str(tmp_path)).returncode == 0
    public, secret = tmp_path / "fastbus.key", tmp_path / "fastbus.key_secret"
    z85 = next(line for line in public.read_text().splitlines() if "public-key" in line).split('"')[1]
    _one_line_error(run("stats", "--curve-server-key", z85, "--curve-cert", z85), 2,
                    "is a key, not a certificate file")
    dash = "-" + "0" * 39                            # one Z85 key in 85 starts with "-" (CI met one)
    _one_line_error(run("stats", "--curve-server-key", dash, "--curve-cert", dash), 2,
                    "is a key, not a certificate file")
    _one_line_error(run("broker", "--curve-cert", str(public)), 2, "has no secret key (use the .key_secret file)")
    # runtime: 1, and an absent broker said at once
    port = free_port()
    t0 = time.monotonic()
    _one_line_error(run("stats", "--port", str(port), "--timeout", "60"), 1,
                    f"no broker answered at tcp://127.0.0.1:{port}", "connection refused")
    assert time.monotonic() - t0 < 30          # not the 60 s timeout (the rest: starting Python on a busy machine)
    # the broker's key given as its file or as Z85: both accepted (then no broker there)
    # (a Z85 key may start with "-": one in 85 does, and is still a value)
    for key in (str(public), z85, "-" + "0" * 39):
        _one_line_error(run("stats", "--port", str(port), "--curve-server-key", key, "--curve-cert", str(secret)),
                        1, "no broker answered")


def test_a_second_broker_on_the_same_port_says_so(tmp_path):
    import signal

    from brokers import free_port
    port = free_port()
    first = subprocess.Popen(fastbus_cmd() + ["broker", "--bind", f"tcp://127.0.0.1:{port}"], cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while run("stats", "--port", str(port), "--timeout", "0.5").returncode != 0:
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.1)
        _one_line_error(run("broker", "--bind", f"tcp://127.0.0.1:{port}", "--log-level", "WARNING"), 1,
                        f"fastbus broker: cannot listen on tcp://127.0.0.1:{port}: address already in use")
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(30)


def test_keygen_refuses_to_overwrite_and_keeps_the_secret_private(tmp_path):
    import stat
    assert run("keygen", "--dir", str(tmp_path), "--name", "b").returncode == 0
    secret = tmp_path / "b.key_secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    before = secret.read_bytes()
    _one_line_error(run("keygen", "--dir", str(tmp_path), "--name", "b"), 2, "already exist", "--force")
    assert secret.read_bytes() == before
    assert run("keygen", "--dir", str(tmp_path), "--name", "b", "--force").returncode == 0
    assert secret.read_bytes() != before and stat.S_IMODE(secret.stat().st_mode) == 0o600


def _subscriber_prints(args: list, subscribed: str, publish) -> list:
    """Run ``fastbus ARGS`` (a sub or psub with --json and --count), wait
    for it to say ``subscribed``, call ``publish(port, cwd)``, and return
    the JSON lines it printed before it stopped by itself."""
    with tempfile.TemporaryDirectory() as cwd:
        sub = subprocess.Popen(fastbus_cmd() + args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            line = sub.stderr.readline().decode()              # confirmed: now publish
            assert line.startswith(f"fastbus sub: subscribed to {subscribed}"), line + sub.stderr.read().decode()
            publish(cwd)
            out, err = sub.communicate(timeout=60)
        finally:
            if sub.poll() is None:
                sub.kill()
                sub.wait()
    assert sub.returncode == 0, err
    return [json.loads(x) for x in out.decode().splitlines()]


def test_pub_and_sub_from_the_shell(brokers):
    """``fastbus sub`` prints what ``fastbus pub`` sends, from arguments and
    from stdin, binary-safe with --json, and stops after --count."""
    port = brokers().endpoint.rsplit(":", 1)[1]

    def publish(cwd):
        r = run("pub", "--port", port, "news", "hello", "w\u00f6rld")
        assert r.returncode == 0 and "published 2 message(s) to news" in r.stdout, r.stderr
        r = subprocess.run(fastbus_cmd() + ["pub", "--port", port, "mk.x", "-"], input=b"a\n\xff\xfe\n",
                           capture_output=True, timeout=60, cwd=cwd)
        assert r.returncode == 0, r.stderr

    got = _subscriber_prints(["sub", "--port", port, "news", "--pattern", "mk.*", "--json", "--count", "4"],
                             "news, mk.*", publish)
    assert got == [
        {"channel": "news", "data": "hello", "encoding": "utf-8", "pattern": None},
        {"channel": "news", "data": "w\u00f6rld", "encoding": "utf-8", "pattern": None},
        {"channel": "mk.x", "data": "a", "encoding": "utf-8", "pattern": "mk.*"},
        {"channel": "mk.x", "data": "//4=", "encoding": "base64", "pattern": "mk.*"},   # bytes ff fe
    ]


def test_pub_and_sub_headers_from_the_shell(brokers):
    """``fastbus pub -H name=value`` sends headers; ``fastbus sub`` shows
    them (in --json as an object, binary-safe as the data is)."""
    port = brokers().endpoint.rsplit(":", 1)[1]

    def publish(cwd):
        r = run("pub", "--port", port, "orders", '{"id": 7}', "-H", "content-type=application/json",
                "--header", "trace=a=b")
        assert r.returncode == 0 and "published 1 message(s)" in r.stdout, r.stderr
        r = run("pub", "--port", port, "orders", "plain")
        assert r.returncode == 0, r.stderr

    got = _subscriber_prints(["sub", "--port", port, "orders", "--json", "--count", "2"], "orders", publish)
    assert got == [
        {"channel": "orders", "data": '{"id": 7}', "encoding": "utf-8", "pattern": None,
         "headers": {"content-type": {"value": "application/json", "encoding": "utf-8"},
                     "trace": {"value": "a=b", "encoding": "utf-8"}}},
        {"channel": "orders", "data": "plain", "encoding": "utf-8", "pattern": None},
    ]
    assert _one_line_error(run("pub", "--port", port, "orders", "x", "-H", "novalue"), 2,
                           "a header is NAME=VALUE, not 'novalue'").startswith("fastbus pub: ")


def test_psub_takes_redis_glob_patterns(brokers):
    """``fastbus psub`` prints what matches Redis's globs, and only that
    (issue 23: ``fastbus sub "news.*.sports"`` once subscribed to the
    literal and printed nothing for ever)."""
    port = brokers().endpoint.rsplit(":", 1)[1]

    def publish(cwd):
        for channel in ("news.uk.weather", "news.uk.sports", "room.12", "room.1", "news.sports", "news.fr.sports"):
            r = run("pub", "--port", port, channel, channel)
            assert r.returncode == 0, r.stderr

    got = _subscriber_prints(["psub", "--port", port, "news.*.sports", "room.?", "--json", "--count", "3"],
                             "news.*.sports, room.?", publish)
    assert [(m["channel"], m["pattern"]) for m in got] == [
        ("news.uk.sports", "news.*.sports"), ("room.1", "room.?"), ("news.fr.sports", "news.*.sports")]


def test_pub_and_sub_errors():
    from brokers import free_port
    port = str(free_port())
    # Each error is one line that names the command it came from.
    assert _one_line_error(run("sub", "--port", port, "x"), 1, f"no broker at tcp://127.0.0.1:{port}",
                           "connection refused").startswith("fastbus sub: ")
    assert _one_line_error(run("pub", "--port", port, "x", "y"), 1,
                           f"no broker at tcp://127.0.0.1:{port}").startswith("fastbus pub: ")
    assert _one_line_error(run("sub", "x?*"), 2, "'x?*' is a glob pattern", "--pattern",
                           "--literal").startswith("fastbus sub: ")
    assert _one_line_error(run("sub"), 2, "nothing to subscribe to").startswith("fastbus sub: ")
    assert _one_line_error(run("pub", "--connect", "nowhere", "x", "y"), 2,
                           "invalid endpoint 'nowhere'").startswith("fastbus pub: ")


def test_channels_messages_and_header_values_that_are_not_utf8_from_the_shell(brokers):
    """``fastbus pub $'\\xff' ...``: the bytes typed are the channel, the
    message and a header's value (was a UnicodeEncodeError); printed with
    \\x escapes, and in --json as base64 where data is not text."""
    port = brokers().endpoint.rsplit(":", 1)[1]
    ff, fe = os.fsdecode(b"\xff"), os.fsdecode(b"\xfe")    # as a shell passes those bytes

    def publish(cwd):
        r = run("pub", "--port", port, ff, fe, "-H", "k=" + ff)
        assert r.returncode == 0 and "published 1 message(s) to \\xff at" in r.stdout, r.stderr

    got = _subscriber_prints(["sub", "--port", port, ff, "--json", "--count", "1"], "\\xff", publish)
    assert got == [{"channel": "\\xff", "data": "/g==", "encoding": "base64", "pattern": None,
                    "headers": {"k": {"value": "/w==", "encoding": "base64"}}}]
    assert _one_line_error(run("pub", "--port", port, "x", "y", "-H", ff + "=1"), 2,
                           "a header name is UTF-8 text, not \\xff").startswith("fastbus pub: ")


def test_ports_and_a_broker_given_a_port_get_the_error_that_says_what_to_do():
    for command in (["pub", "a", "x"], ["sub", "a"], ["stats"], ["redis-server"]):
        r = run(*command, "--port", "70000")
        assert r.returncode == 2 and "--port: must be a port number (1-65535), not 70000" in r.stderr, r.stderr
    assert _one_line_error(run("pub", "--connect", "tcp://127.0.0.1:70000", "a", "x"), 2,
                           "the port is a number from 1 to 65535, not '70000'").startswith("fastbus pub: ")
    # The broker listens where --bind says: a --port or --host is answered with the --bind meant.
    assert _one_line_error(run("broker", "--port", "6464"), 2, "unrecognized arguments: --port 6464",
                           "--bind tcp://127.0.0.1:6464").startswith("fastbus broker: ")
    assert "--bind tcp://127.0.0.2:7000" in run("broker", "--host", "127.0.0.2", "--port=7000").stderr
    assert _one_line_error(run("stats", "--bogus"), 2, "unrecognized arguments: --bogus",
                           "see fastbus stats --help").startswith("fastbus stats: ")


def test_a_malformed_broker_endpoint_is_a_usage_error_naming_its_option():
    """--upstream foo was "cannot listen: Invalid argument (addr='foo')", exit 1."""
    for args, words in ((("--upstream", "foo"), ("--upstream: invalid endpoint 'foo'", "tcp://HOST:PORT")),
                        (("--bind", "foo"), ("--bind: unsupported endpoint 'foo'",)),
                        (("--zmq-pull", "tcp://127.0.0.1"), ("--zmq-pull: endpoint 'tcp://127.0.0.1' needs",))):
        assert _one_line_error(run("broker", *args), 2, *words).startswith("fastbus broker: ")


def test_a_malformed_redis_url_or_broker_endpoint_is_a_usage_error_naming_its_source(monkeypatch):
    """fastbus monitor --broker foo exited 1; a malformed --url/--redis or
    $FASTBUS_REDIS_URL was taken as given and failed later (or as a runtime error)."""
    assert _one_line_error(run("monitor", "--broker", "foo", "--once", "--redis", "redis://127.0.0.1:1"), 2,
                           "--broker foo", "invalid endpoint 'foo'").startswith("fastbus monitor: ")
    assert _one_line_error(run("monitor", "--redis", "localhost:6379", "--once"), 2,
                           "--redis is not a Redis URL: 'localhost:6379'").startswith("fastbus monitor: ")
    for cmd in (["queue", "stats", "jobs"], ["queue", "list"], ["topic", "stats", "events"],
                ["inbox", "members", "chat"]):
        line = _one_line_error(run(*cmd, "--url", "localhost:6379"), 2, "--url is not a Redis URL: 'localhost:6379'")
        assert line.startswith(f"fastbus {cmd[0]}"), line
    monkeypatch.setenv("FASTBUS_REDIS_URL", "127.0.0.1:6379")
    for cmd in (["queue", "stats", "jobs"], ["monitor", "--once"]):
        line = _one_line_error(run(*cmd), 2, "$FASTBUS_REDIS_URL is not a Redis URL: '127.0.0.1:6379'")
        assert line.startswith(f"fastbus {cmd[0]}"), line

def test_request_and_reply_from_the_shell(brokers):
    """``fastbus reply`` answers the requests on a channel (printing each);
    ``fastbus request`` prints the first reply, and says "no responders" at
    once, exit 1, when nobody subscribes."""
    b = brokers()
    port = b.endpoint.rsplit(":", 1)[1]
    with tempfile.TemporaryDirectory() as cwd:
        replier = subprocess.Popen(fastbus_cmd() + ["reply", "--port", port, "time.now", "12:00", "-H", "tz=UTC",
                                                    "--count", "2"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
        try:
            assert "answering requests on time.now" in replier.stderr.readline()
            r = run("request", "--port", port, "time.now", "what time?", "--timeout", "10")
            assert r.returncode == 0, r.stderr
            assert r.stdout.startswith("_INBOX.") and r.stdout.rstrip().endswith(": [tz=UTC] 12:00"), r.stdout
            r = run("request", "--port", port, "time.now", "again", "--json", "--timeout", "10")
            line = json.loads(r.stdout)
            assert line["data"] == "12:00" and line["headers"] == {"tz": {"value": "UTC", "encoding": "utf-8"}}
            out, _ = replier.communicate(timeout=30)
            assert replier.returncode == 0 and out.splitlines() == ["time.now: what time?", "time.now: again"]
        finally:
            if replier.poll() is None:
                replier.kill()
                replier.wait()
    # (NoResponders, not the 60 s timeout: that would say "no reply")
    assert "no responders: nobody subscribes to 'nobody.home'" in _one_line_error(
        run("request", "--port", port, "nobody.home", "x", "--timeout", "60"), 1, "no responders")
    assert _one_line_error(run("reply", "--port", port, "ch"), 2, "give DATA, or --echo")


def test_responders_in_a_queue_group_from_the_shell(brokers):
    """Two ``fastbus reply --queue`` responders share the requests: each
    request is answered by one (the other never sees it)."""
    b = brokers()
    port = b.endpoint.rsplit(":", 1)[1]
    with tempfile.TemporaryDirectory() as cwd:
        repliers = [subprocess.Popen(fastbus_cmd() + ["reply", "--port", port, "svc", "--echo", "--queue", "pool",
                                                      "--count", "2"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
                    for _ in range(2)]
        try:
            for r in repliers:
                assert "answering requests on svc in queue group pool" in r.stderr.readline()
            for i in range(4):
                r = run("request", "--port", port, "svc", f"q{i}", "--timeout", "10")
                assert r.returncode == 0 and r.stdout.rstrip().endswith(f": q{i}"), r.stdout + r.stderr
            outs = [r.communicate(timeout=30)[0].splitlines() for r in repliers]
            assert all(r.returncode == 0 for r in repliers)
            assert sorted(outs[0] + outs[1]) == [f"svc: q{i}" for i in range(4)] and len(outs[0]) == 2, outs
        finally:
            for r in repliers:
                if r.poll() is None:
                    r.kill()
                    r.wait()


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux's /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


import pytest  # noqa: E402


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("how", ["SIGTERM", "SIGHUP", "SIGKILL"])
def test_the_demo_stopped_by_a_signal_leaves_nothing_running(tmp_path, how):
    """`kill PID` (or a closed terminal, or kill -9) of a running demo: its
    broker and clients end with it, none left spinning."""
    import signal
    proc = subprocess.Popen(fastbus_cmd() + ["demo", "--seconds", "60"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        first = proc.stdout.readline()
        assert "broker on" in first, first + proc.stdout.read()
        assert "published" in proc.stdout.readline()          # rates: every client runs
        kids = _children(proc.pid)
        assert len(kids) >= 4, kids                          # the broker, 2 subscribers, a publisher
        proc.send_signal(getattr(signal, how))
        proc.wait(30)
        deadline = time.monotonic() + 20
        while any(_alive(k) for k in kids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [k for k in kids if _alive(k)], "left running after the demo's " + how
        if how != "SIGKILL":
            assert proc.returncode == 128 + getattr(signal, how), proc.returncode
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
