"""``fastbus queue``: put, peek, stats, return-failed, purge and clean from
a shell, against a real server."""

from __future__ import annotations

import io
import json
import subprocess
import sys

from fastbus.cli import main
from fastbus.queue import WorkQueue


def run(*argv: str, stdin: bytes | None = None) -> tuple[int, str, str]:
    p = subprocess.run([sys.executable, "-P", "-m", "fastbus", *argv], check=False, input=stdin,
                       capture_output=True, timeout=60)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def test_put_peek_stats_return_failed_purge_clean(redis_url):
    rc, out, err = run("queue", "put", "jobs", "one", "two", "--url", redis_url)
    assert rc == 0, err
    assert "put 2 message(s) on jobs: ids 1..2" in out
    rc, out, _ = run("queue", "put", "jobs", "--url", redis_url, stdin=b"three\nfour\n")
    assert rc == 0 and "ids 3..4" in out
    q = WorkQueue("jobs", redis_url)
    assert [m.payload for m in q.peek(10)] == [b"one", b"two", b"three", b"four"]

    rc, out, _ = run("queue", "peek", "jobs", "-n", "2", "--url", redis_url)
    assert rc == 0 and "one" in out and "two" in out and "three" not in out
    with q.consumer("w1", clean_interval=None) as c:
        c.reject(*c.get_many(2, timeout=0))
        c.get(timeout=0)                                  # held: shows as unacked
        rc, out, _ = run("queue", "stats", "jobs", "--url", redis_url)
        assert rc == 0
        assert "ready 1, unacked 1, failed 2; consumers 1 live, 0 dead" in out
        assert "consumer w1: 1 unacked, alive" in out
        rc, out, _ = run("queue", "stats", "jobs", "--json", "--url", redis_url)
        st = json.loads(out)
        assert (st["ready"], st["failed"], st["unacked"], st["totals"]["reject"]) == (1, 2, {"w1": 1}, 2)
    rc, out, _ = run("queue", "peek", "jobs", "--failed", "--json", "--url", redis_url)
    assert [m["payload"] for m in json.loads(out)] == ["one", "two"]
    rc, out, _ = run("queue", "return-failed", "jobs", "--count", "1", "--url", redis_url)
    assert rc == 0 and "1 failed message(s) of jobs back to ready" in out
    rc, out, err = run("queue", "purge", "jobs", "--failed", "--url", redis_url)
    assert rc == 1 and "add --yes" in err and q.stats().failed == 1     # nothing deleted without --yes
    rc, out, _ = run("queue", "purge", "jobs", "--failed", "--yes", "--url", redis_url)
    assert rc == 0 and "deleted 1 failed" in out and q.stats().failed == 0
    rc, out, _ = run("queue", "clean", "jobs", "--url", redis_url)
    assert rc == 0 and "0 dead consumer(s) removed" in out
    q.close()


def test_url_from_the_environment_and_watch(redis_url, monkeypatch):
    monkeypatch.setenv("FASTBUS_REDIS_URL", redis_url)
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["queue", "put", "envq", "x"]) == 0
    assert main(["queue", "stats", "envq", "--json", "--watch", "0.1", "--for", "0.25"]) == 0
    lines = [json.loads(x) for x in out.getvalue().splitlines() if x.startswith("{")]
    assert len(lines) >= 2 and all(x["ready"] == 1 for x in lines)


def test_errors_are_clear():
    rc, _, err = run("queue", "stats", "jobs", "--url", "redis://127.0.0.1:1")
    assert rc == 2 and "cannot reach the server at redis://127.0.0.1:1" in err
    rc, _, err = run("queue", "put", "bad name", "x")
    assert rc == 2 and "queue name must be" in err
    rc, _, err = run("queue", "peek", "jobs", "-n", "0")
    assert rc == 2 and "positive integer" in err
    rc, out, _ = run("queue", "--help")
    assert rc == 0 and "return-failed" in out
