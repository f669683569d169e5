"""Held queue groups (``Client.hold`` / ``enqueue`` / ``release``) with real
brokers in subprocesses: a work queue that outlives its workers.  What is
sent while no member is there is kept by the broker, within the sender's
capacity and the broker's bounds, answered per message (delivered, kept,
full, nobody); the first member to join gets it, in order; what waits past
the expiry is dropped and counted; a member killed (-9) leaves what it was
given and never took to the group's backlog; the asyncio twin; the errors."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import urllib.request

import pytest
from brokers import free_port, wait_for

import fastbus
import fastbus.aio


def drain(ps, idle: float = 0.5) -> list[bytes]:
    """The data a PubSub gets until nothing comes for ``idle`` s."""
    got = []
    while (m := ps.get_message(ignore_subscribe_messages=True, timeout=idle)) is not None:
        if m["type"] == "message":
            got.append(m["data"])
    return got


def test_what_comes_while_no_member_is_there_waits_for_the_first_one(brokers, clients):
    b = brokers()
    c = clients(b.endpoint)
    c.hold("jobs", "workers", expiry=60)
    assert [c.enqueue("jobs", b"%d" % i) for i in range(5)] == [False] * 5     # kept, each answered so
    st = b.stats()
    assert (st["held_groups"], st["held_messages"], st["held_kept"]) == (1, 5, 5), st
    first = clients(b.endpoint).pubsub(ignore_subscribe_messages=True)
    first.subscribe("jobs", queue="workers")
    second = clients(b.endpoint).pubsub(ignore_subscribe_messages=True)
    second.subscribe("jobs", queue="workers")
    assert drain(first) == [b"%d" % i for i in range(5)]             # in order, to the one there was
    assert drain(second, idle=0.2) == []
    # With members: each message to one of them, answered "delivered".
    assert all(c.enqueue("jobs", b"live%d" % i) for i in range(10))
    live = drain(first) + drain(second)
    assert sorted(live) == sorted(b"live%d" % i for i in range(10))
    st = b.stats()
    assert (st["held_messages"], st["held_given"]) == (0, 5), st
    # The members gone, the group keeps again (its declaration lives on).
    first.unsubscribe("jobs")
    second.unsubscribe("jobs")
    wait_for(lambda: b.stats()["queue_group_members"] == 0, what="the members' leaving")
    assert c.enqueue("jobs", b"later") is False
    third = clients(b.endpoint).pubsub(ignore_subscribe_messages=True)
    third.subscribe("jobs", queue="workers")
    assert drain(third) == [b"later"]


def test_full_is_said_to_the_sender_and_counted(brokers, clients):
    b = brokers("--max-held-bytes", "4000")
    c = clients(b.endpoint)
    c.hold("jobs", "workers")
    for _ in range(3):
        assert c.enqueue("jobs", b"x", capacity=3) is False
    with pytest.raises(fastbus.QueueFull, match="jobs"):
        c.enqueue("jobs", b"x", capacity=3)
    assert c.enqueue("jobs", b"x", capacity=4) is False              # (the capacity is each sender's word)
    # The broker's own bound, whatever the capacity: ~4 KB of backlogs.
    with pytest.raises(fastbus.QueueFull):
        for _ in range(10):
            c.enqueue("jobs", b"y" * 1000)
    st = b.stats()
    assert st["drops"]["held_full"] == 2 and st["held_bytes"] <= 4000 and st["held_messages"] >= 4, st
    ps = clients(b.endpoint).pubsub(ignore_subscribe_messages=True)
    ps.subscribe("jobs", queue="workers")
    got = drain(ps)
    assert got[:4] == [b"x"] * 4 and len(got) == st["held_messages"]      # what was kept, and nothing else


def test_nobody_is_no_responders_and_release_drops_the_backlog(brokers, clients):
    b = brokers()
    c = clients(b.endpoint)
    with pytest.raises(fastbus.NoResponders):
        c.enqueue("jobs", b"x")                                         # not held, nobody subscribes
    c.hold("jobs", "workers")
    c.enqueue("jobs", b"1")
    c.enqueue("jobs", b"2")
    c.release("jobs", "workers")
    st = b.stats()
    assert (st["held_groups"], st["held_messages"], st["held_purged"], st["queue_groups"]) == (0, 0, 2, 0), st
    with pytest.raises(fastbus.NoResponders):
        c.enqueue("jobs", b"3")
    # A plain subscriber: delivered, answered so, and nothing kept.
    ps = clients(b.endpoint).pubsub(ignore_subscribe_messages=True)
    ps.subscribe("jobs")
    assert c.enqueue("jobs", b"4") is True
    assert drain(ps) == [b"4"]


def test_what_waits_past_the_expiry_is_dropped_and_counted_and_the_group_goes(brokers, clients):
    b = brokers()
    c = clients(b.endpoint)
    c.hold("jobs", "workers", expiry=0.3)
    for i in range(3):
        c.enqueue("jobs", b"%d" % i)
    wait_for(lambda: b.stats()["drops"]["held_expired"] == 3, what="the backlog's expiry")
    wait_for(lambda: b.stats()["held_groups"] == 0, what="the declaration's expiry")
    with pytest.raises(fastbus.NoResponders):
        c.enqueue("jobs", b"late")
    c.hold("jobs", "workers", expiry=0.3)                             # declared again: it keeps again
    assert c.enqueue("jobs", b"again") is False


def test_declarations_past_the_brokers_limit_are_refused(brokers, clients):
    b = brokers("--max-held-groups", "2")
    c = clients(b.endpoint)
    c.hold("a", "q")
    c.hold("b", "q")
    c.hold("a", "q")                                                  # (a renewal: no new group)
    with pytest.raises(fastbus.HoldRefused, match="max_held_groups"):
        c.hold("c", "q")
    assert b.stats()["held_groups"] == 2
    with pytest.raises(ValueError, match="expiry"):
        c.hold("d", "q", expiry=0)
    # A declaration costs as a subscription does, against the broker's total.
    small = brokers("--max-total-subscription-bytes", "300")
    s = clients(small.endpoint)
    s.hold("a", "q")
    with pytest.raises(fastbus.HoldRefused, match="max_total_subscription_bytes"):
        s.hold("b" * 200, "q")
    s.release("a", "q")                                              # (its cost given back)
    s.hold("c" * 150, "q")                                           # (refused were "a" still held)
    with pytest.raises(ValueError, match="capacity"):
        c.enqueue("a", b"x", capacity=-1)
    with pytest.raises(TypeError):
        c.hold("d", None)


MEMBER = textwrap.dedent("""
    import os, sys
    import fastbus
    c = fastbus.Client(endpoint=sys.argv[1], name="member")
    ps = c.pubsub(ignore_subscribe_messages=True)
    ps.subscribe("jobs", queue="workers")
    print("ready", flush=True)
    n = 0
    for m in ps.listen():
        print(m["data"].decode(), flush=True)
        n += 1
        if n == int(sys.argv[2]):
            os.kill(os.getpid(), 9)              # mid-stream, no goodbye
""")


def test_what_a_killed_member_never_took_waits_for_the_next(brokers, clients, tmp_path):
    """The only member killed (-9) with messages on their way to it: once
    its session runs out, what it was given and never said it took goes
    back to the group's backlog, for the next member."""
    b = brokers("--session-linger", "1")
    script = tmp_path / "member.py"
    script.write_text(MEMBER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    p = subprocess.Popen([sys.executable, str(script), b.endpoint, "50"], stdout=subprocess.PIPE, env=env)
    try:
        assert p.stdout.readline() == b"ready\n"
        c = clients(b.endpoint)
        c.hold("jobs", "workers")
        n = 3000
        for i in range(n):
            c.enqueue("jobs", b"%d" % i)
        assert p.wait(30) == -signal.SIGKILL
        took = p.stdout.read().split()
        wait_for(lambda: b.stats()["sessions_expired"] >= 1, what="the killed member's session expiry")
        ps = clients(b.endpoint).pubsub(ignore_subscribe_messages=True)
        ps.subscribe("jobs", queue="workers")
        rest = drain(ps, idle=1.0)
        assert len(rest) == len(set(rest))
        assert set(rest) | set(took) == {b"%d" % i for i in range(n)}, "a message lost"
        st = b.stats()
        assert st["drops"]["session_expired"] == 0 and st["queue_group_handed_over"] > 0, st
    finally:
        if p.poll() is None:
            p.kill()
        p.wait(10)


def test_what_comes_while_the_only_member_is_away_waits_for_its_resume(brokers, clients):
    """The only member's connection cut (by a forwarder) while tasks come:
    the group keeps them (not queued behind the away session) and gives
    them to the member when its session resumes; each task once."""
    from forwarder import Forwarder

    b = brokers()
    with Forwarder(b.port) as fw:
        member = clients(f"tcp://127.0.0.1:{fw.port}").pubsub(ignore_subscribe_messages=True)
        member.subscribe("jobs", queue="workers")
        c = clients(b.endpoint)
        c.hold("jobs", "workers")
        assert c.enqueue("jobs", b"0") is True
        fw.cut(1.0)
        wait_for(lambda: b.stats()["sessions_detached"] >= 1, what="the broker seeing the member gone")
        kept = [c.enqueue("jobs", b"%d" % i) for i in range(1, 101)]
        assert kept == [False] * 100                                   # kept for it, answered so
        got = drain(member, idle=2.0)
        assert sorted(got, key=int) == [b"%d" % i for i in range(101)], got[:5]
        st = b.stats()
        assert st["sessions_resumed"] >= 1 and st["held_given"] >= 100 and st["held_messages"] == 0, st


def test_asyncio_twin(brokers):
    b = brokers()

    async def main():
        c = fastbus.aio.Client(endpoint=b.endpoint)
        w = fastbus.aio.Client(endpoint=b.endpoint)
        try:
            with pytest.raises(fastbus.NoResponders):
                await c.enqueue("jobs", b"x")
            await c.hold("jobs", "workers", expiry=30)
            assert await c.enqueue("jobs", b"1", capacity=2) is False
            assert await c.enqueue("jobs", b"2", capacity=2) is False
            with pytest.raises(fastbus.QueueFull):
                await c.enqueue("jobs", b"3", capacity=2)
            ps = w.pubsub(ignore_subscribe_messages=True)
            await ps.subscribe("jobs", queue="workers")
            got = []
            while len(got) < 2:
                m = await ps.get_message(timeout=5)
                assert m is not None, got
                got.append(m["data"])
            assert got == [b"1", b"2"]
            assert await asyncio.gather(*(c.enqueue("jobs", b"live") for _ in range(20))) == [True] * 20
            await c.release("jobs", "workers")
        finally:
            await c.close()
            await w.close()

    asyncio.run(main())


def test_monitoring_shows_held_groups(brokers, clients):
    port = free_port()
    b = brokers("--http", f"127.0.0.1:{port}")
    c = clients(b.endpoint)
    c.hold("jobs", "workers")
    c.enqueue("jobs", b"x" * 100)

    def metrics() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return r.read().decode()

    def held() -> str | None:
        text = metrics()
        return text if "fastbus_broker_held_messages 1.0" in text else None

    text = wait_for(held, what="the held gauges in /metrics")
    assert "fastbus_broker_held_groups 1.0" in text
    assert "fastbus_broker_held_kept_total 1.0" in text
