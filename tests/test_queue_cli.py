"""``fastbus queue``: put, peek, stats, return-failed, purge and clean from
a shell, against a real server."""

from __future__ import annotations

import base64
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
    assert rc == 2 and "add --yes" in err and q.stats().failed == 1     # nothing deleted without --yes
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
    assert rc == 1 and "cannot reach the server at redis://127.0.0.1:1" in err     # runtime: 1
    rc, _, err = run("queue", "put", "bad name", "x")
    assert rc == 2 and "queue name must be" in err
    rc, _, err = run("queue", "peek", "jobs", "-n", "0")
    assert rc == 2 and "positive integer" in err
    rc, out, _ = run("queue", "--help")
    assert rc == 0 and "return-failed" in out


def test_peek_json_keeps_bytes_apart_from_text(redis_url):
    """Payload bytes ff fe and the text "\\xff\\xfe" come out different:
    UTF-8 text as itself, other bytes in base64, tagged."""
    q = WorkQueue("binq", redis_url)
    q.put_many([b"\xff\xfe", b"\\xff\\xfe", "h\u00e9".encode()])
    rc, out, err = run("queue", "peek", "binq", "--json", "--url", redis_url)
    assert rc == 0, err
    got = [(m["encoding"], m["payload"]) for m in json.loads(out)]
    assert got == [("base64", base64.b64encode(b"\xff\xfe").decode()), ("utf-8", "\\xff\\xfe"),
                   ("utf-8", "h\u00e9")]
    q.close()


def test_put_dash_reads_stdin(redis_url):
    rc, out, err = run("queue", "put", "dashq", "-", "--url", redis_url, stdin=b"one\ntwo\n")
    assert rc == 0 and "put 2 message(s)" in out, err
    q = WorkQueue("dashq", redis_url)
    assert [m.payload for m in q.peek(5)] == [b"one", b"two"]
    q.close()


def test_stats_of_a_misspelled_queue_says_so(redis_url):
    q = WorkQueue("orders", redis_url)
    q.put(b"x")
    rc, out, err = run("queue", "stats", "odrers", "--url", redis_url)
    assert rc == 0 and "ready 0" in out
    assert "nothing was ever put on a queue named 'odrers'" in err and "orders" in err.split("queues there:")[1]
    rc, out, err = run("queue", "stats", "orders", "--url", redis_url)
    assert rc == 0 and "ready 1" in out and err == ""
    q.close()


def test_topic_from_the_shell(redis_url):
    from fastbus.queue import Topic
    rc, out, err = run("topic", "register", "events", "billing", "--url", redis_url)
    assert rc == 0 and "billing registered on topic events" in out, err
    rc, out, err = run("topic", "publish", "events", "one", "two", "--url", redis_url)
    assert rc == 0 and "published 2 message(s) to topic events: ids 1..2" in out, err
    rc, out, err = run("topic", "publish", "events", "--url", redis_url, stdin=b"\xff\xfe\nfour\n")
    assert rc == 0 and "ids 3..4" in out, err
    rc, out, err = run("topic", "read", "events", "--json", "--from", "2", "-n", "2", "--url", redis_url)
    assert rc == 0, err
    assert [(m["id"], m["encoding"], m["payload"]) for m in json.loads(out)] == [
        (2, "utf-8", "two"), (3, "base64", base64.b64encode(b"\xff\xfe").decode())]
    rc, out, err = run("topic", "stats", "events", "--url", redis_url)
    assert rc == 0 and "published 4" in out and "billing: ready 4" in out, out + err
    with Topic("events", redis_url).consumer("billing", "b-1") as c:
        assert [m.payload for m in c.get_many(10, timeout=1)] == [b"one", b"two", b"\xff\xfe", b"four"]
    rc, out, err = run("topic", "stats", "evnets", "--url", redis_url)
    assert rc == 0 and "nothing was ever published to a topic named 'evnets'" in err
    rc, out, err = run("topic", "unregister", "events", "billing", "--url", redis_url)
    assert rc == 0 and Topic("events", redis_url).consumers() == []
    rc, _, err = run("topic", "read", "events", "--url", "redis://127.0.0.1:1")
    assert rc == 1 and "cannot reach the server" in err


def test_inbox_from_the_shell(redis_url):
    rc, out, err = run("inbox", "create", "chat-1", "jason", "jeff", "--url", redis_url)
    assert rc == 0, err
    rc, out, err = run("inbox", "send", "chat-1", "jason", "hi", "there", "--url", redis_url)
    assert rc == 0 and "sent 2 message(s)" in out, err
    rc, out, err = run("inbox", "fetch", "chat-1", "jeff", "--json", "--url", redis_url)
    assert rc == 0, err
    assert [(m["sender"], m["payload"]) for m in json.loads(out)] == [("jason", "hi"), ("jason", "there")]
    rc, out, err = run("inbox", "fetch", "chat-1", "jeff", "--ack", "--url", redis_url)
    assert rc == 0 and "2 pending message(s)" in out and "acked up to" in out, err
    rc, out, err = run("inbox", "fetch", "chat-1", "jeff", "--url", redis_url)
    assert rc == 0 and "0 pending message(s)" in out
    rc, out, err = run("inbox", "join", "chat-1", "alice", "--url", redis_url)
    assert rc == 0
    rc, out, err = run("inbox", "members", "chat-1", "--json", "--url", redis_url)
    assert rc == 0 and sorted(json.loads(out)) == ["alice", "jason", "jeff"]
    rc, _, err = run("inbox", "send", "chat-1", "bad name", "x", "--url", redis_url)
    assert rc == 2 and "member name" in err
