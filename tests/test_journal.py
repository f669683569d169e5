"""The broker's journal (``--journal DIR``): kill -9 of the broker, started
again 0.5 s later with the same directory, loses nothing a client was
told the broker took and delivers nothing twice; a torn last segment is
read up to its last whole commit; the directory stays within its bound;
one that cannot be written is a clear error at start.  Real broker
processes, real kills, on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
from brokers import free_port, wait_for

import fastbus


def _reader(p, last: int, timeout: float = 40.0):
    """A thread taking messages off ``p`` until seq ``last``: (thread, seqs, notices)."""
    seqs: list[int] = []
    other: list[dict] = []

    def run() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not (seqs and seqs[-1] >= last):
            m = p.get_message(timeout=0.2)
            if m is None:
                continue
            if m["type"] == "message":
                seqs.append(int(m["data"]))
            elif m["type"] != "subscribe":
                other.append(m)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, seqs, other


def _publish(pub, n: int, rate: float, at=None) -> None:
    t0 = time.monotonic()
    for i in range(n):
        pub.publish("seq", str(i))
        if at is not None:
            at(i)
        wait = t0 + (i + 1) / rate - time.monotonic()
        if wait > 0:
            time.sleep(wait)


@pytest.mark.parametrize("fsync", ["everysec", "always"])
def test_a_broker_killed_and_restarted_with_its_journal_loses_nothing(brokers, tmp_path, fsync):
    """kill -9 mid-stream (5,000 msg/s), started again 0.5 s later: the
    subscriber gets every message once, in order, told only that its
    connection went; the publisher's close() says the broker took all."""
    b = brokers("--journal", str(tmp_path / "journal"), "--fsync", fsync)
    n = 15_000
    with fastbus.Client(b.endpoint) as pub, fastbus.Client(b.endpoint) as sub:
        p = sub.pubsub()
        p.subscribe("seq")
        t, seqs, other = _reader(p, n - 1)

        def crash(i: int) -> None:
            if i == n // 3:
                b.kill()
                time.sleep(0.5)
                b.start()

        _publish(pub, n, 5_000, crash)
        assert pub.close(timeout=20) == 0                  # the broker took everything
        t.join(45)
        p.close()
    missed = n - len(set(seqs))
    assert (missed, len(seqs) - len(set(seqs))) == (0, 0), f"{missed} missed"
    assert seqs == sorted(seqs)
    assert [m["type"] for m in other] == ["disconnected"], other
    st = b.stats()
    assert st["journal"]["sessions_restored"] >= 2 and st["journal"]["torn_at_start"] == 0
    assert st["journal"]["fsyncs"] > 0 and st["sessions_resumed"] >= 2


def test_a_durable_subscriber_resumes_across_a_broker_restart(brokers, tmp_path):
    """Closed, the broker killed and started again, then a new holder of
    the name: it gets what was published to its session before the kill."""
    b = brokers("--journal", str(tmp_path / "journal"))
    with fastbus.Client(b.endpoint) as c:
        p = c.pubsub(durable="ledger")
        p.subscribe("seq")
        assert p.get_message(timeout=5)["type"] == "subscribe"
        p.close()
        for i in range(1000):
            c.publish("seq", str(i))
        c.flush()                                   # (returns once the journal has them: TOOK)
        assert b.stats()["messages_in"] == 1000
    b.kill()
    b.start()
    with fastbus.Client(b.endpoint) as c:
        q = c.pubsub(durable="ledger")
        q.subscribe("seq")
        t, seqs, other = _reader(q, 999, timeout=20)
        t.join(25)
        assert seqs == list(range(1000))
        assert other == []
        q.close()


def test_a_torn_last_segment_is_read_up_to_its_last_whole_commit(brokers, tmp_path):
    """What a kill cut in the middle of a write (here: garbage after the
    last whole commit) is left; the broker starts, says how much, and the
    sessions before it resume."""
    journal = tmp_path / "journal"
    b = brokers("--journal", str(journal))
    with fastbus.Client(b.endpoint) as pub, fastbus.Client(b.endpoint) as sub:
        p = sub.pubsub()
        p.subscribe("seq")
        assert p.get_message(timeout=5)["type"] == "subscribe"
        t, seqs, other = _reader(p, 199, timeout=30)
        b.kill()
        last = sorted(journal.iterdir())[-1]
        torn = b"\x40\x00\x00\x00garbage: a record cut short"
        with open(last, "ab") as f:
            f.write(torn)
        b.start()
        for i in range(200):
            pub.publish("seq", str(i))
        pub.flush()
        t.join(35)
        assert seqs == list(range(200))
        st = b.stats()
        assert st["journal"]["torn_at_start"] == len(torn) and st["sessions_resumed"] >= 1
        p.close()


def test_the_journal_stays_within_its_bound(brokers, tmp_path):
    """40 MB through a 16 MiB journal: compaction rewrites what sessions
    are still owed and deletes the rest, as soon as the directory holds
    half its bound (after the turn that made it so, not a maintenance
    interval later): it never holds more than its bound."""
    journal = tmp_path / "journal"
    bound = 16 * 1024 * 1024
    b = brokers("--journal", str(journal), "--journal-bytes", str(bound))
    payload = b"x" * 4000
    with fastbus.Client(b.endpoint) as pub, fastbus.Client(b.endpoint) as sub:
        p = sub.pubsub()
        p.subscribe("big")
        assert p.get_message(timeout=5)["type"] == "subscribe"
        got = 0
        biggest = 0
        for i in range(10_000):
            pub.publish("big", payload)
            if i % 500 == 499:
                pub.flush()
                while got < i + 1:
                    batch = p.get_batch(timeout=5)
                    assert batch, f"stopped at {got}"
                    got += len(batch)
                biggest = max(biggest, sum(f.stat().st_size for f in journal.iterdir()))
        assert got == 10_000
        assert biggest <= bound, biggest
        assert b.stats()["journal"]["segments"] >= 1
        p.close()


def test_a_journal_that_cannot_be_written_is_a_clear_error_at_start(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    port = free_port()
    r = subprocess.run([sys.executable, "-m", "fastbus", "broker", "--bind", f"tcp://127.0.0.1:{port}",
                        "--journal", str(blocker / "journal")], cwd=tmp_path, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1
    assert "the journal at" in r.stderr and "cannot be used" in r.stderr and "Traceback" not in r.stderr


def test_journal_options_are_checked(tmp_path):
    port = free_port()
    r = subprocess.run([sys.executable, "-m", "fastbus", "broker", "--bind", f"tcp://127.0.0.1:{port}",
                        "--journal", str(tmp_path / "j"), "--journal-bytes", "1000"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "journal_bytes must be at least 16 MiB" in r.stderr
    assert not os.path.exists(tmp_path / "j")


def test_the_journal_is_in_stats_and_metrics(brokers, tmp_path):
    import urllib.request
    http = free_port()
    b = brokers("--journal", str(tmp_path / "journal"), "--http", f"127.0.0.1:{http}")
    with fastbus.Client(b.endpoint) as c:
        p = c.pubsub()
        p.subscribe("m")
        c.publish("m", "x")
        c.flush()
        st = b.stats()["journal"]
        assert st["commits"] >= 1 and st["bytes"] > 0 and st["fsync"] == "everysec"

        def metrics() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=5) as r:
                return r.read().decode()

        def journal_metrics() -> str | None:
            text = metrics()
            return text if "fastbus_broker_journal_commits_total" in text else None

        text = wait_for(journal_metrics, timeout=10, what="the journal's metrics")
        assert "fastbus_broker_journal_bytes " in text and "fastbus_broker_journal_fsync_seconds_total" in text
        p.close()


def test_what_waited_for_a_lingering_subscriber_survives_a_restart(brokers, tmp_path):
    """A subscriber away (its connection cut) while 5,000 messages are
    published and the broker is killed and started again: back, it gets
    all of them once, in order."""
    from forwarder import Forwarder
    b = brokers("--journal", str(tmp_path / "journal"))
    n = 5_000
    with Forwarder(b.port) as fw, fastbus.Client(b.endpoint) as pub, \
            fastbus.Client(f"tcp://127.0.0.1:{fw.port}") as sub:
        p = sub.pubsub()
        p.subscribe("seq")
        assert p.get_message(timeout=5)["type"] == "subscribe"
        cut = threading.Thread(target=fw.cut, args=(4.0,), daemon=True)
        cut.start()
        wait_for(lambda: b.stats()["sessions_lingering"] >= 1, what="the subscriber's session to linger")
        for i in range(n):
            pub.publish("seq", str(i))
        pub.flush()                                 # the journal has them
        b.kill()
        time.sleep(0.5)
        b.start()
        assert b.stats()["journal"]["messages_restored"] >= n
        t, seqs, other = _reader(p, n - 1, timeout=30)
        cut.join(10)
        t.join(35)
        assert seqs == list(range(n))
        assert [m["type"] for m in other] == ["disconnected"], other
        p.close()


def test_a_journal_whose_disk_fills_up_holds_acknowledgements_and_never_crashes(brokers, tmp_path):
    """The journal on a 4 MB file system, 3 MB of it taken: writes fail
    (ENOSPC), are counted, and no TOOK says the broker took what it could
    not write (flush() waits); subscribers still get everything.  Space
    freed, the next commit writes what waited and flush() returns."""
    fs = tmp_path / "small"
    fs.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(fs)],
                      capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        (fs / "filler").write_bytes(b"\0" * (3 * 1024 * 1024))
        b = brokers("--journal", str(fs / "journal"))
        payload = b"x" * 100_000
        with fastbus.Client(b.endpoint) as pub, fastbus.Client(b.endpoint) as sub:
            p = sub.pubsub()
            p.subscribe("big")
            assert p.get_message(timeout=5)["type"] == "subscribe"
            for _ in range(20):                      # 2 MB: past what the disk has left
                pub.publish("big", payload)
            with pytest.raises(fastbus.FlushTimeout):
                pub.flush(timeout=2)
            got = 0
            while got < 20 and (batch := p.get_batch(timeout=5)):
                got += len(batch)
            assert got == 20                           # delivered all the same
            st = b.stats()
            assert st["journal"]["write_errors"] > 0 and b.proc.poll() is None
            (fs / "filler").unlink()
            pub.flush(timeout=10)                      # written now, and acknowledged
            assert b.stats()["journal"]["dropped_bytes"] == 0
            p.close()
        b.stop()
    finally:
        subprocess.run(["umount", "-l", str(fs)], capture_output=True)


def _drain_group(ps, idle: float = 0.7) -> list[bytes]:
    got = []
    while (m := ps.get_message(ignore_subscribe_messages=True, timeout=idle)) is not None:
        if m["type"] == "message":
            got.append(m["data"])
    return got


def test_a_held_groups_backlog_survives_broker_restarts(brokers, tmp_path):
    """What a held group kept (each send answered "kept") is there after a
    kill -9 and a restart, and after a second one (the start's snapshot):
    the first worker to join gets all of it once, in order, headers and
    all; what was given before a kill is not given again after it."""
    b = brokers("--journal", str(tmp_path / "journal"))
    with fastbus.Client(b.endpoint) as c:
        c.hold("jobs", "workers", expiry=600)
        assert [c.enqueue("jobs", b"early%d" % i) for i in range(5)] == [False] * 5
        with c.pubsub(ignore_subscribe_messages=True) as w:
            w.subscribe("jobs", queue="workers")
            assert _drain_group(w) == [b"early%d" % i for i in range(5)]        # given: gone from the backlog
        wait_for(lambda: b.stats()["queue_group_members"] == 0, what="the worker's leaving")
        assert all(c.enqueue("jobs", b"job%d" % i) is False for i in range(300))
        c.publish("jobs", b"traced", headers={"traceparent": "00-1-2-01"})
        c.flush()
        wait_for(lambda: b.stats()["held_messages"] == 301, what="the traced one kept")
    b.kill()
    b.start()
    st = b.stats()
    assert (st["held_groups"], st["held_messages"]) == (1, 301), st
    assert (st["journal"]["held_groups_restored"], st["journal"]["held_messages_restored"]) == (1, 301), st
    b.kill()
    b.start()
    assert b.stats()["held_messages"] == 301
    with fastbus.Client(b.endpoint) as c:
        with c.pubsub(ignore_subscribe_messages=True) as w:
            w.subscribe("jobs", queue="workers")
            got = []
            while (m := w.get_message(ignore_subscribe_messages=True, timeout=0.7)) is not None:
                if m["type"] == "message":
                    got.append(m)
    assert [m["data"] for m in got] == [b"job%d" % i for i in range(300)] + [b"traced"]
    assert got[-1].get("headers") == {"traceparent": b"00-1-2-01"}
    wait_for(lambda: b.stats()["held_messages"] == 0, what="the backlog given")
    b.kill()
    b.start()
    st = b.stats()
    assert (st["held_groups"], st["held_messages"]) == (1, 0), st      # (the declaration lives on, nothing twice)


def test_a_held_groups_expiry_runs_on_across_a_restart(brokers, tmp_path):
    """Kept with a 2 s expiry, the broker down for 2.5 s: after the restart
    they are expired and counted, not given."""
    b = brokers("--journal", str(tmp_path / "journal"))
    with fastbus.Client(b.endpoint) as c:
        c.hold("jobs", "workers", expiry=2)
        assert [c.enqueue("jobs", b"%d" % i) for i in range(10)] == [False] * 10
    b.kill()
    time.sleep(2.5)
    b.start()
    wait_for(lambda: b.stats()["drops"]["held_expired"] == 10, timeout=10, what="the backlog's expiry")
    st = b.stats()
    assert st["held_messages"] == 0, st
    with fastbus.Client(b.endpoint) as c, c.pubsub(ignore_subscribe_messages=True) as w:
        w.subscribe("jobs", queue="workers")
        assert _drain_group(w, idle=0.5) == []


def test_what_a_confirm_said_survives_a_kill_the_moment_after(brokers, tmp_path):
    """Written before it is said: a hold(), a release() and a subscribe()
    that returned (their CONFIRM came) hold after a kill -9 sent the moment
    they returned, before the broker's turn was over (its group commit
    once came only after the turn, and the CONFIRM went before it)."""
    b = brokers("--journal", str(tmp_path / "journal"))
    for i in range(5):
        with fastbus.Client(b.endpoint) as c:
            c.hold(f"kept{i}", "workers")
            c.hold(f"gone{i}", "workers")
            c.release(f"gone{i}", "workers")
            b.kill()
            b.start()
            st = b.stats()
            assert st["journal"]["held_groups_restored"] == i + 1, (i, st)
            assert st["held_groups"] == i + 1, (i, st)


def test_a_released_held_group_stays_released_after_a_restart(brokers, tmp_path):
    """Released, then the broker killed while the client that declared it is
    still connected (its session lingers again after the restart): the
    group is not declared again by that session, it is gone."""
    b = brokers("--journal", str(tmp_path / "journal"))
    with fastbus.Client(b.endpoint) as c:
        c.hold("jobs", "workers")
        c.hold("other", "workers")
        assert c.enqueue("jobs", b"x") is False
        c.release("jobs", "workers")
        wait_for(lambda: b.stats()["held_groups"] == 1, what="the release")
        b.kill()
        b.start()
        st = b.stats()
        assert (st["held_groups"], st["held_messages"], st["journal"]["held_groups_restored"]) == (1, 0, 1), st
        assert st["journal"]["sessions_restored"] >= 1, st
        # (the client may already have resumed its session: lingering or not,
        # once it has, nothing it sent before the kill declares "jobs" again)
        wait_for(lambda: b.stats()["sessions_lingering"] == 0, timeout=10, what="the session's resumption")
        assert c.enqueue("other", b"y") is False
        with pytest.raises(fastbus.NoResponders):
            c.enqueue("jobs", b"x")
        assert b.stats()["held_groups"] == 1
