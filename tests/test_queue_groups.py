"""Queue groups (``subscribe(channel, queue=name)``) with real brokers in
subprocesses: of a group's members each message goes to exactly one (checked
by sequence numbers), plain subscribers of the channel still get every one,
members join, leave and are killed (-9) mid-stream, glob groups, the asyncio
twin, and the errors a user meets."""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from brokers import wait_for, wait_wanted

import fastbus
import fastbus.aio


def drain(ps, idle: float = 0.5) -> list[bytes]:
    """What a PubSub holds until nothing comes for ``idle`` s."""
    got = []
    while (m := ps.get_message(ignore_subscribe_messages=True, timeout=idle)) is not None:
        if m["type"] in ("message", "pmessage"):
            got.append(m["data"])
    return got


def publish(c: fastbus.Client, channel: str, seqs) -> None:
    for i in seqs:
        c.publish(channel, b"%d" % i)
    c.flush(timeout=30)


def members(clients, endpoint: str, n: int, channel: str = "jobs", queue: str = "workers", glob: bool = False):
    out = []
    for _ in range(n):
        ps = clients(endpoint).pubsub(ignore_subscribe_messages=True)
        (ps.psubscribe if glob else ps.subscribe)(channel, queue=queue)
        out.append(ps)
    return out


def exactly_once(received: list[list[bytes]], n: int) -> collections.Counter:
    counts = collections.Counter(d for got in received for d in got)
    twice = [d for d, k in counts.items() if k > 1]
    missing = n - len(counts)
    assert not twice and not missing, f"{len(twice)} delivered twice (e.g. {twice[:3]}), {missing} never"
    return counts


def test_each_message_goes_to_one_member_and_to_every_plain_subscriber(brokers, clients):
    b = brokers()
    group = members(clients, b.endpoint, 4)
    plain = clients(b.endpoint).pubsub(ignore_subscribe_messages=True)
    plain.subscribe("jobs")
    other = members(clients, b.endpoint, 1, queue="auditors")[0]    # another group: its own copy
    pub = clients(b.endpoint)
    wait_wanted(pub, "jobs")
    publish(pub, "jobs", range(4000))
    got = [drain(ps) for ps in group]
    exactly_once(got, 4000)
    # Round robin over members that take messages: none starves.
    assert min(len(g) for g in got) > 500, [len(g) for g in got]
    assert drain(plain) == [b"%d" % i for i in range(4000)]
    assert drain(other) == [b"%d" % i for i in range(4000)]
    # Each member's share comes in the order it was published.
    for g in got:
        assert g == sorted(g, key=int)


def test_members_join_and_leave(brokers, clients):
    """A member that joins gets its share from its confirmation on; one that
    leaves gets nothing after; nothing is lost or doubled meanwhile."""
    b = brokers()
    first = members(clients, b.endpoint, 2)
    pub = clients(b.endpoint)
    wait_wanted(pub, "jobs")
    publish(pub, "jobs", range(0, 1000))
    late = members(clients, b.endpoint, 1)[0]
    publish(pub, "jobs", range(1000, 2000))
    # It leaves with its share unread, some of it still on its way: what
    # the group gave it before its unsubscribe was in effect is still its
    # own to read (nobody else gets it), and nothing after.
    first[0].unsubscribe("jobs")
    publish(pub, "jobs", range(2000, 3000))
    got = [drain(first[0]), drain(first[1]), drain(late)]
    exactly_once(got, 3000)
    assert all(int(d) >= 1000 for d in got[2]) and len(got[2]) > 100
    assert all(int(d) < 2000 for d in got[0]) and len(got[0]) > 100
    # The last member leaving takes the group: nobody wants the channel.
    first[1].unsubscribe("jobs")
    late.unsubscribe("jobs")
    wait_for(lambda: not pub.is_wanted("jobs"), what="the group gone from the publisher's filter")


def test_a_glob_group(brokers, clients):
    b = brokers()
    group = members(clients, b.endpoint, 2, channel="jobs.*", glob=True)
    pub = clients(b.endpoint)
    wait_wanted(pub, "jobs.a")
    for i in range(600):
        pub.publish(("jobs.a", "jobs.b", "other")[i % 3], b"%d" % i)
    pub.flush(timeout=30)
    got = [drain(ps) for ps in group]
    counts = collections.Counter(d for g in got for d in g)
    assert set(counts) == {b"%d" % i for i in range(600) if i % 3 != 2} and set(counts.values()) == {1}
    assert all(len(g) > 100 for g in got)


MEMBER = textwrap.dedent("""
    import os, sys, fastbus
    c = fastbus.Client(endpoint=sys.argv[1], name="member")
    ps = c.pubsub(ignore_subscribe_messages=True)
    ps.subscribe("jobs", queue="workers")
    die_after = int(sys.argv[2])
    print("ready", flush=True)
    n = 0
    for m in ps.listen():
        if m["data"] == b"end":
            break
        print(m["data"].decode(), flush=True)
        n += 1
        if n == die_after:
            os.kill(os.getpid(), 9)              # mid-stream, no goodbye
""")


def member_process(tmp_path, endpoint: str, die_after: int) -> subprocess.Popen:
    """A member of group ``workers`` on ``jobs`` in a process of its own,
    printing each message; it kills itself (-9) after ``die_after`` (0:
    never), and ends at ``end``."""
    script = tmp_path / "member.py"
    script.write_text(MEMBER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    p = subprocess.Popen([sys.executable, str(script), endpoint, str(die_after)], stdout=subprocess.PIPE, env=env,
                         cwd=str(tmp_path))
    assert p.stdout.readline() == b"ready\n"
    return p


def stream(pub: fastbus.Client, n: int) -> None:
    """Messages 0..n-1 on jobs, flushed every 500 (a stream, not one burst)."""
    wait_wanted(pub, "jobs")
    for i in range(n):
        pub.publish("jobs", b"%d" % i)
        if i % 500 == 499:
            pub.flush(timeout=30)
    pub.flush(timeout=30)


def test_a_member_killed_mid_stream(brokers, clients, tmp_path):
    """A member killed (-9) while messages stream to the group: the others
    take the rest, and once its session runs out, what it was given and
    never said it took goes to them too: nothing is lost (what it may have
    taken without saying so comes again)."""
    b = brokers("--session-linger", "1")
    procs = []
    try:
        for die_after in (300, 0, 0):
            procs.append(member_process(tmp_path, b.endpoint, die_after))
        pub = clients(b.endpoint)
        n = 6000
        stream(pub, n)
        assert procs[0].wait(30) == -signal.SIGKILL
        wait_for(lambda: b.stats()["sessions_expired"] >= 1, what="the killed member's session expiry")
        for _ in procs[1:]:
            pub.publish("jobs", b"end")         # (one each: the group gives each survivor one)
        pub.flush(timeout=30)
        outs = [p.communicate(timeout=30)[0].split() for p in procs]
        survivors = outs[1] + outs[2]
        assert len(survivors) == len(set(survivors)), "a message delivered twice to the survivors"
        assert set(survivors) | set(outs[0]) == {b"%d" % i for i in range(n)}
        # (Twice: only some of what the killed one took, those after its
        # last TAKEN, which it may not have reached: every TAKEN_EVERY.)
        st = b.stats()
        assert len(outs[0]) == 300
        assert st["queue_group_handed_over"] >= len(set(survivors) & set(outs[0])), st
        assert st["drops"]["session_expired"] == 0, st
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)


def test_asyncio_members(brokers):
    b = brokers()

    async def main():
        cs = [fastbus.aio.Client(endpoint=b.endpoint) for _ in range(3)]
        try:
            group = []
            for c in cs[:2]:
                ps = c.pubsub(ignore_subscribe_messages=True)
                await ps.subscribe("jobs", queue="workers")
                group.append(ps)
            pub = cs[2]
            for i in range(1000):
                await pub.publish("jobs", b"%d" % i)
            await pub.flush()
            got = [[], []]
            for ps, out in zip(group, got):
                while (m := await ps.get_message(timeout=0.5)) is not None:
                    out.append(m["data"])
            return got
        finally:
            for c in cs:
                await c.close()

    got = asyncio.run(main())
    exactly_once(got, 1000)
    assert all(len(g) > 100 for g in got)


def test_what_a_user_gets_wrong(brokers, clients):
    b = brokers()
    ps = clients(b.endpoint).pubsub()
    with pytest.raises(ValueError, match="1 to 255 bytes"):
        ps.subscribe("jobs", queue="")
    with pytest.raises(ValueError, match="1 to 255 bytes"):
        ps.subscribe("jobs", queue="q" * 256)
    with pytest.raises(TypeError, match="queue must be a str or bytes"):
        ps.subscribe("jobs", queue=5)
    ps.subscribe("jobs", queue="a")
    ps.subscribe("jobs", queue="a")                  # the same again: nothing changes
    with pytest.raises(ValueError, match="subscribed in queue group 'a'.*unsubscribe it first"):
        ps.subscribe("jobs", queue="b")
    with pytest.raises(ValueError, match="without a queue group"):
        ps.subscribe("plain") or ps.subscribe("plain", queue="a")
    ps.unsubscribe("jobs")
    ps.subscribe("jobs", queue="b")                  # unsubscribed first: fine
    # A callable under "queue" is still the handler of a channel named so.
    seen = []
    ps.subscribe(queue=seen.append)
    pub = clients(b.endpoint)
    wait_wanted(pub, "queue")
    pub.publish("queue", b"x")
    pub.flush()
    wait_for(lambda: ps.get_message(timeout=0.1) is None and seen, what="the handler")
    assert seen[0]["channel"] == b"queue"


def test_one_member_per_message_across_a_federation(brokers, clients):
    """A 2-level federation (top <- mid <- leaf, and top <- side), members
    of one group on every broker, publishers at three of them: each
    message goes to exactly one member in the whole tree (the broker where
    it enters picks, and one it gives to another broker names the group
    for that broker to pick), while a plain subscriber anywhere gets each
    once."""
    top = brokers("--allow-broker", "local")
    mid = brokers("--upstream", top.endpoint, "--allow-broker", "local")
    leaf = brokers("--upstream", mid.endpoint)
    side = brokers("--upstream", top.endpoint)
    for b in (mid, leaf, side):
        wait_for(lambda: b.stats()["upstream"]["connected"], what="the federation")
    group = []
    for b, n in ((top, 1), (mid, 1), (leaf, 2), (side, 1)):
        group += members(clients, b.endpoint, n)
    plain = clients(mid.endpoint).pubsub(ignore_subscribe_messages=True)
    plain.subscribe("jobs")
    pubs = [clients(b.endpoint) for b in (leaf, top, side)]
    for pub in pubs:
        wait_wanted(pub, "jobs")
    n = 0
    for k, pub in enumerate(pubs):
        publish(pub, "jobs", range(k * 1000, (k + 1) * 1000))
        n += 1000
    got = [drain(ps, idle=1.0) for ps in group]
    exactly_once(got, n)
    assert all(len(g) > 100 for g in got), [len(g) for g in got]
    assert sorted(drain(plain), key=int) == [b"%d" % i for i in range(n)]
    # Members leaving anywhere (those of leaf and side): once that is in
    # effect (top's group: its own member and mid; mid's: its own and top),
    # the rest take everything.
    for ps in group[2:]:
        ps.unsubscribe("jobs")
    for b in (top, mid):
        wait_for(lambda: b.stats()["queue_group_members"] == 2, what="the members gone from the groups")
    for pub in pubs:
        publish(pub, "jobs", range(n, n + 300))
        n += 300
    rest = [drain(ps, idle=1.0) for ps in group[:2]]
    exactly_once(rest, 900)


def test_sharded_members(brokers):
    """Members through ShardedClient: each channel's messages go to one
    member on the broker that owns it."""
    eps = [brokers().endpoint for _ in range(2)]
    cs = [fastbus.ShardedClient(eps) for _ in range(3)]
    try:
        chans = [f"job.{i}" for i in range(8)]
        group = []
        for c in cs[:2]:
            p = c.pubsub(ignore_subscribe_messages=True)
            p.subscribe(*chans, queue="workers")
            group.append(p)
        pub = cs[2]
        for cl in pub.clients:
            wait_for(lambda cl=cl: cl.stats()["filter_active"], what="filters")
        wait_for(lambda: all(pub.clients[pub.shard(ch)].is_wanted(ch) for ch in chans), what="channel filters")
        for i in range(800):
            pub.publish(chans[i % 8], b"%d" % i)
        pub.flush()
        got = []
        for p in group:
            mine = []
            while batch := p.get_batch(timeout=0.5):
                mine += [d for _ch, d in batch]
            got.append(mine)
        exactly_once(got, 800)
        assert all(len(g) > 100 for g in got)
    finally:
        for c in cs:
            c.close()


def test_a_member_killed_behind_another_broker(brokers, clients, tmp_path):
    """The only member on a leaf broker killed (-9) mid-stream, publishing
    on the top broker: what the leaf was given for it and it never took
    goes, once its session runs out, back up to the member on top (for the
    group only: the top's plain subscriber gets nothing twice)."""
    top = brokers("--allow-broker", "local")
    leaf = brokers("--upstream", top.endpoint, "--session-linger", "1")
    wait_for(lambda: leaf.stats()["upstream"]["connected"], what="the federation")
    p = member_process(tmp_path, leaf.endpoint, 300)
    try:
        mine = members(clients, top.endpoint, 1)[0]
        plain = clients(top.endpoint).pubsub(ignore_subscribe_messages=True)
        plain.subscribe("jobs")
        wait_for(lambda: top.stats()["queue_group_members"] == 2, what="the leaf's member heard of on top")
        pub = clients(top.endpoint)
        n = 4000
        stream(pub, n)
        assert p.wait(30) == -signal.SIGKILL
        killed = set(p.stdout.read().split())
        wait_for(lambda: leaf.stats()["sessions_expired"] >= 1, what="the killed member's session expiry")
        wait_for(lambda: leaf.stats()["queue_group_handed_over"] > 0, what="the hand-over")
        got = drain(mine, idle=1.0)
        assert len(got) == len(set(got)), "a message delivered twice to the member on top"
        assert set(got) | killed == {b"%d" % i for i in range(n)}
        assert sorted(drain(plain), key=int) == [b"%d" % i for i in range(n)]      # each once
        assert len(killed) == 300 and leaf.stats()["drops"]["session_expired"] == 0
    finally:
        if p.poll() is None:
            p.kill()
        p.wait(10)


def test_a_member_cut_off_resumes_and_the_group_loses_nothing(brokers, clients):
    """A member's connection cut (0.5 s, by a forwarder) while the group is
    busy: what was routed to it before the broker noticed comes to it when
    it resumes, the other member takes the rest meanwhile (a member away is
    picked last), and each message reaches one member, once."""
    from forwarder import Forwarder

    b = brokers()
    with Forwarder(b.port) as fw:
        cut = members(clients, f"tcp://127.0.0.1:{fw.port}", 1)[0]
        other = members(clients, b.endpoint, 1)[0]
        pub = clients(b.endpoint)
        wait_wanted(pub, "jobs")
        n = 20_000
        for i in range(n):
            pub.publish("jobs", b"%d" % i)
            if i == n // 3:
                pub.flush(timeout=30)
                fw.cut(0.5)
            elif i % 1000 == 999:
                pub.flush(timeout=30)
                time.sleep(0.02)                   # (a stream through the cut and past it)
        pub.flush(timeout=30)
        got = [drain(cut, idle=2.0), drain(other)]
        exactly_once(got, n)
        st = b.stats()
        assert st["sessions_detached"] >= 1 and st["sessions_resumed"] >= 1 and st["sessions_expired"] == 0, st
