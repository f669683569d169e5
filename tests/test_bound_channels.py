"""Channels bound to held groups (``Client.bind`` / ``unbind``), with real
brokers in subprocesses: what is published on a bound channel goes to the
group as if published on the group's own channel (one member, or the
backlog while none can take it, within the binding's capacity), while the
channel's plain subscribers still get it as ever; a binding ends when
unbound, when its life runs out, or with its group; it survives a kill -9
of a broker with ``--journal``; the asyncio twin; the errors."""

from __future__ import annotations

import asyncio
import time
import urllib.request

import pytest
from brokers import free_port, wait_for

import fastbus
import fastbus.aio


def drain(ps, idle: float = 0.5) -> list[tuple[bytes, bytes]]:
    """(channel, data) of what a PubSub gets until nothing comes for ``idle`` s."""
    got = []
    while (m := ps.get_message(ignore_subscribe_messages=True, timeout=idle)) is not None:
        if m["type"] == "message":
            got.append((m["channel"], m["data"]))
    return got


def test_a_bound_channel_feeds_the_group_as_its_own_channel(brokers, clients):
    b = brokers()
    c = clients(b.endpoint)
    c.hold("jobs", "workers", expiry=60)
    c.bind("group.uploads", "jobs", "workers")
    plain = clients(b.endpoint).pubsub(ignore_subscribe_messages=True)
    plain.subscribe("group.uploads")
    # No member: kept by the group, under "jobs"; the plain subscriber has each.
    for i in range(5):
        c.publish("group.uploads", b"u%d" % i)
    c.flush()
    wait_for(lambda: b.stats()["held_messages"] == 5, what="the group keeping what came on the bound channel")
    assert drain(plain) == [(b"group.uploads", b"u%d" % i) for i in range(5)]
    # Two members: the backlog, then each message to one of them, as "jobs".
    members = [clients(b.endpoint).pubsub(ignore_subscribe_messages=True) for _ in range(2)]
    for m in members:
        m.subscribe("jobs", queue="workers")
    for i in range(20):
        c.publish("group.uploads", b"live%d" % i)
    assert c.enqueue("jobs", b"direct") is True                      # (its own channel, as ever)
    got = drain(members[0]) + drain(members[1])
    assert {ch for ch, _d in got} == {b"jobs"}
    assert sorted(d for _ch, d in got) == sorted([b"u%d" % i for i in range(5)] +
                                                 [b"live%d" % i for i in range(20)] + [b"direct"])
    assert len(drain(plain)) == 20
    # A member that also subscribes the bound channel plainly gets both.
    both = clients(b.endpoint).pubsub(ignore_subscribe_messages=True)
    both.subscribe("group.uploads")
    both.subscribe("jobs", queue="workers")
    for m in members:
        m.unsubscribe("jobs")
    wait_for(lambda: b.stats()["queue_group_members"] == 1, what="the other members' leaving")
    c.publish("group.uploads", b"twice")
    c.flush()
    assert sorted(drain(both)) == [(b"group.uploads", b"twice"), (b"jobs", b"twice")]
    # Unbound: the group takes its own channel only; what it kept stays.
    both.unsubscribe("jobs")
    wait_for(lambda: b.stats()["queue_group_members"] == 0, what="the last member's leaving")
    c.publish("group.uploads", b"kept")
    c.flush()
    wait_for(lambda: b.stats()["held_messages"] == 1, what="the last one kept")
    c.unbind("group.uploads", "jobs", "workers")
    c.publish("group.uploads", b"after")
    c.flush()
    time.sleep(0.3)
    assert b.stats()["held_messages"] == 1
    w = clients(b.endpoint).pubsub(ignore_subscribe_messages=True)
    w.subscribe("jobs", queue="workers")
    assert drain(w) == [(b"jobs", b"kept")]


def test_the_capacity_bounds_what_the_group_keeps_from_a_binding(brokers, clients):
    b = brokers()
    c = clients(b.endpoint)
    c.hold("jobs", "workers")
    c.bind("g", "jobs", "workers", capacity=3)
    for i in range(10):
        c.publish("g", b"%d" % i)
    c.flush()
    wait_for(lambda: b.stats()["drops"]["held_full"] == 7, what="the bound's drops counted")
    assert c.enqueue("jobs", b"own") is False                        # (its own channel: the sender's capacity)
    st = b.stats()
    assert st["held_messages"] == 4, st
    w = clients(b.endpoint).pubsub(ignore_subscribe_messages=True)
    w.subscribe("jobs", queue="workers")
    assert [d for _ch, d in drain(w)] == [b"0", b"1", b"2", b"own"]  # the oldest kept, in order


def test_a_binding_keeps_its_group_for_its_life_then_ends(brokers, clients):
    """The group's own declaration expires (1 s) while a binding lives (3 s):
    the group goes on keeping what the bound channel gets; once the binding
    runs out too, the bound channel reaches nobody and the group goes."""
    b = brokers()
    c = clients(b.endpoint)
    c.hold("jobs", "workers", expiry=1)
    c.bind("g", "jobs", "workers", life=3)
    time.sleep(1.6)
    c.publish("g", b"still")
    c.flush()
    wait_for(lambda: b.stats()["held_messages"] == 1, what="the group keeping, past its declaration's expiry")
    assert b.stats()["held_groups"] == 1
    wait_for(lambda: b.stats()["held_groups"] == 0, timeout=10, what="the binding's end and the group's")
    with pytest.raises(fastbus.NoResponders):
        c.request("g", b"anyone?", timeout=1)


def test_refusals(brokers, clients):
    port = free_port()
    b = brokers("--http", f"127.0.0.1:{port}")
    c = clients(b.endpoint)
    with pytest.raises(fastbus.HoldRefused, match="no held group"):
        c.bind("g", "jobs", "workers")
    c.hold("jobs", "workers")
    with pytest.raises(fastbus.HoldRefused, match="its own channel"):
        c.bind("jobs", "jobs", "workers")
    with pytest.raises(ValueError, match="life"):
        c.bind("g", "jobs", "workers", life=0)
    with pytest.raises(ValueError, match="capacity"):
        c.bind("g", "jobs", "workers", capacity=-1)
    with pytest.raises(TypeError, match="name"):
        c.bind("g", "jobs", None)                                    # type: ignore[arg-type]
    c.unbind("g", "jobs", "workers")                                 # (nothing bound: nothing happens)
    c.bind("g", "jobs", "workers")
    c.bind("g", "jobs", "workers")                                   # (again: renewed, one binding)
    c.bind("h", "jobs", "workers")
    st = b.stats()
    assert (st["held_groups"], st["held_bindings"]) == (1, 2), st

    def bindings_shown() -> bool:                                    # (the monitor samples the stats)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            return "fastbus_broker_held_bindings 2.0" in r.read().decode()

    wait_for(bindings_shown, what="held_bindings in /metrics")
    c.release("jobs", "workers")                                     # the group's end ends its bindings
    with pytest.raises(fastbus.NoResponders):
        c.request("g", b"anyone?", timeout=1)


def test_bindings_survive_a_kill_of_a_broker_with_a_journal(brokers, tmp_path):
    b = brokers("--journal", str(tmp_path / "journal"))
    with fastbus.Client(b.endpoint) as c:
        c.hold("jobs", "workers", expiry=600)
        c.bind("g", "jobs", "workers", life=600, capacity=50)
        for i in range(3):
            c.publish("g", b"%d" % i)
        c.flush()
        wait_for(lambda: b.stats()["held_messages"] == 3, what="kept before the kill")
    b.kill()
    b.start()
    with fastbus.Client(b.endpoint) as c:
        for i in range(3, 60):
            c.publish("g", b"%d" % i)                                # the binding and its capacity, read back
        c.flush()
        wait_for(lambda: b.stats()["drops"]["held_full"] == 10, what="past the capacity after the restart")
        with c.pubsub(ignore_subscribe_messages=True) as w:
            w.subscribe("jobs", queue="workers")
            got = drain(w, idle=0.7)
    assert got == [(b"jobs", b"%d" % i) for i in range(50)]


def test_asyncio_twin(brokers):
    b = brokers()

    async def main() -> list:
        c = fastbus.aio.Client(b.endpoint)
        try:
            await c.hold("jobs", "workers")
            await c.bind("g", "jobs", "workers")
            ps = c.pubsub(ignore_subscribe_messages=True)
            await ps.subscribe("jobs", queue="workers")
            await c.publish("g", b"x")
            m = await ps.get_message(timeout=5)
            await c.unbind("g", "jobs", "workers")
            with pytest.raises(fastbus.HoldRefused):
                await c.bind("g", "nowhere", "workers")
            await ps.aclose()
            return [m["channel"], m["data"]]
        finally:
            await c.aclose()

    assert asyncio.run(main()) == [b"jobs", b"x"]
