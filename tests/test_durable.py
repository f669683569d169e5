"""Durable subscribers (``client.pubsub(durable="name")``): a session that
outlives its process.  A subscriber process killed with SIGKILL and started
again under the same name resumes where the last one stopped taking
messages; one that closes resumes exactly there; two live processes may
not hold one name.  Real broker and subscriber processes on loopback."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from brokers import wait_for
from forwarder import Forwarder

import fastbus
import fastbus.aio
from fastbus.client._subsession import DURABLE_TAKEN_EVERY

# A subscriber process: takes messages of channel "seq" under a durable
# name and writes each seq to its file as it takes it, until it has the
# last one (or is killed).
_SUBSCRIBER = textwrap.dedent("""
    import json, sys, fastbus
    endpoint, name, out, last = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    with fastbus.Client(endpoint) as c, open(out, "a", buffering=1) as f:
        p = c.pubsub(durable=name)
        p.subscribe("seq")
        print("subscribed", flush=True)
        while True:
            m = p.get_message(timeout=30)
            if m is None:
                break
            if m["type"] == "message":
                seq = int(m["data"])
                f.write(f"{seq}\\n")
                if seq >= last:
                    break
            elif m["type"] not in ("subscribe",):
                f.write(json.dumps(m, default=repr) + "\\n")
        p.close()
""")


def _start_subscriber(tmp_path, endpoint: str, name: str, out, last: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _SUBSCRIBER, endpoint, name, str(out), str(last)],
                            cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "subscribed", "the subscriber process did not start"
    return proc


def _lines(path) -> tuple[list[int], list[str]]:
    seqs, other = [], []
    for line in path.read_text().splitlines():
        (seqs if line.isdigit() else other).append(int(line) if line.isdigit() else line)
    return seqs, other


def _publish(pub, first: int, n: int, rate: float) -> None:
    t0 = time.monotonic()
    for i in range(first, first + n):
        pub.publish("seq", str(i))
        wait = t0 + (i - first + 1) / rate - time.monotonic()
        if wait > 0:
            time.sleep(wait)
    pub.flush()


def test_a_killed_durable_subscriber_resumes_where_it_stopped_taking(brokers, tmp_path):
    """kill -9 of the subscriber process mid-stream, restarted 0.5 s later
    under the same name: nothing published meanwhile is missed; what it
    had taken since its last TAKEN comes again (at most DURABLE_TAKEN_EVERY
    records and the batch it was in), in order."""
    b = brokers()
    n = 20_000
    out = tmp_path / "seqs.txt"
    first = _start_subscriber(tmp_path, b.endpoint, "worker", out, n - 1)
    with fastbus.Client(b.endpoint) as pub:
        done = threading.Event()

        def publish() -> None:
            _publish(pub, 0, n, 5_000)
            done.set()

        t = threading.Thread(target=publish, daemon=True)
        t.start()
        wait_for(lambda: out.exists() and len(out.read_text().splitlines()) > n // 4, timeout=20,
                 what="the first subscriber took a quarter")
        first.send_signal(signal.SIGKILL)
        first.wait()
        time.sleep(0.5)
        # (Its durable session and its client's publishing one.)
        wait_for(lambda: b.stats()["sessions_lingering"] == 2, what="the sessions linger")
        second = _start_subscriber(tmp_path, b.endpoint, "worker", out, n - 1)
        t.join(30)
        assert second.wait(30) == 0
    seqs, other = _lines(out)
    assert other == [], f"notices where none were due: {other[:3]}"
    assert set(seqs) == set(range(n)), f"{n - len(set(seqs))} missed"
    dups = len(seqs) - len(set(seqs))
    assert dups <= 2 * DURABLE_TAKEN_EVERY, f"{dups} delivered twice"
    # In order, but for the records taken again after the restart.
    restart = next(i for i in range(1, len(seqs)) if seqs[i] <= seqs[i - 1]) if dups else len(seqs)
    assert seqs[:restart] == sorted(seqs[:restart]) and seqs[restart:] == sorted(seqs[restart:])
    st = b.stats()
    assert st["durable_taken_over"] == 1 and st["sessions_expired"] == 0


def test_a_durable_subscriber_that_closes_resumes_exactly_where_it_stopped(brokers):
    """close() keeps a durable session, from exactly what the application
    took (mid-batch too): the next holder of the name gets the rest, each
    message once, and what was published while nobody held it."""
    b = brokers()
    n = 3_000
    with fastbus.Client(b.endpoint) as pub, fastbus.Client(b.endpoint) as sub:
        p = sub.pubsub(durable="orders")
        p.subscribe("seq")
        assert p.get_message(timeout=5)["type"] == "subscribe"
        for i in range(n):
            pub.publish("seq", str(i))
        pub.flush()
        got = []
        while len(got) < 1234:                       # (not a batch boundary)
            m = p.get_message(timeout=5)
            assert m is not None
            got.append(int(m["data"]))
        p.close()
        wait_for(lambda: b.stats()["sessions_lingering"] == 1, what="the closed session lingers")
        for i in range(n, 2 * n):
            pub.publish("seq", str(i))
        pub.flush()
        q = sub.pubsub(durable="orders")
        q.subscribe("seq")
        while True:
            m = q.get_message(timeout=5)
            assert m is not None, f"stopped at {got[-1]}"
            if m["type"] == "message":
                got.append(int(m["data"]))
                if got[-1] == 2 * n - 1:
                    break
        assert got == list(range(2 * n))
        q.close()


def test_two_live_processes_may_not_hold_one_durable_name(brokers):
    """The second claimant gets DurableNameInUse (from subscribe() and from
    get_message()); the first keeps its session and its messages."""
    b = brokers()
    with fastbus.Client(b.endpoint) as one, fastbus.Client(b.endpoint) as two, fastbus.Client(b.endpoint) as pub:
        p = one.pubsub(durable="billing")
        p.subscribe("seq")
        assert p.get_message(timeout=5)["type"] == "subscribe"
        q = two.pubsub(durable="billing")
        with pytest.raises(fastbus.DurableNameInUse, match="billing.*held by a live process"):
            q.subscribe("seq")
        with pytest.raises(fastbus.DurableNameInUse):
            q.get_message(timeout=1)
        q.close()
        pub.publish("seq", "still mine")
        pub.flush()
        m = p.get_message(timeout=5)
        assert m["type"] == "message" and m["data"] == b"still mine"
        assert b.stats()["drops"]["durable_in_use"] == 1
        p.close()


def test_a_durable_session_that_ran_out_says_how_many_were_dropped(brokers):
    """Past --durable-linger the session ends; the next holder of the name
    starts a new one and is told how many messages waited and went."""
    b = brokers("--durable-linger", "0.5")
    with fastbus.Client(b.endpoint) as pub, fastbus.Client(b.endpoint) as sub:
        p = sub.pubsub(durable="late")
        p.subscribe("seq")
        assert p.get_message(timeout=5)["type"] == "subscribe"
        p.close()
        for i in range(100):
            pub.publish("seq", str(i))
        pub.flush()
        wait_for(lambda: b.stats()["sessions_expired"] == 1, timeout=10, what="the session to expire")
        q = sub.pubsub(durable="late")
        q.subscribe("seq")
        kinds = {}
        while (m := q.get_message(timeout=2)) is not None:
            kinds[m["type"]] = m
        assert "reconnect" in kinds and b"100 messages" in kinds["reconnect"]["data"]
        q.close()


def test_a_broker_without_durable_sessions_refuses_the_name_clearly(brokers):
    b = brokers("--durable-linger", "0")
    with fastbus.Client(b.endpoint) as sub:
        p = sub.pubsub(durable="x")
        with pytest.raises(fastbus.DurableNameInUse, match="keeps no durable sessions"):
            p.subscribe("seq")
        p.close()


def test_a_durable_name_is_checked():
    with fastbus.Client("tcp://127.0.0.1:1") as c:
        for bad in ("", "x" * 201, "tab\there"):
            with pytest.raises(ValueError, match="durable name"):
                c.pubsub(durable=bad)


def test_a_cut_durable_subscriber_connection_resumes_missing_nothing(brokers):
    """Its own process's cut is a resume as any session's: exact."""
    b = brokers()
    n = 10_000
    with Forwarder(b.port) as fw, fastbus.Client(b.endpoint) as pub, \
            fastbus.Client(f"tcp://127.0.0.1:{fw.port}") as sub:
        p = sub.pubsub(durable="cut")
        p.subscribe("seq")
        assert p.get_message(timeout=5)["type"] == "subscribe"
        got: list[int] = []

        def read() -> None:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and (not got or got[-1] < n - 1):
                m = p.get_message(timeout=0.2)
                if m is not None and m["type"] == "message":
                    got.append(int(m["data"]))

        t = threading.Thread(target=read, daemon=True)
        t.start()
        for i in range(n):
            pub.publish("seq", str(i))
            if i == n // 3:
                threading.Thread(target=fw.cut, args=(0.5,), daemon=True).start()
            if i % 100 == 99:
                time.sleep(0.01)
        pub.flush()
        t.join(35)
        assert got == list(range(n))
        p.close()


def test_an_asyncio_durable_subscriber_resumes_where_the_last_closed(brokers):
    b = brokers()

    async def main() -> list[int]:
        async with fastbus.aio.Client(b.endpoint) as c:
            p = c.pubsub(durable="aio")
            await p.subscribe("seq")
            assert (await p.get_message(timeout=5))["type"] == "subscribe"
            for i in range(10):
                await c.publish("seq", str(i))
            await c.flush()
            got = []
            while len(got) < 4:
                m = await p.get_message(timeout=5)
                got.append(int(m["data"]))
            await p.aclose()
            q = c.pubsub(durable="aio")
            await q.subscribe("seq")
            while len(got) < 10:
                m = await q.get_message(timeout=5)
                assert m is not None
                if m["type"] == "message":
                    got.append(int(m["data"]))
            await q.aclose()
            return got

    assert asyncio.run(main()) == list(range(10))
